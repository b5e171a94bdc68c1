"""`transport: ssh`: one SSH connection per node (never a shared ThreadingGroup).

Fabric's `Connection` where an ssh config file applies (aliases, ProxyJump, Match), else the same
on bare paramiko (`_Direct`): Fabric and invoke cost ~35 ms of start-up. With hostkeys.py, the
only code that imports paramiko or fabric; their failures become one `TransportError`
vocabulary (`_translate`), each with a hint that fixes it.

Where a node must be reached by a process of this machine instead (`pipe`: an image stream into
the node's `RUNTIME load`; `copy_tree`: rsync's `-e`), the OpenSSH client is that process:
`openssh_argv` builds the same reach from the same settings, and nothing else: `-F` the
inventory's `ssh_config` (`none` when it names no file, as the transport then reads none either),
the port, user and identity, `known_hosts` as the only host-key file
(`GlobalKnownHostsFile=/dev/null`), the host-key policy as OpenSSH spells it (strict →
`StrictHostKeyChecking=yes`, accept-new → `accept-new`; there is no `no`), `BatchMode=yes` (a
missing key fails, never prompts), `ConnectTimeout`, `SAFE_OPTIONS` (no forwarding, no
LocalCommand, no shared master connection, whatever the config says), and every hop (the
inventory's gateway, or the ssh config's ProxyJump, read with `ssh -G`) as a `ProxyCommand` running
the same ssh to it: OpenSSH reaches a ProxyJump hop with the config's settings only (command-line
options apply to the last host), so a config whose jump host says `StrictHostKeyChecking no`
would otherwise skip verification there. What OpenSSH prints when it cannot get in becomes the
same `TransportError` vocabulary (`openssh_failure`).
"""

from __future__ import annotations

import errno
import functools
import getpass
import math
import os
import select
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .. import waits
from ..config.nodes import Node, SSHOptions
from ..errors import ConnectionLost, TransportError
from .base import OnOutput, Process, Transport, command_line, log
from .copy import CopyFailed, Transfer, rsync_argv, rsync_failed
from .hostkeys import UnknownHostKey, install_host_key_policy, known_hosts_name


def _send_stdin(chan: Any, data: bytes) -> None:
    """Write a command's stdin. A command that ends without reading it all (a shell that finds no
    such program and exits 127, `head -1`) closes the channel under the write: that is not a lost
    connection but the command's answer, read next (its exit status and stderr), as a local pipe's
    EPIPE is. Only a write that fails on an open channel is the connection's failure."""
    try:
        chan.sendall(data)
    except OSError:
        if not chan.closed:
            raise


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


class SSHTransport(Transport):
    """One SSH connection to one node; safe to use from one thread at a time for `run`,
    while `popen` streams may run beside it (paramiko multiplexes channels). `pipe` and
    `copy_tree` run the OpenSSH client (and rsync over it) with the same reach."""

    name = "ssh"
    copy_tools = ("rsync", "ssh")

    @classmethod
    def target(cls, node: Node) -> str:
        return f"{node.ssh.user + '@' if node.ssh.user else ''}{node.host}:{node.ssh.port}"

    def reach(self, line: str) -> list[str]:
        """The OpenSSH client that runs `line` on the node (every hop verified, `openssh_argv`)."""
        return [*openssh_argv(self.node.ssh, openssh_config_file(self.node.ssh), self.node.host), self.node.host, line]

    def _reach_popen(self) -> dict[str, Any]:
        return {"env": {**os.environ, "LC_ALL": "C"}}  # OpenSSH's words, as `openssh_failure` reads them

    def unreached(self, code: int, stderr: str) -> TransportError | None:
        """ssh's own failure (exit 255 with its words on stderr); a command's 255 stays its own."""
        return openssh_failure(self.node, stderr) if code == 255 else None

    def rsync_argv(
        self,
        sources: Sequence[str],
        dest: str = "/",
        *,
        delete: bool = False,
        dry_run: bool = False,
        checksum: bool = False,
        stall_s: float | None = None,
    ) -> list[str]:
        """rsync copying `sources` under `dest` on the node, over the OpenSSH client that reaches it."""
        host = f"[{self.node.host}]" if ":" in self.node.host else self.node.host
        rsh = openssh_argv(self.node.ssh, openssh_config_file(self.node.ssh), self.node.host)
        target = f"{host}:{dest.rstrip('/')}/"
        return rsync_argv(sources, target, rsh=rsh, delete=delete, dry_run=dry_run, checksum=checksum, stall_s=stall_s)

    def copy_tree(
        self,
        sources: Sequence[str],
        dest: str = "/",
        *,
        delete: bool = False,
        dry_run: bool = False,
        checksum: bool = False,
        stall_s: float | None = None,
    ) -> Transfer:
        """rsync over the OpenSSH client: only what changed is sent (size and time, or `checksum`);
        `stall_s`: rsync's `--timeout` (the rsync on the node is left as it is)."""
        argv = self.rsync_argv(sources, dest, delete=delete, dry_run=dry_run, checksum=checksum, stall_s=stall_s)

        def failed(code: int, stderr: str) -> CopyFailed:
            return rsync_failed(self.node_name, code, stderr, lambda said: openssh_failure(self.node, said))

        return self._run_rsync(argv, stall_s, "rsync is not installed on this machine (the controller)", failed)

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self._conn: Any = None
        self._lock = threading.Lock()
        self._attempt: _Attempt | None = None
        self._closes = 0
        """How many times `close()` ran: an attempt that began before the latest is not kept."""

    def _connection(self, host: str, for_gateway: bool = False) -> Any:
        """A Connection (not yet open) to `host` with this node's SSH options: Fabric's where an
        ssh config file applies (aliases, ProxyJump, Match), else `_Direct` on bare paramiko."""
        opts = self.node.ssh
        cfg_path = os.path.expanduser(opts.ssh_config) if opts.ssh_config else None
        kwargs: dict[str, Any] = {"banner_timeout": opts.connect_timeout, "auth_timeout": auth_timeout(opts)}
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
            # port 22 left unsaid is ssh's default, not a choice: the config's `Port` for this host
            # applies then (as `ssh alias` would connect); a port the inventory wrote wins over it
            conn = Connection(
                host,
                user=opts.user,
                port=opts.chosen_port,
                config=Config(runtime_ssh_path=cfg_path),
                connect_timeout=timeout,
                connect_kwargs=kwargs,
                gateway=gateway,
            )
            install_host_key_policy(conn.client, opts.known_hosts, opts.host_key_policy, node_name=self.node_name)
        else:
            conn = _Direct(host, opts.user, opts.port, timeout, kwargs, gateway)
            install_host_key_policy(
                conn.client,
                opts.known_hosts,
                opts.host_key_policy,
                known_hosts_name(host, opts.port),
                node_name=self.node_name,
            )
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
                install_host_key_policy(
                    conn.gateway.client,
                    self.node.ssh.known_hosts,
                    self.node.ssh.host_key_policy,
                    node_name=self.node_name,
                )
            self._open(conn.gateway)  # the jump host's own connection, then the channel through it
        conn.open()

    def connect(self) -> float:
        """Open the connection unless it is open; how long that took in ms (0 when it was open).

        One attempt at a time, made outside the lock: a caller that finds one in flight waits for
        it and shares its outcome, so a node that does not answer costs every caller (the status
        poll, the log stream, the teardown's stop) one connect timeout together, not one each in
        turn; and `close()` never waits for it."""
        return self._connected()[1]

    def _connected(self) -> tuple[Any, float]:
        while True:
            with self._lock:
                if self._conn is not None and self._conn.is_connected:
                    return self._conn, 0.0
                attempt = self._attempt
                if attempt is None:
                    attempt = self._attempt = _Attempt(self._closes)
                    break
            waits.wait(attempt.done)
            if attempt.error is not None:
                raise attempt.error
        start = time.monotonic()
        conn, opened = None, False
        try:
            conn = self._connection(self.node.host)
            self._open(conn)
            opened = True
        except Exception as exc:  # translated into one error vocabulary below
            slow = _authenticating(conn) and time.monotonic() - start >= auth_timeout(self.node.ssh)
            attempt.error = _translate(self.node, exc, auth_timed_out=slow)
        finally:  # whatever ended the attempt (an interrupt too), its waiters are let go
            with self._lock:
                self._attempt = None
                kept = opened and attempt.closes == self._closes
                if kept:
                    self._conn = conn
            if not kept:
                _close_quietly(conn)
                if opened:
                    attempt.error = TransportError(self.node_name, "error", "the connection was closed as it opened")
            attempt.done.set()
        if attempt.error is not None:
            raise attempt.error from None
        return conn, (time.monotonic() - start) * 1000

    def _channel(self) -> tuple[Any, Any]:
        """A new session channel, with the connection it is on."""
        conn, _ms = self._connected()
        try:
            chan = conn.client.get_transport().open_session(timeout=self.node.ssh.connect_timeout)
        except Exception as exc:
            self._drop(conn)
            raise _translate(self.node, exc) from None
        return conn, chan

    def _exec(
        self,
        line: str,
        stdin: bytes | None,
        timeout: float | None,
        on_output: OnOutput | None = None,
        keep: bool = True,
    ) -> tuple[int, bytes, bytes]:
        conn, chan = self._channel()
        try:
            chan.exec_command(line)
            if stdin:
                _send_stdin(chan, stdin)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                if chan.recv_ready():
                    data = chan.recv(65536)
                    if keep:
                        out += data
                    if on_output is not None and data:
                        on_output("out", data)
                    continue
                if chan.recv_stderr_ready():
                    data = chan.recv_stderr(65536)
                    if keep:
                        err += data
                    if on_output is not None and data:
                        on_output("err", data)
                    continue
                if chan.exit_status_ready() and (chan.eof_received or chan.closed):
                    break  # closed: drained above, nothing more can come
                if deadline is not None and time.monotonic() > deadline:
                    raise TransportError(self.node_name, "timeout", f"command timed out after {timeout:.0f} s")
                if not chan.get_transport().is_active():
                    raise self._lost()
                select.select([chan], [], [], 0.2)
            while chan.recv_stderr_ready():
                data = chan.recv_stderr(65536)
                if keep:
                    err += data
                if on_output is not None and data:
                    on_output("err", data)
            code = chan.recv_exit_status()
            if code == -1 and not chan.get_transport().is_active():
                raise self._lost()
            return code, bytes(out), bytes(err)
        except (OSError, EOFError) as exc:
            self._drop(conn)
            raise _translate(self.node, exc) from None
        finally:
            chan.close()

    def popen(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        keep_stdin: bool = False,
    ) -> Process:
        line = command_line(argv, env, cwd)
        log.debug("%s$ %s", self.node_name, line)
        _conn, chan = self._channel()
        chan.set_combine_stderr(True)
        chan.exec_command(line)
        if not keep_stdin:
            chan.shutdown_write()
        return _SSHProcess(chan)

    def close(self) -> None:
        """Close the connection (one being opened right now is closed once it opens), and end the
        OpenSSH clients and rsyncs `pipe` and `copy_tree` still run."""
        with self._lock:
            conn, self._conn = self._conn, None
            self._closes += 1
        _close_quietly(conn)
        self.children.end_all()

    def _lost(self) -> ConnectionLost:
        """The connection died under a running command: its exit status never came."""
        return ConnectionLost(self.node_name)

    def _drop(self, conn: Any) -> None:
        """Forget and close `conn`, broken: a newer connection another thread opened stays."""
        with self._lock:
            if self._conn is conn:
                self._conn = None
        _close_quietly(conn)


class _Attempt:
    """One connection attempt in flight; its callers wait on `done`, then share `error`."""

    def __init__(self, closes: int) -> None:
        self.closes = closes
        self.done = threading.Event()
        self.error: TransportError | None = None


def _close_quietly(conn: Any) -> None:
    if conn is not None:
        try:
            conn.close()
        except Exception:  # closing a broken connection must not mask the real error
            pass


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
AUTH_TIMEOUT_S = 30.0
"""The least time authentication gets once the server has answered. `ssh.connect_timeout` bounds
reaching the server (the TCP connect and its banner), as OpenSSH's ConnectTimeout does; a server
that answered is not unreachable, and one slow to authenticate (a loaded node checking keys, PAM,
a directory or DNS lookup) would otherwise be dropped, or replaced by a spare, for its load. 30 s
is paramiko's own default; OpenSSH's client sets no bound at all (sshd's LoginGraceTime, 120 s)."""


def auth_timeout(opts: SSHOptions) -> float:
    """How long a node's authentication may take: `AUTH_TIMEOUT_S`, or its connect_timeout if longer."""
    return max(AUTH_TIMEOUT_S, opts.connect_timeout)


class _Direct:
    """What SSHTransport uses of Fabric's Connection, on bare paramiko, for a node without an ssh
    config file: Fabric (with invoke, which paramiko.config would import for `Match exec` only)
    costs ~35 ms of start-up and a Config per node. Same parameters as Fabric passes to
    SSHClient.connect; a gateway is another _Direct, reached through a direct-tcpip channel."""

    def __init__(
        self,
        host: str,
        user: str | None,
        port: int,
        connect_timeout: int,
        connect_kwargs: dict[str, Any],
        gateway: _Direct | None,
    ) -> None:
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
                kind="direct-tcpip", dest_addr=(self.host, int(self.port)), src_addr=("", 0)
            )
        self.client.connect(
            hostname=self.host, port=self.port, username=self.user, timeout=self.connect_timeout, **kwargs
        )
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
    infos = [
        i for i in socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM) if i[1] == socket.SOCK_STREAM
    ]
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


def _authenticating(conn: Any) -> bool:
    """Whether `conn`'s SSH session is up but not authenticated: the server answered and agreed on
    keys, and what ended the attempt was the authentication."""
    client = getattr(conn, "client", None)
    session = client.get_transport() if client is not None else None
    return session is not None and session.is_active() and not session.is_authenticated()


def _translate(node: Node, exc: BaseException, auth_timed_out: bool = False) -> TransportError:
    """Map paramiko/socket failures to a TransportError with a kind and a hint that fixes it: the
    name does not resolve, the port refuses, there is no route, nothing answers in time, the key is
    refused (naming the keys offered), the host key is unknown or changed. Never an errno's number."""
    paramiko = _paramiko()

    opts = node.ssh
    target = f"{opts.user + '@' if opts.user else ''}{node.host}:{opts.port}"
    name = known_hosts_name(node.host, opts.port)
    if isinstance(exc, TransportError):
        return exc
    if isinstance(exc, UnknownHostKey):
        return TransportError(
            node.name,
            "host_key_unknown",
            f"host key of {exc.hostname} ({exc.fingerprint}) is not in {exc.known_hosts}",
            f"verify it, then: ssh-keyscan -p {opts.port} {node.host} >> {opts.known_hosts} "
            f"(or set ssh.host_key_policy: accept-new)",
        )
    if isinstance(exc, paramiko.BadHostKeyException):
        return TransportError(
            node.name,
            "host_key_changed",
            f"host key of {node.host} CHANGED: known_hosts has {exc.expected_key.get_name()} "
            f"{exc.expected_key.fingerprint}, the server sent {exc.key.fingerprint}",
            f"if the server was reinstalled: ssh-keygen -R '{name}' -f {opts.known_hosts}, "
            "then add the new key; otherwise treat it as an attack",
        )
    # the caller's clock, not paramiko's words, tells a timeout: it says "Authentication timeout." only
    # where the last key it tried timed out; after a timeout on an RSA key file it tries the file as
    # its other key types, and their words ("encountered RSA key, expected OPENSSH key") are raised
    if isinstance(exc, paramiko.SSHException) and auth_timed_out:
        return TransportError(
            node.name,
            "unreachable",
            f"authentication timed out: {target} answered but did not finish authenticating within "
            f"{auth_timeout(opts):g} s (no key was refused)",
            f"the node's sshd is slow to answer (load, PAM, a directory or DNS lookup: UseDNS no); "
            f"see its log (journalctl -u ssh on {node.host}) and try again",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        return TransportError(
            node.name,
            "auth",
            f"authentication refused for {target}: {exc}; offered {offered_keys(opts)}",
            f"add the public key to ~{opts.user or ''}/.ssh/authorized_keys on {node.host} "
            "(ssh-copy-id), or point ssh.identity at the key that is there",
        )
    if isinstance(exc, socket.gaierror):
        return TransportError(
            node.name,
            "unreachable",
            f"cannot resolve the name {node.host}: {exc.strerror or exc}",
            f"check host: in the inventory for a typo; this machine must resolve it "
            f"(getent hosts {node.host}: /etc/hosts, DNS, or a Host alias in ssh.ssh_config)",
        )
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return TransportError(
            node.name,
            "unreachable",
            f"timed out: {target} did not answer within {opts.connect_timeout:g} s",
            "is the node up and the port open? ping it; a firewall that drops packets looks "
            "like this; raise ssh.connect_timeout for a slow link",
        )
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        codes = {getattr(e, "errno", None) for e in exc.errors.values()}
        if codes == {errno.ECONNREFUSED}:
            return _errno_error(node, target, errno.ECONNREFUSED, "")
        if len(codes) == 1:
            return _errno_error(node, target, codes.pop(), str(next(iter(exc.errors.values()))))
        tried = "; ".join(
            f"{a[0]}: {os.strerror(e.errno) if getattr(e, 'errno', None) else e}" for a, e in exc.errors.items()
        )
        return TransportError(
            node.name,
            "unreachable",
            f"cannot connect to {target}: {tried}",
            "is sshd running on that port, and is the node reachable from here?",
        )
    if isinstance(exc, FileNotFoundError) and exc.filename:
        # paramiko opening a missing ssh.identity: a credential problem, not a network one
        return TransportError(
            node.name,
            "auth",
            f"cannot read identity file {exc.filename}: {exc.strerror}",
            "check ssh.identity: the private key must exist on this (the controller) machine",
        )
    if isinstance(exc, OSError) and exc.errno is not None:
        return _errno_error(node, target, exc.errno, str(exc))
    if isinstance(exc, OSError):
        return TransportError(
            node.name,
            "error",
            f"cannot reach {target}: {exc or type(exc).__name__}",
            "check the address, routing and that sshd listens there",
        )
    if isinstance(exc, (paramiko.SSHException, EOFError)):
        text = str(exc) or type(exc).__name__
        hint = "check sshd's logs on the node (journalctl -u ssh)"
        if "banner" in text.lower():
            hint = (
                "something other than sshd answers on that port, or sshd is overloaded (MaxStartups) and "
                "did not greet us: check ssh.port and sshd's logs on the node"
            )
        return TransportError(node.name, "unreachable", f"SSH to {target} failed: {text}", hint)
    return TransportError(node.name, "error", f"{type(exc).__name__}: {exc}")


_ERRNO_WORDS = {
    errno.ECONNREFUSED: (
        "connection to {target} refused",
        "is sshd running on that port? (systemctl status ssh on the node; ssh.port in the inventory)",
    ),
    errno.EHOSTUNREACH: (
        "no route to host {host} ({target})",
        "is the node up? check the address and the route to it (ip route get {host}), and a firewall that rejects",
    ),
    errno.ENETUNREACH: (
        "network unreachable: this machine has no route to {host} ({target})",
        "check the address, and this machine's routes (ip route get {host}): is it on that network?",
    ),
    errno.ECONNRESET: (
        "connection to {target} reset during the SSH handshake",
        "sshd closed the connection: its logs on the node say why (MaxStartups, AllowUsers, tcp wrappers, fail2ban)",
    ),
}


def _errno_error(node: Node, target: str, code: int | None, raw: str) -> TransportError:
    """A socket error by its errno, in words."""
    words = _ERRNO_WORDS.get(code) if code is not None else None
    if words is None:
        reason = os.strerror(code) if code is not None and code > 0 else (raw or "connection failed")
        return TransportError(
            node.name,
            "error",
            f"cannot reach {target}: {reason}",
            "check the address, routing and that sshd listens there",
        )
    message, hint = words
    return TransportError(
        node.name,
        "unreachable",
        message.format(target=target, host=node.host),
        hint.format(target=target, host=node.host),
    )


DEFAULT_KEYS = ("id_rsa", "id_ecdsa", "id_ed25519", "id_dsa")
"""The keys paramiko tries from ~/.ssh when none is named (look_for_keys), as OpenSSH does."""


def offered_keys(opts: SSHOptions) -> str:
    """What this client offered the server: ssh.identity, the SSH agent's keys, the default keys
    in ~/.ssh that exist (and the ssh config's IdentityFile), each with its fingerprint when its
    public half is there to read, as `ssh-keygen -l` prints it."""
    offered = []
    if opts.identity:
        offered.append(_key_shown(os.path.expanduser(opts.identity)))
    if os.environ.get("SSH_AUTH_SOCK"):
        offered.append("the SSH agent's keys (ssh-add -l lists them)")
    home = os.path.expanduser("~/.ssh")
    offered += [_key_shown(os.path.join(home, k)) for k in DEFAULT_KEYS if os.path.exists(os.path.join(home, k))]
    if openssh_config_file(opts):
        offered.append(f"any IdentityFile of {opts.ssh_config}")
    return ", ".join(dict.fromkeys(offered)) or "no key at all (no ssh.identity, no agent, no ~/.ssh/id_*)"


def _key_shown(path: str) -> str:
    fp = key_fingerprint(path + ".pub")
    return f"{path} ({fp})" if fp else path


def key_fingerprint(pub_path: str) -> str | None:
    """`SHA256:...` of an OpenSSH public key file (`TYPE BASE64 [comment]`), or None."""
    import base64
    import hashlib

    try:
        with open(pub_path, encoding="ascii", errors="replace") as fh:
            parts = fh.read().split()
        blob = base64.b64decode(parts[1], validate=True)
    except (OSError, IndexError, ValueError):
        return None
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"{parts[0]} SHA256:{digest}"


# ----------------------------------------------------------------------------- the OpenSSH client


def openssh_config_file(opts: SSHOptions) -> str | None:
    """The ssh config the transport reads for this node: `ssh_config` expanded, when that file exists."""
    if not opts.ssh_config:
        return None
    path = os.path.expanduser(opts.ssh_config)
    return path if os.path.exists(path) else None


SAFE_OPTIONS = (
    "ForwardAgent=no",
    "ForwardX11=no",
    "ClearAllForwardings=yes",
    "PermitLocalCommand=no",
    "ControlMaster=no",
    "ControlPath=none",
    "UpdateHostKeys=no",
    "RequestTTY=no",
)
"""What the OpenSSH client is held to whatever the ssh config says, as the paramiko transport
does: no agent or X11 forwarding, no port forwarding, no LocalCommand run here, no connection
shared with a master another ssh opened (and verified, or not, its own way), no host keys learned
behind known_hosts' back, no terminal. Options OpenSSH 7.4 (RHEL 7) already knows."""
MAX_HOPS = 8
"""The most jump hosts one node may be behind (a longer chain is a loop in the ssh config)."""

ProxyJumpOf = Callable[[str, str, "str | None", "int | None"], "str | None"]
"""(config file, host, user, port) -> the ssh config's ProxyJump for that host, or None."""


def config_proxy_jump(config_file: str, host: str, user: str | None, port: int | None) -> str | None:
    """The ProxyJump the ssh config gives `host` (with that user and port, for its Match
    blocks), as OpenSSH reads it (`ssh -G`); None without one, or when ssh cannot read the config
    (then the connection fails on the same error)."""
    return _proxy_jump(config_file, host, user, port)


@functools.lru_cache(maxsize=256)
def _proxy_jump(config_file: str, host: str, user: str | None, port: int | None) -> str | None:
    argv = [
        "ssh",
        "-G",
        "-F",
        config_file,
        *(["-p", str(port)] if port else []),
        *(["-l", user] if user else []),
        "--",
        host,
    ]
    try:
        out = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "LC_ALL": "C"},
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        if key == "proxyjump" and value.strip() and value.strip().lower() != "none":
            return value.strip()
    return None


def parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """One hop of a ProxyJump (`[user@]host[:port]`, `[v6]:port`, `ssh://user@host:port`) →
    (user, host, port)."""
    spec = spec.removeprefix("ssh://")
    user, _, hostport = spec.rpartition("@")
    host, port = hostport, None
    if hostport.startswith("[") and "]" in hostport:
        host, _, rest = hostport[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    elif hostport.count(":") == 1:
        name, _, number = hostport.partition(":")
        if number.isdigit():
            host, port = name, int(number)
    return user or None, host, port


def openssh_argv(
    opts: SSHOptions, config_file: str | None, host: str | None = None, proxy_jump: ProxyJumpOf = config_proxy_jump
) -> list[str]:
    """The OpenSSH client argv (without the host) that reaches `host` with these options: the
    inventory's port, user, identity and host-key policy, SAFE_OPTIONS, and every hop on the way
    (the inventory's gateway, or the ssh config's ProxyJump for `host`) as a ProxyCommand running
    this same verified ssh to the hop. OpenSSH would reach a ProxyJump hop with the ssh config's
    settings alone: the command line's options apply to the last host only."""
    return _argv(opts, config_file, host, opts.port, opts.user, proxy_jump, 0)


def _argv(
    opts: SSHOptions,
    config_file: str | None,
    host: str | None,
    port: int | None,
    user: str | None,
    proxy_jump: ProxyJumpOf,
    depth: int,
) -> list[str]:
    if depth > MAX_HOPS:
        raise TransportError(
            host or "?",
            "error",
            f"more than {MAX_HOPS} jump hosts on the way to {host}: a ProxyJump loop in the ssh config?",
            f"check the ProxyJump lines of {config_file}",
        )
    # the node itself at port 22 left unsaid, with an ssh config: the config's Port for its host
    # applies, as `ssh alias` would (`orch exec -w alias`); hops keep the port they were given
    shown_port = port if depth > 0 or config_file is None else opts.chosen_port
    argv = ["ssh", "-F", config_file or "none", *(["-p", str(shown_port)] if shown_port else [])]
    if user:
        argv += ["-l", user]
    if opts.identity:
        argv += ["-i", os.path.expanduser(opts.identity)]
    policy = "yes" if opts.host_key_policy == "strict" else "accept-new"
    argv += [
        "-o",
        f"UserKnownHostsFile={os.path.expanduser(opts.known_hosts)}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        f"StrictHostKeyChecking={policy}",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={max(1, math.ceil(opts.connect_timeout))}",
    ]
    for option in SAFE_OPTIONS:
        argv += ["-o", option]
    argv += [
        "-o",
        "ServerAliveInterval=10",
        "-o",
        "ServerAliveCountMax=6",  # a node gone mid-copy: ~1 min
        "-o",
        "LogLevel=ERROR",
    ]
    bare = replace(opts, gateway=None)
    proxy = None
    if opts.gateway:  # the inventory's gateway, reached with the node's user and port (as the transport does)
        proxy = _hop(_argv(bare, config_file, opts.gateway, port, user, proxy_jump, depth + 1), opts.gateway, None)
    elif host and config_file:
        jump = proxy_jump(config_file, host, user, port)
        for i, spec in enumerate(jump.split(",") if jump else []):
            hop_user, hop_host, hop_port = parse_jump(spec.strip())
            # the first hop's own ProxyJump (from the config) is followed; a later one is reached through the one before
            hop = _argv(bare, config_file, hop_host if i == 0 else None, hop_port, hop_user, proxy_jump, depth + 1)
            proxy = _hop(hop, hop_host, proxy)
    if proxy is not None:
        argv += ["-o", "ProxyCommand=" + proxy]
    return argv


def _hop(argv: list[str], host: str, through: str | None) -> str:
    """A ProxyCommand that runs `argv` to `host` and forwards the connection (`-W %h:%p`), itself
    through the ProxyCommand `through`. ssh expands %-tokens in it: every literal % is doubled."""
    if through is not None:
        argv = [*argv, "-o", "ProxyCommand=" + through]
    return shlex.join([*(a.replace("%", "%%") for a in argv), "-W", "%h:%p", host.replace("%", "%%")])


# What OpenSSH prints when it cannot get in (checked in this order): its kind, the message orch says
# for it (in the words the paramiko side uses for the same failure), and what fixes it.
_OPENSSH_FAILURES = (
    (
        "has changed and you have requested strict checking",
        "host_key_changed",
        "host key of {host} CHANGED: known_hosts has another key for {name}",
        "if the node was reinstalled: ssh-keygen -R '{name}' -f {known_hosts}, then add the new key; "
        "otherwise treat it as an attack",
    ),
    (
        "host key is known for",
        "host_key_unknown",
        "host key of {name} is not in {known_hosts}",
        "verify it, then: ssh-keyscan -p {port} {host} >> {known_hosts} (or set ssh.host_key_policy: accept-new)",
    ),
    (
        "Host key verification failed",
        "host_key_unknown",
        "host key of {name} could not be verified against {known_hosts}",
        "verify it, then: ssh-keyscan -p {port} {host} >> {known_hosts}",
    ),
    (
        "Permission denied",
        "auth",
        "authentication refused for {target}",
        "check the key (ssh.identity) and that it is in the node's ~/.ssh/authorized_keys",
    ),
    (
        "Connection refused",
        "unreachable",
        "connection to {target} refused",
        "is sshd running on that port? (systemctl status ssh)",
    ),
    (
        "timed out",
        "unreachable",
        "{target} did not answer",
        "is the node up and the port open? check firewalls and ssh.connect_timeout",
    ),
    ("Could not resolve hostname", "unreachable", "cannot resolve {host}", "check the node's host in the inventory"),
)


def openssh_failure(node: Node, stderr: str) -> TransportError | None:
    """The TransportError for what the OpenSSH client printed when it could not get into `node`
    (`ssh: MESSAGE (its line)`, with the fix), or None when none of its lines says so."""
    opts = node.ssh
    where = {
        "host": node.host,
        "port": opts.port,
        "known_hosts": opts.known_hosts,
        "name": known_hosts_name(node.host, opts.port),
        "target": f"{opts.user + '@' if opts.user else ''}{node.host}:{opts.port}",
    }
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for needle, kind, message, hint in _OPENSSH_FAILURES:
        line = next((ln for ln in lines if needle in ln), None)
        if line is not None:
            return TransportError(
                node.name, kind, f"ssh: {message.format(**where)} ({line.rstrip('.')})", hint.format(**where)
            )
    return None
