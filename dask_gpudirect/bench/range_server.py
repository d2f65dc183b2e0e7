"""A ranged HTTP server on loopback: the object store of ``bench read --remote`` (and the tests).

Python's threading HTTP server over a directory, answering ``Range: bytes=a-b`` with 206 and a
``Content-Range``, as object stores and CDNs do, and keeping connections alive (HTTP/1.1) so
that clients reuse them. Its own rate is measured beside every client's: it is the ceiling.
"""

from __future__ import annotations

import contextlib
import email.utils
import functools
import http.server
import io
import os
import threading
from collections.abc import Iterator


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Static files; a ``Range`` request gets its bytes alone (206), with Last-Modified."""

    protocol_version = "HTTP/1.1"

    def send_head(self) -> io.BytesIO | None:
        spec = self.headers.get("Range")
        if spec is None:
            return super().send_head()  # type: ignore[return-value]
        try:
            with open(self.translate_path(self.path), "rb") as f:
                info = os.fstat(f.fileno())
                start, end = (int(n) for n in spec.removeprefix("bytes=").split("-"))
                end = min(end, info.st_size - 1)
                f.seek(start)
                body = f.read(max(0, end - start + 1))
        except (OSError, ValueError):
            self.send_error(404)
            return None
        return self.send_range(body, start, info)

    def send_range(self, body: bytes, start: int, info: os.stat_result) -> io.BytesIO:
        """The 206 response's headers for ``body`` at ``start`` of a file of ``info``."""
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{start + len(body) - 1}/{info.st_size}")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Last-Modified", email.utils.formatdate(info.st_mtime, usegmt=True))
        self.end_headers()
        return io.BytesIO(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: a benchmark makes thousands of requests."""


class LoopbackServer(http.server.ThreadingHTTPServer):
    """Python's threading server with room for many connections at once: its listen backlog
    of 5 drops the SYNs of a 16-thread client's burst, each retried only after a second."""

    request_queue_size = 1024
    daemon_threads = True


@contextlib.contextmanager
def serving(
    root: str, handler: type[RangeHandler] = RangeHandler
) -> Iterator[http.server.ThreadingHTTPServer]:
    """``root`` served on a free loopback port (``server.server_address``) until the block ends."""
    server = LoopbackServer(("127.0.0.1", 0), functools.partial(handler, directory=root))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def base_url(server: http.server.ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"
