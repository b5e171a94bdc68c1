"""The transport's stream verbs on `transport: local` nodes (processes of this machine): `pipe`
(a byte stream into a node's command) and `copy_tree` (rsync here; and the base class's fallback,
a tar stream into the node's tar over `pipe`, which a transport without an rsync reach gets), each
with a real rsync and a real tar. Over real sshd nodes: tests/integration/test_transport_ssh.py."""

from __future__ import annotations

import io
import os
import shutil
import stat
from pathlib import Path

import pytest

from orchestrator.config import inventory
from orchestrator.errors import Stalled, TransportError
from orchestrator.transport import CopyFailed, Fed, LocalTransport, Transport

INV = inventory.parse("transport: local\nnodes:\n  - host: localhost\n    name: n0\n", "local.yaml")
COUNT = ["python3", "-c", "import sys; d = sys.stdin.buffer.read(); print(len(d), d[:5])"]
COUNT_THEN_PAUSE = ["sh", "-c", "wc -c; exec sleep 1"]
"""Takes every byte, then finishes for longer than the tests' stall deadline."""


@pytest.fixture
def t() -> LocalTransport:
    return LocalTransport(INV.nodes[0])


@pytest.mark.parametrize(
    "source",
    [
        b"hello" * 200_000,
        [b"hello" * 100_000, b"hello" * 100_000],
        io.BytesIO(b"hello" * 200_000),
    ],
    ids=["bytes", "chunks", "a stream without a descriptor"],
)
def test_pipe_streams_every_byte_into_the_command(t: LocalTransport, source: object) -> None:
    got = t.pipe(COUNT, source)  # type: ignore[arg-type]
    assert (got.exit_code, got.stdout) == (0, "1000000 b'hello'\n")


def test_pipe_hands_a_real_file_over_as_it_is(t: LocalTransport, tmp_path: Path) -> None:
    archive = tmp_path / "image.tar"
    archive.write_bytes(os.urandom(3 << 20))
    with archive.open("rb") as fh:
        got = t.pipe(["sha256sum"], fh)
    import hashlib

    assert got.stdout.split()[0] == hashlib.sha256(archive.read_bytes()).hexdigest()


def test_pipe_keeps_a_failing_commands_answer_and_a_command_that_stops_reading(t: LocalTransport) -> None:
    got = t.pipe(["sh", "-c", "head -c 3; echo; echo said >&2; exit 4"], [b"x" * (1 << 20)] * 8)
    assert (got.exit_code, got.stdout, got.stderr) == (4, "xxx\n", "said\n")


def test_pipe_ends_a_command_that_stops_taking_bytes_by_its_deadline(t: LocalTransport) -> None:
    """A command that reads a little, then holds its stdin without reading (a stopped load): past
    `Fed.stall_s` with no byte taken the stream is ended, Stalled says after how many bytes, and
    the local transport's command is gone with it (`close_stops_commands`)."""
    fed = Fed(stall_s=0.5)
    stream = [b"x" * (1 << 20)] * 8
    with pytest.raises(Stalled) as info:
        t.pipe(["sh", "-c", "head -c 100000 >/dev/null; exec sleep 60"], stream, fed=fed)
    assert info.value.kind == "stalled" and info.value.stall_s == 0.5
    assert 100_000 <= info.value.sent == fed.bytes < 8 << 20, info.value.sent
    assert fed.stalled and not fed.ended
    assert not t.children._procs  # nothing of it is left to end


def test_pipe_ends_a_command_that_took_every_byte_and_does_not_finish_by_its_finish_deadline(
    t: LocalTransport,
) -> None:
    """A load that took the whole stream, then hangs (its disk, after the stream): past
    `Fed.finish_s` from the last byte the stream is ended, Stalled says it took every byte."""
    fed = Fed(stall_s=0.3, finish_s=0.6)
    with pytest.raises(Stalled) as info:
        t.pipe(["sh", "-c", "cat >/dev/null; exec sleep 60"], [b"x" * (1 << 20)] * 2, fed=fed)
    assert info.value.finishing and info.value.stall_s == 0.6 and info.value.sent == 2 << 20
    assert "took every byte (2097152) and did not finish within 1 s" in str(info.value.message)
    assert fed.ended and fed.stalled and fed.ended_at is not None
    assert not t.children._procs  # nothing of it is left to end


def test_the_finish_deadline_counts_from_the_last_byte() -> None:
    now = [100.0]
    fed = Fed(stall_s=5.0, clock=lambda: now[0], finish_s=20.0)
    fed.took(10)
    now[0] += 4.9
    assert not fed.overdue()
    now[0] += 0.2
    assert fed.overdue()  # no byte for 5 s while some remained
    fed.took(10)
    fed.end()
    now[0] += 19.9
    assert not fed.overdue()  # finishing: only the finish deadline counts
    now[0] += 0.2
    assert fed.overdue()
    assert not Fed(stall_s=5.0, clock=lambda: now[0]).overdue()
    unbounded = Fed(stall_s=5.0, clock=lambda: now[0])
    unbounded.end()
    now[0] += 1e6
    assert not unbounded.overdue()  # without finish_s the finishing is not judged


@pytest.mark.parametrize("source", ["a file", "chunks"])
def test_pipe_counts_every_byte_taken_and_leaves_the_commands_finishing_unjudged(
    t: LocalTransport, tmp_path: Path, source: str
) -> None:
    """`fed` counts a file too (fed through a thread, not handed over): every byte; once the
    last one went, the command may take as long as it needs (its finishing is not judged)."""
    data = os.urandom(3 << 20)
    archive = tmp_path / "image.tar"
    archive.write_bytes(data)
    fed = Fed(stall_s=0.3)
    with archive.open("rb") as fh:
        got = t.pipe(COUNT_THEN_PAUSE, fh if source == "a file" else [data[:1000], data[1000:]], fed=fed)
    assert (got.exit_code, got.stdout.split()[0]) == (0, str(len(data)))
    assert fed.bytes == len(data) and fed.ended and not fed.stalled


def test_pipe_past_its_timeout_is_ended(t: LocalTransport) -> None:
    with pytest.raises(TransportError) as info:
        t.pipe(["sleep", "30"], b"", timeout=0.5)
    assert info.value.kind == "timeout"
    assert not t.children._procs  # nothing of it is left to end


def tree(root: Path) -> Path:
    src = root / "src"
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "pkg" / "w e'ird.bin").write_bytes(os.urandom(5000))
    (src / "pkg" / "__pycache__" / "x.pyc").write_bytes(b"controller's")
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)
    (src / "link").symlink_to("train.py")
    return src


def files(root: Path) -> dict[str, bytes | str]:
    return {
        str(p.relative_to(root)): (os.readlink(p) if p.is_symlink() else p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


@pytest.mark.parametrize("how", ["rsync", "tar"])
def test_copy_tree_puts_each_source_at_its_own_path_under_dest(t: LocalTransport, tmp_path: Path, how: str) -> None:
    src = tree(tmp_path)
    dest = tmp_path / "node root"
    copy = t.copy_tree if how == "rsync" else (lambda *a, **k: Transport.copy_tree(t, *a, **k))
    got = copy([str(src)], str(dest))
    landed = dest / str(src).lstrip("/")
    want = {k: v for k, v in files(src).items() if "__pycache__" not in k}
    assert files(landed) == want
    assert stat.S_IMODE((landed / "run.sh").stat().st_mode) == 0o755 and (landed / "link").is_symlink()
    assert got.files == 3 and got.bytes == sum(len(v) for k, v in want.items() if k != "link")
    assert f"{src}/pkg/w e'ird.bin" in {c.split(" ", 1)[1] for c in got.changes}
    assert not any("__pycache__" in c for c in got.changes)


def test_rsync_sends_nothing_the_second_time_the_tar_fallback_sends_all_and_says_so(
    t: LocalTransport, tmp_path: Path
) -> None:
    src = tree(tmp_path)
    dest = str(tmp_path / "dest")
    t.copy_tree([str(src)], dest)
    again = t.copy_tree([str(src)], dest)
    assert again.up_to_date and (again.files, again.changes) == (0, ())
    fallback = Transport.copy_tree(t, [str(src)], dest)
    assert fallback.files == 3 and fallback.sent > 0
    assert all(c.startswith("<f????????? ") for c in fallback.changes)  # sent, whether or not it changed


def test_the_tar_fallback_dry_run_sends_nothing_and_refuses_delete(t: LocalTransport, tmp_path: Path) -> None:
    src = tree(tmp_path)
    dest = tmp_path / "dest"
    dry = Transport.copy_tree(t, [str(src)], str(dest), dry_run=True)
    assert (dry.files, dry.sent) == (3, 0) and not dest.exists()
    with pytest.raises(CopyFailed, match="cannot delete") as info:
        Transport.copy_tree(t, [str(src)], str(dest), delete=True)
    assert info.value.hint == "copy without --delete" and not dest.exists()


def test_a_node_without_tar_is_named(t: LocalTransport, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The node's PATH has no tar (this machine's tar is started by its full path)."""
    import orchestrator.transport.base as base

    src = tree(tmp_path)
    real, here = shutil.which("tar"), base.tar_argv
    assert real is not None
    monkeypatch.setattr(base, "tar_argv", lambda sources: [real, *here(sources)[1:]])
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(CopyFailed) as info:
        Transport.copy_tree(t, [str(src)], str(tmp_path / "dest"))
    assert (info.value.returncode, info.value.detail) == (127, "tar is not installed on this node")


def test_a_failing_tar_here_is_the_cause_named(
    t: LocalTransport, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import orchestrator.transport.base as base

    src = tree(tmp_path)
    monkeypatch.setattr(base, "tar_argv", lambda sources: ["sh", "-c", "echo 'tar: cannot read x' >&2; exit 2"])
    with pytest.raises(CopyFailed) as info:
        Transport.copy_tree(t, [str(src)], str(tmp_path / "dest"))
    assert info.value.returncode == 2
    assert info.value.detail == "tar on this machine (the controller) exited 2: tar: cannot read x"


def test_close_ends_a_pipe_in_flight(t: LocalTransport) -> None:
    import threading

    answer: dict[str, object] = {}
    runner = threading.Thread(target=lambda: answer.update(got=t.pipe(["sleep", "30"], b"")), daemon=True)
    runner.start()
    import time

    deadline = time.monotonic() + 10
    while not t.children._procs and time.monotonic() < deadline:
        time.sleep(0.01)
    procs = list(t.children._procs)
    t.close()
    assert procs and all(p.poll() is not None for p in procs)  # ended before close returned
    runner.join(10)
    assert answer["got"].exit_code == -9  # type: ignore[attr-defined]
