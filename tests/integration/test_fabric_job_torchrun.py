"""The fabric job (orchestrator/node/jobs/allreduce.py) under real torchrun, gloo on CPU, without orch
around it: two nodes on loopback, one node, and a peer that dies mid-sweep."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.node.jobs import allreduce as job
from orchestrator.preflight.fabric import busbw
from tests.ports import job_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
JOB = Path(job.__file__)
MB = 1 << 20


def _torchrun(
    nnodes: int, node_rank: int, nproc: int, port: int, *args: str, stderr: Path | None = None
) -> subprocess.Popen[str]:
    env = {**os.environ, "ORCH_NODE": f"node{node_rank}", "OMP_NUM_THREADS": "1"}
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nnodes),
        "--node-rank",
        str(node_rank),
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        str(JOB),
        *args,
    ]
    err = stderr.open("w") if stderr else subprocess.PIPE
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=env, start_new_session=True)


def _finish(procs: list[subprocess.Popen[str]], timeout: float) -> list[tuple[int, str, str]]:
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            out.append((p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)  # the session we started for it
                p.wait()
    return out


def _result(stdout: str) -> dict[str, Any]:
    (line,) = [x for x in stdout.splitlines() if x.startswith(job.MARKER + " ")]
    return dict(json.loads(line.split(" ", 1)[1]))


def test_two_nodes_on_loopback() -> None:
    port = job_port()
    procs = [_torchrun(2, n, 2, port, "--max-bytes", "4M") for n in (0, 1)]
    (rc0, out0, err0), (rc1, out1, err1) = _finish(procs, timeout=180)
    assert (rc0, rc1) == (0, 0), err0[-2000:] + err1[-2000:]
    assert job.MARKER not in out1  # only global rank 0 prints
    progress = [json.loads(x.split(" ", 1)[1]) for x in err0.splitlines() if x.startswith(job.PROGRESS_MARKER)]
    assert progress == [
        {"phase": "sweep", "size_bytes": MB, "step": 1, "of": 2},
        {"phase": "sweep", "size_bytes": 4 * MB, "step": 2, "of": 2},
        {"phase": "links", "round": 1, "of": 1, "pass": 1, "step": 1, "steps": 2, "pairs": [[0, 1]]},
        {"phase": "links", "round": 1, "of": 1, "pass": 2, "step": 2, "steps": 2, "pairs": [[0, 1]]},
    ]
    assert job.PROGRESS_MARKER not in err1
    r = _result(out0)
    assert (r["backend"], r["device"], r["world_size"], r["nnodes"]) == ("gloo", "cpu", 4, 2)
    assert [(n["node"], n["host"], n["ranks"]) for n in r["nodes"]] == [(0, "node0", [0, 1]), (1, "node1", [2, 3])]
    assert [(x["rank"], x["node"], x["local_rank"]) for x in r["ranks"]] == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert [s["size_bytes"] for s in r["sweep"]] == [MB, 4 * MB] and r["skipped"] == []
    for s in r["sweep"]:
        assert s["wrong"] == 0 and s["iters"] >= 1 and s["time_us"] > 0
        assert s["algbw_gbps"] == pytest.approx(s["size_bytes"] / (s["time_us"] * 1e-6) / 1e9)
        assert s["busbw_gbps"] == pytest.approx(s["algbw_gbps"] * 1.5)  # 2(n-1)/n, n = 4
    table = busbw.sweep_table(r).splitlines()
    assert table[0] == "# all_reduce in place, gloo on cpu, 4 ranks on 2 node(s)"
    data = [line.split() for line in table if line and not line.startswith("#")]
    assert [(int(f[0]), int(f[1]), f[2], f[3], f[4], f[-1]) for f in data] == [
        (MB, MB // 4, "float", "sum", "-1", "0"),
        (4 * MB, MB, "float", "sum", "-1", "0"),
    ]
    assert set(r["phase_s"]) == {"import", "init", "sweep", "links"}
    links = r["links"]
    assert (links["method"], links["rounds"], links["passes"], links["rails"]) == ("pairwise", 1, 2, 2)
    assert links["pairs_at_once"] == "one"  # both "nodes" are this machine (same boot_id)
    assert sorted((t["pass"], t["src_node"], t["dst_node"], t["rail"]) for t in links["transfers"]) == [
        (p, s, d, rail) for p in (0, 1) for s, d in ((0, 1), (1, 0)) for rail in (0, 1)
    ]
    assert all(t["bytes"] >= 256 * 1024 and t["gbps"] > 0 for t in links["transfers"])
    summary = busbw.link_summary(busbw.best_passes(links["transfers"]), [0, 1], 0.7)
    assert [p["node"] for p in summary["per_node"]] == [0, 1]
    assert all(p["send_gbps"] > 0 and p["recv_gbps"] > 0 for p in summary["per_node"])
    assert summary["slow_nodes"] == []  # two nodes: only a direction can be named


def test_one_node_has_no_link_phase() -> None:
    ((rc, out, err),) = _finish([_torchrun(1, 0, 2, job_port(), "--max-bytes", "1M")], timeout=120)
    assert rc == 0, err[-2000:]
    r = _result(out)
    assert r["nnodes"] == 1 and len(r["sweep"]) == 1
    assert r["links"] == {"method": "pairwise", "skipped": "one node: no links between nodes", "transfers": []}


@pytest.mark.foreground  # bounds the survivor's give-up
def test_a_dead_peer_ends_the_job_with_an_error_line(tmp_path: Path) -> None:
    port = job_port()
    args = ("--max-bytes", "256M", "--seconds-per-size", "5", "--timeout", "20")
    err0 = tmp_path / "node0.err"
    procs = [_torchrun(2, 0, 1, port, *args, stderr=err0), _torchrun(2, 1, 1, port, *args)]
    try:
        victim = _wait_for_worker(procs[1].pid, timeout=120)
        _wait_for_line(err0, job.PROGRESS_MARKER + ' {"phase": "sweep"', timeout=120)
        os.kill(victim, signal.SIGKILL)
        start = time.monotonic()
        results = _finish(procs, timeout=90)
        took = time.monotonic() - start
    finally:
        _finish(procs, timeout=1)
    (rc0, _, _), (rc1, _, _) = results
    assert rc0 != 0 and rc1 != 0
    (line,) = [x for x in err0.read_text().splitlines() if x.startswith(job.ERROR_MARKER + " ")]
    info = json.loads(line.split(" ", 1)[1])
    assert (info["node"], info["rank"], info["phase"]) == ("node0", "0", "sweep")
    assert took < 60, f"the survivor needed {took:.0f} s to give up (--timeout 20)"


def _wait_for_line(path: Path, prefix: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and any(x.startswith(prefix) for x in path.read_text().splitlines()):
            return
        time.sleep(0.2)
    raise AssertionError(f"no line starting with {prefix!r} in {path} after {timeout} s")


def _wait_for_worker(torchrun_pid: int, timeout: float) -> int:
    """The pid of the worker torchrun started (its child running job.py)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == torchrun_pid and str(JOB).encode() in cmdline:
                return int(entry.name)
        time.sleep(0.2)
    raise AssertionError("torchrun did not start its worker")
