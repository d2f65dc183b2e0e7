"""Several "hosts" on one machine: network namespaces on a private subnet, for multi-host tests.

A :class:`Network` makes one namespace per host plus a hub namespace holding a bridge; every host
namespace (the scheduler's too) gets a veth pair whose far end is on the bridge, and so does the
root namespace, where the test process (the Dask client) lives. Addresses are on
``10.231.N.0/24``, with ``N`` chosen so no route of the root namespace already covers it (under
a lock file, so two sessions cannot pick the same one); the names carry a token unique to the
test session, so parallel runs do not clash. ``lo`` is up in
every namespace.

A :class:`NetnsCluster` starts ``dask scheduler`` in one namespace and ``dask worker`` processes
(with ``--preload dask_gpudirect.preload``) in the others, each host with its own environment
(e.g. ``DASK_GPUDIRECT__ALLOWED_ROOTS``). Everything it starts is killed by process group and by
``ip netns pids``, and every namespace deleted, on close, also when a test fails.

Needs root and iproute2 (``ip netns add``): :func:`unavailable` says why not where they are
missing, for a clear skip.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

SUBNET_BASE = "10.231"  # /16 whose /24s the networks use
SCHEDULER_PORT = 8786  # inside its own namespace: no clash with anything else
CLIENT_PORT = 8800  # the scheduler's tcp listener for the client, beside a ucxx one


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *(("netns", "exec", netns, "ip") if netns else ()), *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {result.stderr.strip()}")
    return result


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can), tried for real."""
    if shutil.which("ip") is None:
        return "no `ip` command: network namespaces need iproute2 (apt-get install iproute2)"
    name = f"gdprobe{secrets.token_hex(3)}"
    try:
        made = _ip("netns", "add", name, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`ip netns add` could not run: {exc}"
    if made.returncode != 0:
        return (
            f"`ip netns add` failed ({made.stderr.strip()}): network namespaces need root "
            "(CAP_SYS_ADMIN and CAP_NET_ADMIN)"
        )
    try:
        bridge = _ip("link", "add", "br0", "type", "bridge", netns=name, check=False)
        if bridge.returncode != 0:
            return f"cannot make a bridge in a namespace: {bridge.stderr.strip()}"
    finally:
        _ip("netns", "del", name, check=False)
    return None


#: Held while a network picks its subnet and wires it, by every test session on the machine.
LOCK_PATH = "/tmp/dask-gpudirect-netns.lock"


@contextlib.contextmanager
def _subnet_lock():
    """Two sessions (two ``make test`` side by side) must not both see a /24 free and take it:
    the root namespace would then hold two routes to it and send one cluster's packets to the
    other's bridge, so workers seem to leave the cluster."""
    import fcntl

    with open(LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _free_subnet() -> str:
    """A ``10.231.N`` prefix no route of the root namespace covers (start from our pid)."""
    routes = _ip("-4", "route", "show", "table", "all").stdout
    used = set()
    for line in routes.splitlines():
        dest = line.split()[0] if line.split() else ""
        with contextlib.suppress(ValueError):
            used.add(ipaddress.ip_network(dest, strict=False))
    start = os.getpid() % 250
    for k in range(250):
        prefix = f"{SUBNET_BASE}.{(start + k) % 250 + 1}"
        net = ipaddress.ip_network(f"{prefix}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return prefix
    raise RuntimeError(f"no free /24 in {SUBNET_BASE}.0.0/16")


@dataclass
class Host:
    """One namespace on the test subnet."""

    name: str  # the host's role, e.g. "sched", "a"
    netns: str  # the namespace
    ip: str
    link: str  # its veth end inside the namespace (set it down to cut the host off)


@dataclass
class Network:
    """Namespaces ``names`` on one bridge, plus the root namespace at ``.254``."""

    names: list[str]
    token: str = field(default_factory=lambda: secrets.token_hex(3))
    hosts: dict[str, Host] = field(default_factory=dict)
    root_ip: str = ""
    _made: list[str] = field(default_factory=list)

    @property
    def hub(self) -> str:
        return f"gd{self.token}-hub"

    def up(self) -> Network:
        try:
            with _subnet_lock():  # another session's routes appear only once it is wired
                self._up()
        except BaseException:
            self.down()
            raise
        return self

    def _up(self) -> None:
        prefix = _free_subnet()
        self._add_netns(self.hub)
        _ip("link", "add", "br0", "type", "bridge", netns=self.hub)
        _ip("link", "set", "br0", "up", netns=self.hub)
        for k, name in enumerate(self.names):
            netns = f"gd{self.token}-{name}"
            self._add_netns(netns)
            host = Host(name, netns, f"{prefix}.{k + 1}", "eth0")
            self._wire(host.netns, host.link, host.ip, f"gd{self.token}h{k}")
            self.hosts[name] = host
        # the root namespace: the client's end, in the root, under a unique name
        self.root_ip = f"{prefix}.254"
        self._wire(None, f"gd{self.token}r", self.root_ip, f"gd{self.token}hr")

    def _add_netns(self, netns: str) -> None:
        _ip("netns", "add", netns)
        self._made.append(netns)
        _ip("link", "set", "lo", "up", netns=netns)

    def _wire(self, netns: str | None, inner: str, ip: str, outer: str) -> None:
        """A veth pair: ``inner`` in ``netns`` (None: root) with ``ip``, ``outer`` on the bridge."""
        tmp = inner if netns is None else f"{outer}x"
        _ip("link", "add", tmp, "type", "veth", "peer", "name", outer)
        _ip("link", "set", outer, "netns", self.hub)
        _ip("link", "set", outer, "master", "br0", netns=self.hub)
        _ip("link", "set", outer, "up", netns=self.hub)
        if netns is not None:
            _ip("link", "set", tmp, "netns", netns)
            _ip("link", "set", tmp, "name", inner, netns=netns)
        _ip("addr", "add", f"{ip}/24", "dev", inner, netns=netns)
        _ip("link", "set", inner, "up", netns=netns)

    def exec(self, host: str) -> list[str]:
        """The command prefix that runs a command on ``host``."""
        return ["ip", "netns", "exec", self.hosts[host].netns]

    def cut(self, host: str) -> None:
        """Take ``host``'s link down inside its namespace: it drops off the network."""
        h = self.hosts[host]
        _ip("link", "set", h.link, "down", netns=h.netns)

    def down(self) -> None:
        """Kill whatever still runs in our namespaces and delete them (the veths go with them)."""
        for netns in reversed(self._made):
            pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", netns, check=False)
        self._made.clear()
        # the root end goes with its peer in the hub; make sure
        _ip("link", "del", f"gd{self.token}r", check=False)


class NetnsCluster:
    """A scheduler on host ``sched`` and ``dask worker`` processes on the other hosts.

    ``hosts``: host name -> number of worker processes there. ``env``: host name -> extra
    environment for that host's workers. ``common_env`` goes to every process. ``private_dir``:
    a directory that each host sees as its own empty disk (a tmpfs in a mount namespace of its
    own, shared by that host's workers), and the test process sees as it is: node-local storage
    at one path on every node.
    """

    def __init__(
        self,
        hosts: dict[str, int],
        protocol: str = "tcp",
        env: dict[str, dict[str, str]] | None = None,
        common_env: dict[str, str] | None = None,
        scheduler_env: dict[str, str] | None = None,
        workdir: str | None = None,
        nthreads: int = 1,
        private_dir: str | None = None,
    ):
        self.nworkers = dict(hosts)
        self.protocol = protocol
        self.env = env or {}
        self.common_env = common_env or {}
        self.scheduler_env = scheduler_env or {}
        self.nthreads = nthreads
        self.workdir = workdir or os.path.join("/tmp", f"gd-netns-{secrets.token_hex(4)}")
        self.private_dir = private_dir
        self.network = Network(["sched", *hosts])
        self.procs: list[subprocess.Popen] = []
        self.address = ""  # the scheduler's address for the workers
        self.client_address = ""  # for the client in the root namespace: always tcp

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout: float = 300) -> NetnsCluster:
        atexit.register(self.close)
        try:
            self._start(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _start(self, timeout: float) -> None:
        os.makedirs(self.workdir, exist_ok=True)
        if self.private_dir:
            os.makedirs(self.private_dir, exist_ok=True)
        self.network.up()
        sched = self.network.hosts["sched"]
        scheduler_file = os.path.join(self.workdir, "scheduler.json")
        # The workers' protocol first; the client always speaks tcp (a second listener): UCX
        # reads the network interfaces once per process, and the test process may have started
        # UCX before this network's interface existed in the root namespace.
        protocols = [self.protocol] if self.protocol == "tcp" else [self.protocol, "tcp"]
        ports = [SCHEDULER_PORT, CLIENT_PORT][: len(protocols)]
        self.client_address = f"tcp://{sched.ip}:{ports[-1]}"
        self._spawn(
            "sched",
            [
                "-m",
                "distributed.cli.dask_scheduler",
                "--host",
                sched.ip,
                "--port",
                ",".join(map(str, ports)),
                "--protocol",
                ",".join(protocols),
                "--no-dashboard",
                "--scheduler-file",
                scheduler_file,
            ],
            self.scheduler_env,
        )
        deadline = time.monotonic() + timeout
        while not os.path.exists(scheduler_file):
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scheduler did not start in {timeout} s")
            time.sleep(0.1)
        time.sleep(0.1)  # let the file be written whole
        with open(scheduler_file) as f:
            self.address = json.load(f)["address"]
        for name, n in self.nworkers.items():
            host = self.network.hosts[name]
            local = os.path.join(self.workdir, f"worker-{name}")
            self._spawn(
                name,
                [
                    "-m",
                    "distributed.cli.dask_worker",
                    self.address,
                    "--host",
                    host.ip,
                    "--protocol",
                    self.protocol,
                    "--nworkers",
                    str(n),
                    "--nthreads",
                    str(self.nthreads),
                    "--no-dashboard",
                    "--local-directory",
                    local,
                    "--name",
                    f"{name}",
                    "--preload",
                    "dask_gpudirect.preload",
                ],
                self.env.get(name, {}),
                self.private_dir,
            )

    def connect(self, timeout: float = 300):
        """A client (not the default one) once every worker has joined; on failure the
        cluster is closed."""
        from distributed import Client

        try:
            client = Client(self.client_address, timeout=60, set_as_default=False)
            self.wait_for_workers(client, sum(self.nworkers.values()), timeout=timeout)
        except BaseException:
            self.close()
            raise
        return client

    def wait_for_workers(self, client, n: int, timeout: float = 300) -> None:
        """Wait until ``client`` sees ``n`` workers; fail at once, with the log, if a process of
        ours exits, and with every log after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while len(client.nthreads()) < n:
            self._check_alive()
            if time.monotonic() > deadline:
                logs = {p.host: self.log(p.host)[-2000:] for p in self.procs}
                raise TimeoutError(f"{n} workers did not join in {timeout} s; logs: {logs}")
            time.sleep(0.2)

    def _spawn(
        self, host: str, args: list[str], env: dict[str, str], private_dir: str | None = None
    ) -> None:
        full = {**os.environ, **self.common_env, **env}
        log = open(os.path.join(self.workdir, f"{host}.log"), "ab")  # noqa: SIM115
        private = (
            # a mount namespace of the host's own, with a fresh tmpfs over ``private_dir``
            ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
            + ['mount -t tmpfs gd-local "$0" && exec "$@"', private_dir]
            if private_dir
            else []
        )
        proc = subprocess.Popen(
            [*self.network.exec(host), *private, sys.executable, *args],
            env=full,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # one process group: the nanny and its workers
        )
        log.close()
        proc.host = host  # type: ignore[attr-defined]
        self.procs.append(proc)

    def _check_alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{proc.host} exited with {proc.returncode}: {self.log(proc.host)[-3000:]}"
                )

    def log(self, host: str) -> str:
        path = os.path.join(self.workdir, f"{host}.log")
        if not os.path.exists(path):
            return ""
        with open(path, errors="replace") as f:
            return f.read()

    def close(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.procs.clear()
        self.network.down()
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.private_dir:
            shutil.rmtree(self.private_dir, ignore_errors=True)
        atexit.unregister(self.close)

    def __enter__(self) -> NetnsCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # --- who is where ------------------------------------------------------------------------
    def host_ip(self, name: str) -> str:
        return self.network.hosts[name].ip

    def host_of(self, address: str) -> str:
        """The host name (e.g. "a") of a worker ``address``."""
        from distributed.comm.addressing import get_address_host

        ip = get_address_host(address)
        for name, host in self.network.hosts.items():
            if host.ip == ip:
                return name
        raise KeyError(f"{address} is on no host of this cluster")

    def cut(self, host: str) -> None:
        self.network.cut(host)


@contextlib.contextmanager
def private_disks(hosts: dict[str, int], private_dir: str):
    """A :class:`NetnsCluster` of ``hosts``, each with its own empty disk at ``private_dir``,
    and a client of it, closed after; the test skipped where namespaces cannot be made."""
    import pytest

    reason = unavailable()
    if reason is not None:
        pytest.skip(f"cannot make network namespaces: {reason}")
    cluster = NetnsCluster(hosts, private_dir=private_dir).start()
    client = cluster.connect()
    try:
        yield cluster, client
    finally:
        client.close(timeout=10)
        cluster.close()
