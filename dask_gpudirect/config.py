"""Dask config defaults for every ``gpudirect.*`` knob, and the plugin's option names.

The packaged ``gpudirect.yaml`` is merged into ``dask.config`` on import, so each knob can be
set in a Dask yaml file, with ``DASK_GPUDIRECT__READER__THREADS=8`` and friends, or with
``dask.config.set``.
"""

from __future__ import annotations

import pathlib
from typing import Any

import dask.config
import yaml

from .errors import OptionError

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
    return options
