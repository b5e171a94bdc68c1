"""Transports: the only module that imports fabric/paramiko or starts processes for a node.

Every command is an argv list; it is turned into one shell line exactly once, in
`command_line()` (`shlex.join`), so env values and arguments reach the node byte for byte.
`SSHTransport` uses one connection per node (never a shared ThreadingGroup): Fabric's
`Connection` where an ssh config file applies, else the same on bare paramiko (`_Direct`);
`LocalTransport` runs the same line under `/bin/sh -c` on this machine, so both transports
exercise the same quoting.

Host keys are always verified: `strict` refuses an unknown or changed key, `accept-new`
records unknown keys in `known_hosts`. There is deliberately no option that skips verification.
"""

from __future__ import annotations

import errno
import fcntl
import getpass
import logging
import os
import select
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from .config.inventory import Inventory, Node
from .errors import RemoteCommandFailed, TransportError

log = logging.getLogger("orch.transport")
T = TypeVar("T")


@dataclass(frozen=True)
class Result:
    """What a finished command left: exit code, both streams, and how long it took."""

    node: str
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    elapsed_ms: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def check(self) -> Result:
        """Return self, or raise RemoteCommandFailed with the stderr tail."""
        if not self.ok:
            raise RemoteCommandFailed(self.node, self.argv, self.exit_code, self.stderr.splitlines()[-10:])
        return self


def shell_path(path: str) -> str:
    """Quote a path for the remote shell, keeping a leading `~/` meaning the login's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def command_line(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
    """The one place argv becomes a shell line: `cd DIR && exec env -- K=V ... argv`."""
    if not argv:
        raise ValueError("empty argv")
    parts = []
    if cwd:
        parts.append(f"cd {shell_path(cwd)} &&")
    if env:
        parts.append("exec env -- " + shlex.join([f"{k}={v}" for k, v in env.items()] + list(argv)))
    else:
        parts.append("exec " + shlex.join(argv))
    return " ".join(parts)


class Process:
    """A command still running on a node, its stdout+stderr merged into one byte stream."""

    stdout: IO[bytes]

    def poll(self) -> int | None:  # pragma: no cover - interface
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> int | None:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - interface
        """Stop reading; end the command's session (SSH channel closed / local process killed)."""
        raise NotImplementedError

    def lines(self) -> Iterator[bytes]:
        """Yield output lines (with their newline) until the stream ends."""
        yield from iter(self.stdout.readline, b"")

    def write(self, data: bytes) -> None:
        """Send data to the command's stdin (only for `popen(..., keep_stdin=True)`)."""
        raise NotImplementedError

    def close_stdin(self) -> None:
        """End the command's stdin (EOF); the command keeps running."""
        raise NotImplementedError


class Transport:
    """Run commands on one node. Subclasses implement `connect`, `_exec`, `popen`, `close`."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def connect(self) -> float:
        """Open the connection if needed; return how long that took in ms (0 when already open)."""
        raise NotImplementedError

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
            stdin: bytes | None = None, timeout: float | None = None) -> Result:
        """Run argv to completion; never raises for a non-zero exit (see `Result.check`)."""
        line = command_line(argv, env, cwd)
        log.debug("%s$ %s", self.node.name, line)
        start = time.monotonic()
        code, out, err = self._exec(line, stdin, timeout)
        elapsed = (time.monotonic() - start) * 1000
        return Result(self.node.name, tuple(argv), code, out.decode("utf-8", "replace"),
                      err.decode("utf-8", "replace"), elapsed)

    def popen(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | None = None, keep_stdin: bool = False) -> Process:
        """Start argv, stdout+stderr merged into one stream; stdin is closed at once unless
        `keep_stdin` (then `Process.write` talks to the command while it runs)."""
        raise NotImplementedError

    def put(self, data: bytes, path: str, mode: int = 0o600) -> None:
        """Write `data` to `path` on the node (parents created, private by default)."""
        script = ('p="$1"; case "$p" in "~/"*) p="$HOME/${p#"~/"}";; esac; '
                  'umask 077; mkdir -p "$(dirname "$p")" && cat > "$p.tmp.$$" && chmod "$2" "$p.tmp.$$" '
                  '&& mv -f "$p.tmp.$$" "$p"')
        self.run(["sh", "-c", script, "orch-put", path, format(mode, "o")], stdin=data, timeout=60).check()

    def close(self) -> None:
        pass

    def _exec(self, line: str, stdin: bytes | None, timeout: float | None) -> tuple[int, bytes, bytes]:
        raise NotImplementedError

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------- local


class _LocalProcess(Process):
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        assert proc.stdout is not None
        self.stdout = proc.stdout

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def write(self, data: bytes) -> None:
        if self.proc.stdin is None:
            raise ValueError("stdin was not kept open (popen keep_stdin=False)")
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.close_stdin()
        self.stdout.close()


class LocalTransport(Transport):
    """Nodes that are processes on this machine (`transport: local`). Commands start in $HOME,
    like an SSH login, through `/bin/sh -c` with the same command line SSH would send."""

    def connect(self) -> float:
        return 0.0

    def _exec(self, line: str, stdin: bytes | None, timeout: float | None) -> tuple[int, bytes, bytes]:
        proc = subprocess.Popen(["/bin/sh", "-c", line], cwd=os.path.expanduser("~"),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            out, err = proc.communicate(stdin or b"", timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.communicate()
            raise TransportError(self.node.name, "timeout", f"command timed out after {timeout:.0f} s") from None
        return proc.returncode, out, err

    def popen(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | None = None, keep_stdin: bool = False) -> Process:
        line = command_line(argv, env, cwd)
        log.debug("%s$ %s", self.node.name, line)
        proc = subprocess.Popen(["/bin/sh", "-c", line], cwd=os.path.expanduser("~"),
                                stdin=subprocess.PIPE if keep_stdin else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        return _LocalProcess(proc)


# ----------------------------------------------------------------------------- ssh


class _SSHProcess(Process):
    def __init__(self, chan: Any) -> None:
        self.chan = chan
        self.stdout = chan.makefile("rb")

    def poll(self) -> int | None:
        return int(self.chan.recv_exit_status()) if self.chan.exit_status_ready() else None

    def wait(self, timeout: float | None = None) -> int | None:
        if self.chan.status_event.wait(timeout):
            return int(self.chan.recv_exit_status())
        return None

    def write(self, data: bytes) -> None:
        self.chan.sendall(data)

    def close_stdin(self) -> None:
        self.chan.shutdown_write()

    def close(self) -> None:
        self.chan.close()


def _known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


class SSHTransport(Transport):
    """One SSH connection to one node; safe to use from one thread at a time for `run`,
    while `popen` streams may run beside it (paramiko multiplexes channels)."""

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self._conn: Any = None
        self._lock = threading.Lock()

    def _connection(self, host: str, for_gateway: bool = False) -> Any:
        """A Connection (not yet open) to `host` with this node's SSH options: Fabric's where an
        ssh config file applies (aliases, ProxyJump, Match), else `_Direct` on bare paramiko."""
        opts = self.node.ssh
        cfg_path = os.path.expanduser(opts.ssh_config) if opts.ssh_config else None
        kwargs: dict[str, Any] = {"banner_timeout": opts.connect_timeout, "auth_timeout": opts.connect_timeout}
        if opts.identity:
            kwargs["key_filename"] = [os.path.expanduser(opts.identity)]
        gateway = None
        if opts.gateway and not for_gateway:
            gateway = self._connection(opts.gateway, for_gateway=True)
        timeout = max(1, int(round(opts.connect_timeout)))
        conn: Any
        if cfg_path and os.path.exists(cfg_path):
            from fabric import Config, Connection

            _paramiko_with_invoke()
            conn = Connection(host, user=opts.user, port=opts.port, config=Config(runtime_ssh_path=cfg_path),
                              connect_timeout=timeout, connect_kwargs=kwargs, gateway=gateway)
            _install_host_key_policy(conn.client, opts.known_hosts, opts.host_key_policy)
        else:
            conn = _Direct(host, opts.user, opts.port, timeout, kwargs, gateway)
            _install_host_key_policy(conn.client, opts.known_hosts, opts.host_key_policy,
                                     _known_hosts_name(host, opts.port))
        return conn

    def _open(self, conn: Any) -> None:
        """conn.open() over a socket of ours with TCP_NODELAY when the connection is direct (no
        gateway or ProxyCommand from the ssh config): paramiko's own socket leaves Nagle on, and each
        of the handshake's three round trips (key exchange, auth, session) then waits ~40 ms for the
        server's delayed ACK."""
        if conn.gateway is None:
            conn.connect_kwargs["sock"] = _tcp_connect(conn.host, int(conn.port), conn.connect_timeout)
        elif not isinstance(conn.gateway, str) and not conn.gateway.is_connected:
            if not isinstance(conn.gateway, _Direct):  # a ProxyJump hop Fabric made from the ssh config
                _install_host_key_policy(conn.gateway.client, self.node.ssh.known_hosts,
                                         self.node.ssh.host_key_policy)
            self._open(conn.gateway)  # the jump host's own connection, then the channel through it
        conn.open()

    def connect(self) -> float:
        with self._lock:
            if self._conn is not None and self._conn.is_connected:
                return 0.0
            start = time.monotonic()
            conn = self._connection(self.node.host)
            try:
                self._open(conn)
            except Exception as exc:  # translated into one error vocabulary below
                conn.close()
                raise _translate(self.node, exc) from None
            self._conn = conn
            return (time.monotonic() - start) * 1000

    def _channel(self) -> Any:
        self.connect()
        try:
            transport = self._conn.client.get_transport()
            chan = transport.open_session(timeout=self.node.ssh.connect_timeout)
        except Exception as exc:
            self.close()
            raise _translate(self.node, exc) from None
        return chan

    def _exec(self, line: str, stdin: bytes | None, timeout: float | None) -> tuple[int, bytes, bytes]:
        chan = self._channel()
        try:
            chan.exec_command(line)
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                if chan.recv_ready():
                    out += chan.recv(65536)
                    continue
                if chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    continue
                if chan.exit_status_ready() and chan.eof_received:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise TransportError(self.node.name, "timeout", f"command timed out after {timeout:.0f} s")
                if not self._conn.client.get_transport().is_active():
                    raise TransportError(self.node.name, "unreachable", "connection lost while running a command")
                select.select([chan], [], [], 0.2)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            return chan.recv_exit_status(), bytes(out), bytes(err)
        except (OSError, EOFError) as exc:
            self.close()
            raise _translate(self.node, exc) from None
        finally:
            chan.close()

    def popen(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | None = None, keep_stdin: bool = False) -> Process:
        line = command_line(argv, env, cwd)
        log.debug("%s$ %s", self.node.name, line)
        chan = self._channel()
        chan.set_combine_stderr(True)
        chan.exec_command(line)
        if not keep_stdin:
            chan.shutdown_write()
        return _SSHProcess(chan)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.close()
                except Exception:  # closing a broken connection must not mask the real error
                    pass
                self._conn = None


class _QuickAckSocket(socket.socket):
    """A TCP socket that acknowledges what it receives at once (TCP_QUICKACK after every recv;
    Linux clears it on its own). sshd does not set TCP_NODELAY for a non-interactive session, so
    each of its small writes that follows one we have not acknowledged yet (the debug and
    hostkeys messages after auth, then the channel confirmation; a probe's lines) would otherwise
    wait for our delayed ACK, up to 40 ms."""

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        if QUICKACK is not None:
            try:
                self.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)
            except OSError:
                pass
        return data


QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


class _Direct:
    """What SSHTransport uses of Fabric's Connection, on bare paramiko, for a node without an ssh
    config file: Fabric (with invoke, which paramiko.config would import for `Match exec` only)
    costs ~35 ms of start-up and a Config per node. Same parameters as Fabric passes to
    SSHClient.connect; a gateway is another _Direct, reached through a direct-tcpip channel."""

    def __init__(self, host: str, user: str | None, port: int, connect_timeout: int,
                 connect_kwargs: dict[str, Any], gateway: _Direct | None) -> None:
        paramiko = _paramiko()
        self.host, self.user, self.port = host, user or getpass.getuser(), port
        self.connect_timeout, self.connect_kwargs, self.gateway = connect_timeout, connect_kwargs, gateway
        self.client = paramiko.SSHClient()
        self.transport: Any = None

    @property
    def is_connected(self) -> bool:
        return bool(self.transport.active) if self.transport is not None else False

    def open(self) -> None:
        if self.is_connected:
            return
        kwargs = dict(self.connect_kwargs)
        if self.gateway is not None:
            self.gateway.open()
            kwargs["sock"] = self.gateway.transport.open_channel(
                kind="direct-tcpip", dest_addr=(self.host, int(self.port)), src_addr=("", 0))
        self.client.connect(hostname=self.host, port=self.port, username=self.user,
                            timeout=self.connect_timeout, **kwargs)
        self.transport = self.client.get_transport()

    def close(self) -> None:
        if self.is_connected:
            self.client.close()
        if self.gateway is not None:
            self.gateway.close()


_IMPORT_LOCK = threading.Lock()


def _paramiko() -> Any:
    """paramiko, imported without invoke: paramiko.config imports it only to run an ssh config's
    `Match exec`, and it costs ~30 ms (unittest.mock, asyncio). `_paramiko_with_invoke` adds it
    back before Fabric parses an ssh config."""
    with _IMPORT_LOCK:
        if "paramiko" not in sys.modules and "invoke" not in sys.modules:
            sys.modules["invoke"] = None  # type: ignore[assignment]
            try:
                import paramiko
            finally:
                if sys.modules.get("invoke", 0) is None:
                    del sys.modules["invoke"]
        import paramiko
    return paramiko


def _paramiko_with_invoke() -> None:
    """Give paramiko.config the invoke it did not import (see `_paramiko`), for `Match exec`."""
    import paramiko.config

    if getattr(paramiko.config, "invoke", True) is None:
        import invoke

        paramiko.config.invoke = invoke  # type: ignore[attr-defined]
        paramiko.config.invoke_import_error = None


def _tcp_connect(host: str, port: int, timeout: float | None) -> socket.socket:
    """A connected TCP socket with TCP_NODELAY, tried over every address of `host` the way
    paramiko's SSHClient.connect does (the same NoValidConnectionsError when all refuse)."""
    NoValidConnectionsError = _paramiko().ssh_exception.NoValidConnectionsError  # noqa: N806

    errors: dict[tuple[str, int] | tuple[str, int, int, int], Exception] = {}
    infos = [i for i in socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
             if i[1] == socket.SOCK_STREAM]
    for family, _, _, _, addr in infos:
        sock = _QuickAckSocket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(addr)
        except OSError as exc:
            sock.close()
            if exc.errno not in (errno.ECONNREFUSED, errno.EHOSTUNREACH):
                raise
            errors[(str(addr[0]), int(addr[1]))] = exc
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise NoValidConnectionsError(errors)


_KNOWN_HOSTS: dict[str, tuple[tuple[int, int], Any]] = {}


def _known_host_keys(path: str) -> Any:
    """known_hosts parsed once per process (again when the file changes), not once per node: every
    node parsed every line of it, ~2 ms per node at 32 nodes and growing with the cluster."""
    import paramiko

    try:
        st = os.stat(path)
    except OSError:
        return None
    stamp = (st.st_mtime_ns, st.st_size)
    with _IMPORT_LOCK:
        cached = _KNOWN_HOSTS.get(path)
        if cached is None or cached[0] != stamp:
            cached = _KNOWN_HOSTS[path] = (stamp, paramiko.HostKeys(path))
    return cached[1]


def _install_host_key_policy(client: Any, known_hosts: str, policy: str, hostkey_name: str | None = None) -> None:
    """Verify the server's key against known_hosts with `policy`. With `hostkey_name` (the name
    paramiko looks the server up by: `host`, or `[host]:port` off port 22) only that name's keys
    are given to the client, which is all it consults."""
    _paramiko()
    import paramiko

    path = os.path.expanduser(known_hosts)
    if hostkey_name is None:
        if os.path.exists(path):
            client.load_host_keys(path)
    else:
        known = _known_host_keys(path)
        for keytype, key in ((known.lookup(hostkey_name) or {}).items() if known is not None else ()):
            client.get_host_keys().add(hostkey_name, keytype, key)

    class StrictPolicy(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            raise UnknownHostKey(hostname, key, path)

    class AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
        """Like OpenSSH's StrictHostKeyChecking=accept-new: record unknown keys, refuse changed ones."""

        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            client.get_host_keys().add(hostname, key.get_name(), key)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "a", encoding="utf-8") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
            log.info("added host key for %s to %s", hostname, path)

    client.set_missing_host_key_policy(StrictPolicy() if policy == "strict" else AcceptNewPolicy())


class UnknownHostKey(Exception):
    """The node offered a host key that known_hosts does not have (strict policy)."""

    def __init__(self, hostname: str, key: Any, known_hosts: str) -> None:
        super().__init__(hostname)
        self.hostname = hostname
        self.fingerprint = key.fingerprint if hasattr(key, "fingerprint") else key.get_name()
        self.known_hosts = known_hosts


def _translate(node: Node, exc: BaseException) -> TransportError:
    """Map paramiko/socket failures to a TransportError with a kind and a hint that fixes it."""
    paramiko = _paramiko()

    opts = node.ssh
    target = f"{opts.user + '@' if opts.user else ''}{node.host}:{opts.port}"
    name = _known_hosts_name(node.host, opts.port)
    if isinstance(exc, TransportError):
        return exc
    if isinstance(exc, UnknownHostKey):
        return TransportError(
            node.name, "host_key_unknown",
            f"host key of {exc.hostname} ({exc.fingerprint}) is not in {exc.known_hosts}",
            f"verify it, then: ssh-keyscan -p {opts.port} {node.host} >> {opts.known_hosts} "
            f"(or set ssh.host_key_policy: accept-new)")
    if isinstance(exc, paramiko.BadHostKeyException):
        return TransportError(
            node.name, "host_key_changed",
            f"host key of {node.host} CHANGED: known_hosts has {exc.expected_key.get_name()} "
            f"{exc.expected_key.fingerprint}, the server sent {exc.key.fingerprint}",
            f"if the server was reinstalled: ssh-keygen -R '{name}' -f {opts.known_hosts}, "
            "then add the new key; otherwise treat it as an attack")
    if isinstance(exc, paramiko.AuthenticationException):
        return TransportError(node.name, "auth", f"authentication refused for {target}: {exc}",
                              f"check the key (ssh.identity) and that it is in ~{opts.user or ''}/.ssh/authorized_keys")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return TransportError(node.name, "unreachable", f"{target} did not answer within {opts.connect_timeout:g} s",
                              "is the node up and port open? ping it; check firewalls and ssh.connect_timeout")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return TransportError(node.name, "unreachable", f"connection to {target} refused",
                              "is sshd running on that port? (systemctl status ssh)")
    if isinstance(exc, FileNotFoundError) and exc.filename:
        # paramiko opening a missing ssh.identity: a credential problem, not a network one
        return TransportError(node.name, "auth", f"cannot read identity file {exc.filename}: {exc.strerror}",
                              "check ssh.identity: the private key must exist on this (the controller) machine")
    if isinstance(exc, OSError):
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        kind = "unreachable" if exc.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH,
                                              errno.ETIMEDOUT, None) else "error"
        return TransportError(node.name, kind, f"cannot reach {target}: {reason}",
                              "check the address, routing and that sshd listens there")
    if isinstance(exc, (paramiko.SSHException, EOFError)):
        return TransportError(node.name, "unreachable", f"SSH to {target} failed: {exc or type(exc).__name__}",
                              "check sshd's logs on the node")
    return TransportError(node.name, "error", f"{type(exc).__name__}: {exc}")


# ----------------------------------------------------------------------------- fan-out


def open_transport(inv: Inventory, node: Node) -> Transport:
    """The transport the inventory asks for, not yet connected."""
    return LocalTransport(node) if inv.transport == "local" else SSHTransport(node)


def fan_out(nodes: Sequence[Node], fn: Callable[[Node], T], max_workers: int = 32) -> dict[str, T | Exception]:
    """Call fn(node) for every node in parallel (bounded); collect every result or exception,
    keyed by node name in the order given. Never stops at the first bad node."""
    results: dict[str, T | Exception] = {n.name: RuntimeError("not run") for n in nodes}
    if not nodes:
        return results

    def one(node: Node) -> T | Exception:
        try:
            return fn(node)
        except Exception as exc:  # collected, judged by the caller
            return exc

    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(nodes))), thread_name_prefix="orch") as pool:
        for node, value in zip(nodes, pool.map(one, nodes)):
            results[node.name] = value
    return results


class Cluster:
    """One transport per node of an inventory, opened lazily, closed together."""

    def __init__(self, inv: Inventory) -> None:
        self.inv = inv
        self.transports = {n.name: open_transport(inv, n) for n in inv.nodes}

    def __getitem__(self, name: str) -> Transport:
        return self.transports[name]

    def fan_out(self, fn: Callable[[Transport], T], nodes: Sequence[Node] | None = None) -> dict[str, T | Exception]:
        """fn(transport) on every node (or the given ones) in parallel, bounded by `fanout`."""
        return fan_out(list(nodes if nodes is not None else self.inv.nodes),
                       lambda n: fn(self.transports[n.name]), self.inv.fanout)

    def close(self) -> None:
        fan_out(list(self.inv.nodes), lambda n: self.transports[n.name].close(), self.inv.fanout)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
