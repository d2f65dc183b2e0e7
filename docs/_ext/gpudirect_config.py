"""The ``gpudirect-config`` directive: a table of every ``gpudirect.*`` key, made at build time.

It reads the packaged ``dask_gpudirect/gpudirect.yaml``: values from the YAML itself, meanings
from its comments (a comment block above a key, or a comment after it and the comment lines
aligned under that one). A key without a comment, or a comment that no key takes, fails the
build, so the page cannot drift from the file.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import re

import yaml
from docutils import nodes
from docutils.parsers.rst import Directive

_KEY = re.compile(r"^(?P<indent> *)(?P<name>[A-Za-z][\w-]*):(?P<value>[^#]*)(?:#\s?(?P<note>.*))?$")
_COMMENT = re.compile(r"^(?P<indent> *)#\s?(?P<note>.*)$")


@dataclasses.dataclass
class Key:
    """One leaf key of the yaml: its dotted name, default and meaning."""

    name: str
    default: object
    meaning: str

    @property
    def env(self) -> str:
        """Dask's environment variable for the key (``-`` and ``_`` are one to Dask)."""
        return "DASK_" + self.name.upper().replace(".", "__").replace("-", "_")


def packaged_yaml() -> str:
    return (importlib.resources.files("dask_gpudirect") / "gpudirect.yaml").read_text()


def parse(text: str) -> list[Key]:
    """Every leaf key of ``text`` with its default and the comments that describe it."""
    values = yaml.safe_load(text)
    keys: list[Key] = []
    path: list[tuple[int, str]] = []  # (indent, name) of the mappings above the current line
    above: list[str] = []  # a comment block waiting for the key under it
    last: tuple[Key, int] | None = None  # the last key with a trailing comment, and its column
    for line in text.splitlines():
        if not line.strip():
            continue
        if comment := _COMMENT.match(line):
            column = line.index("#")
            if last and column == last[1]:  # continues the comment of the key above
                last[0].meaning += " " + comment["note"].strip()
            else:
                above.append(comment["note"].strip())
            continue
        key = _KEY.match(line)
        if key is None:
            raise ValueError(f"gpudirect.yaml: cannot read the line {line!r}")
        indent = len(key["indent"])
        path = [(i, n) for i, n in path if i < indent]
        path.append((indent, key["name"]))
        name = ".".join(n for _, n in path)
        node = values
        for _, part in path:
            node = node[part]
        last = None
        if isinstance(node, dict):
            if above:
                raise ValueError(f"gpudirect.yaml: the comment above {name} describes no leaf key")
            continue
        meaning = " ".join([*above, (key["note"] or "").strip()]).strip()
        if not meaning:
            raise ValueError(f"gpudirect.yaml: {name} has no comment to say what it is")
        keys.append(Key(name, node, meaning))
        above = []
        if key["note"] is not None:
            last = (keys[-1], line.index("#"))
    if above:
        raise ValueError("gpudirect.yaml: a comment at the end describes no key")
    return keys


def show(value: object) -> str:
    """A default as YAML writes it: ``null``, ``16``, ``4MiB``, ``[/data]``."""
    return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()


def plugin_overrides() -> dict[str, list[str]]:
    """Per config key, the ``GPUDirectPlugin`` keyword and ``--gpudirect-*`` preload flag that
    override it."""
    from dask_gpudirect.config import PLUGIN_OPTIONS
    from dask_gpudirect.preload import dask_setup

    flags = {
        p.name.removeprefix("gpudirect_"): p.opts[0]
        for p in dask_setup.params
        if p.name.startswith("gpudirect_")
    }
    return {
        key: [word, *([flags[word]] if word in flags else [])]
        for word, key in PLUGIN_OPTIONS.items()
    }


def _cell(*paragraphs: list[nodes.Node]) -> nodes.entry:
    return nodes.entry("", *(nodes.paragraph("", "", *children) for children in paragraphs))


def _row(*cells: nodes.entry) -> nodes.row:
    return nodes.row("", *cells)


class ConfigTable(Directive):
    """``.. gpudirect-config::``: per key its environment variable, default and meaning, and the
    plugin's keyword and the preload's flag where the key has them."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        headers = ["key and environment variable", "default", "meaning"]
        group = nodes.tgroup(cols=len(headers))
        for width in (40, 10, 50):
            group += nodes.colspec(colwidth=width)
        group += nodes.thead("", _row(*(_cell([nodes.Text(h)]) for h in headers)))
        body = nodes.tbody()
        overrides = plugin_overrides()
        for key in parse(packaged_yaml()):
            meaning = [[nodes.Text(key.meaning)]]
            if key.name in overrides:
                word, *flag = overrides[key.name]
                also = [nodes.Text("GPUDirectPlugin keyword "), nodes.literal(text=word)]
                if flag:
                    also += [nodes.Text(", preload flag "), nodes.literal(text=flag[0])]
                meaning.append(also)
            body += _row(
                _cell([nodes.literal(text=key.name)], [nodes.literal(text=key.env)]),
                _cell([nodes.literal(text=show(key.default))]),
                _cell(*meaning),
            )
        group += body
        return [nodes.table("", group, classes=["gpudirect-config"])]


def setup(app):
    app.add_directive("gpudirect-config", ConfigTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
