"""`orch up` / `status` / `down` over real sshd nodes (loopback cluster), real torchrun, gloo on CPU.

Every test ends by checking each node's process table for anything carrying the run id: a run
must leave nothing behind, whatever way it ended.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.node import FROM_STDIN_OPEN, script
from tests.cluster import TestCluster
from tests.logs_support import reader_pids
from tests.up_helpers import (
    REPO,
    Orch,
    ddp_inventory,
    ddp_job,
    leftover,
    node_log,
    node_state,
    run_root,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


inventory = ddp_inventory


def execs(err: str, script: str) -> list[str]:
    """The nodes on which an `orch -v up` ran `python -c SCRIPT` (its log shows every remote command)."""
    return re.findall(r"orch\.transport: (\S+)\$ exec \S+ -c " + re.escape(shlex.quote(script)), err)


def status_execs(err: str) -> list[tuple[str, int]]:
    """(node, --tail N) of every `agent.py status` SSH exec an `orch -v up` logged."""
    return [
        (m.group(1), int(m.group(2)))
        for m in re.finditer(r"orch\.transport: (\S+)\$ .* agent\.py status \. --tail (\d+)", err)
    ]


def test_success_4_nodes_x_2_processes_supervised_without_a_single_status_exec(
    cluster: TestCluster, orch: Orch
) -> None:
    """Through the preflight, 8 ranks on 4 nodes succeed: every rank's done line with its host and
    rank, run.json and the nodes' state private and final, nothing left. The run is supervised on
    what the log streams push: no status poll, one exec per node to ship and start the agent and one
    log stream (the streams send a frame every 0.2 s; only a reader starved for 20 s, a machine far
    beyond what the job alone loads it with, may fall back to a poll here; the old design polled
    every node every second whatever the load)."""
    steps = 30  # 6 s of all_reduce steps: long enough that a poller would have polled
    inv = inventory(cluster, nproc=2, job_env=ddp_job(steps=steps, sleep=0.2))
    orch.env.update(ORCH_STREAM_SILENT_S="20", ORCH_UNREACHABLE_GRACE_S="60")
    t0 = time.monotonic()
    up = orch.start(str(inv), verbose=True)  # through the preflight: the test cluster passes it
    code = up.wait(240)
    err = up.err
    assert code == 0, err[-3000:]
    run_id = up.run_id()
    out = up.out
    merged = (orch.run_dir(run_id) / "merged.log").read_text()
    final = 8 * 9 // 2 + 8 * (steps - 1)  # every rank checks the sum of (rank + 1 + step) over 8 ranks
    for rank in range(8):
        node = f"node{rank // 2 + 1}"
        pattern = rf"\b{node}\s+r{rank}\s+done steps={steps} allreduce_ok=True final_sum={final} expected={final}"
        assert re.search(pattern, out), f"no done line of rank {rank} on {node}:\n{out[-3000:]}"
        assert re.search(pattern, merged), f"no done line of rank {rank} in merged.log"
    assert re.search(r"preflight passed in [\d.]+ s", err), err[-3000:]
    assert re.search(r"all 4 nodes running after [\d.]+ s", err), err[-3000:]
    assert re.search(r"succeeded on every node in [\d.]+ s", err), err[-3000:]
    data = orch.run_json(run_id)
    assert data["state"] == "succeeded"
    assert [n["state"] for n in data["nodes"]] == ["succeeded"] * 4
    assert [n["exit_code"] for n in data["nodes"]] == [0] * 4
    for name in ("run.json", "plan.json", "inventory.yaml"):
        assert (orch.run_dir(run_id) / name).stat().st_mode & 0o077 == 0, f"{name} is not private"
    st = node_state(run_root(cluster), run_id, "node3")
    assert st["state"] == "succeeded" and st["pgid"] == st["pid"]
    log = node_log(run_root(cluster), run_id, "node3")
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z (out|err|orch) ", log), log[:200]
    assert (orch.run_dir(run_id) / "check.json").exists()
    # the node states came pushed through the log streams: no poll, no excerpt, no confirmation
    assert status_execs(err) == []
    # and each node cost one exec to ship and start the agent, and one log stream
    nodes = ["node1", "node2", "node3", "node4"]
    assert sorted(execs(err, script("boot"))) == nodes
    assert sorted(execs(err, FROM_STDIN_OPEN)) == nodes  # attached: stdin stays open for the lease
    assert leftover(cluster, run_id) == {}
    print(f"4x2 success: {time.monotonic() - t0:.1f} s wall")


def step_of(out: str, node: str) -> int:
    """The last step of `node`'s rank that orch up's merged output shows (-1 before any)."""
    steps = [int(m.group(1)) for m in re.finditer(rf"^\S+\s+{node}\s+r\d+\s+.*\bstep (\d+) sum=", out, re.M)]
    return max(steps, default=-1)


@pytest.mark.foreground  # counts the status polls: a stream slowed 3 s by load is polled
def test_a_node_whose_log_stream_goes_silent_is_polled_until_heard_again(
    cluster: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    stop = tmp_path / "stop"  # the job runs until the test has seen what it waits for (tests/ddp_job.py)
    # two nodes: node2's stream goes silent while node1's goes on
    inv = inventory(
        cluster, nproc=1, job_env=ddp_job(steps=1000, sleep=0.1, stop_file=str(stop)), only=["node1", "node2"]
    )
    up = orch.start(str(inv), "--skip-checks", verbose=True)
    run_id = up.wait_running()
    wait_for(lambda: "step 2 " in node_log(run_root(cluster), run_id, "node2"), 90, "node2 to step")
    node_dir = str(run_root(cluster) / run_id / "node2")
    readers = wait_for(lambda: reader_pids(node_dir), 30, "node2's log reader")
    for pid in readers:
        os.kill(pid, signal.SIGSTOP)  # the stream goes silent; the node and its job do not
    try:
        wait_for(lambda: status_execs(up.err), 30, "a status poll of the silent node")
    finally:
        for pid in readers:
            os.kill(pid, signal.SIGCONT)
    # heard again: node2's lines written a second after the stream resumed reach orch up (a poll
    # already under way has finished by then; from here on, any poll of node2 would be logged)
    resumed_at = int(re.findall(r" step (\d+) ", node_log(run_root(cluster), run_id, "node2"))[-1])
    target = resumed_at + 10
    wait_for(lambda: step_of(up.out, "node2") >= target, 60, "node2's stream to be heard again")
    polled = status_execs(up.err)
    # then heard for longer than a silence that is polled (ORCH_STREAM_SILENT_S, 3 s): 40 steps of
    # 0.1 s at least, and the job ends
    wait_for(lambda: step_of(up.out, "node2") >= target + 40, 60, "40 more steps of node2 heard")
    stop.touch()
    code = up.wait(180)
    err = up.err
    assert code == 0, err[-3000:]
    assert "stop file seen" in node_log(run_root(cluster), run_id, "node2")
    assert {n for n, _tail in polled} == {"node2"}
    assert status_execs(err) == polled, "still polled after its stream was heard again"
    assert orch.run_json(run_id)["state"] == "succeeded"
    assert leftover(cluster, run_id) == {}


@pytest.mark.foreground  # bounds the teardown to 15 s and counts the polls
def test_kill9_torchrun_on_one_node_fails_fast_and_cleans_every_node(cluster: TestCluster, orch: Orch) -> None:
    # three nodes of two ranks: node3 in the middle of the node list is killed, the two others are stopped
    inv = inventory(cluster, nproc=2, job_env=ddp_job(steps=400, sleep=0.2), only=["node1", "node3", "node4"])
    up = orch.start(str(inv), "--skip-checks", verbose=True)
    run_id = up.wait_running()
    wait_for(lambda: "step 2 " in node_log(run_root(cluster), run_id, "node3"), 90, "node3's workers to step")
    pid = node_state(run_root(cluster), run_id, "node3")["pid"]
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    code = up.wait(60)
    elapsed = time.monotonic() - killed
    assert code == 1, up.err
    # orch up ends only once every node's stop is confirmed: within 15 s of the kill, nothing is left
    assert leftover(cluster, run_id) == {}
    assert elapsed < 15, f"every node stopped only {elapsed:.1f} s after the kill"
    assert re.search(r"first failure on node3 \(node rank 1", up.err), up.err
    assert "torchrun was killed by SIGKILL" in up.err, up.err
    assert leftover(cluster, run_id) == {}
    ff = orch.run_json(run_id)["first_failure"]
    assert ff["node"] == "node3" and ff["exit_code"] == -9
    assert (ff["cause"], ff["signal"]) == ("torchrun was killed by SIGKILL", "SIGKILL")
    # node3's failure came pushed: it was asked only for its log excerpt; the others once, to
    # order failures that could have happened at the same time
    execs = status_execs(up.err)
    assert [(n, tail) for n, tail in execs if n == "node3"] == [("node3", 200)], execs
    assert sorted(n for n, tail in execs if tail == 0) == ["node1", "node4"], execs
    print(f"kill -9 -> orch up exit after {elapsed:.1f} s; teardown {orch.run_json(run_id).get('teardown_s')} s")


def test_one_rank_raises_excerpt_shows_the_exception(cluster: TestCluster, orch: Orch) -> None:
    # two nodes of two ranks: the failing rank is node2's second (local rank 1), its peers die of it
    inv = inventory(
        cluster, nproc=2, job_env=ddp_job(steps=400, sleep=0.2, fail_rank=3, fail_step=3), only=["node1", "node2"]
    )
    up = orch.start(str(inv), "--skip-checks")
    code = up.wait(180)
    assert code == 1, up.err
    assert re.search(
        r"first failure on node2 \(node rank 1, rank 3, exit code 1\): RuntimeError: injected failure on "
        r"rank 3 at step 3\n",
        up.err,
    ), up.err
    assert "Root Cause (first observed failure)" not in up.err  # torchrun's summary stays in the log
    run_id = up.run_id()
    ff = orch.run_json(run_id)["first_failure"]
    assert (ff["node"], ff["rank"], ff["local_rank"]) == ("node2", 3, 1)
    assert leftover(cluster, run_id) == {}


def test_sigint_stops_every_node_and_exits_130(cluster: TestCluster, orch: Orch) -> None:
    inv = inventory(cluster, nproc=1, job_env=ddp_job(steps=400, sleep=0.2), only=["node1", "node2"])
    up = orch.start(str(inv), "--skip-checks")
    run_id = up.wait_running()
    wait_for(lambda: "step 1 " in node_log(run_root(cluster), run_id, "node2"), 90, "node2 to step")
    up.proc.send_signal(signal.SIGINT)
    t = time.monotonic()
    assert up.wait(60) == 130, up.err
    print(f"SIGINT -> exit 130 after {time.monotonic() - t:.1f} s")
    # torchrun's SignalException tracebacks stay in the node logs: one line per node says it stopped
    assert "SignalException" not in up.out + up.err and "Traceback" not in up.out + up.err
    assert sorted(re.findall(r"^(node\d): stopped [\d.]+ s after its agent got SIGTERM", up.err, re.M)) == [
        "node1",
        "node2",
    ], up.err
    assert leftover(cluster, run_id) == {}
    data = orch.run_json(run_id)
    assert data["state"] == "stopped"
    assert {node_state(run_root(cluster), run_id, f"node{i}")["state"] for i in range(1, 3)} == {"stopped"}


def test_detach_status_logs_follow_down(cluster: TestCluster, orch: Orch) -> None:
    inv = inventory(cluster, nproc=1, job_env=ddp_job(steps=1000, sleep=0.3), only=["node1", "node2"])
    r = orch.run("up", str(inv), "--skip-checks", "--detach", timeout=120)
    assert r.returncode == 0, r.stderr
    run_id = (orch.home / "latest").read_text().strip()
    assert f"orch down {run_id}" in r.stderr
    status = orch.run("status", "--json")
    assert status.returncode == 0, status.stderr
    import json

    doc = json.loads(status.stdout)
    assert doc["run"] == run_id and doc["state"] == "running"
    assert [(n["node"], n["state"]) for n in doc["nodes"]] == [("node1", "running"), ("node2", "running")]
    assert all(n["pid"] for n in doc["nodes"])
    _follow_shows_new_lines(orch, run_id)
    down = orch.run("down")
    assert down.returncode == 0, down.stderr
    assert leftover(cluster, run_id) == {}
    again = orch.run("down", run_id)
    assert again.returncode == 0 and "nothing running" in again.stderr, again.stderr
    doc = json.loads(orch.run("status", run_id, "--json").stdout)
    assert doc["state"] == "stopped"
    assert {n["state"] for n in doc["nodes"]} == {"stopped"}


def _follow_shows_new_lines(orch: Orch, run_id: str) -> None:
    """`orch logs --follow` prints lines written after it started (a step beyond the last one seen)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "logs", "--follow", run_id],
        cwd=REPO,
        env=orch.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        steps: list[int] = []
        deadline = time.monotonic() + 40
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            m = re.search(r"step (\d+) sum=", line)
            if m:
                steps.append(int(m.group(1)))
                if len(steps) > 1 and max(steps) >= min(steps) + 3:
                    break
        assert steps and max(steps) >= min(steps) + 3, f"follow showed steps {steps}"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_controller_killed_job_keeps_running_then_down(cluster: TestCluster, orch: Orch) -> None:
    """orch up killed (SIGKILL): the job runs on, status and logs read it, down stops it. It runs
    on until its lease runs out (3 x the grace: here 180 s; test_up_netns.py proves the end)."""
    orch.env.update(ORCH_UNREACHABLE_GRACE_S="60")
    inv = inventory(cluster, nproc=1, job_env=ddp_job(steps=1000, sleep=0.3), only=["node1", "node2"])
    up = orch.start(str(inv), "--skip-checks")
    run_id = up.wait_running()
    up.proc.kill()
    up.proc.wait(10)

    def steps_logged() -> int:  # the job's own lines: the agent's telemetry lines grow node.log too
        return len(re.findall(r"\[rank 1\] step \d+ ", node_log(run_root(cluster), run_id, "node2")))

    before = steps_logged()
    wait_for(lambda: steps_logged() >= before + 3, 60, "node2's job to log 3 more steps after the controller died")
    import json

    doc = json.loads(orch.run("status", run_id, "--json").stdout)
    assert doc["state"] == "running" and {n["state"] for n in doc["nodes"]} == {"running"}
    # the logs of a run whose controller is gone: every node, including what it wrote after the kill
    logs = orch.run("logs", run_id, "--json")
    assert logs.returncode == 0, logs.stderr
    lines = [json.loads(x) for x in logs.stdout.splitlines()]
    assert {x["node"] for x in lines} == {"node1", "node2"}
    last = max(
        int(m.group(1)) for x in lines if x["node"] == "node2" for m in [re.search(r"step (\d+) ", x["line"])] if m
    )
    assert last >= 3, last
    down = orch.run("down", run_id)
    assert down.returncode == 0, down.stderr
    assert leftover(cluster, run_id) == {}
    doc = json.loads(orch.run("status", run_id, "--json").stdout)
    assert doc["state"] == "stopped" and {n["state"] for n in doc["nodes"]} == {"stopped"}


def test_node_that_cannot_start_stops_the_others(cluster: TestCluster, orch: Orch) -> None:
    inv = inventory(
        cluster,
        nproc=1,
        job_env=ddp_job(steps=1000, sleep=0.3),
        nodes_extra={"node3": {"python": "/nonexistent/bin/python3"}},
    )
    r = orch.run("up", str(inv), "--skip-checks", timeout=120)
    assert r.returncode == 1, r.stderr
    assert "node3: could not start" in r.stderr and "/nonexistent/bin/python3" in r.stderr, r.stderr
    assert "hint:" in r.stderr
    assert "nothing was left running" in r.stderr, r.stderr
    run_id = (orch.home / "latest").read_text().strip()
    # the other nodes had started (their job ran, with a pid) before node3's failure stopped them
    for node in ("node1", "node2", "node4"):
        st = node_state(run_root(cluster), run_id, node)
        assert st["pid"] and st["started_at"] and st["state"] == "stopped", (node, st)
    assert leftover(cluster, run_id) == {}
    assert orch.run_json(run_id)["state"] == "failed"
