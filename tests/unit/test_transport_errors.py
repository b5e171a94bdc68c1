"""Why a node cannot be reached, in words (transport/ssh.py `_translate`): the exceptions are the
ones the socket layer and paramiko raise (their errno and text as Linux gives them), no network."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import paramiko
import pytest
from paramiko.ssh_exception import NoValidConnectionsError

from orchestrator.config.nodes import Node, SSHOptions
from orchestrator.transport.ssh import _translate, key_fingerprint, offered_keys
from tests.node_support import ssh_node


def node(**ssh: object) -> Node:
    opts = SSHOptions(**{"user": "root", "port": 22, "connect_timeout": 10, "ssh_config": None, **ssh})  # type: ignore[arg-type]
    return ssh_node("gpu-node-02", "gpu-node-02", opts, index=1)


def said(exc: BaseException, **ssh: object) -> tuple[str, str, str]:
    """(kind, message without the node's name in front, hint) of the error for `exc`."""
    err = _translate(node(**ssh), exc)
    assert err.message.startswith("gpu-node-02: ")
    return err.kind, err.message.removeprefix("gpu-node-02: "), err.hint or ""


def test_a_name_that_does_not_resolve_says_so_not_unknown_error_minus_2() -> None:
    # what socket.getaddrinfo raises for a name no resolver knows (EAI_NONAME is -2 on glibc)
    kind, message, hint = said(socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    assert message == "cannot resolve the name gpu-node-02: Name or service not known"
    assert "Unknown error" not in message and "getent hosts gpu-node-02" in hint and kind == "unreachable"


def test_refused_names_sshd_and_the_port() -> None:
    exc = NoValidConnectionsError({("10.0.0.2", 22): ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")})
    _, message, hint = said(exc)
    assert message == "connection to root@gpu-node-02:22 refused" and "is sshd running on that port?" in hint


def test_no_route_is_not_called_refused() -> None:
    _, message, _ = said(NoValidConnectionsError({("10.0.0.2", 22): OSError(errno.EHOSTUNREACH, "No route to host")}))
    assert message == "no route to host gpu-node-02 (root@gpu-node-02:22)"
    _, message, hint = said(OSError(errno.ENETUNREACH, "Network is unreachable"))
    assert message == "network unreachable: this machine has no route to gpu-node-02 (root@gpu-node-02:22)"
    assert "ip route get gpu-node-02" in hint


def test_a_timeout_names_the_seconds() -> None:
    assert said(TimeoutError("timed out"), connect_timeout=2)[1] == (
        "timed out: root@gpu-node-02:22 did not answer within 2 s"
    )
    # connect(2)'s ETIMEDOUT is Python's TimeoutError: the same words
    assert said(OSError(errno.ETIMEDOUT, "Connection timed out"))[1] == (
        "timed out: root@gpu-node-02:22 did not answer within 10 s"
    )


def test_an_errno_orch_has_no_words_for_is_still_words() -> None:
    assert said(OSError(errno.EPERM, "Operation not permitted"))[1] == (
        "cannot reach root@gpu-node-02:22: Operation not permitted"
    )


def test_auth_refused_names_the_keys_offered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    key = tmp_path / "cluster_ed25519"
    key.write_text("(private key)\n")
    # a real OpenSSH public key line (ssh-keygen -t ed25519), its fingerprint as ssh-keygen -l prints it
    key.with_suffix(".pub").write_text(
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJDg8Bo2U7txquhOhLSkjmZzhe6w9XXGs/7mdGms1lZV test@orch\n"
    )
    kind, message, hint = said(paramiko.AuthenticationException("Authentication failed."), identity=str(key))
    assert kind == "auth"
    assert message == (
        f"authentication refused for root@gpu-node-02:22: Authentication failed.; offered "
        f"{key} (ssh-ed25519 SHA256:Ho6p4bBJjoE/iE+rSrs6iGRutFAw3HytRp4W82YnUa8)"
    )
    assert "authorized_keys" in hint
    assert offered_keys(SSHOptions(identity=None, ssh_config=None)) == (
        "no key at all (no ssh.identity, no agent, no ~/.ssh/id_*)"
    )
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_rsa").write_text("x")
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/agent.sock")
    assert offered_keys(SSHOptions(identity=None, ssh_config=None)) == (
        f"the SSH agent's keys (ssh-add -l lists them), {tmp_path}/.ssh/id_rsa"
    )


def test_fingerprint_of_a_file_that_is_not_a_key_is_none(tmp_path: Path) -> None:
    (tmp_path / "k.pub").write_text("not a key\n")
    assert key_fingerprint(str(tmp_path / "k.pub")) is None
    assert key_fingerprint(str(tmp_path / "missing.pub")) is None
