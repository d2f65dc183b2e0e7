"""Remote objects: ``s3://`` through pyarrow's ``S3FileSystem``, ``http(s)://`` by ranged GETs.

Footers and headers are read at planning, shards on the workers, all as byte-range requests into
host memory. pyarrow's S3 client rather than fsspec/s3fs: it is a dependency already (s3fs would
add aiobotocore, botocore and aiohttp, pinned to each other), its C++ requests run outside the
GIL, so a worker's threads read ranges in parallel, and it takes credentials, profiles and
retries (the AWS SDK's standard backoff on 5xx and throttling) the way AWS tools do. Plain
HTTP(S) needs no client library: ``urllib`` with a ``Range`` header, retried here.

Credentials live only in :class:`Store`, whose repr leaves them out, and are scrubbed from every
error text: they never reach a log, the ledger, metrics or a shard's repr.
"""

from __future__ import annotations

import configparser
import contextlib
import dataclasses
import datetime
import email.message
import email.utils
import functools
import http.client
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import dask.config

from . import access
from .config import duration_seconds, positive_size, whole_number
from .errors import ConfigError, InputError, flag
from .stamps import CHANGED, same_version

if TYPE_CHECKING:
    import pyarrow.fs as pafs

#: The URL schemes read remotely; any other (``gs://``...) is refused by name.
SCHEMES = ("s3", "http", "https")

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def scheme(path: str) -> str | None:
    """``path``'s URL scheme, lower case, or None for a plain path."""
    match = _SCHEME.match(path)
    return match.group(1).lower() if match else None


def is_remote(path: str) -> bool:
    """Whether ``path`` is a URL this module reads (s3, http, https)."""
    return scheme(path) in SCHEMES


def store_of(path: str, store: Store | None) -> Store | None:
    """What a shard of ``path`` carries to reach it: ``store`` for a remote object, nothing for
    a local file (so that a local shard is the same whatever ``storage_options`` said)."""
    return store if is_remote(path) else None


def checked_url(url: str) -> str:
    """``url`` as given (an HTTP(S) path percent-encoded where it needs to be), refused where
    it carries credentials: a ``user:password@`` or a query string (a presigned signature)
    would show in the ledger and in errors."""
    parts = urllib.parse.urlsplit(url)
    if parts.username or parts.password or (parts.query and scheme(url) != "s3"):
        raise InputError(
            _redacted(parts),
            "credentials in a URL (user:password@, a presigned query string) are not taken, "
            "since the URL shows in errors and the ledger: use storage_options= or the "
            "environment (AWS_ACCESS_KEY_ID...)",
        )
    if not parts.netloc:
        raise InputError(url, "a remote URL needs a bucket or host")
    if scheme(url) in ("http", "https"):  # a space or a non-ASCII letter as a browser sends it
        # (urllib and libcurl refuse them); what is encoded already stays as it is
        url = urllib.parse.urlunsplit(parts._replace(path=urllib.parse.quote(parts.path, _SAFE)))
    return url


#: What an HTTP(S) URL's path keeps as written: its separators and percent-encoding.
_SAFE = "/%:@!$&'()*+,;=~"


def _redacted(parts: urllib.parse.SplitResult) -> str:
    netloc = parts.netloc.rpartition("@")[2]  # the host and port as written: [::1]:8000
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@dataclasses.dataclass(frozen=True)
class Store:
    """How to reach remote objects, as ``storage_options`` gave it; what it leaves unset is
    taken, where the requests are made, from the environment as AWS tools take it
    (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_PROFILE``...).
    The credentials are left out of the repr."""

    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    anonymous: bool = False
    key: str | None = dataclasses.field(default=None, repr=False)
    secret: str | None = dataclasses.field(default=None, repr=False)
    token: str | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> Store:
        """``storage_options`` as Dask and s3fs take them: ``key``, ``secret``, ``token``,
        ``anon``, ``endpoint_url``, ``region`` (``region_name``), ``profile``, and
        ``client_kwargs={"endpoint_url": ..., "region_name": ...}``. Another key is refused
        by name (never with its value)."""
        if not isinstance(options, Mapping | None):
            raise InputError(None, f"storage_options must be a dict, not {options!r}")
        given = dict(options or {})
        client = dict(given.pop("client_kwargs", None) or {})
        unknown = sorted(set(given) - _OPTIONS) + sorted(
            f"client_kwargs[{k!r}]" for k in set(client) - _CLIENT
        )
        if unknown:
            raise InputError(
                None,
                f"storage_options: {', '.join(unknown)} not taken; known: "
                f"{', '.join(sorted(_OPTIONS))}, client_kwargs (endpoint_url, region_name)",
            )
        anonymous = given.get("anon", False)
        flag("storage_options' anon", anonymous)
        return cls(
            endpoint_url=given.get("endpoint_url") or client.get("endpoint_url"),
            region=given.get("region") or given.get("region_name") or client.get("region_name"),
            profile=given.get("profile"),
            anonymous=anonymous,
            key=given.get("key"),
            secret=given.get("secret"),
            token=given.get("token"),
        )

    def endpoint(self) -> str | None:
        """The S3 endpoint: given, or ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``."""
        return (
            self.endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
        )

    def region_name(self) -> str | None:
        """The region: given, or ``AWS_REGION`` / ``AWS_DEFAULT_REGION``."""
        return self.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")

    def credentials(self) -> tuple[str | None, str | None, str | None]:
        """Access key, secret and session token: given, or from the named profile; None
        where neither says (the client library then reads the environment), and for an
        anonymous store (s3fs's ``anon=True`` ignores keys too)."""
        if self.anonymous:
            return None, None, None
        if self.profile and not self.key:
            found = _profile(self.profile)
            return (
                found.get("aws_access_key_id"),
                found.get("aws_secret_access_key"),
                found.get("aws_session_token"),
            )
        return self.key, self.secret, self.token

    def scrub(self, text: str) -> str:
        """``text`` with any of the credentials in it masked, where it stands as a word of
        its own (a key "test" leaves "test-bucket" and "listing" as written)."""
        for value in (self.key, self.secret, self.token):
            if value:
                text = re.sub(rf"(?<![\w-]){re.escape(value)}(?![\w-])", "***", text)
        return text


_OPTIONS = {"key", "secret", "token", "anon", "endpoint_url", "region", "region_name", "profile"}
_CLIENT = {"endpoint_url", "region_name"}


def _profile(name: str) -> dict[str, str]:
    """A named profile's keys: its section of the AWS shared credentials file, or else its
    ``[profile NAME]`` section of the config file, as the AWS tools look them up (pyarrow takes
    no profile name; the environment's ``AWS_PROFILE`` the AWS SDK reads itself). A profile
    without keys (a role to assume, SSO, a credential process) is refused: taking none would
    read with whatever other credentials the environment holds."""
    files = [
        (os.environ.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"), name),
        (os.environ.get("AWS_CONFIG_FILE", "~/.aws/config"),
         name if name == "default" else f"profile {name}"),
    ]  # fmt: skip
    for path, section in files:
        parser = configparser.ConfigParser()
        parser.read(os.path.expanduser(path))
        if not parser.has_section(section):
            continue
        found = dict(parser[section])
        if not (found.get("aws_access_key_id") and found.get("aws_secret_access_key")):
            raise InputError(
                None,
                f"storage_options: profile {name!r} ({path}) holds no aws_access_key_id and "
                "aws_secret_access_key (a role, SSO or credential process): give key= and "
                "secret= (and token=), or set AWS_PROFILE where the reads run",
            )
        return found
    raise InputError(
        None, f"storage_options: no profile {name!r} in {files[0][0]} or {files[1][0]}"
    )


#: The environment the AWS SDK and :class:`Store` read: a file system is made anew when it changes.
_ENVIRONMENT = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
)


@functools.lru_cache(maxsize=16)
def _s3(store: Store, retries: int, timeout: float, env: tuple) -> pafs.S3FileSystem:
    """One S3 file system per store, settings and ``env`` (the AWS variables, which the SDK
    reads) in this process, so that its connections are reused."""
    import pyarrow.fs as pafs

    key, secret, token = store.credentials()
    return pafs.S3FileSystem(
        access_key=key,
        secret_key=secret,
        session_token=token,
        anonymous=store.anonymous,
        region=store.region_name(),
        endpoint_override=store.endpoint(),
        connect_timeout=timeout,
        request_timeout=timeout,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=retries + 1),
    )


@dataclasses.dataclass(frozen=True)
class Settings:
    """``gpudirect.remote.*`` as read in this process."""

    connections: int
    range_size: int
    retries: int
    backoff: float
    timeout: float

    @classmethod
    def current(cls) -> Settings:
        """This process's settings, each checked as it is read: a ConfigError naming the key,
        the value and what it takes where one cannot be used (not int()'s or Dask's parsers'
        error, nor a negative count of retries taken as "retry forever")."""
        return cls(
            connections=_whole("connections", 1),
            range_size=_size("range-size"),
            retries=_whole("retries", 0),
            backoff=duration_seconds(f"{_SETTINGS}.backoff", zero=True),
            timeout=duration_seconds(f"{_SETTINGS}.timeout"),
        )

    @property
    def timeout_text(self) -> str:
        """The timeout as an error names it, with its key, for the user to raise it."""
        return f"gpudirect.remote.timeout ({self.timeout:g}s)"

    @property
    def retries_text(self) -> str:
        """That every retry failed too, as an error says it, with the key."""
        return f"through gpudirect.remote.retries ({self.retries}) retries"


#: The prefix of the keys :class:`Settings` reads.
_SETTINGS = "gpudirect.remote"


def _setting(key: str) -> Any:
    """``gpudirect.remote.<key>`` (by Dask's names: DASK_GPUDIRECT__REMOTE__RANGE_SIZE sets
    "range_size", which Dask finds as "range-size")."""
    return dask.config.get(f"{_SETTINGS}.{key}")


def _whole(key: str, minimum: int) -> int:
    """``gpudirect.remote.<key>``: a whole number of at least ``minimum`` ("16" from a yaml
    string too; not a bool, not 1.5)."""
    value = _setting(key)
    number = whole_number(value, minimum)
    if number is None:
        raise ConfigError(f"{_SETTINGS}.{key}={value!r}: use a whole number of at least {minimum}")
    return number


def _size(key: str) -> int:
    """``gpudirect.remote.<key>`` in bytes: a positive size."""
    value = _setting(key)
    nbytes = positive_size(value)
    if nbytes is None:
        raise ConfigError(f"{_SETTINGS}.{key}={value!r}: use a positive size, like '8MiB'")
    return nbytes


def filesystem(store: Store) -> pafs.S3FileSystem:
    """The S3 file system of ``store`` with this process's settings."""
    settings = Settings.current()
    env = tuple(os.environ.get(name) for name in _ENVIRONMENT)
    return _s3(store, settings.retries, settings.timeout, env)


def s3_path(url: str) -> str:
    """``s3://bucket/key`` as pyarrow names it: ``bucket/key``."""
    return url.split("://", 1)[1]


def error(url: str, exc: BaseException, store: Store) -> InputError | ConfigError:
    """An error of a request for ``url`` as an :class:`InputError` that says the cause; a
    ``gpudirect.remote.*`` setting that cannot be used (:class:`Settings`) as its own
    ConfigError, which names the key, not the URL."""
    if isinstance(exc, InputError | ConfigError):
        return exc
    text = store.scrub(str(exc))
    if isinstance(exc, urllib.error.HTTPError):
        if exc.code >= 500 or exc.code == 429:  # what _retried sends again, until it gives up
            retried = Settings.current().retries_text
            return InputError(
                url, f"the server kept throttling or failing (HTTP {exc.code}) {retried}"
            )
        causes = {404: "not found", 403: "access denied", 401: "access denied (unauthorized)"}
        return InputError(url, f"{causes.get(exc.code, 'request failed')} (HTTP {exc.code})")
    if isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError):
        settings = Settings.current()  # urllib's: to connect (its URLError), to a response
        return InputError(url, f"no answer within {settings.timeout_text}, {settings.retries_text}")
    if isinstance(exc, (urllib.error.URLError, ConnectionError, http.client.HTTPException)):
        reason = getattr(exc, "reason", exc)
        return InputError(url, f"cannot reach the server: {store.scrub(str(reason))}")
    if isinstance(exc, FileNotFoundError):
        return _missing(url, store)
    if any(code in text for code in _S3_TIMEOUTS):  # the SDK's (libcurl's) timeout, to
        settings = Settings.current()  # connect or for bytes (connect/request_timeout in _s3)
        return InputError(
            url,
            f"no answer from the endpoint {store.endpoint() or 'AWS'} within "
            f"{settings.timeout_text}, {settings.retries_text}: {text}",
        )
    for codes, cause in _S3_CAUSES:
        if any(code in text for code in codes):
            return InputError(url, cause.format(endpoint=store.endpoint() or "AWS") + f": {text}")
    return InputError(url, f"cannot read: {text}")


#: libcurl's timeout (CURLE_OPERATION_TIMEDOUT) as the AWS SDK reports it in pyarrow's messages
#: ("curlCode: 28, Timeout was reached"): no connection or no bytes within the timeout.
_S3_TIMEOUTS = ("curlCode: 28,", "Timeout was reached")

#: The AWS SDK's error names in pyarrow's messages, and what they mean to a user.
_S3_CAUSES = (
    (
        ("ACCESS_DENIED", "SIGNATURE_DOES_NOT_MATCH", "INVALID_ACCESS_KEY_ID", "code: 403"),
        "access denied: check the credentials and the bucket's policy",
    ),
    (("NO_SUCH_BUCKET",), "no such bucket"),
    (
        ("SLOW_DOWN", "SlowDown", *(f"HTTP status {code}" for code in (500, 502, 503, 504))),
        "the store kept throttling or failing (HTTP 5xx) through gpudirect.remote.retries retries",
    ),
    (
        ("NETWORK_CONNECTION", "curlCode", "Could not resolve"),
        "cannot reach the endpoint {endpoint}",
    ),
)


def _missing(url: str, store: Store) -> InputError | ConfigError:
    """A missing object's error: whether its bucket is missing too."""
    import pyarrow.fs as pafs

    bucket = s3_path(url).split("/", 1)[0]
    try:
        kind = filesystem(store).get_file_info(bucket).type
    except OSError as exc:
        return error(url, exc, store)
    if kind == pafs.FileType.NotFound:
        return InputError(url, f"no such bucket {bucket!r}")
    return InputError(url, "no such key in the bucket")


class Object:
    """A remote object opened for range reads: its ``size`` and ``version`` (the ETag, or for
    an HTTP server without one its Last-Modified) as one request found them."""

    def __init__(self, url: str, store: Store, size: int, version: str, handle: Any = None):
        self.path = url
        self.store = store
        self.size = size
        self.version = version
        self._handle = handle  # pyarrow's file for s3://; None for http(s)://

    @property
    def stat(self) -> access.Stat:
        """Size and modification time as a local file's stat gives them (the time is 0: the
        version stands for it)."""
        return access.Stat(self.size, 0)

    @property
    def weak_version(self) -> bool:
        """Whether the version is only a Last-Modified time (an HTTP server without ETags),
        which a rewrite within its second keeps, or a weak ETag (``W/"..."``), which a server
        may keep for other bytes (Apache's, for a file modified within the second)."""
        return weak(self.version)

    def pread(self, length: int, offset: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer only at the end of the object)."""
        length = max(0, min(length, self.size - offset))
        if length == 0:
            return b""
        try:
            if self._handle is not None:
                return self._handle.read_at(length, offset)
            return _http_range(self.path, offset, length, self.size, self.version)
        except Exception as exc:  # pyarrow: OSError, ArrowException; urllib: URLError...
            failure = error(self.path, exc, self.store)
        raise failure  # outside the handler: see _opened

    def head(self) -> tuple[int, str]:
        """The object's size and version now (a fresh request)."""
        with opened(self.path, self.store) as now:
            assert isinstance(now, Object)
            return now.size, now.version


@contextlib.contextmanager
def opened(path: str, store: Store | None) -> Iterator[access.Opened | Object]:
    """``path`` opened for reading: a remote object (one HEAD request), or a local file through
    :func:`.access.opened` (allowed roots checked on it)."""
    if not is_remote(path):
        with access.opened(path) as file:
            yield file
        return
    obj = _opened(path, store or Store())
    try:
        yield obj
    finally:
        if obj._handle is not None:
            obj._handle.close()


def _opened(path: str, store: Store) -> Object:
    """``path``'s object by one HEAD request. A failure is raised outside the ``except``
    block, so that it carries no ``__context__``: urllib's ``HTTPError`` holds the response's
    socket, which Distributed cannot pickle when it sends a task's error to the client."""
    try:
        if scheme(path) == "s3":
            handle = filesystem(store).open_input_file(s3_path(path))
            meta = {k: v.decode() for k, v in handle.metadata().items()}  # the HEAD's headers
            _check_identity(path, meta)
            version = meta.get("ETag") or meta.get("Last-Modified") or ""
            return Object(path, store, handle.size(), version, handle)
        return Object(path, store, *_http_head(path))
    except Exception as exc:
        failure = error(path, exc, store)
    raise failure


_LAST_MODIFIED = "Last-Modified "


def weak(version: str | None) -> bool:
    """Whether a remote object's ``version`` (:attr:`Object.version`, a stamp's) is a weak
    one: a Last-Modified second or a weak ETag, which other bytes may keep."""
    return version is not None and version.startswith((_LAST_MODIFIED, "W/"))


def _version(headers: email.message.Message) -> str:
    etag = headers.get("ETag")
    return etag if etag else f"{_LAST_MODIFIED}{headers.get('Last-Modified', '')}"


def _retried(request: urllib.request.Request) -> http.client.HTTPResponse:
    """``request`` sent, sent again after a 5xx, a 429 or a dropped connection, waiting
    ``gpudirect.remote.backoff`` and twice as long each time, or as long as the server's
    Retry-After asks where that is longer (up to ``timeout``), ``retries`` times at most."""
    settings = Settings.current()
    attempt = 0
    while True:
        asked = 0.0
        try:
            response: http.client.HTTPResponse = urllib.request.urlopen(
                request, timeout=settings.timeout
            )
            return response
        except urllib.error.HTTPError as exc:
            if (exc.code < 500 and exc.code != 429) or attempt == settings.retries:
                raise
            asked = min(_retry_after(exc.headers), settings.timeout)
            exc.close()  # its connection, now, not when it is collected
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if attempt == settings.retries:
                raise
        _back_off(settings, attempt, asked)
        attempt += 1


def _retry_after(headers: email.message.Message | None) -> float:
    """The seconds a throttled reply's Retry-After asks to wait, given as seconds or as the
    HTTP-date to wait until: 0 where it names none, a date past, or one that cannot be read."""
    text = (headers.get("Retry-After") if headers is not None else None) or ""
    seconds = _count(text)
    if seconds is not None:
        return float(seconds)
    try:
        until = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return 0.0
    if until.tzinfo is None:  # "-0000": UTC, as an HTTP-date always is
        until = until.replace(tzinfo=datetime.UTC)
    return max(0.0, until.timestamp() - time.time())


def _count(text: str) -> int | None:
    """``text`` as the whole number an HTTP header writes (ASCII digits), else None: ``str``'s
    ``isdigit`` also takes digits ``int`` cannot read ("\xb2", a latin-1 header's superscript)."""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() else None


def _back_off(settings: Settings, retry: int, at_least: float = 0.0) -> None:
    """Wait before retry ``retry`` (from 0): ``gpudirect.remote.backoff``, doubled each time,
    or ``at_least`` seconds where that is longer."""
    time.sleep(max(settings.backoff * 2**retry, at_least))


#: HEAD answers after which a GET of the first byte is asked for the size, as fsspec does: a
#: server without HEAD (405, 501), or a URL signed for GET alone (an S3 presigned URL: 403).
_NO_HEAD = (403, 405, 501)


def _http_head(url: str) -> tuple[int, str]:
    """``url``'s size and version by a HEAD request, or by a GET of its first byte where the
    server answers no HEAD or one without a Content-Length (or one that is not a number)."""
    try:
        with _retried(urllib.request.Request(url, method="HEAD")) as response:
            _check_identity(url, response.headers)
            length = _count(response.headers.get("Content-Length") or "")
            if length is not None:  # else (none, or not a number) the GET of the first byte's
                return length, _version(response.headers)
    except urllib.error.HTTPError as exc:
        if exc.code not in _NO_HEAD:
            raise
        exc.close()
    return _http_first_byte(url)


def _http_first_byte(url: str) -> tuple[int, str]:
    """``url``'s size (a ranged GET's Content-Range) and version."""
    headers: email.message.Message
    try:
        with _retried(urllib.request.Request(url, headers={"Range": "bytes=0-0"})) as response:
            status, headers = response.status, response.headers
    except urllib.error.HTTPError as exc:
        if exc.code != 416:  # an empty object: no first byte to serve
            raise
        status, headers = exc.code, exc.headers
        exc.close()
    if status == 200:
        raise InputError(url, "the server does not serve byte ranges (HTTP 200)")
    _check_identity(url, headers)
    size = _count((headers.get("Content-Range") or "").rpartition("/")[2])
    if size is None:
        raise InputError(
            url, "the server gives no size: no Content-Length to a HEAD, no Content-Range to a GET"
        )
    return size, _version(headers)


def _http_range(url: str, offset: int, length: int, size: int, version: str) -> bytes:
    """Bytes ``offset .. offset + length`` of ``url``, checked to be of an object of ``size``
    bytes and ``version``. A reply that comes whole but shorter (a server that caps its ranges)
    is followed by a request for the rest; a body cut short (the connection dropped) is asked
    for again from where it stopped, after the same backoff as a failed request, ``retries``
    times at most."""
    settings = Settings.current()
    data = bytearray()
    cuts = 0
    while len(data) < length:
        start = offset + len(data)
        asked = f"bytes={start}-{offset + length - 1}"
        before, whole, stalled = len(data), False, False
        with _retried(urllib.request.Request(url, headers={"Range": asked})) as response:
            _check_range(url, response, asked, start, size, version)
            try:
                data += response.read(length - len(data))
                whole = not response.length  # all the body its Content-Length announced
            except http.client.IncompleteRead as exc:
                data += exc.partial
            except (ConnectionError, TimeoutError) as exc:  # what this response gave is
                stalled = isinstance(exc, TimeoutError)  # lost with it: asked for again
        if len(data) < length and not (whole and len(data) > before):
            if cuts == settings.retries:
                cause = "the connection was cut"
                if stalled:
                    cause = f"no bytes came within {settings.timeout_text}"
                raise InputError(
                    url,
                    f"{cause} after {len(data)} of {length} bytes at {offset}, "
                    f"{settings.retries_text}",
                )
            _back_off(settings, cuts)
            cuts += 1
    return bytes(data)


def _check_range(
    url: str, response: http.client.HTTPResponse, asked: str, start: int, size: int, version: str
) -> None:
    """That ``response`` holds the ranged bytes of ``url`` asked for, from ``start``, of an
    object of ``size`` bytes and ``version``: a reply that starts elsewhere (its
    Content-Range) read as asked would be other bytes, and a size other than the HEAD's (a
    server whose HEAD disagrees with its GET) a file read cut short, both unnoticed."""
    if response.status != 206:
        raise InputError(url, f"the server does not serve byte ranges (HTTP {response.status})")
    _check_identity(url, response.headers)
    now = _version(response.headers)
    if not same_version(version, now):
        raise InputError(url, CHANGED.format(f"{version} then, {now} now"))
    served = response.headers.get("Content-Range")
    # "bytes=a-b/n" (a few servers', not RFC 9110's "bytes a-b/n"): its numbers where they are
    first = re.sub(r"^bytes[ =]", "", served or "").partition("-")[0]
    if served is not None and first != str(start):
        raise InputError(url, f"the server answered {served!r} to a request for {asked}")
    total = _count((served or "").rpartition("/")[2])  # None for "*": a size not known
    if total is not None and total != size:
        raise InputError(
            url,
            f"its size is {size} bytes by the HEAD request, {total} by a ranged GET's "
            f"Content-Range ({served!r}): the server's HEAD and GET disagree, or it changed "
            "while it was read",
        )


def _check_identity(url: str, headers: email.message.Message | Mapping[str, str]) -> None:
    """That ``headers`` send the object's own bytes: one stored with a ``Content-Encoding``
    (gzip-compressed, as S3 serves an object uploaded with that header whatever the request
    asks) has its size and byte ranges counted in the encoded bytes, which read as the
    object's would be other values, unnoticed. ``identity`` and ``none`` (some servers') name
    no coding; nor does ``aws-chunked``: it framed a chunk-signed upload, and stores that keep
    it (S3 drops it) serve the object's own bytes."""
    encoding = headers.get("Content-Encoding", "")
    codings = {c.strip().lower() for c in encoding.split(",")}
    if codings - {"", "identity", "none", "aws-chunked"}:
        raise InputError(
            url,
            f"the server sends the object encoded (Content-Encoding: {encoding}): its byte "
            "ranges are not the file's bytes; store it without a Content-Encoding",
        )
