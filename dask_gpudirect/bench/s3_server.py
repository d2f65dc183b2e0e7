"""moto's S3 server on loopback, holding a folder's files: the object store of
``bench read --remote s3``.

Its bucket is filled through boto3 before any measurement; the keys are moto's (it accepts any),
given to every reader as ``storage_options`` and, for libcudf's own S3 source (which takes
credentials only from the environment), as ``AWS_*`` variables on the workers. Like the HTTP
server, its own rate is measured beside the readers' and is the ceiling.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

BUCKET = "gpudirect-bench"
REGION = "us-east-1"
#: moto's server takes any keys; these are not secrets.
KEYS = {"key": "bench", "secret": "bench"}


@contextlib.contextmanager
def s3_serving(root: str) -> Iterator[tuple[str, dict[str, str]]]:
    """``root``'s files under ``s3://BUCKET/`` (same relative keys) until the block ends:
    that base URL and the storage_options that reach it."""
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        raise RuntimeError(
            f"--remote s3 needs moto's S3 server and boto3 (pip install 'moto[server]'): {exc}"
        ) from None
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = {**KEYS, "endpoint_url": f"http://{host}:{port}"}
        client = boto3.client(
            "s3",
            endpoint_url=options["endpoint_url"],
            aws_access_key_id=KEYS["key"],
            aws_secret_access_key=KEYS["secret"],
            region_name=REGION,
        )
        client.create_bucket(Bucket=BUCKET)
        for folder, _, names in os.walk(root):
            for name in sorted(names):
                path = os.path.join(folder, name)
                client.upload_file(path, BUCKET, os.path.relpath(path, root))
        yield f"s3://{BUCKET}", options
    finally:
        server.stop()


def aws_environment(options: dict[str, str]) -> dict[str, str]:
    """The ``AWS_*`` variables that point AWS tools (and libcudf's KvikIO S3 source) at the
    server of ``options``."""
    return {
        "AWS_ACCESS_KEY_ID": options["key"],
        "AWS_SECRET_ACCESS_KEY": options["secret"],
        "AWS_ENDPOINT_URL": options["endpoint_url"],
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
    }
