"""``s3://`` and ``http(s)://`` reads on the host target (issue 16), against real servers on
loopback: moto's S3 server (its requests signed and checked against an IAM user's keys) and an
HTTP server that serves byte ranges. Results equal pyarrow's and NumPy's reads of local copies.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import os
import socket
import threading
import time
import urllib.parse
import urllib.request

import dask
import numpy as np
import pytest
from object_servers import BUCKET, FILES, parquet_files
from util import (
    assert_same_frame,
    clear_ledgers,
    compute,
    expected_parquet,
    shards_of,
    worker_config,
    workers_info,
)

import dask_gpudirect as dg
from dask_gpudirect import ledger_report, remote
from dask_gpudirect.bench.range_server import LoopbackServer, RangeHandler
from dask_gpudirect.errors import InputError

pytest.importorskip("moto.server")


def _routes(client) -> set[str]:
    return set(dg.report(client, by="path")["path"])


def write_ids(path: os.PathLike, start: int) -> None:
    """100 ids from ``start``, plain: a file of one size whatever ``start`` (a rewrite keeps
    it), its footer another."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = pa.table({"id": np.arange(start, start + 100, dtype="int64")})
    pq.write_table(ids, path, compression=None, use_dictionary=False)


def test_s3_parquet_directory_glob_and_object_equal_pyarrow(tcp, s3, local_data):
    files = parquet_files(local_data)
    clear_ledgers(tcp)
    for url in (f"s3://{BUCKET}/pq/", f"s3://{BUCKET}/pq", f"s3://{BUCKET}/pq/*.parquet"):
        df = dg.read_parquet(url, client=tcp, storage_options=s3.options)
        assert df.npartitions >= 2
        assert_same_frame(compute(tcp, df), expected_parquet(files))
    one = dg.read_parquet(f"s3://{BUCKET}/pq/part-1.parquet", client=tcp,
                          storage_options=s3.options, split_row_groups=True)  # fmt: skip
    assert one.npartitions == 4
    assert_same_frame(compute(tcp, one), expected_parquet(files[1]))
    assert _routes(tcp) == {"host-remote"}


def test_s3_parquet_columns_and_filters(tcp, s3, local_data):
    files = parquet_files(local_data)
    filters = [("id", ">=", 140), ("id", "<", 260)]
    df = dg.read_parquet(f"s3://{BUCKET}/pq/", columns=["id", "x"], filters=filters,
                         client=tcp, storage_options=s3.options)  # fmt: skip
    assert_same_frame(compute(tcp, df), expected_parquet(files, ["id", "x"], filters))
    series = dg.read_parquet(f"s3://{BUCKET}/pq/", columns="name", client=tcp,
                             storage_options=s3.options)  # fmt: skip
    assert list(compute(tcp, series)) == list(expected_parquet(files)["name"])


def test_s3_shards_are_balanced_over_every_worker(tcp, s3):
    df = dg.read_parquet(f"s3://{BUCKET}/pq/", client=tcp, storage_options=s3.options,
                         split_row_groups=True)  # fmt: skip
    workers = {shard.worker for shard in shards_of(df).values()}
    assert workers == set(tcp.nthreads())


def test_s3_npy_and_raw_binary_equal_numpy(tcp, s3, local_data):
    expected = np.concatenate([np.load(local_data / "npy" / f"shard-{k}.npy") for k in range(2)])
    for url in (f"s3://{BUCKET}/npy/", f"s3://{BUCKET}/npy/shard-*.npy"):
        arr = dg.read_binary(url, client=tcp, storage_options=s3.options, blocksize=96)
        assert arr.numblocks[0] > 2
        np.testing.assert_array_equal(compute(tcp, arr), expected)
    raw = dg.read_binary(f"s3://{BUCKET}/raw.bin", dtype="<i4", client=tcp,
                         storage_options=s3.options, blocksize=1000)  # fmt: skip
    np.testing.assert_array_equal(compute(tcp, raw), np.arange(1000, dtype="<i4"))


def test_s3_credentials_and_endpoint_from_the_environment(tcp, s3, local_data, monkeypatch):
    """No storage_options: the client (listing) and the workers (planning, reading) take the
    keys and the endpoint from AWS_* variables, as AWS tools do."""
    env = {"AWS_ACCESS_KEY_ID": s3.key, "AWS_SECRET_ACCESS_KEY": s3.secret,
           "AWS_ENDPOINT_URL": s3.endpoint, "AWS_REGION": "us-east-1"}  # fmt: skip
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    old = tcp.run(_set_env, env)
    try:
        df = dg.read_parquet(f"s3://{BUCKET}/pq/", client=tcp)
        assert_same_frame(compute(tcp, df), expected_parquet(parquet_files(local_data)))
    finally:
        for worker, previous in old.items():
            tcp.run(_set_env, previous, workers=[worker])


def _set_env(values: dict) -> dict:
    """Set (None: unset) ``values`` in this process's environment; the values they replace."""
    old = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return old


def test_http_parquet_and_npy_equal_local(tcp, http_url, local_data):
    base, _, _ = http_url
    files = parquet_files(local_data)
    urls = [f"{base}/pq/part-{k}.parquet" for k in range(FILES)]
    clear_ledgers(tcp)
    df = dg.read_parquet(urls, client=tcp, filters=[("id", "<", 150)], columns=["id", "name"])
    assert_same_frame(compute(tcp, df), expected_parquet(files, ["id", "name"], [("id", "<", 150)]))
    arr = dg.read_binary([f"{base}/npy/shard-0.npy", f"{base}/npy/shard-1.npy"], client=tcp)
    expected = np.concatenate([np.load(local_data / "npy" / f"shard-{k}.npy") for k in range(2)])
    np.testing.assert_array_equal(compute(tcp, arr), expected)
    assert _routes(tcp) == {"host-remote"}


def test_http_server_without_head_requests(tcp, http_url, local_data):
    """A server that answers no HEAD (405; a presigned URL answers 403) is read as fsspec reads
    it: the size from a ranged GET of the first byte."""
    base, root, server = http_url
    (root / "pq" / "no-head.parquet").write_bytes(
        (local_data / "pq" / "part-2.parquet").read_bytes()
    )
    server.no_head = True
    try:
        df = dg.read_parquet(f"{base}/pq/no-head.parquet", client=tcp, columns=["id", "name"])
        arr = dg.read_binary(f"{base}/npy/shard-1.npy", client=tcp)
        got, got_array = compute(tcp, df), compute(tcp, arr)
    finally:
        server.no_head = False
    assert_same_frame(got, expected_parquet(parquet_files(local_data)[2], ["id", "name"]))
    np.testing.assert_array_equal(got_array, np.load(local_data / "npy" / "shard-1.npy"))


def test_http_names_with_spaces_and_other_letters_as_written(tcp, http_url, local_data):
    """A URL as a browser takes it, a space and a non-ASCII letter in it (urllib refused it:
    "URL can't contain control characters"); one encoded already stays as it was."""
    base, root, _ = http_url
    name = "odd names/größe 1.npy"
    (root / name).parent.mkdir()
    (root / name).write_bytes((local_data / "npy" / "shard-0.npy").read_bytes())
    expected = np.load(local_data / "npy" / "shard-0.npy")
    for url in (f"{base}/{name}", f"{base}/{urllib.parse.quote(name)}"):
        np.testing.assert_array_equal(compute(tcp, dg.read_binary(url, client=tcp)), expected)


def _message(excinfo) -> str:
    return str(excinfo.value)


def test_s3_missing_bucket_key_and_prefix(tcp, s3):
    cases = {
        "s3://no-such-bucket/pq/": "no such bucket",
        "s3://no-such-bucket/pq/*.parquet": "no such bucket",
        f"s3://{BUCKET}/missing.parquet": "no such key",
        f"s3://{BUCKET}/pq/*.csv": "no files match",
    }
    for url, cause in cases.items():
        with pytest.raises(InputError, match=cause) as excinfo:
            dg.read_parquet(url, client=tcp, storage_options=s3.options)
        assert url in _message(excinfo)
    df = dg.read_parquet(f"s3://{BUCKET}/pq/", client=tcp, storage_options=s3.options)
    assert len(compute(tcp, df)) == FILES * 100


def test_s3_denied_access_and_wrong_endpoint(tcp, s3):
    url = f"s3://{BUCKET}/pq/"
    wrong = {**s3.options, "secret": "not-the-secret-" + s3.secret[:4]}
    with pytest.raises(InputError, match="access denied") as excinfo:
        dg.read_parquet(url, client=tcp, storage_options=wrong)
    assert url in _message(excinfo)
    assert wrong["secret"] not in _message(excinfo)
    closed = {**s3.options, "endpoint_url": "http://127.0.0.1:9"}  # discard: nothing listens
    with dask.config.set({"gpudirect.remote.retries": 0}):
        with pytest.raises(InputError, match="cannot reach the endpoint http://127.0.0.1:9"):
            dg.read_binary(f"s3://{BUCKET}/npy/", client=tcp, storage_options=closed)


def test_s3_timeout_names_the_setting(tcp):
    """An S3 endpoint that takes the connection and never answers: the error said "cannot
    reach the endpoint" with the SDK's "curlCode: 28, Timeout was reached", naming neither
    ``gpudirect.remote.timeout`` nor its value, as an HTTP server's timeout does."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:  # holds each connection open, unanswered, until the listener closes
        with contextlib.suppress(OSError):
            while True:
                held.append(listener.accept()[0])

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
    options = {"key": "k", "secret": "s", "endpoint_url": endpoint, "region": "us-east-1"}
    url = f"s3://{BUCKET}/npy/a.npy"
    settings = {"gpudirect.remote.retries": 0, "gpudirect.remote.timeout": "1s"}
    start = time.monotonic()
    try:
        with dask.config.set(settings):
            with pytest.raises(InputError, match=r"gpudirect.remote.timeout \(1s\)") as excinfo:
                dg.read_binary(url, client=tcp, storage_options=options)
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
        listener.close()
        acceptor.join(timeout=10)
        for conn in held:
            conn.close()
    assert time.monotonic() - start < 30
    assert held  # the endpoint was reached: a timeout, not a refused connection
    message = _message(excinfo)
    assert url in message and f"no answer from the endpoint {endpoint}" in message
    assert "gpudirect.remote.retries (0) retries" in message


def test_http_missing_file_and_no_listing(tcp, http_url):
    base, _, _ = http_url
    with pytest.raises(InputError, match=r"not found \(HTTP 404\)") as excinfo:
        dg.read_binary(f"{base}/npy/missing.npy", client=tcp)
    assert f"{base}/npy/missing.npy" in _message(excinfo)
    with pytest.raises(InputError, match="HTTP.S. has no listing"):
        dg.read_parquet(f"{base}/pq/", client=tcp)
    with pytest.raises(InputError, match="cannot reach the server"):
        with dask.config.set({"gpudirect.remote.retries": 0}):
            dg.read_binary("http://127.0.0.1:9/x.npy", client=tcp)


def test_s3_object_changed_since_planning(tcp, s3, local_data):
    url = f"s3://{BUCKET}/changing.parquet"
    s3.put("changing.parquet", (local_data / "pq" / "part-0.parquet").read_bytes())
    df = dg.read_parquet(url, client=tcp, storage_options=s3.options)
    s3.put("changing.parquet", (local_data / "pq" / "part-1.parquet").read_bytes())
    with pytest.raises(InputError, match="changed since it was planned") as excinfo:
        compute(tcp, df)
    assert url in _message(excinfo)
    again = dg.read_parquet(url, client=tcp, storage_options=s3.options)  # planned anew: fine
    assert_same_frame(compute(tcp, again), expected_parquet(parquet_files(local_data)[1]))


def test_http_file_changed_since_planning(tcp, http_url):
    base, root, _ = http_url
    path = root / "changing.npy"
    np.save(path, np.arange(30))
    arr = dg.read_binary(f"{base}/changing.npy", client=tcp)
    np.save(path, np.arange(30) * 2)
    os.utime(path, (time.time() + 5, time.time() + 5))  # Last-Modified has 1 s resolution
    with pytest.raises(InputError, match="changed since it was planned") as excinfo:
        compute(tcp, arr)
    assert f"{base}/changing.npy" in _message(excinfo)


def test_http_file_rewritten_within_its_last_modified_second(tcp, http_url):
    """A server without ETags versions a file by its Last-Modified, to the second: a rewrite
    of the same size that keeps it is found by the footer the plan was made from."""
    base, root, _ = http_url
    path = root / "same-second.parquet"
    write = functools.partial(write_ids, path)
    write(0)
    df = dg.read_parquet(f"{base}/same-second.parquet", client=tcp)
    planned = os.stat(path)
    write(1000)
    os.utime(path, ns=(planned.st_atime_ns, planned.st_mtime_ns))
    assert os.stat(path).st_size == planned.st_size
    with pytest.raises(InputError, match=r"changed since it was planned \(bytes"):
        compute(tcp, df)


def test_credentials_never_show(tcp, s3, caplog):
    """The keys appear in no ledger record, report, error text, repr of the shards or of the
    graph, in no log of the client or the workers, nor in the metrics or the dashboard page."""
    clear_ledgers(tcp)
    df = dg.read_parquet(f"s3://{BUCKET}/pq/", client=tcp, storage_options=s3.options)
    compute(tcp, df)
    arr = dg.read_binary(f"s3://{BUCKET}/npy/", client=tcp, storage_options=s3.options)
    compute(tcp, arr)
    texts = [
        dg.report(tcp).to_string(),
        dg.report(tcp, by="shard").to_string(),
        ledger_report.records(tcp).to_string(),
        repr(shards_of(df)),
        repr(shards_of(arr)),
        repr(dict(df.__dask_graph__())),
        repr(dict(arr.__dask_graph__())),
        caplog.text,
    ]
    wrong = {**s3.options, "secret": s3.secret[::-1]}
    for bad in (wrong, {**s3.options, "bogus": s3.secret}):
        with pytest.raises(InputError) as excinfo:
            dg.read_parquet(f"s3://{BUCKET}/pq/", client=tcp, storage_options=bad)
        texts.append(_message(excinfo))
    texts += [str(logs) for logs in tcp.get_worker_logs().values()]
    pages = [tcp.dashboard_link.replace("/status", "/gpudirect")]  # the scheduler's page
    for info in workers_info(tcp).values():  # each worker's Prometheus metrics
        pages.append(f"http://127.0.0.1:{info['services']['dashboard']}/metrics")
    for page in pages:
        with urllib.request.urlopen(page, timeout=30) as response:
            texts.append(response.read().decode())
    assert any("host-remote" in text for text in texts[-2:])
    for text in texts:
        assert s3.secret not in text and s3.secret[::-1] not in text
    assert "host-remote" in texts[0]


def _set_environment(values: dict[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def test_s3_profiles_of_either_file_and_one_without_keys(tcp, s3, local_data, tmp_path):
    """A ``[profile NAME]`` of the config file is read as the AWS tools read it (it was "no
    profile"), and a profile without keys (a role to assume) is refused: taken as no keys, the
    reads went on with whatever other credentials the environment held."""
    (tmp_path / "credentials").write_text(
        "[assume]\nrole_arn = arn:aws:iam::123456789012:role/reader\nsource_profile = base\n"
    )
    (tmp_path / "config").write_text(
        f"[profile cfgonly]\naws_access_key_id = {s3.key}\naws_secret_access_key = {s3.secret}\n"
    )
    files = {"AWS_SHARED_CREDENTIALS_FILE": os.fspath(tmp_path / "credentials"),
             "AWS_CONFIG_FILE": os.fspath(tmp_path / "config")}  # fmt: skip
    where = {"endpoint_url": s3.endpoint, "region": "us-east-1"}
    url = f"s3://{BUCKET}/pq/part-0.parquet"
    _set_environment(files)
    tcp.run(_set_environment, files)
    try:
        got = dg.read_parquet(url, client=tcp, storage_options={**where, "profile": "cfgonly"})
        assert_same_frame(compute(tcp, got), expected_parquet(parquet_files(local_data)[0]))
        with pytest.raises(InputError, match="profile 'assume' .* holds no aws_access_key_id"):
            dg.read_parquet(url, client=tcp, storage_options={**where, "profile": "assume"})
    finally:
        _set_environment(dict.fromkeys(files))
        tcp.run(_set_environment, dict.fromkeys(files))


def test_s3_anon_options(tcp, s3):
    """``anon`` is True or False (the string "false" read as True); with keys beside it the
    store is anonymous, as s3fs makes it (pyarrow's ValueError came through as it was)."""
    url = f"s3://{BUCKET}/pq/"
    with pytest.raises(InputError, match="anon must be True or False, not 'false'"):
        dg.read_parquet(url, client=tcp, storage_options={**s3.options, "anon": "false"})
    # unsigned requests: moto, checking signatures, fails them (HTTP 500)
    with dask.config.set({"gpudirect.remote.retries": 0}), pytest.raises(InputError, match=url):
        dg.read_parquet(url, client=tcp, storage_options={**s3.options, "anon": True})


def test_s3_key_pyarrow_cannot_name(tcp, s3):
    """An empty segment (``a//b``, legal in S3) is an InputError naming the URL (pyarrow's
    ArrowInvalid came through as it was)."""
    url = f"s3://{BUCKET}//pq/part-0.parquet"
    with pytest.raises(InputError, match=f"{url}: cannot read: .*Empty path component"):
        dg.read_parquet(url, client=tcp, storage_options=s3.options)


def test_s3_prefix_with_a_slash_that_is_an_object_too(tcp, s3, local_data):
    """``s3://b/p/`` is the prefix ``p/`` where an object ``p`` stands beside it (S3 holds
    both), and the object where it alone is (as a local ``file/``): either was taken as the
    object named ``p/``, which failed the read with pyarrow's "Not a regular file"."""
    s3.put("dual", b"an object beside its prefix")
    s3.put("dual/part-0.parquet", (local_data / "pq" / "part-0.parquet").read_bytes())
    got = dg.read_parquet(f"s3://{BUCKET}/dual/", client=tcp, storage_options=s3.options)
    assert_same_frame(compute(tcp, got), expected_parquet(parquet_files(local_data)[0]))
    raw = dg.read_binary(f"s3://{BUCKET}/raw.bin/", dtype="<i4", client=tcp,
                         storage_options=s3.options)  # fmt: skip
    np.testing.assert_array_equal(compute(tcp, raw), np.arange(1000, dtype="<i4"))


def test_credentials_are_masked_where_they_stand_as_words():
    store = remote.Store(key="k", secret="test")
    said = "listing keys under k in 'test-bucket': Credential=k/2026 secret test"
    assert (
        store.scrub(said)
        == "listing keys under *** in 'test-bucket': Credential=***/2026 secret ***"
    )


def test_other_schemes_and_credentials_in_urls_are_refused(tcp):
    with pytest.raises(InputError, match="gs:// paths are not supported"):
        dg.read_parquet("gs://bucket/data.parquet")
    with pytest.raises(InputError, match="credentials in a URL"):
        dg.read_parquet("https://user:pw@example.com/data.parquet")
    with pytest.raises(InputError, match="bogus not taken"):
        remote.Store.from_options({"bogus": 1})
    given = {"key": "K", "secret": "S3CR3T", "client_kwargs": {"endpoint_url": "http://h:1"}}
    store = remote.Store.from_options(given)
    assert store.endpoint() == "http://h:1" and "S3CR3T" not in repr(store)


def test_s3_hive_folders_as_locally(tcp, s3, local_data, tmp_path):
    for k, year in enumerate((2024, 2025)):
        (tmp_path / f"year={year}").mkdir()
        (tmp_path / f"year={year}" / f"part-{k}.parquet").write_bytes(
            (local_data / "pq" / f"part-{k}.parquet").read_bytes()
        )
    got = dg.read_parquet(f"s3://{BUCKET}/hive/", client=tcp, storage_options=s3.options,
                          filters=[("year", "==", 2025)])  # fmt: skip
    local = dg.read_parquet(str(tmp_path), client=tcp, filters=[("year", "==", 2025)])
    assert_same_frame(compute(tcp, got), compute(tcp, local))
    assert list(compute(tcp, got)["year"].unique()) == [2025]


def test_s3_names_and_patterns_as_locally(tcp, s3, local_data, tmp_path):
    """The same tree in S3 and on disk reads alike: ``**`` any depth of folders (none too, no
    hidden one), a key with brackets named as written is that object (not ``part1``), and hive
    values with ``#`` or ``?`` are letters of a key, not a URL's fragment or query."""
    names = ["deep/top.parquet", "deep/a/d.parquet", "deep/a/b/c.parquet", "deep/.h/x.parquet",
             "br/part[1].parquet", "br/part1.parquet",
             "hv/lang=c#/p.parquet", "hv/lang=why?/p.parquet", "hv/lang=cpp/p.parquet"]  # fmt: skip
    for k, name in enumerate(names):
        body = (local_data / "pq" / f"part-{k % FILES}.parquet").read_bytes()
        s3.put(f"names/{name}", body)
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(body)
    entries = ["deep/**/*.parquet", "deep/**", "deep/a/**/c.parquet", "br/part[1].parquet", "hv/"]
    for entry in entries:
        got = compute(tcp, dg.read_parquet(f"s3://{BUCKET}/names/{entry}", client=tcp,
                                           storage_options=s3.options))  # fmt: skip
        local = compute(tcp, dg.read_parquet(str(tmp_path / entry), client=tcp))
        assert_same_frame(got, local)
    assert len(got) == 3 * 100 and set(got["lang"]) == {"c#", "why?", "cpp"}


def test_http_hive_folders_of_encoded_values_as_locally(tcp, http_url, local_data):
    """A folder ``region=a%2Fb`` (Hive's encoding of ``a/b``) is ``region=a%252Fb`` in its URL:
    the URL's encoding comes off first, then Hive's, as a local read decodes the folder."""
    base, root, _ = http_url
    names = [f"hive-enc/region={r}/part-{k}.parquet" for k, r in enumerate(("eu", "a%2Fb"))]
    for k, name in enumerate(names):
        (root / name).parent.mkdir(parents=True)
        (root / name).write_bytes((local_data / "pq" / f"part-{k}.parquet").read_bytes())
    urls = [f"{base}/{urllib.parse.quote(name)}" for name in names]
    kept = [("region", "==", "a/b")]
    got = compute(tcp, dg.read_parquet(urls, client=tcp, filters=kept))
    local = compute(tcp, dg.read_parquet([str(root / n) for n in names], client=tcp, filters=kept))
    assert_same_frame(got, local)
    assert list(got["region"].unique()) == ["a/b"] and len(got) > 0


def test_http_retries_a_server_error(tcp, http_url, local_data):
    base, _, server = http_url
    server.fail_next = 2
    arr = dg.read_binary(f"{base}/npy/shard-1.npy", client=tcp)
    np.testing.assert_array_equal(compute(tcp, arr), np.load(local_data / "npy" / "shard-1.npy"))
    assert server.fail_next == 0


def test_http_server_error_at_compute_reaches_the_client_as_an_input_error(tcp, http_url):
    """urllib's HTTPError holds its socket: an error raised while handling it could not be
    pickled to the client, which got a bare ``Exception`` with the text in it."""
    base, _, server = http_url
    url = f"{base}/npy/shard-1.npy"
    arr = dg.read_binary(url, client=tcp)
    server.fail_next = 100
    try:
        with worker_config(tcp, {"gpudirect.remote.retries": 1}):
            throttled = r"the server kept throttling or failing \(HTTP 503\) through gpudirect"
            with pytest.raises(InputError, match=throttled) as excinfo:
                compute(tcp, arr)
    finally:
        server.fail_next = 0
    assert url in _message(excinfo)


def test_http_retries_wait_as_long_as_the_servers_retry_after_asks(tcp, http_url):
    """A server that answers 503 with ``Retry-After: 1`` for a second: the retries, 10 ms
    apart, all came within it and the read failed; they now wait what it asks."""
    base, _, server = http_url
    arr = dg.read_binary(f"{base}/raw.bin", dtype="<i4", client=tcp)  # planned before the pause
    server.busy_for = 1.0
    try:
        settings = {"gpudirect.remote.retries": 2, "gpudirect.remote.backoff": "10ms"}
        with worker_config(tcp, settings):
            got = compute(tcp, arr)
    finally:
        server.busy_for, server.busy_until = 0.0, None
    np.testing.assert_array_equal(got, np.arange(1000, dtype="<i4"))


def test_http_connection_cut_mid_read_is_resumed_then_an_error(tcp, http_url):
    base, _, server = http_url
    url = f"{base}/raw.bin"
    arr = dg.read_binary(url, dtype="<i4", client=tcp)
    server.cut_next = 1  # the rest asked for again from where the body stopped
    np.testing.assert_array_equal(compute(tcp, arr), np.arange(1000, dtype="<i4"))
    assert server.cut_next == 0
    server.cut_next = 2  # cut at 2000, then the rest cut at 3000: past one retry
    with worker_config(tcp, {"gpudirect.remote.retries": 1}):
        with pytest.raises(InputError, match="the connection was cut after 3000 of 4000 bytes"):
            compute(tcp, arr)
    np.testing.assert_array_equal(compute(tcp, arr), np.arange(1000, dtype="<i4"))  # usable


def test_http_server_that_caps_its_ranges_is_read_whole(tcp, http_url):
    """A server may answer a range with fewer bytes than asked, whole (its Content-Range says
    which): the rest is asked for next, not counted as a cut connection (with no retry left,
    the read failed)."""
    base, _, server = http_url
    arr = dg.read_binary(f"{base}/raw.bin", dtype="<i4", client=tcp)
    server.cap = 700
    try:
        with worker_config(tcp, {"gpudirect.remote.retries": 0}):
            np.testing.assert_array_equal(compute(tcp, arr), np.arange(1000, dtype="<i4"))
    finally:
        server.cap = 0


def test_http_reply_of_other_bytes_than_asked_is_an_error(tcp, http_url):
    """A 206 that starts before the byte asked for (as its Content-Range says) was read as
    if it held the bytes asked for: wrong values and no error."""
    base, _, server = http_url
    url = f"{base}/raw.bin"
    arr = dg.read_binary(url, dtype="<i4", blocksize="1000B", client=tcp)
    assert arr.numblocks[0] > 1  # shards at 1000, 2000...: not multiples of 64
    server.align = 64
    try:
        with pytest.raises(
            InputError, match=r"answered 'bytes \d+-\d+/4000' to a request for bytes=\d+-"
        ):
            compute(tcp, arr)
    finally:
        server.align = 0
    whole = dg.read_binary(url, dtype="<i4", client=tcp)  # not the shards still being read
    np.testing.assert_array_equal(compute(tcp, whole), np.arange(1000, dtype="<i4"))


def test_http_head_of_another_size_than_the_ranges_is_an_error(tcp, http_url):
    """A HEAD whose Content-Length is not the size every ranged GET's Content-Range gives (a
    proxy or framework that answers HEAD itself): the read was planned from the HEAD's size,
    and a raw file came back cut to it, its last records dropped without an error."""
    base, _, server = http_url
    url = f"{base}/raw.bin"
    server.head_length = 2000  # of 4000 bytes
    try:
        with pytest.raises(InputError, match=r"2000 bytes by the HEAD request, 4000 by") as excinfo:
            compute(tcp, dg.read_binary(url, dtype="<i4", client=tcp))
    finally:
        server.head_length = None
    assert url in _message(excinfo)
    np.testing.assert_array_equal(
        compute(tcp, dg.read_binary(url, dtype="<i4", client=tcp)), np.arange(1000, dtype="<i4")
    )


def test_http_object_served_encoded_is_an_error(tcp, http_url):
    """An object served with a Content-Encoding (stored gzip-compressed, as S3 serves one
    uploaded with that header): its ranges are of the compressed bytes, which were read as
    the file's, wrong values and no error."""
    base, root, server = http_url
    (root / "encoded.bin").write_bytes(gzip.compress(np.arange(1000, dtype="<i4").tobytes()))
    server.encoding = "gzip"
    try:
        with pytest.raises(InputError, match=r"encoded \(Content-Encoding: gzip\)") as excinfo:
            compute(tcp, dg.read_binary(f"{base}/encoded.bin", dtype="u1", client=tcp))
    finally:
        server.encoding = None
    assert f"{base}/encoded.bin" in _message(excinfo)


@pytest.mark.parametrize(
    "encoding", ["aws-chunked", "identity, aws-chunked", "AWS-Chunked", "none", "None", "IDENTITY"]
)
def test_http_object_served_with_no_coding_is_read(tcp, http_url, encoding):
    """Content-Encodings that name no coding of the object's bytes, which were refused as
    encoded: ``aws-chunked`` framed a chunk-signed upload (the AWS SDKs' default since their
    trailing checksums), and stores that keep it (NooBaa, versitygw, Ceph and LocalStack before
    their fixes; S3 drops it) serve the object's own bytes; ``none`` is some servers'
    ``identity``. With a real coding beside it, still refused."""
    base, _, server = http_url
    server.encoding = encoding
    try:
        got = compute(tcp, dg.read_binary(f"{base}/raw.bin", dtype="<i4", client=tcp))
        server.encoding = f"{encoding}, gzip"
        with pytest.raises(InputError, match=r"encoded \(Content-Encoding: "):
            compute(tcp, dg.read_binary(f"{base}/raw.bin", dtype="<i4", client=tcp))
    finally:
        server.encoding = None
    np.testing.assert_array_equal(got, np.arange(1000, dtype="<i4"))


def test_s3_object_stored_encoded_is_an_error(tcp, s3, local_data):
    """An object uploaded with ``ContentEncoding="gzip"``: S3 serves its stored, compressed
    bytes, which were read as the file's (wrong values and no error; a Parquet file's or an
    .npy header's error blamed the file), as over HTTP."""
    raw = gzip.compress(np.arange(1000, dtype="<i4").tobytes())
    body = gzip.compress((local_data / "pq" / "part-0.parquet").read_bytes())
    s3.client.put_object(Bucket=BUCKET, Key="encoded/raw.bin", Body=raw, ContentEncoding="gzip")
    s3.client.put_object(Bucket=BUCKET, Key="encoded/part-0.parquet", Body=body,
                         ContentEncoding="gzip")  # fmt: skip
    raw_url, parquet_url = f"s3://{BUCKET}/encoded/raw.bin", f"s3://{BUCKET}/encoded/part-0.parquet"
    reads = {raw_url: functools.partial(dg.read_binary, dtype="u1"), parquet_url: dg.read_parquet}
    for url, read in reads.items():
        with pytest.raises(InputError, match=r"encoded \(Content-Encoding: gzip\)") as excinfo:
            compute(tcp, read(url, client=tcp, storage_options=s3.options))
        assert url in _message(excinfo)


def test_http_url_of_an_ipv6_host(tcp, tmp_path):
    """An IPv6 literal's brackets in a URL's host are no glob (the read was refused as one);
    a pattern in its path still is."""
    np.save(tmp_path / "a.npy", np.arange(10.0))
    try:
        server = _V6Server(("::1", 0), functools.partial(RangeHandler, directory=str(tmp_path)))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://[::1]:{server.server_address[1]}"
    try:
        np.testing.assert_array_equal(
            compute(tcp, dg.read_binary(f"{base}/a.npy", client=tcp)), np.arange(10.0)
        )
        with pytest.raises(InputError, match="HTTP.S. has no listing"):
            dg.read_binary(f"{base}/*.npy", client=tcp)
    finally:
        server.shutdown()
        server.server_close()


class _V6Server(LoopbackServer):
    address_family = socket.AF_INET6


def test_s3_throttling_is_retried_then_an_error_naming_the_url(tcp, s3_proxy, local_data):
    """503 SlowDown, as S3 throttles: retried with the SDK's backoff and read whole; where it
    never ends, an InputError naming the object, and the cluster still reads."""
    proxy, options = s3_proxy
    url = f"s3://{BUCKET}/npy/shard-1.npy"
    expected = np.load(local_data / "npy" / "shard-1.npy")
    arr = dg.read_binary(url, client=tcp, storage_options=options)
    proxy.throttle_next = 2
    np.testing.assert_array_equal(compute(tcp, arr), expected)
    assert proxy.throttle_next == 0
    with worker_config(tcp, {"gpudirect.remote.retries": 1}):
        try:
            proxy.throttle_next = 1000
            with pytest.raises(InputError) as excinfo:
                compute(tcp, arr)
        finally:
            proxy.throttle_next = 0
    assert excinfo.value.path == url, str(excinfo.value)
    assert "kept throttling or failing (HTTP 5xx)" in str(excinfo.value)
    np.testing.assert_array_equal(compute(tcp, arr), expected)


def test_s3_connection_cut_mid_read(tcp, s3_proxy, local_data):
    """A ranged GET whose connection drops halfway: retried, or an InputError naming the
    object; never a partial or wrong array."""
    proxy, options = s3_proxy
    url = f"s3://{BUCKET}/raw.bin"
    arr = dg.read_binary(url, dtype="<i4", client=tcp, storage_options=options)
    proxy.cut_next = 1000
    try:
        with pytest.raises(InputError) as excinfo:
            compute(tcp, arr)
    finally:
        proxy.cut_next = 0
    assert excinfo.value.path == url, str(excinfo.value)
    np.testing.assert_array_equal(compute(tcp, arr), np.arange(1000, dtype="<i4"))
    proxy.cut_next = 1  # once: the SDK tries again and the read is whole
    np.testing.assert_array_equal(compute(tcp, arr), np.arange(1000, dtype="<i4"))


def test_remote_settings_from_environment_variables():
    """``DASK_GPUDIRECT__REMOTE__RANGE_SIZE=1000``, as a deployment sets the workers' config:
    Dask stores that key as ``range_size``, which the settings must find as ``range-size``."""
    import subprocess
    import sys

    code = "from dask_gpudirect import remote; print(remote.Settings.current().range_size)"
    env = {**os.environ, "DASK_GPUDIRECT__REMOTE__RANGE_SIZE": "1000"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1000"


@pytest.mark.parametrize(
    ("key", "value", "wanted"),
    [
        ("connections", 0, "a whole number of at least 1"),
        ("connections", "abc", "a whole number of at least 1"),
        ("range-size", "abc", "a positive size"),
        ("range-size", -5, "a positive size"),
        ("retries", -1, "a whole number of at least 0"),  # retried forever: a hang
        ("retries", 1.5, "a whole number of at least 0"),
        ("backoff", "x", "a duration of at least 0"),
        ("backoff", -1, "a duration of at least 0"),
        ("timeout", -1, "a positive duration"),  # Dask's parser: "could not convert '1-1'"
        ("timeout", "abc", "a positive duration"),
    ],
)
def test_a_bad_remote_setting_is_named(tcp, http_url, key, value, wanted):
    """A ``gpudirect.remote.*`` value that cannot be used is a ConfigError naming the key,
    the value and what it takes, in the caller's process (the client's config) or from the
    worker that reads it (a worker's own): not int()'s or Dask's parser's error, a read that
    retries forever, or a read of no bytes reported as a truncated file."""
    base, _, _ = http_url
    url = f"{base}/raw.bin"
    pattern = rf"gpudirect.remote.{key}=.*: use {wanted}"
    with dask.config.set({f"gpudirect.remote.{key}": value}):
        with pytest.raises(dg.ConfigError, match=pattern):
            dg.read_binary(url, dtype="<i4", client=tcp)
    arr = dg.read_binary(url, dtype="<i4", client=tcp)
    with worker_config(tcp, {f"gpudirect.remote.{key}": value}):
        with pytest.raises(dg.ConfigError, match=pattern):
            compute(tcp, arr)
    np.testing.assert_array_equal(compute(tcp, arr), np.arange(1000, dtype="<i4"))  # usable


def test_http_head_whose_length_is_not_a_number_is_sized_by_a_get(tcp, http_url):
    """A HEAD with a Content-Length that is not a whole number (a latin-1 "\xb2" passed
    ``str.isdigit``; "abc" went to ``int``): the read failed with Python's ValueError text;
    the size now comes from a GET of the first byte, as where a HEAD gives none."""
    base, _, server = http_url
    url = f"{base}/raw.bin"
    for length in ("abc", "\xb2"):
        server.head_length = length
        try:
            got = compute(tcp, dg.read_binary(url, dtype="<i4", client=tcp))
        finally:
            server.head_length = None
        np.testing.assert_array_equal(got, np.arange(1000, dtype="<i4"))


def test_http_weak_etag_to_head_and_strong_to_get_is_the_same_version(tcp, http_url):
    """nginx (and CDNs) give a weak ETag where they may compress, a HEAD's ``W/"abc"`` beside
    the GET's ``"abc"``: the read failed as changed since it was planned. Tags are compared as
    RFC 9110's weak comparison does (the opaque tags); another tag is still a change."""
    base, _, server = http_url
    url = f"{base}/raw.bin"
    server.etags = ('W/"abc"', '"abc"')
    try:
        arr = dg.read_binary(url, dtype="<i4", client=tcp)
        np.testing.assert_array_equal(compute(tcp, arr), np.arange(1000, dtype="<i4"))
        server.etags = ('W/"abc"', '"abd"')
        with pytest.raises(InputError, match=r"changed since it was planned") as excinfo:
            compute(tcp, arr)
    finally:
        server.etags = None
    assert url in _message(excinfo)


def test_http_retries_wait_until_the_date_retry_after_names(tcp, http_url):
    """A Retry-After that is an HTTP-date, not seconds, was taken as no wait: the retries, 10
    ms apart, all came within the pause and the read failed; they now wait until that date."""
    base, _, server = http_url
    arr = dg.read_binary(f"{base}/raw.bin", dtype="<i4", client=tcp)  # planned before the pause
    server.busy_for, server.retry_date = 1.0, True
    try:
        settings = {"gpudirect.remote.retries": 2, "gpudirect.remote.backoff": "10ms"}
        with worker_config(tcp, settings):
            got = compute(tcp, arr)
    finally:
        server.busy_for, server.busy_until, server.retry_date = 0.0, None, False
    np.testing.assert_array_equal(got, np.arange(1000, dtype="<i4"))


def test_http_retry_after_as_seconds_or_a_date():
    """The seconds a Retry-After asks for, as a number or as an HTTP-date (which read as no wait); a
    date past, or one that cannot be read, asks for no wait. (_retried waits that long, up to
    ``gpudirect.remote.timeout``, whichever form it came in.)"""
    import email.message
    import email.utils

    def asked(value: str) -> float:
        headers = email.message.Message()
        headers["Retry-After"] = value
        return remote._retry_after(headers)

    in_an_hour = email.utils.formatdate(time.time() + 3600, usegmt=True)
    assert 3590 < asked(in_an_hour) <= 3600
    assert 3590 < asked(in_an_hour.replace("GMT", "-0000")) <= 3600  # UTC, not local time
    assert asked(email.utils.formatdate(time.time() - 3600, usegmt=True)) == 0
    assert asked("soon") == asked("") == 0
    assert asked("7") == 7


def test_http_retry_after_date_is_waited_for_at_most_the_timeout(tcp, http_url):
    """A Retry-After date an hour away is waited for ``gpudirect.remote.timeout``, as a number
    of seconds is: the retry then fails as throttled, not an hour later."""
    base, _, server = http_url
    url = f"{base}/raw.bin"
    arr = dg.read_binary(url, dtype="<i4", client=tcp)
    server.busy_for, server.retry_date = 3600.0, True
    settings = {"gpudirect.remote.retries": 1, "gpudirect.remote.timeout": "300ms"}
    start = time.monotonic()
    try:
        with worker_config(tcp, settings):
            with pytest.raises(InputError, match=r"kept throttling or failing \(HTTP 503\)"):
                compute(tcp, arr)
    finally:
        server.busy_for, server.busy_until, server.retry_date = 0.0, None, False
    assert 0.3 <= time.monotonic() - start < 10


@pytest.mark.parametrize("stall", ["stall", "stall_body"])
def test_http_timeout_names_the_setting(tcp, http_url, stall):
    """A server that does not answer within ``gpudirect.remote.timeout``, before a reply's
    headers or in its body: the error named neither the timeout nor its setting ("cannot
    read: timed out", "the connection was cut")."""
    base, _, server = http_url
    url = f"{base}/raw.bin"
    arr = dg.read_binary(url, dtype="<i4", client=tcp)
    setattr(server, stall, 1.0)
    settings = {"gpudirect.remote.retries": 0, "gpudirect.remote.timeout": "200ms"}
    try:
        with worker_config(tcp, settings):
            with pytest.raises(InputError, match=r"gpudirect.remote.timeout \(0.2s\)") as excinfo:
                compute(tcp, arr)
    finally:
        setattr(server, stall, 0.0)
    assert url in _message(excinfo)
    np.testing.assert_array_equal(compute(tcp, arr), np.arange(1000, dtype="<i4"))  # usable


def test_http_content_range_written_with_equals_is_read(tcp, http_url):
    """A Content-Range written ``bytes=0-9/100`` (RFC 9110 has a space): its start and size
    are where the standard form has them, so it is read as that form; its start and size are
    still checked."""
    base, _, server = http_url
    url = f"{base}/raw.bin"
    server.range_equals = True  # shards at 800, 1600...; then 1200, 2400: not multiples of 64
    try:
        arr = dg.read_binary(url, dtype="<i4", blocksize="800B", client=tcp)
        np.testing.assert_array_equal(compute(tcp, arr), np.arange(1000, dtype="<i4"))
        server.align = 64
        with pytest.raises(InputError, match=r"answered 'bytes=\d+-\d+/4000' to a request for"):
            compute(tcp, dg.read_binary(url, dtype="<i4", blocksize="1200B", client=tcp))
    finally:
        server.range_equals, server.align = False, 0


def test_http_weak_etag_when_planned_has_the_footer_checked_though_strong_now(tcp, http_url):
    """A weak ETag at planning (Apache's ``W/"..."`` for a file modified within the second)
    may be kept for other bytes: a rewrite of the same size within that second, then served
    with the strong ETag of the same opaque tag (the second past), is one version by the weak
    comparison, and was read as the plan's, its footer not checked since the version now is
    strong. Either side weak has the footer the plan was made from checked."""
    base, root, server = http_url
    path = root / "weak-then.parquet"
    write = functools.partial(write_ids, path)
    write(0)
    server.etags = ('W/"abc"', 'W/"abc"')
    try:
        df = dg.read_parquet(f"{base}/weak-then.parquet", client=tcp)
        write(1000)
        server.etags = ('"abc"', '"abc"')
        with pytest.raises(InputError, match=r"changed since it was planned \(bytes"):
            compute(tcp, df)
    finally:
        server.etags = None
