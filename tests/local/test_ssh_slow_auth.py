"""A node whose SSH server answers at once but is slow to authenticate (a loaded node: key checks,
PAM, a directory lookup) against orch's real SSH transport: paramiko's own server on 127.0.0.1,
stalling in its public-key check. `ssh.connect_timeout` bounds reaching the server, not its
authentication (transport/ssh.py `AUTH_TIMEOUT_S`); an authentication that outlasts its own bound
is said as a timeout, never as a refused key."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import paramiko
import pytest

from orchestrator.config.nodes import Node, SSHOptions
from orchestrator.errors import TransportError
from orchestrator.transport import ssh
from tests.node_support import ssh_node

pytestmark = pytest.mark.waits


class SlowAuth(paramiko.ServerInterface):
    """Accepts the client's key after `delay` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        time.sleep(self.delay)
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED


@dataclass
class Server:
    port: int
    host_key: paramiko.PKey
    delay: list[float]


@pytest.fixture
def server() -> Iterator[Server]:
    host_key = paramiko.RSAKey.generate(1024)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    srv = Server(listener.getsockname()[1], host_key, [0.0])
    stop = threading.Event()
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            t = paramiko.Transport(conn)
            t.add_server_key(host_key)
            t.start_server(server=SlowAuth(srv.delay[0]))
            transports.append(t)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        stop.set()
        thread.join(5)
        listener.close()
        for t in transports:
            t.close()


def node(tmp_path: Path, srv: Server, connect_timeout: float, key_type: str = "rsa") -> Node:
    """The node, its identity a key of `key_type`: an RSA key in PEM (paramiko's own), or an ed25519
    key (ssh-keygen's), the last type paramiko tries a key file as."""
    identity = tmp_path / f"id_{key_type}"
    if key_type == "rsa":
        paramiko.RSAKey.generate(1024).write_private_key_file(str(identity))
    else:
        subprocess.run(["ssh-keygen", "-q", "-t", key_type, "-N", "", "-f", str(identity)], check=True)
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{srv.port} {srv.host_key.get_name()} {srv.host_key.get_base64()}\n")
    opts = SSHOptions(
        user="trainer",
        port=srv.port,
        identity=str(identity),
        known_hosts=str(known),
        host_key_policy="strict",
        connect_timeout=connect_timeout,
        ssh_config=None,
    )
    return ssh_node("slow", "127.0.0.1", opts)


def test_an_authentication_slower_than_the_connect_timeout_still_connects(server: Server, tmp_path: Path) -> None:
    """connect_timeout 2 s, the server's key check 4 s: the node is reached, not dropped."""
    server.delay[0] = 4.0
    transport = ssh.SSHTransport(node(tmp_path, server, connect_timeout=2))
    try:
        took_ms = transport.connect()
    finally:
        transport.close()
    assert took_ms >= 4000


@pytest.mark.parametrize("key_type", ["rsa", "ed25519"])
def test_an_authentication_that_outlasts_its_bound_is_a_timeout_not_a_refused_key(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key_type: str
) -> None:
    """With an ed25519 key paramiko says "Authentication timeout."; with an RSA key file, what the
    key types it tries after that say about the file: the words orch gives are the same. The bound
    is the longer of the two: connect_timeout 2 s over AUTH_TIMEOUT_S made 1 s."""
    monkeypatch.setattr(ssh, "AUTH_TIMEOUT_S", 1.0)
    server.delay[0] = 6.0
    transport = ssh.SSHTransport(node(tmp_path, server, connect_timeout=2, key_type=key_type))
    try:
        with pytest.raises(TransportError) as caught:
            transport.connect()
    finally:
        transport.close()
    err = caught.value
    assert err.kind == "unreachable"
    assert err.message == (
        f"slow: authentication timed out: trainer@127.0.0.1:{server.port} answered but did not finish "
        "authenticating within 2 s (no key was refused)"
    )
    assert "refused for" not in err.message and "authorized_keys" not in (err.hint or "")
    assert "journalctl -u ssh on 127.0.0.1" in (err.hint or "")
