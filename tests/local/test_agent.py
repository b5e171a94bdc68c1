"""The node agent on this machine, with plain shell jobs standing in for torchrun (no network), and
one real torchrun (--standalone, on loopback) where its own output is the subject."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from orchestrator.logs.fetch import new_nonce, read_frames, reader_argv, reader_program
from orchestrator.node import agent, agent_files, script, stacks
from tests.disk_support import fill, small_disk
from tests.procs_support import received, stranger

BOOT = script("boot")
READER = reader_program()

AGENT = str(Path(agent.__file__))


def call(*args: str, timeout: float = 60) -> tuple[int, dict[str, Any]]:
    r = subprocess.run([sys.executable, AGENT, *args], capture_output=True, text=True, timeout=timeout)
    return r.returncode, json.loads(r.stdout.strip().splitlines()[-1])


def prepare(tmp_path: Path, script: str, run: str = "r1", grace: float = 1.0, **kw: Any) -> Path:
    d = tmp_path / "run" / "n1"
    d.mkdir(parents=True)
    spec = {
        "run": f"{run}-{os.getpid()}-{time.monotonic_ns()}",
        "node": "n1",
        "argv": ["sh", "-c", script],
        "env": {"GREETING": "hello world; $(not expanded)"},
        "cwd": str(tmp_path),
        "grace": grace,
        **kw,
    }
    (d / "launch.json").write_text(json.dumps(spec))
    return d


def state(d: Path) -> dict[str, Any]:
    return dict(json.loads((d / "state.json").read_text()))


def wait_for(pred: Callable[[], Any], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.05)


def snapshot_holds(d: Path, marker: bytes) -> None:
    """Wait until the agent's snapshot of the job's processes (state.json `procs`) holds the one
    whose command line has `marker` (the agent takes one about every second)."""

    def cmdline(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""

    wait_for(
        lambda: any(marker in cmdline(p) for p, _s in state(d).get("procs") or []),
        f"a snapshot of the job's processes with {marker.decode()}",
    )


def wait_state(d: Path, *states: str, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = state(d)
        if st.get("state") in states:
            return st
        time.sleep(0.05)
    raise AssertionError(f"state stayed {state(d)}")


def test_start_runs_detached_stamps_lines_and_records_the_exit(tmp_path: Path) -> None:
    d = prepare(tmp_path, 'echo "$GREETING"; echo oops >&2; pwd; echo "umask $(umask)"; exit 3')
    code, st = call("start", str(d))
    assert code == 0 and st["state"] in ("running", "failed")
    assert os.getsid(0) != st["agent_pid"]  # not in our session
    final = wait_state(d, "failed")
    assert final["exit_code"] == 3 and final["pgid"] == final["pid"] and final["finished_at"]
    log = (d / "node.log").read_text().splitlines()
    assert any(ln.endswith(" out hello world; $(not expanded)") for ln in log)
    assert any(ln.endswith(" err oops") for ln in log)
    assert any(ln.endswith(f" out {tmp_path}") for ln in log)
    mine = os.umask(0o022)
    os.umask(mine)
    assert any(ln.endswith(f" out umask {mine:04o}") for ln in log), log  # the job keeps the login's umask
    assert all(len(ln.split(" ", 2)[0]) == 27 and ln.split(" ", 2)[0].endswith("Z") for ln in log)
    assert (d / "state.json").stat().st_mode & 0o077 == 0 and (d / "node.log").stat().st_mode & 0o077 == 0


TORCHRUN_FAILED = (
    (Path(__file__).resolve().parents[1] / "fixtures" / "torchrun_tee3_2proc_exit3_stderr_torch2.14.txt")
    .read_text()
    .splitlines()[10]
)  # torchrun's line when a worker exits non-zero (torch 2.14)


def test_when_torchrun_first_says_a_worker_failed_is_recorded_apart_from_its_exit(tmp_path: Path) -> None:
    assert "] failed (exitcode: 3) local_rank: 1 (pid: 6482)" in TORCHRUN_FAILED
    older = (
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 77) of binary: x"
    )
    # a rank's line (torchrun's `[default0]:` prefix) and stdout are not torchrun saying so; the job then
    # stays until the test has seen the line, as torchrun writes its summary and exits later
    job = (
        f"echo '[default0]:failed (exitcode: 9) local_rank: 0 (pid: 5)' >&2; echo '{TORCHRUN_FAILED}'; "
        f"echo '{TORCHRUN_FAILED}' >&2; echo '{older}' >&2; "
        "while [ ! -e release ]; do sleep 0.05; done; exit 3"
    )
    d = prepare(tmp_path, job)
    assert call("start", str(d))[0] == 0
    log = d / "node.log"
    wait_for(lambda: " err ERROR:torch" in log.read_text(), "torchrun's failure lines in node.log")
    assert "failed_at" not in state(d)  # said once the job ends, with its exit
    (tmp_path / "release").touch()
    final = wait_state(d, "failed")
    stamp = next(ln.split(" ", 1)[0] for ln in log.read_text().splitlines() if ln.endswith(" err " + TORCHRUN_FAILED))
    when = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    assert final["failed_at"] == pytest.approx(when, abs=1e-6) and final["failed_at"] < final["finished_at"]
    assert final["exit_code"] == 3
    _code, st = call("status", str(d))
    assert st["failed_at"] == final["failed_at"]
    # a job that fails without torchrun's line (torchrun itself, or no torchrun) has none
    d2 = prepare(tmp_path / "b", "echo '[default0]:failed (exitcode: 9) local_rank: 0 (pid: 5)' >&2; exit 1")
    assert call("start", str(d2))[0] == 0
    assert "failed_at" not in wait_state(d2, "failed")


def test_a_workers_line_torn_by_torchruns_tee_is_whole_in_node_log(tmp_path: Path) -> None:
    """Real torchrun --tee 3 under PYTHONUNBUFFERED (as the plan starts it): local rank 0 writes
    half a line, rank 1 a whole one, then rank 0 the rest. torchrun writes the half and rank 1's
    line as one line (tests/fixtures/torchrun_tee3_torn_line_stdout_torch2.14.txt); node.log has
    each rank's own line."""
    flags = tmp_path / "flags"
    flags.mkdir()
    worker = Path(__file__).resolve().parents[1] / "fixtures" / "torchrun_capture_worker_torn.py"
    d = prepare(tmp_path, "", env={"FLAGS": str(flags), "PYTHONUNBUFFERED": "1"})
    spec = json.loads((d / "launch.json").read_text())
    spec["argv"] = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "--tee=3",
        str(worker),
    ]
    (d / "launch.json").write_text(json.dumps(spec))
    code, _ = call("start", str(d))
    assert code == 0
    assert wait_state(d, "succeeded", "failed", timeout=90)["state"] == "succeeded", (d / "node.log").read_text()
    out = [ln.split(" ", 2)[2] for ln in (d / "node.log").read_text().splitlines() if ln.split(" ", 2)[1] == "out"]
    assert "[default0]:[rank 0] seq=5 of 53 and the rest" in out, out
    assert "[default1]:[rank 1] seq=5 of 53" in out, out


def test_stop_terms_then_kills_the_group_and_is_idempotent(tmp_path: Path) -> None:
    d = prepare(tmp_path, "trap '' TERM; while true; do echo tick; sleep 0.2; done", grace=1.0)
    assert call("start", str(d))[0] == 0
    wait_for(lambda: "tick" in (d / "node.log").read_text(), "the job to run past its trap")
    t = time.monotonic()
    code, out = call("stop", str(d), "--grace", "1")
    assert code == 0 and out["remaining"] == [] and out["state"] == "stopped"
    assert time.monotonic() - t < 8
    st = state(d)
    assert st["exit_code"] == -9 and st["signal"] == "SIGKILL"
    log = (d / "node.log").read_text()
    assert "received SIGTERM" in log and "SIGKILL" in log
    code, again = call("stop", str(d), "--grace", "1")
    assert code == 0 and again["stopped"] == [] and again["state"] == "stopped"


def test_orphans_of_a_killed_job_are_reaped_and_killed(tmp_path: Path) -> None:
    # like torchrun's workers: in a session of their own, they survive a kill -9 of their parent
    d = prepare(tmp_path, "setsid sleep 300 & setsid sleep 301 & wait")
    assert call("start", str(d))[0] == 0
    deadline = time.monotonic() + 10
    while len(state(d).get("procs") or []) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    sleepers = [p for p, _s in state(d)["procs"] if p != state(d)["pid"]]
    os.kill(state(d)["pid"], signal.SIGKILL)
    final = wait_state(d, "failed")
    assert final["exit_code"] == -9
    wait_for(lambda: not any(agent.alive(p) for p in sleepers), "the orphans to be killed")


def test_stop_without_the_agent_still_finds_the_job(tmp_path: Path) -> None:
    d = prepare(tmp_path, "setsid sleep 302 & while true; do sleep 0.2; done")
    assert call("start", str(d))[0] == 0
    # the sleeper itself, not the job's shell (whose command line holds "302" too)
    snapshot_holds(d, b"sleep\x00302\x00")
    st = state(d)
    sleeper = next(p for p, _s in st["procs"] if Path(f"/proc/{p}/cmdline").read_bytes() == b"sleep\x00302\x00")
    os.kill(st["agent_pid"], signal.SIGKILL)
    code, status = call("status", str(d))
    assert status["agent_alive"] is False and status["job_alive"] is True
    code, out = call("stop", str(d), "--grace", "1")
    # the job's shell (its process group) and the sleeper in a session of its own are both found and stopped
    assert code == 0 and out["remaining"] == [] and {st["pid"], sleeper} <= set(out["stopped"]), out
    assert not agent.alive(sleeper) and not agent.alive(st["pid"])
    assert state(d)["state"] == "stopped"


def hook_spec(tmp_path: Path) -> list[str]:
    """A stop hook standing in for `docker rm -f NAME`: it appends its argv (and an env value of
    the launch, as a runtime reads DOCKER_HOST) to hook.log beside the run."""
    return [
        "sh",
        "-c",
        'echo "$GREETING | $*" >> "$0"',
        str(tmp_path / "hook.log"),
        "rm",
        "-f",
        "orch-r1-n1-{ORCH_UID}",
    ]


def hook_calls(tmp_path: Path) -> list[str]:
    try:
        return (tmp_path / "hook.log").read_text().splitlines()
    except FileNotFoundError:
        return []


STOP_PATHS = (
    "torchrun exit",
    "SIGTERM to the agent",
    "agent.py stop",
    "lease expiry",
    "agent killed -9, then stop",
    "grace passed",
)


@pytest.mark.parametrize("path", STOP_PATHS)
def test_the_stop_hook_runs_on_every_stop_path(tmp_path: Path, path: str) -> None:
    """The plan's stop hook (launch.json `stop_hook`, recorded in state.json with the node's values
    filled in) runs however the job ends: what a container launch needs so that no container
    outlives the job, without the agent knowing what a container is."""
    job = {"torchrun exit": "echo ran; exit 0", "grace passed": "trap '' TERM; while true; do sleep 0.1; done"}.get(
        path, "setsid sleep 305 & while true; do sleep 0.1; done"
    )
    d = prepare(
        tmp_path, job, grace=1.0, stop_hook=hook_spec(tmp_path), **({"lease_s": 1} if path == "lease expiry" else {})
    )
    assert call("start", str(d))[0] == 0
    st = state(d)
    assert st["stop_hook"][-1] == f"orch-r1-n1-{os.getuid()}", st
    assert hook_calls(tmp_path) == [] or path == "torchrun exit"
    if path == "SIGTERM to the agent":
        os.kill(st["agent_pid"], signal.SIGTERM)
    elif path == "agent.py stop":
        assert call("stop", str(d), "--grace", "1")[0] == 0
    elif path == "grace passed":  # the agent's own grace (1 s) passes first: its hook before its SIGKILL
        assert call("stop", str(d), "--grace", "10")[0] == 0
    elif path == "agent killed -9, then stop":
        snapshot_holds(d, b"sleep\x00305\x00")
        os.kill(st["agent_pid"], signal.SIGKILL)
        wait_for(lambda: not agent.alive(st["agent_pid"], st.get("agent_start")), "the agent to die")
        assert call("stop", str(d), "--grace", "1")[0] == 0
    final = wait_state(d, "succeeded", "stopped")
    wait_for(lambda: "stop_hook_result" in state(d), "the hook's result in state.json")
    want = f"hello world; $(not expanded) | rm -f orch-r1-n1-{os.getuid()}"
    calls = hook_calls(tmp_path)
    assert calls and set(calls) == {want}, calls
    assert len(calls) == (2 if path == "grace passed" else 1), calls  # before the SIGKILL, and at the end
    assert state(d)["stop_hook_result"] == "exit 0", final
    assert "stop hook" in (d / "node.log").read_text()


def test_a_failing_stop_hook_is_recorded_and_the_run_still_ends(tmp_path: Path) -> None:
    d = prepare(tmp_path, "exit 4", stop_hook=["sh", "-c", "echo no such container >&2; exit 1"])
    assert call("start", str(d))[0] == 0
    wait_state(d, "failed")
    wait_for(lambda: "stop_hook_result" in state(d), "the hook's result in state.json")
    assert state(d)["stop_hook_result"] == "exit 1: no such container" and state(d)["exit_code"] == 4


def reader(d: Path) -> tuple[subprocess.Popen[bytes], Iterator[tuple[str, bytes]]]:
    """The log reader `orch up` runs on a node, asked for status frames, polling every 50 ms."""
    nonce = new_nonce()
    proc = subprocess.Popen(
        reader_argv(sys.executable, str(d), 0, 0.05, False, True, nonce), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(READER.encode())
    proc.stdin.close()
    return proc, read_frames(proc.stdout, nonce)


def next_status(frames: Iterator[tuple[str, bytes]], until: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    for kind, payload in frames:
        if kind == "S":
            st = dict(json.loads(payload))
            if until(st):
                return st
    raise AssertionError("the reader ended")


SAME = ("state", "exit_code", "signal", "pid", "pgid", "agent_pid", "started_at", "finished_at", "agent_alive")


def test_the_log_readers_status_frames_say_what_agent_status_says(tmp_path: Path) -> None:
    d = prepare(tmp_path, "setsid sleep 303 & while true; do sleep 0.2; done")
    assert call("start", str(d))[0] == 0
    snapshot_holds(d, b"303")
    proc, frames = reader(d)
    try:
        st = next_status(frames, lambda s: True)
        want = agent.status(str(d))
        assert st["state"] == "running" and st["agent_alive"] is True
        assert {k: st[k] for k in SAME} == {k: want[k] for k in SAME}
        # nothing changes: heartbeats only, no status frame again
        kinds, until = [], time.monotonic() + 0.5
        for kind, _payload in frames:
            kinds.append(kind)
            if time.monotonic() > until:
                break
        assert "S" not in kinds and kinds.count("H") >= 3, kinds
        os.kill(st["agent_pid"], signal.SIGKILL)  # the agent vanishes, its job does not
        st = next_status(frames, lambda s: not s["agent_alive"])
        want = agent.status(str(d))
        assert st["job_alive"] is True and want["job_alive"] is True and want["agent_alive"] is False
        assert call("stop", str(d), "--grace", "1")[0] == 0
        st = next_status(frames, lambda s: s["state"] != "running")
        assert st["state"] == "stopped" and st["finished_at"] == state(d)["finished_at"]
        assert [k for k, _p in frames] == ["E"]  # the final status, then the end of the stream
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait()
        call("stop", str(d), "--grace", "1")


def test_boot_ships_the_files_privately_and_starts_the_agent(tmp_path: Path) -> None:
    d = tmp_path / "runs" / "r1" / "n1"  # none of it exists yet
    spec = {
        "run": f"boot-{os.getpid()}",
        "node": "n1",
        "argv": ["sh", "-c", 'echo "umask $(umask)"'],
        "env": {},
        "cwd": str(tmp_path),
        "grace": 1.0,
    }
    files = {**agent_files(), "launch.json": json.dumps(spec)}  # the agent and its modules, as run/agents.py ships them
    r = subprocess.run(
        [sys.executable, "-c", BOOT, str(d), "start", ".", "--wait", "20"],
        input=json.dumps(files).encode("ascii"),
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.decode().splitlines()[-1])["pid"]
    for name in agent_files():
        assert (d / name).read_text() == files[name]
    assert json.loads((d / "launch.json").read_text())["argv"] == spec["argv"]
    for path in (d, d.parent, *(d / name for name in files)):
        assert path.stat().st_mode & 0o077 == 0, f"{path} is not private"
    assert not list(d.glob("*.tmp.*"))
    wait_state(d, "succeeded")
    mine = os.umask(0o022)
    os.umask(mine)
    assert f" out umask {mine:04o}" in (d / "node.log").read_text()  # the job keeps the login's umask


def test_bad_interpreter_fails_start_with_the_reason(tmp_path: Path) -> None:
    d = tmp_path / "r"
    d.mkdir()
    (d / "launch.json").write_text(json.dumps({"run": "x", "node": "n", "argv": ["/nonexistent/python", "-V"]}))
    code, st = call("start", str(d))
    assert code == 1 and st["state"] == "failed" and st["exit_code"] == 127
    assert "/nonexistent/python" in st["reason"]


def test_missing_workdir_and_double_start_are_refused(tmp_path: Path) -> None:
    d = prepare(tmp_path, "sleep 30", cwd=str(tmp_path / "nope"))
    code, st = call("start", str(d))
    assert code == 2 and "does not exist" in st["reason"]
    d2 = prepare(tmp_path / "b", "sleep 30")
    assert call("start", str(d2))[0] == 0
    try:
        code, st = call("start", str(d2))
        assert code == 3 and "already started" in st["reason"]
    finally:
        call("stop", str(d2), "--grace", "1")


def test_status_of_a_directory_without_a_run() -> None:
    out = agent.status("/nonexistent/run/dir", tail=5)
    assert out["exists"] is False and out["agent_alive"] is False and out["tail"] == []


@pytest.mark.parametrize("status, code", [(0, 0), (3 << 8, 3), (signal.SIGKILL, -9)])
def test_exit_code_of(status: int, code: int) -> None:
    assert agent.exit_code_of(status) == code


def test_the_plans_argv_runs_as_it_is_with_the_nodes_values_filled_in(tmp_path: Path) -> None:
    """The plan puts torchrun's --log-dir in the argv (config/plan.TORCHRUN_LOG_DIR); the agent
    edits nothing but the node's values (its run directory, uid, gid, home)."""
    m = agent.Monitor(
        str(tmp_path),
        {
            "argv": [
                "py",
                "-m",
                "torch.distributed.run",
                "--log-dir={ORCH_RUN_DIR}/torchrun",
                "--nnodes=2",
                "--user={ORCH_UID}:{ORCH_GID}",
                "{ORCH_HOME}",
                "{OTHER}",
            ],
            "torchrun_log_dir": True,
        },
    )
    assert m.argv() == [
        "py",
        "-m",
        "torch.distributed.run",
        f"--log-dir={tmp_path}/torchrun",
        "--nnodes=2",
        f"--user={os.getuid()}:{os.getgid()}",
        os.path.expanduser("~"),
        "{OTHER}",
    ]


# ----------------------------------------------------------------------------- process identity


def foreign_group() -> subprocess.Popen[str]:
    """A process group that is nobody's job: what a recycled pid or pgid would now name. It blocks
    the signals it can (tests/procs_support.py), so one sent to it shows as pending."""
    return stranger()


def rewrite_state(d: Path, **fields: Any) -> None:
    st = state(d)
    st.update(fields)
    (d / "state.json").write_text(json.dumps(st))


def test_stop_of_an_ended_run_leaves_a_process_group_that_took_the_recorded_pgid_alone(tmp_path: Path) -> None:
    d = prepare(tmp_path, "exit 0")
    assert call("start", str(d))[0] == 0
    done = wait_state(d, "succeeded")
    assert done["pgid_start"] == done["pid_start"] and done["pid_start"] is not None and done["boot_id"]
    stranger = foreign_group()
    try:
        # the job's pgid and pid now belong to another process (pid reuse, made to happen here)
        rewrite_state(d, pgid=stranger.pid, pid=stranger.pid, procs=[[stranger.pid, 12345]])
        code, status = call("status", str(d))
        assert status["job_alive"] is False
        code, out = call("stop", str(d), "--grace", "1")
        assert code == 0 and out["stopped"] == [] and out["remaining"] == []
        assert out["strangers"] == [stranger.pid]
        assert received(stranger.pid) == set(), "stop signalled a process that is not the job's"
    finally:
        stranger.kill()
        stranger.wait()


def test_a_group_whose_leader_exited_is_signalled_only_where_members_carry_the_run(tmp_path: Path) -> None:
    # torchrun (the leader) gone, one of its group still there: found by the run's tag, stopped
    d = prepare(tmp_path, "sleep 300 & echo started; exit 0")
    assert call("start", str(d))[0] == 0
    wait_state(d, "succeeded")  # the agent's cleanup stopped the child: start one by hand instead
    st = state(d)
    env = dict(os.environ, ORCH_RUN_ID=st["run"], ORCH_NODE="n1")
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 300 & echo $!; exit 0"], start_new_session=True, env=env, stdout=subprocess.PIPE, text=True
    )
    assert leader.stdout is not None
    member = int(leader.stdout.readline())
    leader.wait()
    stranger = foreign_group()
    try:
        rewrite_state(d, pgid=leader.pid, pgid_start=12345)  # the leader is gone: the start can't match
        assert agent.job_alive(state(d))
        code, out = call("stop", str(d), "--grace", "1")
        assert code == 0 and out["stopped"] == [member] and out["remaining"] == []
        assert not agent.alive(member) and received(stranger.pid) == set()
    finally:
        stranger.kill()
        stranger.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


def test_send_signals_only_the_process_that_started_at_the_recorded_time() -> None:
    p = foreign_group()
    try:
        start = agent.proc_start_time(p.pid)
        assert start is not None
        assert not agent.send(p.pid, start + 1, signal.SIGTERM) and not agent.send(p.pid, None, signal.SIGTERM)
        assert received(p.pid) == set()  # it blocks SIGTERM: one sent would be pending now
        assert agent.send(p.pid, start, signal.SIGTERM)
        assert received(p.pid) == {"SIGTERM"}
        p.kill()
        p.wait(5)
        assert not agent.send(p.pid, start, signal.SIGTERM)  # gone: nothing to signal
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_cleanup_that_times_out_is_recorded_not_assumed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a process no signal removes (uninterruptible sleep on a dead NFS server) stands in as one
    # the signals do not reach
    (tmp_path / "d").mkdir()
    m = agent.Monitor(str(tmp_path / "d"), {"argv": ["true"], "grace": 0.3})  # TERM waits 0.3 s, not 5
    stuck = subprocess.Popen(["sleep", "30"])
    monkeypatch.setattr(agent, "send", lambda pid, start, sig: True)
    try:
        left = m.cleanup(-1, kill_wait=0.3)
        assert (stuck.pid, agent.proc_start_time(stuck.pid)) in left
        assert "cleanup timed out" in (tmp_path / "d" / "node.log").read_text()
    finally:
        stuck.kill()
        stuck.wait()


def test_an_untrusted_run_directory_is_refused(tmp_path: Path) -> None:
    d = prepare(tmp_path, "exit 0")
    d.chmod(0o777)
    code, out = call("status", str(d))
    assert code == 2 and out["untrusted"] and "writable by others" in out["error"]
    d.chmod(0o700)
    (tmp_path / "run").chmod(0o777)  # the directory above: others could swap the run directory
    code, out = call("stop", str(d))
    assert code == 2 and "above the run directory" in out["error"]
    (tmp_path / "run").chmod(0o1777)  # sticky like /tmp: others cannot rename what is ours
    assert call("status", str(d))[0] == 0
    link = tmp_path / "run" / "link"
    link.symlink_to(d)
    code, out = call("status", str(link))
    assert code == 2 and "not a directory" in out["error"]


def test_boot_refuses_a_directory_others_can_write_and_writes_nothing(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    d = shared / "r1" / "n1"
    spec = {"run": f"boot-{os.getpid()}", "node": "n1", "argv": ["true"], "env": {}, "cwd": str(tmp_path)}
    files = {**agent_files(), "launch.json": json.dumps(spec)}  # the agent and its modules, as run/agents.py ships them
    r = subprocess.run(
        [sys.executable, "-c", BOOT, str(d), "start", ".", "--wait", "20"],
        input=json.dumps(files).encode("ascii"),
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    out = json.loads(r.stdout.decode().splitlines()[-1])
    assert out["untrusted"] and str(shared) in out["error"]
    assert not (d / "launch.json").exists() and not (d / "agent.py").exists()


def test_agent_files_are_never_written_through_a_planted_link(tmp_path: Path) -> None:
    d = prepare(tmp_path, "echo hello")
    target = tmp_path / "victim"
    target.write_text("precious\n")
    (d / "node.log").symlink_to(target)
    call("start", str(d))
    deadline = time.monotonic() + 10
    while state(d).get("state") not in ("failed", "succeeded") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert target.read_text() == "precious\n"
    assert state(d)["state"] == "failed" and "Too many levels of symbolic links" in state(d)["reason"]


def test_stop_asks_python3_where_the_runs_python_is_gone_and_reports_the_job_gone(tmp_path: Path) -> None:
    """The run's python was removed while its job ran: the stop is still done and confirmed (by
    python3, the agent needs only the standard library), never reported as a node with nothing."""

    from orchestrator.config.inventory import parse
    from orchestrator.run.agents import stop_node
    from orchestrator.transport.local import LocalTransport

    d = prepare(tmp_path, "sleep 60")
    assert call("start", str(d))[0] == 0
    pid = wait_state(d, "running")["pid"]
    for name, text in agent_files().items():  # the run directory as boot left it
        (d / name).write_text(text)
    node = parse("transport: local\nnodes:\n  - host: localhost\n    name: n1\n", "t.yaml").nodes[0]
    try:
        res = stop_node(LocalTransport(node), str(tmp_path / "gone" / "bin" / "python"), str(d), 1.0)
        assert res.status is not None and res.status.state == "stopped", res
        assert pid in res.stopped and res.remaining == ()
        assert state(d)["state"] == "stopped"
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def test_a_job_started_again_in_its_directory_is_not_judged_by_the_last_stop(tmp_path: Path) -> None:
    """`orch up` retries a run in the same run directories: the stop that tore the last attempt
    down must not make the next one end as `stopped`."""
    d = prepare(tmp_path, "sleep 30")
    assert call("start", str(d))[0] == 0
    assert call("stop", str(d), "--grace", "1")[1]["state"] == "stopped"
    assert (d / agent.STOP_REQUEST).exists()
    spec = json.loads((d / "launch.json").read_text())
    (d / "launch.json").write_text(
        json.dumps(dict(spec, argv=["sh", "-c", "echo second attempt"], env=dict(spec["env"], ORCH_ATTEMPT="2")))
    )
    assert call("start", str(d))[0] == 0
    final = wait_state(d, "succeeded", "stopped", "failed")
    assert final["state"] == "succeeded" and final["exit_code"] == 0
    log = (d / "node.log").read_text()
    assert "second attempt" in log
    # the node's log (and so the merged log) says where each attempt starts; the first says none
    starts = [ln.split(" orch ", 1)[1] for ln in log.splitlines() if " starting" in ln]
    assert len(starts) == 2 and " starting: sh -c 'sleep 30'" in starts[0], (
        starts
    )  # the argv quoted, as a shell reads it
    assert " starting attempt 2: sh -c 'echo second attempt'" in starts[1], starts


RANKS = """
import os, subprocess, sys, time
def waiting_here():
    while True:
        time.sleep(60)
if os.environ["RANK"] == "0":  # a child of rank 0 (a DataLoader worker) inherits RANK: not a rank of its own
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
print("ready", flush=True)
waiting_here()
"""


def test_stacks_finds_every_rank_of_the_job_and_dumps_it(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANKS)
    py = sys.executable
    d = prepare(tmp_path, f"RANK=0 LOCAL_RANK=0 {py} {script} & RANK=1 LOCAL_RANK=1 {py} {script} & wait")
    assert call("start", str(d))[0] == 0
    try:
        deadline = time.monotonic() + 30
        while (d / "node.log").read_text().count("ready") < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        code, out = call("stacks", str(d), "--timeout", "20")
        assert code == 0 and out["state"] == "running"
        assert out["py_spy"] == str(Path(py).parent / "py-spy") and out["python"] == py
        ranks = out["ranks"]
        assert [(r["rank"], r["local_rank"]) for r in ranks] == [(0, 0), (1, 1)], ranks
        for r in ranks:
            assert r["code"] == 0 and r["error"] is None, r
            assert re.search(r"^ {4}waiting_here \(" + re.escape(str(script)) + r":\d+\)$", r["dump"], re.M), r["dump"]
    finally:
        call("stop", str(d), "--grace", "1")


def test_stacks_says_where_py_spy_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = prepare(tmp_path, "RANK=0 LOCAL_RANK=0 sleep 30")
    assert call("start", str(d))[0] == 0
    try:
        deadline = time.monotonic() + 10
        while not stacks.rank_processes(str(d), state(d)) and time.monotonic() < deadline:
            time.sleep(0.1)
        env = dict(os.environ, PATH="/usr/bin:/bin")
        lone = tmp_path / "bin" / "python3"  # an interpreter with no py-spy beside it
        lone.parent.mkdir()
        lone.symlink_to(Path(sys.base_exec_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}")
        r = subprocess.run([str(lone), AGENT, "stacks", str(d)], capture_output=True, text=True, timeout=60, env=env)
        out = json.loads(r.stdout)
        assert out["py_spy"] is None and out["python"] == str(lone)
        assert [(x["rank"], x["dump"], x["error"]) for x in out["ranks"]] == [(0, "", None)]
    finally:
        call("stop", str(d), "--grace", "1")


@pytest.mark.waits  # mostly waits: runs beside the slow tests (tests/conftest.py)
def test_an_attached_runs_lease_is_renewed_through_the_reader_and_its_end_stops_the_job(tmp_path: Path) -> None:
    """lease_s 2: while the controller writes lines to the log reader's stdin the job runs on
    (well past the lease); once they stop (a cut link), the agent stops the job within the lease
    plus its stop, recording why in state.json and node.log."""
    d = prepare(tmp_path, "setsid sleep 304 & while true; do sleep 0.2; done", lease_s=2)
    assert call("start", str(d))[0] == 0
    snapshot_holds(d, b"304")
    proc = subprocess.Popen(
        reader_argv(sys.executable, str(d), 0, 0.05, False, True, new_nonce(), lease=True),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdin is not None
    proc.stdin.write(b"%d\n" % len(READER) + READER.encode())
    proc.stdin.flush()
    try:
        until = time.monotonic() + 5  # 2.5 leases
        while time.monotonic() < until:
            proc.stdin.write(b"L\n")
            proc.stdin.flush()
            time.sleep(0.5)
        assert state(d)["state"] == "running", state(d)
        cut = time.monotonic()  # no more renewals: the controller is gone for the node
        st = wait_state(d, "stopped", timeout=20)
        took = time.monotonic() - cut
        assert st["lease_expired"] is True and "was not heard from" in st["reason"], st
        assert "lease 2 s" in (d / "node.log").read_text()
        assert not agent.job_alive(st) and not any(
            b"304" in Path(f"/proc/{p}/cmdline").read_bytes()
            for p, _s in st.get("procs") or []
            if Path(f"/proc/{p}").exists()
        )
        print(f"lease 2 s: job stopped {took:.1f} s after the last renewal")
    finally:
        proc.kill()
        proc.wait()
        call("stop", str(d), "--grace", "1")


FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


@pytest.mark.waits
@pytest.mark.skipif(not Path(FAKETIME_LIB).exists(), reason="libfaketime is not installed")
def test_a_forward_clock_step_on_the_node_neither_stops_a_renewed_run_nor_keeps_an_abandoned_one(
    tmp_path: Path,
) -> None:
    """lease_s 2, the agent's clock stepped 10 minutes ahead mid-run (libfaketime's timestamp file
    rewritten, as NTP or an admin would step it): while renewals come the job runs on; once they
    stop, it is still stopped within the lease. libfaketime 0.9.10 moves CLOCK_MONOTONIC and
    CLOCK_BOOTTIME with the wall clock (and with FAKETIME_DONT_FAKE_MONOTONIC Python's sleep fails
    with EINVAL), so the agent reads its lease clock from /proc/uptime, which no preload moves. (A
    step back cannot be played so: the faked monotonic clock would hold the agent's sleep.)"""
    clock = tmp_path / "faketime"
    clock.write_text("+0s\n")
    d = prepare(tmp_path, "while true; do sleep 0.2; done", lease_s=2)
    env = dict(os.environ, LD_PRELOAD=FAKETIME_LIB, FAKETIME_TIMESTAMP_FILE=str(clock), FAKETIME_NO_CACHE="1")
    r = subprocess.run([sys.executable, AGENT, "start", str(d)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        lease = d / agent.LEASE

        def renew_for(seconds: float) -> None:
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                os.utime(lease)  # what the log reader and status --renew do: the node's own clock
                time.sleep(0.3)

        renew_for(1.5)
        clock.write_text("+600s\n")
        renew_for(5)  # 2.5 leases after the step
        assert state(d)["state"] == "running", state(d)
        assert "was not heard from" not in (d / "node.log").read_text()
        cut = time.monotonic()
        st = wait_state(d, "stopped", timeout=20)
        assert st["lease_expired"] is True and time.monotonic() - cut < 2 + 1 + 5, st
    finally:
        call("stop", str(d), "--grace", "1")


def test_a_detached_run_has_no_lease(tmp_path: Path) -> None:
    d = prepare(tmp_path, "while true; do sleep 0.2; done")
    assert call("start", str(d))[0] == 0
    try:
        assert not (d / agent.LEASE).exists()
        assert state(d)["state"] == "running"
    finally:
        call("stop", str(d), "--grace", "1")


def test_pids_recorded_on_another_boot_are_never_signalled_even_when_start_times_match(tmp_path: Path) -> None:
    """The boot-id half of process identity: after a reboot, pids and start times (ticks since
    boot) can name other processes exactly. state.json from another boot, naming a live stranger
    with its real start time as agent, torchrun, group and snapshot: nothing is signalled, the
    agent and the job read as gone."""
    d = prepare(tmp_path, "exit 0")
    assert call("start", str(d))[0] == 0
    wait_state(d, "succeeded")
    stranger = foreign_group()
    try:
        start = agent.proc_start_time(stranger.pid)
        assert start is not None
        rewrite_state(
            d,
            state="running",
            boot_id="00000000-0000-4000-8000-000000000000",
            agent_pid=stranger.pid,
            agent_start=start,
            pid=stranger.pid,
            pid_start=start,
            pgid=stranger.pid,
            pgid_start=start,
            procs=[[stranger.pid, start]],
        )
        assert agent.agent_alive(state(d)) is False and agent.job_alive(state(d)) is False
        code, out = call("stop", str(d), "--grace", "1")
        assert code == 0 and out["stopped"] == [] and out["remaining"] == [], out
        assert received(stranger.pid) == set(), "stop signalled a process recorded on another boot"
    finally:
        stranger.kill()
        stranger.wait()


def telemetry_samples(d: Path) -> list[Any]:
    from orchestrator.logs.lines import read_node_lines
    from orchestrator.logs.telemetry import parse_sample

    text = (d / "node.log").read_text().splitlines(keepends=True)
    return [s for s in (parse_sample(line) for line in read_node_lines(text, "n1", 0, 0)) if s is not None]


RANKS_JOB = (
    "export TORCHELASTIC_RUN_ID=t; "
    "for r in 0 1; do RANK=$r LOCAL_RANK=$r python3 -c 'import time\n"
    "t = time.monotonic()\nwhile time.monotonic() - t < 30: pass' & done; wait"
)
"""torchrun's shape: two workers with RANK/LOCAL_RANK/TORCHELASTIC_RUN_ID, busy on a core each."""


def test_the_agent_samples_gpus_cpu_memory_and_each_rank_into_the_node_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = Path(__file__).resolve().parents[1] / "fixtures" / "telemetry" / "h100x8" / "bin"
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    d = prepare(tmp_path, RANKS_JOB, telemetry_s=1)
    code, _st = call("start", str(d))
    assert code == 0
    try:
        wait_for(
            lambda: any(
                s.ranks and all(r.cpu_pct is not None for r in s.ranks) and len(s.ranks) == 2
                for s in telemetry_samples(d)
            ),
            "a sample with both ranks' CPU shares",
            timeout=30,
        )
    finally:
        call("stop", str(d), "--grace", "1")
    samples = telemetry_samples(d)
    s = next(x for x in samples if len(x.ranks) == 2 and all(r.cpu_pct is not None for r in x.ranks))
    assert len(s.gpus) == 8 and s.gpu_error is None
    g = s.gpus[0]
    assert (g.index, g.name, g.util_pct, g.mem_total_mb, g.temp_c, g.power_w, g.sm_mhz) == (
        0,
        "NVIDIA H100 80GB HBM3",
        0.0,
        81559,
        29.0,
        67.74,
        86,
    )
    assert g.throttle == ("hw_slowdown", "hw_power_brake") and g.error is None
    assert [r.rank for r in s.ranks] == [0, 1] and [r.local_rank for r in s.ranks] == [0, 1]
    assert all(r.cpu_pct is not None and r.cpu_pct > 0 for r in s.ranks), s.ranks  # each spins (a shared core)
    assert all(r.rss_mb is not None and r.rss_mb > 1 for r in s.ranks)
    assert s.mem_total_mb and s.mem_used_mb and s.load1 is not None and s.ncpu
    assert samples[0].cpu_pct is None and s.cpu_pct is not None  # the first sample has no delta yet


@pytest.mark.waits  # mostly waits: runs beside the slow tests (tests/conftest.py)
def test_no_nvidia_smi_is_said_in_the_sample_and_telemetry_0_writes_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("sh", "python3", "sleep"):
        (bare / tool).symlink_to(
            subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        )
    monkeypatch.setenv("PATH", str(bare))
    d = prepare(tmp_path, "sleep 4", telemetry_s=1)
    assert call("start", str(d))[0] == 0
    wait_for(lambda: telemetry_samples(d), "a telemetry sample")
    call("stop", str(d), "--grace", "1")
    s = telemetry_samples(d)[0]
    assert s.gpus == () and s.gpu_error == "nvidia-smi: not found in PATH"
    off = prepare(tmp_path / "off", "sleep 3", telemetry_s=0)
    assert call("start", str(off))[0] == 0
    wait_state(off, "succeeded")
    assert telemetry_samples(off) == [] and "telemetry" not in (off / "node.log").read_text()


def test_the_starting_line_quotes_the_argv_so_a_newline_stays_on_it(tmp_path: Path) -> None:
    """An argument holding a newline left an unstamped line in node.log; quoted, the line reads
    back as the argv a shell would run."""
    import shlex

    d = prepare(tmp_path, "echo 'two\nlines' 'a b'; exit 0")
    code, _st = call("start", str(d))
    assert code == 0
    wait_state(d, "succeeded")
    log = (d / "node.log").read_text().splitlines()
    assert all(re.match(r"^\d{4}-\d\d-\d\dT[\d:.]+Z (out|err|orch) ", ln) for ln in log), log
    start = next(ln for ln in log if " starting: " in ln)
    argv = start.split(" starting: ", 1)[1].rsplit(" (cwd ", 1)[0]
    assert argv == "sh -c $'echo \\'two\\nlines\\' \\'a b\\'; exit 0'", argv
    assert agent.shown(["python", "-m", "trainer", "--name", "a b"]) == "python -m trainer --name 'a b'"
    assert shlex.split(agent.shown(["x", "it's"])) == ["x", "it's"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs: needs root")
def test_a_full_run_root_neither_kills_the_agent_nor_makes_the_job_unstoppable(tmp_path: Path) -> None:
    """The run root's disk fills up under a running job (each `sleep` a new process: the agent
    records the job's processes every second, and the job prints all along). The agent survives
    its own failed writes, keeps supervising and says the disk is full; `agent.py stop` signals
    first and records after, so it stops the job without a byte of disk; the run ends `stopped`
    in state.json, rewritten in the blocks it has."""
    with small_disk(tmp_path / "disk") as disk:
        d = disk / "run" / "n1"
        d.mkdir(parents=True)
        spec = {
            "run": f"full-{os.getpid()}",
            "node": "n1",
            "grace": 1.0,
            "cwd": str(tmp_path),
            "argv": ["sh", "-c", "while true; do echo tick $(seq 100 130); sleep 0.05; done"],
        }
        (d / "launch.json").write_text(json.dumps(spec))
        assert call("start", str(d))[0] == 0
        filler = fill(disk)
        try:
            t0 = time.monotonic()
            sizes = [-1]

            def log_stopped() -> bool:  # node.log's last page filled too: the job's lines are being lost
                sizes.append((d / "node.log").stat().st_size)
                time.sleep(0.5)
                return sizes[-1] == sizes[-2]

            wait_for(log_stopped, "node.log to stop growing")

            def hit() -> bool:  # the agent said so, or died of it
                st = call("status", str(d))[1]
                return "is full" in str(st.get("disk_full")) or not st["agent_alive"]

            wait_for(hit, "the agent to meet the full disk")
            time.sleep(max(0.0, t0 + 3 - time.monotonic()))  # three of the agent's snapshots on a full disk
            st = call("status", str(d))[1]
            assert st["agent_alive"] and st["job_alive"] and st["state"] == "running", st
            assert f"run_root {disk} is full" in st["disk_full"], st  # <run_root>/<run>/<node>
            filler.unlink()  # room again: what was lost is said, and disk_full goes
            wait_for(lambda: call("status", str(d))[1].get("disk_full") is None, "disk_full to go")
            wait_for(
                lambda: re.search(
                    r"Z orch \d+ lines of output lost: No space left on device\n", (d / "node.log").read_text()
                ),
                "the lost lines to be said",
            )
            assert all(re.match(r"\d{4}-\d\d-\d\dT", ln) for ln in (d / "node.log").read_text().splitlines()), (
                "a line cut short by the full disk was not ended"
            )
            filler = fill(disk)
            code, out = call("stop", str(d), "--grace", "1")
            assert code == 0 and out["remaining"] == [] and out["state"] == "stopped", out
            assert f"run_root {disk} is full" in out["disk_full"], out  # stop.request could not be written: said
            assert not agent.job_alive(out) and not agent.agent_alive(out), out
            assert state(d)["state"] == "stopped"
        finally:
            filler.unlink(missing_ok=True)
            call("stop", str(d), "--grace", "1")


def test_the_agent_samples_ranks_outside_its_process_tree_by_the_launchs_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container launch: the ranks are the runtime's processes (conmon's, containerd-shim's), not
    the agent's descendants; they carry the launch's identity (ORCH_RUN_ID, ORCH_NODE, ORCH_LAUNCH,
    passed in by name), and the telemetry samples them by it: `orch top` shows their CPU share."""
    fake = Path(__file__).resolve().parents[1] / "fixtures" / "telemetry" / "h100x8" / "bin"
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    d = prepare(tmp_path, "sleep 60", telemetry_s=1, nonce="n0nce")
    spec = json.loads((d / "launch.json").read_text())
    spin = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 30: pass"
    outside = []
    for r in (0, 1):  # started by the test, not under the agent: as a container runtime's would be
        env = dict(
            os.environ,
            ORCH_RUN_ID=spec["run"],
            ORCH_NODE="n1",
            ORCH_LAUNCH="n0nce",
            RANK=str(r),
            LOCAL_RANK=str(r),
            TORCHELASTIC_RUN_ID="t",
        )
        outside.append(subprocess.Popen([sys.executable, "-c", spin], env=env))
    other = subprocess.Popen(
        [sys.executable, "-c", spin],
        env=dict(  # another launch's rank: never counted
            os.environ,
            ORCH_RUN_ID=spec["run"],
            ORCH_NODE="n1",
            ORCH_LAUNCH="other",
            RANK="5",
            LOCAL_RANK="5",
            TORCHELASTIC_RUN_ID="t",
        ),
    )
    try:
        assert call("start", str(d))[0] == 0
        wait_for(
            lambda: any(
                len(s.ranks) == 2 and all(r.cpu_pct is not None for r in s.ranks) for s in telemetry_samples(d)
            ),
            "a sample with both outside ranks' CPU shares",
            timeout=30,
        )
    finally:
        call("stop", str(d), "--grace", "1")
        for p in (*outside, other):
            p.kill()
            p.wait()
    s = next(x for x in telemetry_samples(d) if len(x.ranks) == 2 and all(r.cpu_pct is not None for r in x.ranks))
    assert [r.rank for r in s.ranks] == [0, 1] and {r.pid for r in s.ranks} == {p.pid for p in outside}
    assert all(x.rank != 5 for x in telemetry_samples(d) for x in x.ranks)


def test_a_slow_stop_hook_is_waited_for_not_reported_as_a_survivor(tmp_path: Path) -> None:
    """`docker rm -f` of a container that holds GPUs can take seconds: `agent.py stop` waits for the
    agent to finish its stop hook (up to the hook's own bound) instead of reporting the agent as a
    process that survived the stop (exit 1, and `orch down` said to run it again)."""
    d = prepare(tmp_path, "while true; do sleep 0.1; done", grace=0.5, stop_hook=["sh", "-c", "sleep 7; echo removed"])
    assert call("start", str(d))[0] == 0
    code, out = call("stop", str(d), "--grace", "0.5")
    assert code == 0 and out["remaining"] == [], out
    assert state(d)["stop_hook_result"] == "exit 0: removed"


def test_the_stop_hook_is_not_taken_for_the_job_and_killed_by_the_stop(tmp_path: Path) -> None:
    """The stop hook runs with the launch's environment (a runtime reads DOCKER_HOST from it), and
    that environment carries the run's identity (ORCH_RUN_ID, ORCH_NODE, ORCH_LAUNCH), by which
    `agent.py stop` finds the job's processes: the hook was then found as one, and SIGKILLed at the
    end of the grace, leaving the container (a retry in a podman bed logged `stop hook: exit -9`).
    Here the job's shell ends at the SIGTERM (so the agent runs the hook) while a process of the job
    that ignores it holds the stop in its grace, until the SIGKILL that also found the hook."""
    d = prepare(
        tmp_path,
        "trap '' TERM; sleep 300 & trap - TERM; while true; do sleep 0.1; done",
        grace=10,
        stop_hook=["sh", "-c", "sleep 4; echo removed"],
        nonce="n0nce",
    )
    spec = json.loads((d / "launch.json").read_text())
    spec["env"].update(ORCH_RUN_ID=spec["run"], ORCH_NODE=spec["node"], ORCH_LAUNCH=spec["nonce"])  # as a plan's launch
    (d / "launch.json").write_text(json.dumps(spec))
    assert call("start", str(d))[0] == 0
    code, out = call("stop", str(d), "--grace", "2", "--nonce", spec["nonce"])
    assert code == 0 and out["remaining"] == [], out
    wait_for(lambda: "stop_hook_result" in state(d), "the hook's result in state.json")
    assert state(d)["stop_hook_result"] == "exit 0: removed", state(d)
