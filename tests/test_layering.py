"""Imports go one way (docs/development.md, "Layers"): checked over the source, every import
statement counted, those inside functions too.

- worker-side modules (what runs in a task or a worker plugin) never import client-side ones;
- the library never imports the tools (``probe``, ``bench``, ``demo``, ``cli``), and a tool
  imports no other tool but ``measure``, what they share;
- the library's modules import each other without a cycle, and so do the bench's.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "dask_gpudirect"

TOOLS = ("probe", "bench", "demo", "cli", "measure")
#: The tool the others share (a local cluster, the pinned-copy ceiling, the pair transfer).
SHARED = "measure"
WORKER_SIDE = (
    "access", "remote", "stamps", "shards", "plan_cache", "loading", "targets", "formats",
    "filters", "plugin", "preload", "metrics", "ledger", "shuffle.worker", "shuffle.split",
    "shuffle.buffer", "shuffle.rapidsmpf_engine",
)  # fmt: skip
CLIENT_SIDE = (
    "discovery", "remote_listing", "read_plans", "placement", "collections", "cluster",
    "connection", "dashboard", "progress", "ledger_report", "shuffle.api", "shuffle.coordinator",
    "shuffle.dask_method",
)  # fmt: skip


def _name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Module (``a.b``, relative to the package) -> the package's modules it imports."""
    modules = {_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".") if package else []
                    base = base[: len(base) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                elif (node.module or "").startswith("dask_gpudirect"):
                    module = node.module.removeprefix("dask_gpudirect").lstrip(".")
                else:
                    continue
                for alias in node.names:  # `from . import x` imports the module x
                    sub = f"{module}.{alias.name}".lstrip(".")
                    found.add(sub if sub in modules else module)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("dask_gpudirect"):
                        found.add(alias.name.removeprefix("dask_gpudirect").lstrip("."))
        graph[name] = found - {name}
    return graph


def _in(module: str, group: tuple[str, ...]) -> bool:
    return any(module == g or module.startswith(g + ".") for g in group)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_the_graph_is_read():
    graph = _imports()
    assert {"loading", "plugin", "targets"} <= graph["collections"] | graph["loading"]
    assert "formats.parquet" in graph["loading"]  # a `from .formats import parquet`
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_worker_side_modules_never_import_client_side_ones():
    bad = [
        (m, d)
        for m, deps in _imports().items()
        if _in(m, WORKER_SIDE)
        for d in deps
        if _in(d, CLIENT_SIDE)
    ]
    assert bad == []


def test_tools_are_leaves():
    graph = _imports()
    library = [(m, d) for m, deps in graph.items() if not _in(m, TOOLS) for d in deps]
    assert [(m, d) for m, d in library if _in(d, TOOLS)] == []
    across = [  # the command line (cli) gathers the commands: it may import them all
        (m, d)
        for m, deps in graph.items()
        for d in deps
        if _in(m, TOOLS) and _in(d, TOOLS) and m != "cli" and d != SHARED
        if m.split(".")[0] != d.split(".")[0]
    ]
    assert across == [], f"a tool imports another tool: put what they share in {SHARED}.py"


def test_no_import_cycles():
    graph = _imports()
    library = {m: {d for d in ds if not _in(d, TOOLS)} for m, ds in graph.items() if m}
    library = {m: ds for m, ds in library.items() if not _in(m, TOOLS)}
    assert _cycle(library) is None
    bench = {m: {d for d in ds if d.startswith("bench")} for m, ds in graph.items()}
    assert _cycle({m: ds for m, ds in bench.items() if m.startswith("bench")}) is None
