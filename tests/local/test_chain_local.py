"""The copy chain's relays as processes of this machine (`transport: local`), on this Python and on
the oldest a node may have (3.8): a stranger without the transfer's secret is refused while the
transfer runs, a relay killed mid-transfer is spliced out and the members after it resume, and the
tail's files are the controller's, byte for byte. The same on real nodes behind rate-limited ports:
tests/integration/test_chain_netns.py."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from orchestrator.config.nodes import Node, SSHOptions
from orchestrator.node import relay
from orchestrator.remote import chain
from orchestrator.transport.local import LocalTransport

MB = 1 << 20


def python(which: str) -> str:
    """This Python, or the oldest a node may have: $ORCH_TEST_PYTHON38, python3.8 on PATH, or pyenv's."""
    if which == "this":
        return sys.executable
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates = [os.environ.get("ORCH_TEST_PYTHON38"), shutil.which("python3.8")]
    candidates += sorted(str(p) for p in pyenv.glob("versions/3.8*/bin/python3.8"))
    for exe in filter(None, candidates):
        out = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip() == "(3, 8)":
            return exe
    pytest.skip("no Python 3.8 here (set ORCH_TEST_PYTHON38, or put python3.8 on PATH or in pyenv)")


def kill_once_written(where: Path, group: int, bytes_: int, killed: list[int]) -> None:
    """SIGKILL the process group `group` once a temporary file in `where` holds `bytes_` (30 s at most)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for part in where.glob(".*.orch-*") if where.is_dir() else ():
            try:
                size = part.stat().st_size
            except OSError:
                continue
            if size >= bytes_:
                os.killpg(group, signal.SIGKILL)
                killed.append(size)
                return
        time.sleep(0.001)


def local_nodes(n: int, exe: str) -> dict[str, LocalTransport]:
    nodes = [Node(f"n{i}", "localhost", "127.0.0.1", None, 1, exe, {}, SSHOptions(), i) for i in range(n)]
    return {node.name: LocalTransport(node) for node in nodes}


def files(tmp_path: Path, sizes: Sequence[int]) -> tuple[list[tuple[str, int]], list[dict]]:
    rng = random.Random(7)
    out, entries = [], []
    for i, size in enumerate(sizes):
        src = tmp_path / "src" / f"f{i}.bin"
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_bytes(rng.randbytes(size))
        st = src.stat()
        out.append((str(src), size))
        entries.append({"p": str(tmp_path / "dst" / src.name), "t": "f", "s": size, "m": 0o644, "mt": st.st_mtime_ns})
    return out, entries


@pytest.mark.parametrize("which", ["this", "3.8"])
def test_a_stranger_is_refused_and_a_relay_killed_mid_transfer_is_spliced_out(which: str, tmp_path: Path) -> None:
    transports = local_nodes(4, python(which))
    sources, entries = files(tmp_path, [16 * MB, 16 * MB, 16 * MB])
    killed: list[int] = []

    with chain.Chain(transports, [t.node for t in transports.values()], {"mode": "files", "manifest": entries}) as ch:  # type: ignore[arg-type]
        members = ch.start()
        assert all(m.ready is not None for m in members.values()), [m.said() for m in members.values()]
        assert relay.expand(members["n3"].ready["need"]) == [0, 1, 2]  # type: ignore[index]
        # a stranger at n2's port: it answers the challenge without the secret, and is shut out
        with socket.create_connection(("127.0.0.1", members["n2"].port), timeout=10) as stranger:
            hello = relay.read_exact(stranger.makefile("rb").read, len(relay.MAGIC) + 16)
            stranger.sendall(relay.hello_answer(bytes(32), ch.tid.encode(), hello[8:], 2, os.urandom(16)))
            assert stranger.recv(1) == b""

        # n1's relay dies once the tail has written 2 MB of the 48 (local nodes run in sessions of their own)
        n1 = members["n1"]
        assert n1.proc is not None
        killer = threading.Thread(target=kill_once_written, args=(tmp_path / "dst", n1.proc.pid, 2 * MB, killed))
        killer.start()
        go = {name: {"send": [[0, 3]], "want": [[0, 3]] if name == "n3" else []} for name in transports}
        source = chain.FileSource(sources)
        ch.run([list(transports)], source, go)
        source.close()
        killer.join(30)
        notes = list(ch.notes)
        n3 = members["n3"]
    assert any(note.startswith("n2 refused a connection from 127.0.0.1") for note in notes), notes
    assert killed, (
        notes,
        {n: (m.got, m.dropped, m.ready and m.ready["pid"], m.proc and m.proc.pid) for n, m in members.items()},
    )
    assert members["n1"].dropped is not None and members["n1"].dropped.startswith("its relay ended"), notes
    assert any(note.startswith("n0 now forwards to n2, which resumes at byte") for note in notes), notes
    assert n3.done == {"ev": "done", "files": 3, "bytes": 48 * MB} and n3.bye
    for (src, _), entry in zip(sources, entries):
        assert hashlib.sha256(Path(entry["p"]).read_bytes()).digest() == hashlib.sha256(Path(src).read_bytes()).digest()
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == ["f0.bin", "f1.bin", "f2.bin"]
