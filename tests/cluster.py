"""A real multi-node SSH test cluster: one OpenSSH `sshd` per test node, a real `chronyd`.

Two modes:

- ``loopback`` (no network namespaces): node *i* is an sshd on ``127.0.1.<i>`` and a free port;
  every node shares this machine's network and process table.
- ``netns`` (root): node *i* lives in its own network and UTS namespace (hostname = node name)
  at ``198.18.<s>.<i>:22``, plugged into a bridge (``198.18.<s>.254``) in the root namespace, so
  a test can pull its cable (`link_down`), add latency (`netem`) or give it extra NICs.
  ``<s>`` is 0 unless another session on this machine holds that subnet.

In both modes every node has its own mount namespace in which ``NODE_LOCAL`` is bind-mounted
from the node's private ``local_dir``: a file there exists on that node only (when root).
`controller_dir()` makes a directory under ``NODE_LOCAL`` as this machine (the controller) sees
it, which every node sees empty: a cluster without shared storage.

Every node's login has the cluster's own ``home`` (``HOME``, by ``SetEnv``), shared by its nodes
as an NFS home is, empty but for what a test writes there: a node never runs this machine's user
dotfiles (a ``~/.bashrc`` that runs ``pyenv init`` costs about 100 ms of CPU per SSH command, and
its ``pyenv rehash`` prints a warning when logins race). A test that wants a chatty login shell
gives its nodes a ``HOME`` of its own (``node_env``).

The broadcast bed (issue 51), two options of a netns cluster, both off by default:

- ``rate`` (e.g. ``"100mbit"``): every port of the switch runs at that rate, both ways. Each node's
  veth has a token bucket (`PORT_TBF`) on both ends (what the bridge sends the node, what the node
  sends), and the controller (this machine's root namespace) reaches the bridge through a port of
  its own, a veth pair whose root end holds ``198.18.<s>.254`` and whose other end is a bridge port,
  with the same bucket on both ends: the controller's uplink is one port at that rate, however many
  nodes it sends to (without ``rate`` the address sits on the bridge itself, as before).
- ``tmpfs`` (e.g. ``"256m"``): each node's ``NODE_LOCAL`` is a private tmpfs of that size instead of
  its ``local_dir``, mounted by the holder before the node's sshd starts, so eight nodes hold eight
  copies in memory and a node's disk can fill (`resize_tmpfs`: ENOSPC on that node only).
  `node_path` reads a node's files from the controller (``/proc/<holder>/root``); a podman store can
  keep its graph, run root and temporary files there (tests/containers.py, ``data``).

A "holder" process (``sleep``) keeps each node's namespaces alive, so sshd can be stopped and
started again and `exec` works while sshd is down. Every process the cluster starts carries
``ORCH_TEST_SESSION`` / ``ORCH_TEST_CLUSTER`` / ``ORCH_TEST_NODE`` in its environment (sshd's own
environment, and ``SetEnv`` for login sessions), which is how `processes`, `stop` and the
session-finish leak check (`leftovers`) find them, detached grandchildren included.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import getpass
import itertools
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn

import yaml

from tests.lanes import lane_of, pid_alive
from tests.ports import free_port

SSHD = shutil.which("sshd", path="/usr/sbin:/usr/bin:/sbin:/bin") or "/usr/sbin/sshd"
SETPRIV = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin") or "/usr/bin/setpriv"
CHRONYD = shutil.which("chronyd", path="/usr/sbin:/usr/bin:/sbin:/bin") or "/usr/sbin/chronyd"
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"

# Everything this pytest process creates is named after its pid, so concurrent sessions of other
# engineers on the same machine never collide and the leak check only judges our own leftovers.
SESSION_TAG = f"orchtest{os.getpid()}"
NETNS_PREFIX = f"orch-{os.getpid()}-"
LINK_PREFIX = f"o{os.getpid()}x"  # + cluster number + role: stays within IFNAMSIZ (15)
SUBNET_LOCK = "/tmp/orch-test-netns.lock"
ACCOUNT = (4242, 4242)
"""The uid:gid of the non-root SSH account bed (tests/conftest.py `account_cluster`): no account of
this machine's (sshd logs in as root and drops to it)."""
PORT_TBF = ("burst", "256kb", "latency", "100ms")
"""The token bucket of every port of a cluster with a ``rate`` (`tc qdisc ... tbf rate RATE` + these):
a 256 kB burst, and at most 100 ms of queue before the port drops, as a switch port's buffer."""
RATE_RE = re.compile(r"^\d+(\.\d+)?[kmgt]?(bit|bps)$", re.IGNORECASE)
"""A rate as `tc` reads it: 100mbit, 1gbit, 12.5mbps."""
SIZE_RE = re.compile(r"^\d+[kmg]?$", re.IGNORECASE)
"""A tmpfs size as `mount -o size=` reads it: 256m, 1g, 65536k."""

_cluster_ids = itertools.count(1)
_started: dict[int, TestCluster] = {}
"""The clusters of this process that are started and not stopped (by number): `daemon_pids`."""

Mode = Literal["loopback", "netns"]


class ClusterError(RuntimeError):
    """The test cluster could not be started or changed; the message carries the daemon's log."""


# ----------------------------------------------------------------------------- small helpers


def is_root() -> bool:
    return os.geteuid() == 0


STRICT = os.environ.get("ORCH_TEST_STRICT") == "1"
"""Set by .ci/run: a test that would skip for lack of something CI installs (root, network
namespaces, chromium, a C compiler) fails instead, so a CI machine without them cannot pass."""


def missing(reason: str) -> NoReturn:
    """Skip for lack of `reason` here; fail under ORCH_TEST_STRICT=1. Never returns."""
    import pytest

    if STRICT:
        pytest.fail(f"ORCH_TEST_STRICT=1, and this test cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


def kernel_limit(reason: str) -> NoReturn:
    """Skip for a kernel feature no package installs (tc netem): a skip even under
    ORCH_TEST_STRICT=1, saying so. Never returns."""
    import pytest

    pytest.skip(f"kernel limit, skipped even under ORCH_TEST_STRICT: {reason}")


def _sh(argv: Sequence[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a setup command; on failure raise ClusterError with its stderr."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise ClusterError(f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def wait_port(host: str, port: int, timeout: float, alive: Any = None) -> None:
    """Block until host:port accepts a TCP connection; `alive()` False aborts early."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if alive is not None and not alive():
                raise ClusterError(f"{host}:{port}: daemon exited before listening") from None
            if time.monotonic() > deadline:
                raise ClusterError(f"{host}:{port} did not accept connections within {timeout:g} s") from None
            time.sleep(0.02)


def netns_supported() -> str | None:
    """None when network namespaces can be created here, else why not (a skip reason)."""
    if not is_root():
        return "netns mode needs root (ip netns add)"
    if shutil.which("ip") is None or shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "netns mode needs iproute2 (ip), unshare and nsenter"
    probe = f"{NETNS_PREFIX}probe"
    proc = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"`ip netns add` does not work here: {proc.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _read_proc(pid: int, name: str) -> bytes:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as fh:
            return fh.read()
    except OSError:  # gone, or a kernel thread / other user's process we may not read
        return b""


def _environ(pid: int) -> dict[bytes, bytes]:
    out = {}
    for item in _read_proc(pid, "environ").split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key] = value
    return out


def _pids() -> Iterator[int]:
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            yield int(entry)


def _fd_target(pid: int, fd: int) -> bytes:
    try:
        return os.fsencode(os.readlink(f"/proc/{pid}/fd/{fd}"))
    except OSError:
        return b""


def cluster_pids(cluster_id: str | None = None) -> list[int]:
    """Live pids started by the fixture for that cluster (or for any cluster of this session).

    A process is ours when its environment carries the tag, or its command line or stderr names it:
    sshd writes its process title over its environment, but every sshd process of a node (the
    listener and each connection's) keeps stderr on the node's `sshd-<cluster id>.log`."""
    key, value = (b"ORCH_TEST_CLUSTER", cluster_id) if cluster_id else (b"ORCH_TEST_SESSION", SESSION_TAG)
    tag = value.encode()
    out = []
    for pid in _pids():
        if not _alive(pid):
            continue
        if (
            _environ(pid).get(key) == tag
            or names_tag(_read_proc(pid, "cmdline"), tag)
            or names_tag(_fd_target(pid, 2), tag)
        ):
            out.append(pid)
    return sorted(out)


def names_tag(text: bytes, tag: bytes) -> bool:
    """Whether `text` (a command line, a file path) names `tag`: an occurrence not followed by a
    digit. Cluster 1's tag `orchtest<pid>c1` is a prefix of cluster 12's, and a session's
    `orchtest<pid>` of a session whose pid extends it (the same care as `_root_links`): a plain
    substring test made cluster 1's reset kill cluster 12's sshds."""
    return re.search(re.escape(tag) + rb"(?!\d)", text) is not None


def _empty(directory: Path) -> None:
    """Remove what `directory` holds (a link itself, never what it points to); keep the directory."""
    for child in directory.iterdir():
        shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()


def kill_pids(pids: Sequence[int], grace: float = 3.0) -> None:
    """SIGTERM the given pids, SIGKILL whatever is still there after `grace` seconds."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if _alive(p)]
        time.sleep(0.05)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    stat = _read_proc(pid, "stat")
    if not stat:
        return False
    return stat.rsplit(b")", 1)[-1].split()[0] != b"Z"


def _stop_popen(proc: subprocess.Popen[bytes] | None, grace: float = 3.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Merge override into a copy of base: mappings recursively, a None value deletes the key."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# ----------------------------------------------------------------------------- keys


class KeyStore:
    """SSH keys generated once per test session: one client key, one host key per node index."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)

    def _key(self, name: str) -> Path:
        path = self.dir / name
        if not path.exists():
            _sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{SESSION_TAG}-{name}", "-f", str(path)])
        return path

    @property
    def client_key(self) -> Path:
        return self._key("client_ed25519")

    def host_key(self, index: int) -> Path:
        return self._key(f"host{index}_ed25519")

    def new_key(self, name: str) -> Path:
        """A fresh key pair outside the cluster's (e.g. a 'changed' host key or a wrong identity)."""
        return self._key(f"extra_{name}")


@contextlib.contextmanager
def _subnet_lock() -> Iterator[None]:
    with open(SUBNET_LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _used_subnets() -> set[int]:
    """Third octets of 198.18.X.0/24 already configured in the root namespace."""
    out = _sh(["ip", "-4", "-o", "addr", "show"], check=False).stdout
    used = set()
    for word in out.split():
        if word.startswith("198.18."):
            used.add(int(word.split(".")[2]))
    return used


# ----------------------------------------------------------------------------- the cluster


@dataclass
class TestNode:
    """One test node = one real OpenSSH sshd (plus its namespaces)."""

    __test__ = False  # not a pytest test class

    name: str
    host: str
    port: int
    addr: str
    netns: str | None
    local_dir: Path
    index: int = 0
    dir: Path = field(default_factory=Path)
    env: dict[str, str] = field(default_factory=dict)
    host_veth: str | None = None
    holder: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    sshd: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    extra_links: int = 0
    ifaces: list[str] = field(default_factory=list)
    """NICs `add_interface` gave the node (removed by `reset`)."""
    tmpfs: str = ""
    """The size its private tmpfs has now ("": no tmpfs; `resize_tmpfs` changes it, `reset` restores it)."""


class TestCluster:
    """N real sshd nodes, a chronyd, generated keys and known_hosts; see the module docstring."""

    __test__ = False  # not a pytest test class

    NODE_LOCAL = "/tmp/orch-node-local"

    def __init__(
        self,
        keys: KeyStore,
        n: int = 4,
        mode: Mode = "loopback",
        node_env: Mapping[str, Mapping[str, str]] | None = None,
        root: Path | None = None,
        rate: str | None = None,
        tmpfs: str | None = None,
        account: tuple[int, int] | None = None,
    ) -> None:
        if mode not in ("loopback", "netns"):
            raise ValueError(f"mode must be loopback or netns, not {mode!r}")
        if not 1 <= n <= 200:
            raise ValueError(f"n must be 1..200, got {n}")
        if rate is not None and mode != "netns":
            raise ValueError(f"rate={rate!r} needs mode='netns' (a loopback cluster has no ports to limit)")
        if rate is not None and not RATE_RE.match(rate):
            raise ValueError(f"rate={rate!r} is no tc rate: write it as 100mbit, 1gbit or 12.5mbps")
        if tmpfs is not None and not SIZE_RE.match(tmpfs):
            raise ValueError(f"tmpfs={tmpfs!r} is no tmpfs size: write it as 256m, 1g or 65536k")
        self.keys = keys
        self.mode: Mode = mode
        self.number = next(_cluster_ids)
        self.id = f"{SESSION_TAG}c{self.number}"
        self.root = root or Path(tempfile.mkdtemp(prefix=f"{self.id}-"))
        self.client_key = keys.client_key
        self.known_hosts = self.root / "known_hosts"
        self.home = self.root / "home"
        """The nodes' ``HOME`` unless ``node_env`` gives one (see the module docstring)."""
        self.python = sys.executable
        self.user = "root" if is_root() else getpass.getuser()
        self.ntp_server = ""
        self.subnet: int | None = None
        self.bridge: str | None = None
        self.chronyd: subprocess.Popen[bytes] | None = None
        self.nodes: list[TestNode] = []
        self._n = n
        self._node_env = {k: dict(v) for k, v in (node_env or {}).items()}
        self._private_fs = is_root() and shutil.which("unshare") is not None
        self._controller_dirs: list[Path] = []
        self._cpu_cgroups: dict[str, Path] = {}
        self.rate = rate
        """Every port's rate, both ways (netns; None: unlimited), see the module docstring."""
        self.tmpfs = tmpfs
        self.account = account
        """Every login's uid:gid (None: the user this runs as): a non-root SSH account, as a team's
        `train` user, made by sshd's ForceCommand dropping to it with setpriv (no account on this
        machine needed); the nodes' HOME and the run root are its own, `job.python` the system's
        python3 (this machine's interpreter may sit under root's private home)."""
        if account is not None:
            self.python = "/usr/bin/python3"
        """The size of each node's private tmpfs at ``NODE_LOCAL`` (None: its ``local_dir`` instead)."""
        self.controller_port: str | None = None
        """With ``rate``: the root namespace's end of the controller's port (it holds ``.254``)."""

    # -- lifecycle

    def start(self) -> TestCluster:
        """Create namespaces, start every sshd and chronyd; return once all of them answer."""
        try:
            if self.account is not None:
                self._own_dirs()
            if self.tmpfs is not None and not self._private_fs:
                raise ClusterError(f"tmpfs={self.tmpfs!r}: a node's private tmpfs needs root and unshare")
            if self.mode == "netns":
                reason = netns_supported()
                if reason:
                    raise ClusterError(reason)
                self._setup_bridge()
            if is_root():
                os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
            if self._private_fs:
                os.makedirs(self.NODE_LOCAL, exist_ok=True)  # the mount point in the root namespace
            self.home.mkdir(parents=True, exist_ok=True)  # a given root may not exist yet (the benchmarks')
            for i in range(1, self._n + 1):
                self.nodes.append(self._make_node(i))
            self._write_known_hosts()
            for node in self.nodes:
                self._start_holder(node)
                self._write_sshd_config(node)
                self._spawn_sshd(node)
            for node in self.nodes:
                self._wait_sshd_or_move(node)
            self._start_chronyd()
        except BaseException:
            self.stop()
            raise
        self._start_env = {n.name: dict(n.env) for n in self.nodes}
        _started[self.number] = self
        return self

    def reset(self) -> list[str]:
        """Make a started cluster what `start` left, for the next test that shares it: what the
        last test left on the nodes (login sessions, detached jobs, their children) killed; every
        node's sshd up with the environment it started with; known_hosts as written at start; the
        nodes' run root (`job.run_root`), private directories and home empty, controller
        directories gone; each private tmpfs empty at its start size; in netns mode every cable
        plugged in, no qdisc but the ports' own (`rate`), no extra NIC. Returns what it undid."""
        undone: list[str] = []
        undone += self._undo_cpu_quotas()
        infra = {p.pid for n in self.nodes for p in (n.sshd, n.holder) if p is not None and p.poll() is None}
        if self.chronyd is not None:
            infra.add(self.chronyd.pid)
        left = [p for p in cluster_pids(self.id) if p not in infra]
        if left:
            kill_pids(left)
            undone.append(f"killed {len(left)} processes")
        for node in self.nodes:
            want = self._start_env[node.name]
            if node.env != want or node.sshd is None or node.sshd.poll() is not None:
                node.env = dict(want)
                self._write_sshd_config(node)
                _stop_popen(node.sshd)
                self._spawn_sshd(node)
                self._wait_sshd(node)
                undone.append(f"{node.name}: sshd restarted as it started")
        self._write_known_hosts()
        for path in [self.root / "runs", *self._controller_dirs]:
            shutil.rmtree(path, ignore_errors=True)
        self._controller_dirs.clear()
        _empty(self.home)
        if self.account is not None:
            self._own_dirs()
        for node in self.nodes:
            _empty(node.local_dir)
            if node.tmpfs:
                _empty(self.node_path(node.name, self.NODE_LOCAL))
                if node.tmpfs != self.tmpfs:
                    self.resize_tmpfs(node.name, str(self.tmpfs))
                    undone.append(f"{node.name}: tmpfs back to {self.tmpfs}")
            if node.netns is not None:
                self.link_up(node.name)
                self.netem(node.name, "")
                self.tbf(node.name, "")
                for ifname in node.ifaces:
                    _sh(["ip", "-n", node.netns, "link", "del", ifname], check=False)
                node.ifaces.clear()
        if self.mode == "netns":
            for link in self._root_links("p"):  # the outside ends of add_interface's veths
                _sh(["ip", "link", "del", link], check=False)
        return undone

    def stop(self) -> None:
        """Stop everything this cluster started (sshd, sessions, detached jobs, chronyd, namespaces)."""
        _started.pop(self.number, None)
        self._undo_cpu_quotas()
        for node in self.nodes:
            _stop_popen(node.sshd)
        _stop_popen(self.chronyd)
        # whatever login sessions started, detached grandchildren included, then the holders
        holders = {n.holder.pid for n in self.nodes if n.holder is not None}
        kill_pids([p for p in cluster_pids(self.id) if p not in holders])
        for node in self.nodes:
            _stop_popen(node.holder)
        for path in self._controller_dirs:
            shutil.rmtree(path, ignore_errors=True)
        if self.mode == "netns":
            for node in self.nodes:
                if node.netns:
                    _sh(["ip", "netns", "del", node.netns], check=False)
            for link in self._root_links():
                _sh(["ip", "link", "del", link], check=False)

    def daemons(self) -> list[int]:
        """The pids of the daemons that outlive a test (every sshd and namespace holder, chronyd):
        whatever a test's logins start descends from them."""
        procs = [p for n in self.nodes for p in (n.sshd, n.holder)] + [self.chronyd]
        return [p.pid for p in procs if p is not None and p.poll() is None]

    def __enter__(self) -> TestCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- node setup

    def _own_dirs(self) -> None:
        """With `account`: the cluster's root enterable by it (0711), its HOME and run root its own
        (0700, as an account's are)."""
        assert self.account is not None
        self.root.chmod(0o711)
        for d in (self.home, self.root / "runs"):
            d.mkdir(parents=True, exist_ok=True)
            os.chown(d, *self.account)
            d.chmod(0o700)

    def _make_node(self, i: int) -> TestNode:
        name = f"node{i}"
        ndir = self.root / name
        local = ndir / "local"
        local.mkdir(parents=True, exist_ok=True)
        if self.mode == "netns":
            host, port, netns = f"198.18.{self.subnet}.{i}", 22, f"{NETNS_PREFIX}{self.number}-{name}"
        else:
            host = f"127.0.1.{i}"
            host, port, netns = host, free_port(host), None
        env = {
            "ORCH_TEST_SESSION": SESSION_TAG,
            "ORCH_TEST_CLUSTER": self.id,
            "ORCH_TEST_NODE": name,
            "HOME": str(self.home),
        }
        env.update(self._node_env.get(name, {}))
        node = TestNode(
            name=name, host=host, port=port, addr=host, netns=netns, local_dir=local, index=i, dir=ndir, env=env
        )
        if netns:
            self._setup_netns(node)
        return node

    def _daemon_env(self, node: TestNode | None = None) -> dict[str, str]:
        """Environment of the daemons we start: tagged so stop/leftovers can find them and their children."""
        env = dict(os.environ)
        env.update({"ORCH_TEST_SESSION": SESSION_TAG, "ORCH_TEST_CLUSTER": self.id})
        if node is not None:
            env["ORCH_TEST_NODE"] = node.name
        return env

    def _setup_bridge(self) -> None:
        self.bridge = f"{LINK_PREFIX}{self.number}b"
        with _subnet_lock():
            used = _used_subnets()
            free = [s for s in range(256) if s not in used]
            if not free:
                raise ClusterError("no free 198.18.X.0/24 subnet for the test bridge")
            self.subnet = free[0]
            _sh(["ip", "link", "add", self.bridge, "type", "bridge"])
            holder = self.bridge
            if self.rate is not None:  # the controller's own port: a veth into the bridge, limited both ways
                holder, port = f"{LINK_PREFIX}{self.number}c", f"{LINK_PREFIX}{self.number}d"
                self.controller_port = holder
                _sh(["ip", "link", "add", holder, "type", "veth", "peer", "name", port])
                _sh(["ip", "link", "set", port, "master", self.bridge])
                _sh(["ip", "link", "set", port, "up"])
                self._port_tbf(holder)
                self._port_tbf(port)
            _sh(["ip", "addr", "add", f"198.18.{self.subnet}.254/24", "dev", holder])
            _sh(["ip", "link", "set", holder, "up"])
            _sh(["ip", "link", "set", self.bridge, "up"])

    def _port_tbf(self, dev: str, netns: str | None = None) -> None:
        """The bed's token bucket (`rate`, `PORT_TBF`) on what `dev` sends (in that namespace)."""
        assert self.rate is not None
        tc = ["tc", "-n", netns] if netns else ["tc"]
        _sh([*tc, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", self.rate, *PORT_TBF])

    def _setup_netns(self, node: TestNode) -> None:
        assert node.netns and self.bridge
        host_if, tmp_if = f"{LINK_PREFIX}{self.number}h{node.index}", f"{LINK_PREFIX}{self.number}n{node.index}"
        node.host_veth = host_if
        _sh(["ip", "netns", "add", node.netns])
        _sh(["ip", "link", "add", host_if, "type", "veth", "peer", "name", tmp_if])
        _sh(["ip", "link", "set", tmp_if, "netns", node.netns])
        ns = ["ip", "-n", node.netns]
        _sh(ns + ["link", "set", tmp_if, "name", "eth0"])
        _sh(ns + ["addr", "add", f"{node.host}/24", "dev", "eth0"])
        _sh(ns + ["link", "set", "eth0", "up"])
        _sh(ns + ["link", "set", "lo", "up"])
        _sh(["ip", "link", "set", host_if, "master", self.bridge])
        _sh(["ip", "link", "set", host_if, "up"])
        if self.rate is not None:  # both ends: what the node receives, what it sends
            self._port_tbf(host_if)
            self._port_tbf("eth0", node.netns)

    def _start_holder(self, node: TestNode) -> None:
        """The process that owns the node's mount (and UTS) namespace for the cluster's lifetime."""
        if not self._private_fs and node.netns is None:
            return
        # netns: what `ip netns exec` does (the namespace's own sysfs on /sys, so /sys/class/net lists
        # the node's NICs), but with this machine's cgroup mounts kept under /sys/fs/cgroup (moved
        # aside and back), which a container runtime on the node needs (runc: "no cgroup mount
        # found in mountinfo"); the holder is in the network namespace before it says ready
        script = (
            'set -e; if [ -n "$3" ]; then hostname "$3"; fi; '
            'if [ -n "$6" ]; then mount -t tmpfs -o "size=$6,mode=1777" orch-node "$2"; '
            'elif [ -n "$1" ]; then mount --bind "$1" "$2"; fi; echo ready; exec sleep 2147483647'
        )
        if node.netns:
            script = (
                'set -e; mkdir -p "$5"; mount --rbind /sys/fs/cgroup "$5"; '
                'nsenter --net="$4" mount -t sysfs -o nosuid,nodev,noexec sysfs /sys; '
                'mount --rbind "$5" /sys/fs/cgroup; umount -l "$5"; '
                f'exec nsenter --net="$4" sh -c {shlex.quote(script)} holder "$@"'
            )
        argv: list[str] = ["unshare", "--mount", "--propagation", "private"]
        if node.netns:
            argv += ["--uts"]
        argv += [
            "--",
            "sh",
            "-c",
            script,
            "holder",
            str(node.local_dir) if self._private_fs else "",
            self.NODE_LOCAL,
            node.name if node.netns else "",
            f"/run/netns/{node.netns}" if node.netns else "",
            str(self.root / f"cgroup-{node.name}"),
            self.tmpfs or "",
        ]
        holder = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._daemon_env(node),
            start_new_session=True,
        )
        node.holder = holder
        assert holder.stdout is not None
        if holder.stdout.readline().strip() != b"ready":
            err = holder.stderr.read().decode(errors="replace") if holder.stderr else ""
            holder.wait(5)
            raise ClusterError(f"{node.name}: could not set up its namespaces: {err.strip()}")
        node.tmpfs = self.tmpfs or ""

    def _enter(self, node: TestNode) -> list[str]:
        """argv prefix that runs a command inside the node's namespaces (empty: this machine as is)."""
        if node.holder is None:
            return []
        flags = ["-m", "-u", "-n"] if node.netns else ["-m"]
        return ["nsenter", "-t", str(node.holder.pid), *flags, "--"]

    def _write_known_hosts(self) -> None:
        lines = []
        for node in self.nodes:
            pub = Path(str(self.keys.host_key(node.index)) + ".pub").read_text().split()
            name = node.host if node.port == 22 else f"[{node.host}]:{node.port}"
            lines.append(f"{name} {pub[0]} {pub[1]}\n")
        self.known_hosts.write_text("".join(lines))

    def _sshd_log_path(self, node: TestNode) -> Path:
        return node.dir / f"sshd-{self.id}.log"

    def _sshd_config(self, node: TestNode) -> Path:
        """Named after the cluster id: the listener's command line then says whose it is."""
        return node.dir / f"sshd-{self.id}.conf"

    def _write_sshd_config(self, node: TestNode) -> None:
        for key, value in node.env.items():
            if '"' in value or "\n" in value or "\r" in value:
                raise ValueError(f"{node.name}: SetEnv cannot carry {key}={value!r} (no quotes or newlines)")
        setenv = " ".join(f'"{k}={v}"' for k, v in node.env.items())
        listen = node.host if node.netns is None else "0.0.0.0"
        conf = f"""\
# sshd of test node {node.name} (cluster {self.id})
Port {node.port}
ListenAddress {listen}
HostKey {self.keys.host_key(node.index)}
PidFile {node.dir / "sshd.pid"}
AuthorizedKeysFile {self.client_key}.pub
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
X11Forwarding no
AllowTcpForwarding yes
MaxSessions 100
MaxStartups 100:30:200
LogLevel INFO
Subsystem sftp internal-sftp
SetEnv {setenv}
"""
        if self.account is not None:
            uid, gid = self.account
            conf += (
                f"ForceCommand exec {SETPRIV} --reuid={uid} --regid={gid} --clear-groups -- "
                '/bin/sh -c "$SSH_ORIGINAL_COMMAND"\n'
            )
        self._sshd_config(node).write_text(conf)

    def _spawn_sshd(self, node: TestNode) -> None:
        # sshd must be started by absolute path (it re-execs itself); nsenter execs it in place,
        # so the Popen pid is sshd's own.
        with open(self._sshd_log_path(node), "ab") as log:
            node.sshd = subprocess.Popen(
                self._enter(node) + [SSHD, "-D", "-e", "-f", str(self._sshd_config(node))],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self._daemon_env(node),
                start_new_session=True,
            )

    def _wait_sshd(self, node: TestNode) -> None:
        proc = node.sshd
        assert proc is not None
        try:
            wait_port(node.host, node.port, 15, alive=lambda: proc.poll() is None)
        except ClusterError as exc:
            raise ClusterError(f"{node.name}: sshd failed: {exc}\n{self.sshd_log(node)[-2000:]}") from None

    def _wait_sshd_or_move(self, node: TestNode, tries: int = 3) -> None:
        """Wait for a fresh sshd; in loopback mode a port taken meanwhile by someone else
        (free_port has a race) moves the node to another free port."""
        for attempt in range(tries):
            try:
                self._wait_sshd(node)
                return
            except ClusterError:
                if (
                    node.netns is not None
                    or attempt == tries - 1
                    or "Address already in use" not in self.sshd_log(node)
                ):
                    raise
            node.port = free_port(node.host)
            self._write_known_hosts()
            self._write_sshd_config(node)
            self._spawn_sshd(node)

    def sshd_log(self, node: str | TestNode) -> str:
        """The node's sshd log (stderr of `sshd -D -e`), for failure messages."""
        n = self.node(node) if isinstance(node, str) else node
        try:
            return self._sshd_log_path(n).read_text(errors="replace")
        except OSError:
            return ""

    def _start_chronyd(self) -> None:
        """A real chronyd serving this machine's clock at local stratum 8 on an unprivileged port."""
        bind = "127.0.0.1" if self.mode == "loopback" else f"198.18.{self.subnet}.254"
        port = free_port(bind, socket.SOCK_DGRAM)
        cdir = self.root / "chrony"
        cdir.mkdir(exist_ok=True)
        (cdir / "chrony.conf").write_text(
            f"port {port}\nbindaddress {bind}\nlocal stratum 8\nallow 127.0.0.0/8\nallow 198.18.0.0/15\n"
            # its command socket stays in our tmp dir: the default /run/chrony/chronyd.sock would make
            # every `chronyc` on this machine (and on the test nodes) talk to this test server
            f"cmdport 0\nbindcmdaddress {cdir / 'chronyd.sock'}\n"
            f"pidfile {cdir / 'chronyd.pid'}\ndriftfile {cdir / 'drift'}\n"
        )
        argv = [CHRONYD, "-x", "-d", "-f", str(cdir / "chrony.conf")]
        if is_root():
            argv += ["-u", "root"]  # keep root: the pid/drift files live in our private tmp dir
        with open(cdir / "chronyd.log", "ab") as log:
            self.chronyd = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self._daemon_env(), start_new_session=True
            )
        self.ntp_server = f"{bind}:{port}"
        self._wait_ntp(bind, port, cdir)

    def _wait_ntp(self, host: str, port: int, cdir: Path) -> None:
        import ntplib

        deadline = time.monotonic() + 10
        while True:
            try:
                ntplib.NTPClient().request(host, port=port, version=3, timeout=0.5)
                return
            except (ntplib.NTPException, OSError):
                if self.chronyd is None or self.chronyd.poll() is not None or time.monotonic() > deadline:
                    log = (cdir / "chronyd.log").read_text(errors="replace")
                    raise ClusterError(f"chronyd did not answer NTP on {host}:{port}:\n{log[-2000:]}") from None
                time.sleep(0.05)

    # -- API used by tests

    def controller_dir(self, name: str) -> Path:
        """A new empty directory `NODE_LOCAL/<cluster id>-<name>` on this machine (the controller)
        that no node can see: each node's NODE_LOCAL is its own private directory, empty at start.
        Removed at `stop`. Raises ClusterError where nodes cannot have private directories (not root)."""
        if not self._private_fs:
            raise ClusterError("private node directories need root and unshare (mount namespaces)")
        path = Path(self.NODE_LOCAL) / f"{self.id}-{name}"
        path.mkdir(parents=True)
        self._controller_dirs.append(path)
        return path

    def node_path(self, node: str, path: str | os.PathLike[str]) -> Path:
        """Where this machine reads and writes the absolute `path` as that node sees it (its private
        `NODE_LOCAL` or tmpfs included): ``/proc/<holder>/root/<path>``. Only while the node runs."""
        n = self.node(node)
        if n.holder is None or n.holder.poll() is not None:
            raise ClusterError(f"{node}: no namespace holder (not root, or stopped): its files are this machine's")
        if not os.path.isabs(path):
            raise ValueError(f"node_path needs an absolute path, not {os.fspath(path)!r}")
        return Path(f"/proc/{n.holder.pid}/root") / os.fspath(path).lstrip("/")

    def resize_tmpfs(self, node: str, size: str) -> None:
        """Give that node's private tmpfs (`tmpfs`) another size (`mount -o remount,size=SIZE`): a
        size below what it holds fails with the kernel's reason; `reset` restores the cluster's."""
        n = self.node(node)
        if not n.tmpfs:
            raise ClusterError(f"{node}: no private tmpfs (start the cluster with tmpfs=SIZE)")
        if not SIZE_RE.match(size):
            raise ValueError(f"{size!r} is no tmpfs size: write it as 256m, 1g or 65536k")
        _sh([*self._enter(n), "mount", "-o", f"remount,size={size}", self.NODE_LOCAL])
        n.tmpfs = size

    def node(self, name: str) -> TestNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no test node {name!r} (have {', '.join(n.name for n in self.nodes)})")

    def write_inventory(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        job: Mapping[str, Any] | None = None,
        env: Mapping[str, Any] | None = None,
        checks: Mapping[str, Any] | None = None,
        master: Mapping[str, Any] | None = None,
        nodes_extra: Mapping[str, Mapping[str, Any]] | None = None,
        only: Sequence[str] | None = None,
        **top: Any,
    ) -> Path:
        """Write a valid inventory for this cluster, deep-merging the overrides (None deletes a key);
        with `only`, of those nodes alone (a scenario that needs no more: each node is a torchrun
        and its ranks, seconds of CPU on this 2-core machine)."""
        unknown = set(only or ()) - {n.name for n in self.nodes}
        assert not unknown, f"no node {sorted(unknown)} in this cluster"
        nodes = []
        for n in self.nodes:
            if only is not None and n.name not in only:
                continue
            entry: dict[str, Any] = {"host": n.host, "name": n.name, "addr": n.addr}
            if n.port != 22:
                entry["port"] = n.port
            nodes.append(deep_merge(entry, (nodes_extra or {}).get(n.name, {})))
        doc: dict[str, Any] = {
            "name": f"tc{self.number}-{self.mode}",
            "transport": "ssh",
            "ssh": {
                "user": self.user,
                "identity": str(self.client_key),
                "known_hosts": str(self.known_hosts),
                "host_key_policy": "strict",
                "connect_timeout": 5,
                "ssh_config": str(self.root / "no-ssh-config"),
            },
            "nodes": nodes,
            "checks": {"clock": {"ntp_server": self.ntp_server}},
            "job": {"python": self.python, "run_root": str(self.root / "runs")},
        }
        for key, value in (("job", job), ("env", env), ("checks", checks), ("master", master)):
            if value is not None:
                doc = deep_merge(doc, {key: value})
        doc = deep_merge(doc, top)
        target = Path(path) if path is not None else self.root / "inventory.yaml"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(doc, sort_keys=False))
        return target

    def set_env(self, node: str, **env: str) -> None:
        """Add/replace SetEnv variables of that node's sshd and restart it (new logins see them)."""
        n = self.node(node)
        n.env.update({k: str(v) for k, v in env.items()})
        self._write_sshd_config(n)
        self.stop_node(node)
        self.start_node(node)

    def unset_env(self, node: str, *names: str) -> None:
        """Remove SetEnv variables of that node and restart its sshd."""
        n = self.node(node)
        for name in names:
            n.env.pop(name, None)
        self._write_sshd_config(n)
        self.stop_node(node)
        self.start_node(node)

    def skew_clock(self, node: str, offset: str) -> None:
        """Make every process of new logins on that node see its clock shifted (libfaketime, e.g. "+2s").

        Only the wall clock moves (FAKETIME_DONT_FAKE_MONOTONIC): timeouts and sleeps keep working."""
        self.set_env(node, LD_PRELOAD=FAKETIME_LIB, FAKETIME=offset, FAKETIME_DONT_FAKE_MONOTONIC="1")

    def stop_node(self, node: str) -> None:
        """Stop that node's sshd listener (like `systemctl stop ssh`: open sessions keep running)."""
        n = self.node(node)
        _stop_popen(n.sshd)
        n.sshd = None

    def start_node(self, node: str) -> None:
        """Start that node's sshd again and wait until it accepts connections."""
        n = self.node(node)
        if n.sshd is not None and n.sshd.poll() is None:
            return
        self._spawn_sshd(n)
        self._wait_sshd(n)

    CPU_CGROUP_ROOT = Path("/sys/fs/cgroup/cpu")
    """The cgroup v1 `cpu` controller (`cpu.cfs_quota_us`) where `cpu_quota` makes a node slow."""

    def cpu_quota(self, node: str, percent: float) -> None:
        """Make that node slow: its sshd and every process already running on it (a job's agent,
        torchrun and ranks), and so whatever they start from now on, share `percent` % of one
        CPU (a cgroup v1 `cpu` group with `cpu.cfs_quota_us`). `reset` (and `stop`) move them
        back and remove the group. Root only; a kernel without the v1 `cpu` controller skips."""
        n = self.node(node)
        if not is_root():
            missing("a CPU quota needs root (cgroup v1 cpu controller)")
        if not (self.CPU_CGROUP_ROOT / "cpu.cfs_quota_us").exists():
            kernel_limit(f"no cgroup v1 cpu controller at {self.CPU_CGROUP_ROOT}")
        if n.sshd is None or n.sshd.poll() is not None:
            raise ClusterError(f"{node}: sshd is not running")
        # inside the group the node is in now (the session's CPU lane, tests/lanes.py), so the quota
        # caps a node that otherwise competes as its lane does
        group = self._cpu_cgroups.get(node) or (lane_of(n.sshd.pid) or self.CPU_CGROUP_ROOT) / f"{self.id}-{node}"
        group.mkdir(exist_ok=True)
        self._cpu_cgroups[node] = group
        (group / "cpu.cfs_period_us").write_text("100000\n")
        (group / "cpu.cfs_quota_us").write_text(f"{max(1000, round(percent * 1000))}\n")
        holder = n.holder.pid if n.holder is not None else None
        for pid in [n.sshd.pid, *(p for p in self.processes(node, "") if p not in (n.sshd.pid, holder))]:
            with contextlib.suppress(OSError):  # gone meanwhile
                (group / "cgroup.procs").write_text(f"{pid}\n")

    def _undo_cpu_quotas(self) -> list[str]:
        undone = []
        for node, group in list(self._cpu_cgroups.items()):
            for _ in range(50):  # tasks may fork while they are moved: until the group is empty
                try:
                    pids = (group / "cgroup.procs").read_text().split()
                except OSError:
                    break
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(OSError):
                        (group.parent / "cgroup.procs").write_text(f"{pid}\n")
            with contextlib.suppress(OSError):
                group.rmdir()
            del self._cpu_cgroups[node]
            undone.append(f"{node}: CPU quota removed")
        return undone

    def _need_netns(self, what: str) -> TestNode:
        raise ClusterError(f"{what} needs netns mode (this cluster is {self.mode})")

    def link_down(self, node: str) -> None:
        """Pull the node's cable: its bridge port goes down, packets to and from it are lost."""
        n = self.node(node)
        if n.host_veth is None:
            self._need_netns("link_down")
        _sh(["ip", "link", "set", str(n.host_veth), "down"])

    def link_up(self, node: str) -> None:
        """Plug the node's cable back in."""
        n = self.node(node)
        if n.host_veth is None:
            self._need_netns("link_up")
        _sh(["ip", "link", "set", str(n.host_veth), "up"])

    def netem(self, node: str, spec: str) -> None:
        """`tc qdisc replace dev eth0 root netem SPEC` on the node (e.g. "delay 200ms"); "" removes it
        (with a `rate`, it puts the port's bucket back: netem replaces it while set).

        Raises `NetemUnsupported` when the kernel lacks sch_netem (tests turn that into a skip)."""
        n = self.node(node)
        if n.netns is None:
            self._need_netns("netem")
        base = ["ip", "netns", "exec", str(n.netns), "tc", "qdisc"]
        if not spec.strip():
            if self.rate is not None:
                self._port_tbf("eth0", n.netns)
            else:
                _sh(base + ["del", "dev", "eth0", "root"], check=False)
            return
        proc = _sh(base + ["replace", "dev", "eth0", "root", "netem", *spec.split()], check=False)
        if proc.returncode != 0:
            if "unknown" in proc.stderr.lower() or "not supported" in proc.stderr.lower():
                raise NetemUnsupported(
                    f"this kernel has no tc netem qdisc (CONFIG_NET_SCH_NETEM): {proc.stderr.strip()}"
                )
            raise ClusterError(f"netem {spec!r} on {node}: {proc.stderr.strip()}")

    def tbf(self, node: str, rate: str) -> None:
        """Limit what the node receives to `rate` (e.g. "50mbit"): a token bucket on the bridge side
        of its veth (`tc qdisc replace dev <host veth> root tbf rate RATE burst 64kb latency 50ms`;
        tbf works in kernels without netem). "" removes it (with the cluster's `rate`, it puts the
        port's own bucket back)."""
        n = self.node(node)
        if n.host_veth is None:
            self._need_netns("tbf")
        if not rate:
            if self.rate is not None:
                self._port_tbf(str(n.host_veth))
            else:
                _sh(["tc", "qdisc", "del", "dev", str(n.host_veth), "root"], check=False)
            return
        _sh(
            [
                "tc",
                "qdisc",
                "replace",
                "dev",
                str(n.host_veth),
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                "64kb",
                "latency",
                "50ms",
            ]
        )

    def add_interface(self, node: str, ifname: str, ipv4_cidr: str, up: bool = True) -> None:
        """Give the node one more NIC named ifname (a dummy, or a veth whose peer stays outside)."""
        n = self.node(node)
        if n.netns is None:
            self._need_netns("add_interface")
        if len(ifname) > 15:
            raise ValueError(f"interface name {ifname!r} is longer than 15 characters")
        ns = ["ip", "-n", str(n.netns)]
        if _sh(ns + ["link", "add", ifname, "type", "dummy"], check=False).returncode != 0:
            # kernels without the dummy driver: a veth pair, one end renamed inside the node
            n.extra_links += 1
            peer = f"{LINK_PREFIX}{self.number}p{n.index}{n.extra_links}"[:15]
            tmp = f"{LINK_PREFIX}{self.number}q{n.index}{n.extra_links}"[:15]
            _sh(["ip", "link", "add", peer, "type", "veth", "peer", "name", tmp])
            _sh(["ip", "link", "set", tmp, "netns", str(n.netns)])
            _sh(ns + ["link", "set", tmp, "name", ifname])
            _sh(["ip", "link", "set", peer, "up"])
        n.ifaces.append(ifname)
        _sh(ns + ["addr", "add", ipv4_cidr, "dev", ifname])
        if up:
            _sh(ns + ["link", "set", ifname, "up"])

    def exec(self, node: str, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run argv "on" the node (its namespaces and SetEnv environment), not over SSH."""
        n = self.node(node)
        env = dict(os.environ)
        env.update(n.env)
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 60)
        kw.setdefault("env", env)
        return subprocess.run(self._enter(n) + list(argv), **kw)

    def processes(self, node: str, marker: str) -> list[int]:
        """Pids on that node whose environment or command line contains marker (e.g. a run id)."""
        n = self.node(node)
        want = marker.encode()
        ns_inode = self._netns_inode(n)
        out = []
        for pid in _pids():
            env_raw = _read_proc(pid, "environ")
            if not env_raw:
                continue
            env = _environ(pid)
            on_node = (
                env.get(b"ORCH_TEST_CLUSTER") == self.id.encode() and env.get(b"ORCH_TEST_NODE") == n.name.encode()
            )
            if not on_node and ns_inode is not None:
                on_node = self._netns_inode_of(pid) == ns_inode
            if on_node and (want in env_raw or want in _read_proc(pid, "cmdline")):
                out.append(pid)
        return sorted(out)

    def _netns_inode(self, node: TestNode) -> int | None:
        if node.netns is None or node.holder is None:
            return None
        return self._netns_inode_of(node.holder.pid)

    @staticmethod
    def _netns_inode_of(pid: int) -> int | None:
        try:
            return os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:
            return None

    def _root_links(self, kinds: str = "bcdhnpq") -> list[str]:
        """This cluster's links in the root namespace: its bridge (b), the controller's port (c, d),
        the nodes' veths (h, n) and add_interface's (p, q); cluster 1's prefix is also cluster 12's,
        so the kind letter must follow."""
        mine = re.compile(rf"^{re.escape(LINK_PREFIX)}{self.number}[{kinds}]\d*$")
        out = _sh(["ip", "-o", "link", "show"], check=False).stdout
        names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
        return [nm for nm in names if mine.match(nm)]


class NetemUnsupported(ClusterError):
    """The kernel cannot emulate delay/loss (no sch_netem)."""


def daemon_pids() -> list[int]:
    """The daemons of every cluster this process has started and not stopped (`TestCluster.daemons`)."""
    return [pid for c in list(_started.values()) for pid in c.daemons()]


def reap_stale_networks() -> list[str]:
    """Delete namespaces and links of earlier test sessions whose pytest process is gone
    (killed before its teardown ran), so they do not pile up or hold 198.18.X subnets."""
    if not is_root() or shutil.which("ip") is None:
        return []
    removed = []
    for line in _sh(["ip", "netns", "list"], check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) > 2 and parts[0] == "orch" and parts[1].isdigit() and not pid_alive(int(parts[1])):
            _sh(["ip", "netns", "del", name], check=False)
            removed.append(f"network namespace {name}")
    for line in _sh(["ip", "-o", "link", "show"], check=False).stdout.splitlines():
        if ":" not in line:
            continue
        name = line.split(":")[1].strip().split("@")[0]
        m = re.match(r"^o(\d+)x\d+[bcdhnpq]\d*$", name)
        if m and not pid_alive(int(m.group(1))) and _sh(["ip", "link", "del", name], check=False).returncode == 0:
            removed.append(f"link {name}")
    return removed


def leftovers() -> list[str]:
    """What this pytest session started and did not stop: processes, namespaces, links."""
    found = []
    for pid in cluster_pids():
        cmd = _read_proc(pid, "cmdline").replace(b"\0", b" ").decode(errors="replace").strip()
        found.append(f"process {pid}: {cmd}")
    if shutil.which("ip") and is_root():
        for line in _sh(["ip", "netns", "list"], check=False).stdout.splitlines():
            if line.startswith(NETNS_PREFIX):
                found.append(f"network namespace {line.split()[0]}")
        for line in _sh(["ip", "-o", "link", "show"], check=False).stdout.splitlines():
            if ":" in line:
                name = line.split(":")[1].strip().split("@")[0]
                if name.startswith(LINK_PREFIX):
                    found.append(f"link {name}")
    return found
