"""Object storage on loopback for the remote-read tests (issue 16), CPU and GPU alike: moto's
S3 server (its requests signed and checked against an IAM user's keys) and an HTTP server that
serves byte ranges, both holding the same local files. Fixtures: ``local_data``, ``s3``,
``http_url`` (made available to every test by conftest.py; moto is imported only by ``s3``,
which skips where it is missing)."""

from __future__ import annotations

import email.utils
import http.client
import http.server
import io
import json
import math
import threading
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dask_gpudirect.bench.range_server import LoopbackServer, RangeHandler, base_url, serving

BUCKET = "gpudirect-data"
FILES = 3  # Parquet files, 100 rows each in 4 row groups


def _frame(k: int) -> pd.DataFrame:
    rng = np.random.default_rng(k)
    return pd.DataFrame(
        {
            "id": np.arange(k * 100, (k + 1) * 100),
            "x": rng.normal(size=100),
            "name": [f"n{i % 7}" for i in range(100)],
        }
    )


@pytest.fixture(scope="session")
def local_data(tmp_path_factory):
    """Local copies of what the servers hold: Parquet files, .npy files, a raw file."""
    root = tmp_path_factory.mktemp("remote-data")
    (root / "pq").mkdir()
    for k in range(FILES):
        pq.write_table(pa.Table.from_pandas(_frame(k)), root / "pq" / f"part-{k}.parquet",
                       row_group_size=25)  # fmt: skip
    (root / "pq" / "_SUCCESS").write_bytes(b"")
    (root / "npy").mkdir()
    for k in range(2):
        np.save(root / "npy" / f"shard-{k}.npy", np.arange(k * 60, (k + 1) * 60).reshape(20, 3))
    (root / "raw.bin").write_bytes(np.arange(1000, dtype="<i4").tobytes())
    return root


class _S3:
    """The S3 server: its endpoint, an IAM user's keys, and the storage_options with both."""

    def __init__(self, endpoint: str, key: str, secret: str):
        self.endpoint, self.key, self.secret = endpoint, key, secret
        import boto3

        self.options = {"key": key, "secret": secret, "endpoint_url": endpoint,
                        "region": "us-east-1"}  # fmt: skip
        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            region_name="us-east-1",
        )

    def put(self, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=BUCKET, Key=key, Body=body)


@pytest.fixture(scope="session")
def s3(local_data):
    """moto's S3 server on a free loopback port, holding ``local_data`` under ``BUCKET``;
    after setup every request must be signed with the IAM user's keys (wrong ones: 403)."""
    moto_server = pytest.importorskip("moto.server")
    import boto3
    import moto.settings
    from moto.core.authorization import ActionAuthenticatorMixin

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    setup = {"endpoint_url": endpoint, "region_name": "us-east-1",
             "aws_access_key_id": "setup", "aws_secret_access_key": "setup"}  # fmt: skip
    iam = boto3.client("iam", **setup)
    iam.create_user(UserName="reader")
    policy = {"Version": "2012-10-17",
              "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}  # fmt: skip
    iam.put_user_policy(UserName="reader", PolicyName="s3", PolicyDocument=json.dumps(policy))
    keys = iam.create_access_key(UserName="reader")["AccessKey"]
    boto3.client("s3", **setup).create_bucket(Bucket=BUCKET)
    old = moto.settings.INITIAL_NO_AUTH_ACTION_COUNT
    moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # from now on, requests are authenticated
    ActionAuthenticatorMixin.request_count = 0
    store = _S3(endpoint, keys["AccessKeyId"], keys["SecretAccessKey"])
    for path in sorted(local_data.rglob("*")):
        if path.is_file():
            store.put(str(path.relative_to(local_data)), path.read_bytes())
    store.put("pq/.hidden.parquet", b"not parquet")
    for k, year in enumerate((2024, 2025)):
        store.put(
            f"hive/year={year}/part-{k}.parquet",
            (local_data / "pq" / f"part-{k}.parquet").read_bytes(),
        )
    yield store
    moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = old
    server.stop()


class _FaultyRangeHandler(RangeHandler):
    """The benchmark's ranged server, able to fail: 503s, connections cut mid-body, HEAD
    requests refused (405) or answered with another Content-Length than the file's, ranges
    served otherwise than asked, as the reply's
    Content-Range says: at most ``cap`` bytes, or from the multiple of ``align`` below, and
    files served as stored with a ``Content-Encoding`` (as S3 serves an object uploaded
    gzip-compressed with that header, whatever the request's Accept-Encoding); ETags, one
    to HEAD and one to GET (a weak one and its strong one, as nginx gives where it compresses);
    a Content-Range written ``bytes=a-b/n``; Retry-After as a date; ranges answered late."""

    def end_headers(self):
        if self.server.encoding:
            self.send_header("Content-Encoding", self.server.encoding)
        if self.server.etags:
            self.send_header("ETag", self.server.etags[self.command != "HEAD"])
        super().end_headers()

    def send_header(self, keyword, value):
        if keyword == "Content-Length" and self.command == "HEAD" and self.server.head_length:
            value = str(self.server.head_length)  # a HEAD answered otherwise than the GET
        if keyword == "Content-Range" and self.server.range_equals:
            value = value.replace("bytes ", "bytes=", 1)
        super().send_header(keyword, value)

    def do_HEAD(self):
        if self.server.no_head:
            self.send_error(405)
            return
        super().do_HEAD()

    def send_head(self):
        if self.server.busy_for:  # a server that asks for a pause: 503s with Retry-After
            now = time.monotonic()
            until = self.server.busy_until = self.server.busy_until or now + self.server.busy_for
            if now < until:
                self.send_response(503)
                wait = math.ceil(until - now)
                if self.server.retry_date:  # an HTTP-date, to the second: not before until
                    wait = email.utils.formatdate(math.ceil(time.time() + until - now), usegmt=True)
                self.send_header("Retry-After", str(wait))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
        if self.server.fail_next > 0:  # a server that is briefly unwell: 503, then fine
            self.server.fail_next -= 1
            self.send_error(503)
            return None
        spec = self.headers.get("Range")
        if spec and (self.server.cap or self.server.align):
            start, end = (int(n) for n in spec.removeprefix("bytes=").split("-"))
            start -= start % (self.server.align or 1)
            end = min(end, start + self.server.cap - 1) if self.server.cap else end
            self.headers.replace_header("Range", f"bytes={start}-{end}")
        return super().send_head()

    def send_range(self, body, start, info):
        gate = self.server.gate
        if gate is not None:  # a slow server: ranged requests wait until the test opens it
            gate.arrived.release()
            gate.opened.wait()
        time.sleep(self.server.stall)  # a server slow to answer a range
        if self.server.cut_next > 0:  # the connection drops after half the body
            self.server.cut_next -= 1
            self.send_response(206)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Last-Modified", email.utils.formatdate(info.st_mtime, usegmt=True))
            self.end_headers()
            self.close_connection = True
            return io.BytesIO(body[: len(body) // 2])
        sent = super().send_range(body, start, info)
        time.sleep(self.server.stall_body)  # a body slow to come: its headers sent
        return sent


class Gate:
    """Holds the HTTP server's range requests: ``arrived`` counts those held, each waits
    until ``opened`` is set."""

    def __init__(self) -> None:
        self.arrived = threading.Semaphore(0)
        self.opened = threading.Event()


@pytest.fixture(scope="session")
def http_url(tmp_path_factory, local_data):
    """An HTTP server with Range support on a free loopback port, serving a copy of
    ``local_data`` (tests may change its files): its base URL, root and server."""
    root = tmp_path_factory.mktemp("http-root")
    for path in local_data.rglob("*"):
        if path.is_file():
            (root / path.relative_to(local_data)).parent.mkdir(parents=True, exist_ok=True)
            (root / path.relative_to(local_data)).write_bytes(path.read_bytes())
    with serving(str(root), _FaultyRangeHandler) as server:
        server.fail_next = 0  # requests to answer 503 before serving again
        server.cut_next = 0  # range requests whose connection drops mid-body
        server.gate = None  # a Gate that holds every range request
        server.no_head = False  # whether HEAD requests are refused
        server.cap = server.align = 0  # bytes a range reply holds at most; where ranges start
        server.encoding = None  # the Content-Encoding every reply names
        server.head_length = None  # the Content-Length HEAD replies give, where not the file's
        server.busy_for = 0.0  # seconds from the next request that it answers 503, Retry-After
        server.busy_until = None  # when that ends (set by the first such request)
        server.retry_date = False  # whether that Retry-After is an HTTP-date, not seconds
        server.etags = None  # the ETags of HEAD and of GET replies
        server.range_equals = False  # whether a Content-Range is written bytes=a-b/n
        server.stall = 0.0  # seconds before a range request is answered
        server.stall_body = 0.0  # seconds from the headers of a range reply to its body
        yield base_url(server), root, server


def parquet_files(local_data) -> list[str]:
    return [str(local_data / "pq" / f"part-{k}.parquet") for k in range(FILES)]


class _S3ProxyHandler(http.server.BaseHTTPRequestHandler):
    """Forwards every request to moto unchanged (the Host header too, so that signatures
    still match), unless told to throttle (503 SlowDown, as S3 says it) or to cut a ranged
    GET's body in half and drop the connection."""

    protocol_version = "HTTP/1.1"

    def _forward(self) -> None:
        if self.server.throttle_next > 0:
            self.server.throttle_next -= 1
            body = b"<Error><Code>SlowDown</Code><Message>Slow down.</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":  # a HEAD's body would be read as the next response
                self.wfile.write(body)
            return
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length) if length else None
        upstream = http.client.HTTPConnection(*self.server.moto, timeout=60)
        upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for name, value in self.headers.items():
            upstream.putheader(name, value)
        upstream.endheaders(data)
        response = upstream.getresponse()
        body = response.read()
        upstream.close()
        cut = self.command == "GET" and "Range" in self.headers and self.server.cut_next > 0
        self.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(name, value)
        # a HEAD's length is the object's, as the server said; a body's is its own
        length = response.getheader("Content-Length") if self.command == "HEAD" else len(body)
        self.send_header("Content-Length", str(length or 0))
        self.end_headers()
        if cut:
            self.server.cut_next -= 1
            self.wfile.write(body[: len(body) // 2])
            self.close_connection = True
        elif self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def s3_proxy(s3):
    """A proxy in front of moto that can throttle or cut: its server (``throttle_next``,
    ``cut_next``) and storage_options that go through it."""
    host, port = s3.endpoint.removeprefix("http://").split(":")
    server = LoopbackServer(("127.0.0.1", 0), _S3ProxyHandler)
    server.moto, server.throttle_next, server.cut_next = (host, int(port)), 0, 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    options = {**s3.options, "endpoint_url": f"http://127.0.0.1:{server.server_address[1]}"}
    yield server, options
    server.shutdown()
    server.server_close()
