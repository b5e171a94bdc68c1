"""Long-run failures over real sshd nodes, real torchrun and gloo: a hung rank found by the
watchdog and named by its stack (`orch stacks`), and automatic retries (a spare replacing a node
that breaks). A trainer's retry under orch up is in test_up_container_retry.py and
test_up_resume_local.py; its exact resume in test_trainer_ddp.py and test_trainer_preempt.py.

Every test ends by checking each node's process table for anything carrying the run id.
"""

from __future__ import annotations

import json
import re
import signal
import time
from typing import Any

import pytest
import yaml

from tests.cluster import TestCluster
from tests.up_helpers import Orch, ddp_inventory, ddp_job, leftover, node_log, run_root, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STALL_S = 5.0


inventory = ddp_inventory


def group_line(err: str, label: str) -> str:
    """The line of the grouped stacks view for `label` (`rank 2`, `ranks 0-1,3`)."""
    m = re.search(rf"^{re.escape(label)}\s+(.*)$", err, re.M)
    assert m, f"no `{label}` line in the stacks view:\n{err[-3000:]}"
    return m.group(1)


@pytest.mark.foreground  # a watchdog of 5 s: a loaded machine could starve a healthy rank that long
def test_a_hung_rank_fires_the_watchdog_names_its_stack_and_nothing_is_left(cluster: TestCluster, orch: Orch) -> None:
    # rank 2 (node3) stops at step 3 inside sleep_forever; ranks 0 and 1 block in all_reduce waiting for it
    # (three nodes: the odd rank stands apart from a majority of two)
    inv = inventory(
        cluster, job_env=ddp_job(steps=400, sleep=0.2, hang_rank=2, hang_step=3), only=["node1", "node2", "node3"]
    )
    up = orch.start(str(inv), "--skip-checks", "--stall-timeout", f"{STALL_S:g}")
    run_id = up.wait_running()
    wait_for(lambda: "hanging at step 3" in node_log(run_root(cluster), run_id, "node3"), 120, "rank 2 to hang")
    hung = time.monotonic()  # the hanging rank's last line is in its node's log (the others' came before)
    wait_for(lambda: "no rank wrote a line" in up.err, 60, "the watchdog")
    fired = time.monotonic() - hung
    code = up.wait(120)
    err = up.err
    assert code == 1, err[-3000:]
    assert fired <= STALL_S + 10, f"the watchdog fired {fired:.1f} s after the last line (limit {STALL_S + 10:g} s)"
    # the grouped view: the sleeping rank apart, named by its function; the others in all_reduce
    assert "sleep_forever (ddp_job.py:" in group_line(err, "rank 2")
    assert "all_reduce (torch/distributed/distributed_c10d.py:" in group_line(err, "ranks 0-1")
    assert "in main (ddp_job.py:" in group_line(err, "ranks 0-1")
    # the first failure names the odd rank, on its node
    assert re.search(
        r"first failure on node3 \(node rank 2, rank 2, exit code None\): hung: no rank wrote a line "
        r"for \d+ s \(stall timeout 5 s\); rank 2 stands apart: sleep_forever",
        err,
    ), err[-3000:]
    data = orch.run_json(run_id)
    assert data["state"] == "failed" and data["first_failure"]["rank"] == 2
    saved = sorted((orch.run_dir(run_id) / "stacks").glob("*-hang.json"))
    assert len(saved) == 1, saved
    stacks = json.loads(saved[0].read_text())
    assert stacks["odd_ranks"] == [2] and stacks["complete"] is True
    assert [g["ranks_text"] for g in stacks["groups"]] == ["0-1", "2"]
    assert "sleep_forever" in saved[0].with_suffix(".txt").read_text()
    assert leftover(cluster, run_id) == {}
    print(f"watchdog fired {fired:.1f} s after the hung rank's last line (stall timeout {STALL_S:g} s)")


@pytest.mark.foreground  # a watchdog of 5 s: a loaded machine could starve a healthy rank that long
def test_warn_keeps_the_run_and_orch_stacks_shows_the_hang(cluster: TestCluster, orch: Orch) -> None:
    inv = inventory(
        cluster,
        job_env=ddp_job(steps=400, sleep=0.2, hang_rank=1, hang_step=2),
        job={"on_stall": "warn", "stall_timeout_s": STALL_S},
        only=["node1", "node2", "node3"],
    )
    up = orch.start(str(inv), "--skip-checks")
    run_id = up.wait_running()
    wait_for(lambda: "job.on_stall is warn: the run goes on" in up.err, 120, "the watchdog's warning")
    warned = time.monotonic()
    # from another shell, while the run hangs: every rank's stack, grouped, as JSON
    res = orch.run("stacks", run_id, "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    groups = {g["ranks_text"]: g for g in report["groups"]}
    assert set(groups) == {"0,2", "1"}, report["groups"]
    assert groups["1"]["summary"].startswith("sleep_forever (ddp_job.py:") and groups["1"]["nodes"] == ["node2"]
    assert groups["0,2"]["summary"].startswith("all_reduce (")
    assert report["odd_ranks"] == [1]
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert sorted(ranks) == [0, 1, 2] and all(r["pid"] and r["error"] is None for r in ranks.values())
    assert ranks[1]["node"] == "node2" and ranks[1]["threads"][0]["name"] == "MainThread"
    # the human view of the same
    res = orch.run("stacks", run_id)
    assert res.returncode == 0, res.stderr
    assert re.search(r"^rank 1\s+sleep_forever \(ddp_job\.py:\d+\) in main|^rank 1\s+sleep_forever", res.stdout, re.M)
    assert re.search(r"^ranks 0,2\s+all_reduce", res.stdout, re.M), res.stdout
    # warned once, still running; Ctrl-C ends it cleanly. A watchdog that forgot it had reported
    # this silence would warn again one stall timeout after the first warning: the run is kept
    # until then (and a margin), and the whole of its stderr, read after it ended, must hold one
    # warning. (That a silence is reported once is also proven on an injected clock:
    # tests/unit/test_stacks.py, the Watchdog tests.)
    wait_for(lambda: time.monotonic() - warned > STALL_S + 2, STALL_S + 10, "a second stall timeout")
    assert up.proc.poll() is None, up.err[-2000:]
    assert orch.run_json(run_id)["state"] == "running"
    up.proc.send_signal(signal.SIGINT)
    assert up.wait(60) == 130  # the supervisor was alive and judging until the end
    assert up.err.count("no rank wrote a line") == 1, up.err[-2000:]
    assert leftover(cluster, run_id) == {}


def need_private_fs(cluster: TestCluster) -> None:
    if not cluster._private_fs:
        pytest.skip("node-local files need root (a mount namespace per node)")


def test_a_node_that_breaks_is_replaced_by_a_spare_on_retry(make_cluster: Any, orch: Orch) -> None:
    cluster = make_cluster(4)
    need_private_fs(cluster)
    data = "names: {0: a}\n"
    for name in ("node1", "node2", "node4"):
        (cluster.node(name).local_dir / "data.yaml").write_text(data)
    path = f"{cluster.NODE_LOCAL}/data.yaml"
    # node2's rank fails at step 4 and breaks its node on the way (its data file is gone): the retry's
    # preflight fails there, and the spare node4 takes its place in the middle (node rank 1, rank 1)
    inv = inventory(
        cluster,
        job_env=ddp_job(steps=8, sleep=0.1),
        job={"args": {"data": path}, "retries": 1},
        nodes_extra={"node2": {"env": {"DDP_FAIL_RANK": "1", "DDP_FAIL_STEP": "4", "DDP_BREAK_FILE": path}}},
    )
    doc = yaml.safe_load(inv.read_text())
    doc["spare"] = [doc["nodes"].pop()]  # node4
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert [n["name"] for n in doc["nodes"]] == ["node1", "node2", "node3"]
    (cluster.node("node3").local_dir / "data.yaml").write_text(data)

    up = orch.start(str(inv))
    code = up.wait(240)
    err = up.err
    assert code == 0, err[-4000:]
    run_id = up.run_id()
    assert re.search(r"attempt 2/2 after node2 rank 1: RuntimeError: injected failure on rank 1 at step 4", err), (
        "\n".join(ln for ln in err.splitlines() if not ln.startswith(("│", "┌", "└", "├", "┃", "┏", "┗", "┡")))
    )
    assert re.search(
        r"node2 failed the preflight \(job: [^)]*does not exist on this node\): spare node4 takes its "
        r"place",
        err,
    ), err[-3000:]
    assert "succeeded on every node" in err and "(attempt 2 of 2)" in err
    data_json = orch.run_json(run_id)
    assert data_json["attempt"] == 2 and data_json["replaced"] == {"node2": "node4"}
    assert [(n["node"], n["node_rank"], n["state"]) for n in data_json["nodes"]] == [
        ("node1", 0, "succeeded"),
        ("node4", 1, "succeeded"),
        ("node3", 2, "succeeded"),
    ]
    assert data_json["attempts"][0]["first_failure"]["node"] == "node2"
    # the spare ran rank 1 of the relaunch; the merged log has both attempts
    assert re.search(r"\bnode4\s+r1\s+.*done steps=8 allreduce_ok=True", up.out), up.out[-2000:]
    merged = (orch.run_dir(run_id) / "merged.log").read_text()
    assert "injected failure on rank 1 at step 4" in merged and re.search(r"\bnode4\s+r1\s+.*done steps=8", merged)
    assert re.search(r"\bnode4\s.*starting attempt 2: ", merged), merged[-3000:]  # where the relaunch begins
    status = orch.run("status", run_id, "--json")
    st = json.loads(status.stdout)
    assert st["attempt"] == 2 and st["max_attempts"] == 2 and st["replaced"] == {"node2": "node4"}
    assert [n["node"] for n in st["nodes"]] == ["node1", "node4", "node3"]
    human = orch.run("status", run_id)
    assert "(attempt 2 of 2)" in human.stdout, human.stdout
    assert leftover(cluster, run_id) == {}
