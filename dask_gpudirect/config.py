"""Dask config defaults for every ``gpudirect.*`` knob, and the plugin's option names.

The packaged ``gpudirect.yaml`` is merged into ``dask.config`` on import, so each knob can be
set in a Dask yaml file, with ``DASK_GPUDIRECT__READER__THREADS=8`` and friends, or with
``dask.config.set``.
"""

from __future__ import annotations

import numbers
import pathlib
from typing import Any

import dask.config
import yaml
from dask.utils import parse_bytes, parse_timedelta

from .errors import ConfigError, OptionError

_YAML = pathlib.Path(__file__).with_name("gpudirect.yaml")

with _YAML.open() as f:
    defaults: dict[str, Any] = yaml.safe_load(f)

dask.config.update_defaults(defaults)

#: Keyword options of :class:`~dask_gpudirect.GPUDirectPlugin` and the config key each overrides.
PLUGIN_OPTIONS: dict[str, str] = {
    "target": "gpudirect.target",
    "threads": "gpudirect.reader.threads",
    "task_size": "gpudirect.reader.task-size",
    "compat_mode": "gpudirect.reader.compat-mode",
    "max_records": "gpudirect.ledger.max-records",
}


def resolve_options(overrides: dict[str, Any]) -> dict[str, Any]:
    """Plugin options: Dask config, with the constructor's keywords on top."""
    unknown = sorted(set(overrides) - set(PLUGIN_OPTIONS))
    if unknown:
        raise OptionError(
            f"unknown GPUDirectPlugin option(s) {unknown}; known: {sorted(PLUGIN_OPTIONS)}"
        )
    options = {name: dask.config.get(key) for name, key in PLUGIN_OPTIONS.items()}
    options.update(overrides)
    return {name: _checked(name, value, name in overrides) for name, value in options.items()}


def configured(name: str) -> Any:
    """The plugin option ``name`` as this process's Dask config gives it, checked as
    :func:`resolve_options` checks it: for what reads the key without a plugin (a worker's
    ledger, made by a shuffle that sets up no reader plugin)."""
    return _checked(name, dask.config.get(PLUGIN_OPTIONS[name]), False)


def boolean(key: str) -> bool:
    """The Dask config ``key``: a ConfigError naming it where it is no bool (a string "no"
    or "false", as ``DASK_GPUDIRECT__...=no`` gives, would read as true)."""
    value = dask.config.get(key)
    if not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r}: use true or false")
    return value


def size_in_bytes(value: Any) -> int | None:
    """``value`` in bytes (a number, or a size like ``"4MiB"``); None where it is no size (an
    unknown unit, a boolean): what every size setting and option is read with."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):  # a NumPy integer too, which parse_bytes refuses
        return int(value)
    if _fractional(value):  # parse_bytes cuts 1.5 to 1 and -0.5 to 0: no size of bytes
        return None
    try:
        return parse_bytes(value)
    except (ValueError, TypeError, KeyError, AttributeError):  # parse_bytes([1]): AttributeError
        return None


def positive_size(value: Any) -> int | None:
    """``value`` in bytes where it is a size above zero; None otherwise."""
    nbytes = size_in_bytes(value)
    return nbytes if nbytes is not None and nbytes > 0 else None


def whole_number(value: Any, minimum: int) -> int | None:
    """``value`` as a whole number of at least ``minimum`` ("16" from a yaml string too; not a
    bool, not 1.5); None where it is none. An integer (a NumPy one too) or a string: int()
    of any other number cuts it (numpy's float32 1.5, Decimal 1.5) and takes numpy's True."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral | str | bytes):
        return None
    try:
        number = int(value)
    except ValueError:
        return None
    return number if number >= minimum else None


def duration_seconds(key: str, zero: bool = False) -> float:
    """The Dask config ``key`` in seconds: a ConfigError naming it where it is no positive
    duration (every timeout of the package is read with this), or with ``zero`` no duration of
    at least 0 (a wait that may be none)."""
    value = dask.config.get(key)
    try:
        seconds = parse_timedelta(value)
    except (ValueError, TypeError, KeyError, AttributeError):
        seconds = None
    if seconds is None or not (seconds >= 0 if zero else seconds > 0):
        wanted = "a duration of at least 0" if zero else "a positive duration"
        raise ConfigError(f"{key}={value!r}: use {wanted}, like '600s'")
    return float(seconds)


def _fractional(value: Any) -> bool:
    """Whether ``value`` is a number of bytes that is not whole (``1.5``, ``"0.5"``)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return not number.is_integer()


def _checked(name: str, value: Any, given: bool) -> Any:
    """An option's value made what the readers take, or a ConfigError that names where it came
    from: where the plugin is made (or set up), not in the first read task."""
    # a str first: an array or pd.NA compared with "device" has no truth value (a bare error)
    if name == "target" and (
        value is None or isinstance(value, str) and value in ("device", "host")
    ):
        return value
    if name == "compat_mode":  # YAML reads an unquoted ON or OFF as a boolean
        mode = {True: "ON", False: "OFF"}[value] if isinstance(value, bool) else str(value).upper()
        if mode in ("AUTO", "ON", "OFF"):
            return mode
    if name in ("threads", "max_records"):
        number = whole_number(value, 1 if name == "threads" else 0)
        if number is not None:
            return number
    if name == "task_size" and (size := positive_size(value)) is not None:
        return size
    wanted = {
        "target": "'device', 'host' or None",
        "threads": "a whole number of at least 1",
        "task_size": "a positive size, like '4MiB'",
        "compat_mode": "'AUTO', 'ON' or 'OFF'",
        "max_records": "a whole number of at least 0",
    }[name]
    origin = f"GPUDirectPlugin({name}={value!r})" if given else f"{PLUGIN_OPTIONS[name]}={value!r}"
    raise ConfigError(f"{origin}: use {wanted}")
