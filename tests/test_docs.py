"""The docs cannot rot: every ```python block of README.md and docs/*.md runs here.

Each page's blocks run in order, in one namespace, in a fresh Python process (so their Dask
config and clusters cannot leak into other tests), in a directory with small generated files:
``data/*.parquet`` (columns ``id, x, y, label``) and ``shards/*.npy``. On the host target:

- ``dg.LocalCUDACluster`` is replaced by a ``LocalCluster`` of two worker processes that takes
  the same ``plugins=``, because CI has no GPU, and runs over tcp where the block asks for
  ``protocol="ucxx"`` (see :func:`host_cluster`); the rest of each block runs as written.
- A page whose blocks use ``client`` without making one (docs/observability.md) gets one: a
  ``Client`` of such a cluster that has loaded ``data/*.parquet``.
- A block can be skipped only with a stated reason, on the line right above it:
  ``<!-- docs-test: skip: REASON -->``.

Run one page by hand: ``python tests/test_docs.py docs/guide.md`` (in a scratch directory).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import subprocess
import sys

import pytest
from util import HANG_GUARD

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SKIP = re.compile(r"^<!-- docs-test: skip(?P<colon>:?)(?P<reason>.*?)\s*-->$")
FENCE = re.compile(r"^```(?P<info>\S*)")  # ```python, ```{include}, ...


@dataclasses.dataclass
class Block:
    page: pathlib.Path
    line: int  # the first code line, 1-based
    code: str
    skip: str | None  # the reason, where the block is marked to skip


def python_blocks(page: pathlib.Path) -> list[Block]:
    """The top-level ```python fences of a Markdown page, with any skip marker above each."""
    lines = page.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```")
        if fence["info"] == "python":
            marker = SKIP.match(lines[i - 1]) if i else None
            skip = marker["reason"].strip() if marker else None
            blocks.append(Block(page, i + 2, "\n".join(lines[i + 1 : end]) + "\n", skip))
        i = end + 1
    return blocks


def pages() -> list[pathlib.Path]:
    found = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    return [p for p in found if python_blocks(p)]


@pytest.mark.timeout(HANG_GUARD + 60)
@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_page_runs(page, tmp_path):
    proc = subprocess.run(
        [sys.executable, __file__, str(page)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    ran = re.findall(r"^ran (\S+:\d+)$", proc.stdout, re.M)
    expected = [f"{b.page.name}:{b.line}" for b in python_blocks(page) if b.skip is None]
    assert ran == expected


def test_the_pages_have_examples():
    names = {p.relative_to(ROOT).as_posix() for p in pages()}
    assert {"README.md", "docs/quickstart.md", "docs/guide.md"} <= names


def test_a_skip_says_why():
    for page in [ROOT / "README.md", *DOCS.glob("*.md")]:
        lines = page.read_text().splitlines()
        for n, line in enumerate(lines):
            if "docs-test:" in line:
                marker = SKIP.match(line.strip())
                assert marker and marker["colon"] and marker["reason"].strip(), (
                    f"{page.name}:{n + 1}: write <!-- docs-test: skip: REASON -->"
                )
                assert n + 1 < len(lines) and lines[n + 1] == "```python", (
                    f"{page.name}:{n + 1}: the skip marker must stand right above a ```python block"
                )


def test_readme_links_exist():
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((?!https?://|#)([^)#]+)", text)
    assert links
    for link in links:
        assert (ROOT / link).exists(), f"README.md links to {link}, which does not exist"


def test_configuration_table_has_every_key_and_its_variable():
    """The generated table (docs/_ext/gpudirect_config.py) lists every leaf key of the packaged
    yaml, and each variable it names sets that key."""
    import dask.config
    import yaml

    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import gpudirect_config
    finally:
        sys.path.remove(str(DOCS / "_ext"))

    text = gpudirect_config.packaged_yaml()
    keys = gpudirect_config.parse(text)

    def leaves(node, prefix):
        for name, value in node.items():
            if isinstance(value, dict):
                yield from leaves(value, f"{prefix}{name}.")
            else:
                yield f"{prefix}{name}", value

    assert {(k.name, k.default) for k in keys} == set(leaves(yaml.safe_load(text), ""))
    for key in keys:
        assert key.meaning
        collected = dask.config.collect_env({key.env: "7"})
        assert dask.config.get(key.name, config=collected) == 7, key.env


def test_configuration_parser_refuses_an_undescribed_key():
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import gpudirect_config
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    with pytest.raises(ValueError, match="gpudirect.reader.new-knob has no comment"):
        gpudirect_config.parse("gpudirect:\n  reader:\n    threads: 4  # reads\n    new-knob: 1\n")


def test_concepts_copies_table_is_the_ledgers():
    from dask_gpudirect.ledger import COPIES

    text = (DOCS / "concepts.md").read_text()
    table = dict(re.findall(r"^\| `([a-z-]+)` \| (\d+) \|", text, re.M))
    assert table == {path: str(copies) for path, copies in COPIES.items()}


# --- the runner: `python tests/test_docs.py PAGE` in a scratch directory --------------------


def write_data(root: pathlib.Path) -> None:
    """Small files for the examples: data/*.parquet and shards/*.npy."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    (root / "data").mkdir()
    (root / "shards").mkdir()
    rows = 5000
    for i in range(4):
        table = pa.table(
            {
                "id": rng.integers(0, 1000, rows, dtype="int64"),
                "x": rng.standard_normal(rows),
                "y": rng.standard_normal(rows),
                "label": rng.integers(0, 10, rows, dtype="int32"),
            }
        )
        pq.write_table(table, root / "data" / f"part-{i}.parquet", row_group_size=rows // 4)
        np.save(root / "shards" / f"shard-{i}.npy", rng.standard_normal((500, 16), dtype="f4"))


def host_cluster(plugins=None, protocol=None):
    """Stands in for ``dg.LocalCUDACluster`` where there is no GPU (CI). Over tcp whatever
    ``protocol`` says: on the host target UCX would move host memory all the same, and starting
    and closing it costs this 2-core CI half a minute a page."""
    from distributed import LocalCluster
    from util import PatientNanny  # the runner's sys.path[0] is tests/

    del protocol
    return LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        dashboard_address=":0",
        plugins=plugins or set(),
        worker_class=PatientNanny,
    )


def run_page(page: pathlib.Path) -> None:
    from distributed import Client

    import dask_gpudirect as dg

    write_data(pathlib.Path.cwd())
    dg.LocalCUDACluster = host_cluster
    blocks = python_blocks(page)
    namespace: dict = {"__name__": "__main__"}
    code = "".join(b.code for b in blocks if b.skip is None)
    if re.search(r"\bclient\b", code) and "Client(" not in code:
        namespace["client"] = Client(host_cluster(plugins={dg.GPUDirectPlugin()}))
        namespace["dg"] = dg
        dg.read_parquet("data/*.parquet").compute()  # something in the ledger
    for block in blocks:
        where = f"{page.name}:{block.line}"
        if block.skip is not None:
            print(f"skipped {where}: {block.skip}")
            continue
        source = "\n" * (block.line - 1) + block.code  # tracebacks give the page's line numbers
        exec(compile(source, str(page), "exec"), namespace)
        print(f"ran {where}", flush=True)
    for value in list(namespace.values()):
        if isinstance(value, Client):
            cluster = value.cluster
            value.close()
            if cluster is not None:  # workers slow to stop on a loaded machine are not a fault:
                cluster.close(timeout=120)  # PatientNanny gives each 30 s, not 5


if __name__ == "__main__":
    run_page(pathlib.Path(sys.argv[1]).resolve())
