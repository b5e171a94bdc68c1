"""Quoting happens once, in `command_line`; LocalTransport runs exactly what SSH would send."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.config import inventory, nodes
from orchestrator.errors import RemoteCommandFailed, TransportError
from orchestrator.transport import Cluster, LocalTransport, Transport, command_line, fan_out
from tests.hypothesis_support import examples

INV = inventory.parse("transport: local\nnodes:\n  - host: localhost\n    name: n[0-2]\n", "local.yaml")
ECHO = [sys.executable, "-c", "import json,os,sys; print(json.dumps([sys.argv[1:], os.environ.get('X')]))"]

# Anything a shell might interpret, plus unicode; NUL cannot exist in argv or environ at all.
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)


def test_command_line_quotes_once() -> None:
    line = command_line(["echo", "a b", "$(id)"], {"K": "v'1"}, "/tmp/x y")
    assert line == "cd '/tmp/x y' && exec env -- 'K=v'\"'\"'1' echo 'a b' '$(id)'"
    assert command_line(["ls"], cwd="~/runs") == 'cd "$HOME"/runs && exec ls'


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=st.lists(TEXT, max_size=4), value=TEXT)
def test_args_and_env_arrive_byte_for_byte(args: list[str], value: str) -> None:
    t = LocalTransport(INV.nodes[0])
    result = t.run([*ECHO, *args], env={"X": value}).check()
    assert json.loads(result.stdout) == [args, value]


def test_nonzero_exit_is_a_value_then_an_error_on_check() -> None:
    r = LocalTransport(INV.nodes[0]).run(["sh", "-c", "echo oops >&2; exit 3"])
    assert (r.ok, r.exit_code, r.stderr.strip()) == (False, 3, "oops")
    with pytest.raises(RemoteCommandFailed, match="exited 3"):
        r.check()


def test_timeout_kills_the_command() -> None:
    start = time.monotonic()
    with pytest.raises(TransportError) as info:
        LocalTransport(INV.nodes[0]).run(["sleep", "30"], timeout=0.5)
    assert info.value.kind == "timeout"
    assert time.monotonic() - start < 5


def test_popen_streams_lines_and_close_kills() -> None:
    t = LocalTransport(INV.nodes[0])
    p = t.popen(["sh", "-c", "for i in 1 2 3; do echo $i; done; sleep 30"])
    lines = [next(p.lines()) for _ in range(3)]
    assert lines == [b"1\n", b"2\n", b"3\n"]
    assert p.poll() is None
    p.close()
    assert p.poll() is not None


def test_fan_out_collects_every_node_even_when_some_fail() -> None:
    def work(node: nodes.Node) -> str:
        if node.name == "n1":
            raise TransportError(node.name, "unreachable", "down")
        return node.name.upper()

    results = fan_out(list(INV.nodes), work, max_workers=2)
    assert list(results) == ["n0", "n1", "n2"]
    assert results["n0"] == "N0" and results["n2"] == "N2"
    assert isinstance(results["n1"], TransportError)
    assert results.succeeded == {"n0": "N0", "n2": "N2"}
    assert list(results.failed) == ["n1"] and results.failed["n1"] is results["n1"]


def test_cluster_fan_out_runs_on_every_node() -> None:
    with Cluster(INV) as cluster:
        results = cluster.fan_out(lambda t: t.run(["sh", "-c", "echo $0", t.node.name]).stdout.strip())
    assert results == {"n0": "n0", "n1": "n1", "n2": "n2"}


def test_fan_out_draws_the_progress_as_nodes_answer_and_limits_the_workers() -> None:
    seen: list[tuple[str, int, int]] = []
    running, most = [0], [0]
    lock = threading.Lock()

    def work(t: Transport) -> str:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            return t.run(["sh", "-c", "sleep 0.2; echo $0", t.node.name]).stdout.strip()
        finally:
            with lock:
                running[0] -= 1

    with Cluster(INV) as cluster:
        got = cluster.fan_out(work, workers=2, progress=lambda *p: seen.append(p), label="syncing")
    assert got == {"n0": "n0", "n1": "n1", "n2": "n2"}
    assert seen == [("syncing", 1, 3), ("syncing", 2, 3), ("syncing", 3, 3)] and most[0] == 2


def test_run_shell_sends_the_line_as_it_is() -> None:
    r = LocalTransport(INV.nodes[0]).run_shell("echo a | tr a b; echo $((1 + 2))")
    assert (r.exit_code, r.stdout, r.argv) == (0, "b\n3\n", ("echo a | tr a b; echo $((1 + 2))",))


def child_runs(cmdline: bytes) -> list[int]:
    """Pids of this process's children (and theirs) whose command line is `cmdline`."""
    import os

    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes() if entry.isdigit() else b""
        except OSError:
            continue
        if stat:
            parents[int(entry)] = int(stat.rsplit(b")", 1)[1].split()[1])
    mine, found = {os.getpid()}, []
    for _ in range(5):  # a few generations deep
        mine |= {pid for pid, ppid in parents.items() if ppid in mine}
    for pid in mine - {os.getpid()}:
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() == cmdline:
                found.append(pid)
        except OSError:
            continue
    return found


def test_close_ends_a_command_run_still_waits_for() -> None:
    """As closing an SSH connection ends its sessions: Ctrl-C in `orch exec` must not wait for them."""
    import threading

    t = LocalTransport(INV.nodes[0])
    got: list[object] = []
    worker = threading.Thread(target=lambda: got.append(t.run(["sleep", "60"])))
    worker.start()
    deadline = time.monotonic() + 30
    while not any(child_runs(b"sleep\x0060\x00")):  # the command runs: close must end it, not wait
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.02)
    t0 = time.monotonic()
    t.close()
    worker.join(30)
    assert not worker.is_alive() and time.monotonic() - t0 < 30
    assert got[0].exit_code == -9  # type: ignore[attr-defined]


def test_a_close_while_a_command_is_starting_ends_it_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in `orch exec` right as a node's command starts (the process exists, the transport
    has not recorded it yet): close must end it too, or the exec waits out the whole command."""
    import subprocess

    from orchestrator.transport import local

    t = LocalTransport(INV.nodes[0])
    real = subprocess.Popen

    def popen_then_close(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        proc = real(*args, **kwargs)  # type: ignore[call-overload]
        t.close()  # lands between the fork and the transport's record of the process
        return proc  # type: ignore[no-any-return]

    monkeypatch.setattr(local.subprocess, "Popen", popen_then_close)
    result = t.run(["sleep", "60"])
    assert result.exit_code == -9  # killed, not run to its end
    monkeypatch.undo()
    assert t.run(["true"]).exit_code == 0  # a command started after the close runs as usual
