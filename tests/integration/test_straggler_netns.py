"""The straggler detector on a real 4-node trainer run (network namespaces, root only): one node
made slow names that node, and only it, with the reason; `orch top` and the report say the same.

The slow node is slow for real: its sshd (and so its agent, torchrun and rank) is put in a cgroup
with a CPU quota (`TestCluster.cpu_quota`), or its rank's data loader hands out every batch late
(tests/slow_data). CPU, gloo, yolo12n at 64 px: every rank computes the same, so the only
difference between the ranks is the one made.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import TestCluster
from tests.trainer_helpers import make_dataset
from tests.up_helpers import REPO, Orch, leftover, node_log, run_root, wait_for

# A straggler is a relative speed: another test's load would slow nodes unevenly. Both run in the
# foreground lane (tests/conftest.py), whose cgroup outweighs the other tests' 16 to 1: the nodes
# then share what the test itself loads the machine with, as if it ran alone. The CPU quota is a
# group inside that lane (TestCluster.cpu_quota).
pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(900)]

SLOW_DATA = REPO / "tests" / "slow_data"


def straggler_inventory(
    c: TestCluster, tmp: Path, name: str, node_env: dict[str, dict[str, str]] | None = None, epochs: int = 3
) -> Path:
    data = make_dataset(tmp / "data", images=48, imgsz=64)
    (tmp / "runs").mkdir(exist_ok=True)
    args: dict[str, Any] = {
        "model": "yolo12n.yaml",
        "data": str(data),
        "epochs": epochs,
        "batch": 8,
        "imgsz": 64,
        "log-every": 1,
        "accumulate": 1,
        "workers": 0,
        "val-period": 0,
        "warmup-epochs": 0,
        "close-mosaic": 0,
        "project": str(tmp / "runs"),
        "name": name,
        "seed": 1,
    }
    return c.write_inventory(
        tmp / f"{name}.yaml",
        job={
            "module": "trainer",
            "nproc_per_node": 1,
            "workdir": str(REPO),
            "stop_grace_s": 5,
            "args": args,
            "telemetry_s": 2,
            "straggler": {"share": 0.8, "windows": 3, "action": "warn"},
        },
        env={"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"},
        master={"port": 29500},
        nodes_extra={n: {"env": e} for n, e in (node_env or {}).items()},
    )


def named(text: str) -> list[tuple[str, str, str]]:
    """(rank, node, reason) of every straggler line."""
    return re.findall(r"straggler: rank (\d+) on (\S+) at [\d.]+× the median for [^;]+; [^:]+: (.+)", text)


def check_everywhere(orch: Orch, run_id: str, node: str, reason: str) -> None:
    run = orch.run_json(run_id)
    assert [s["node"] for s in run.get("stragglers", [])] == [node], run.get("stragglers")
    assert reason in run["stragglers"][0]["reason"]
    status = json.loads(orch.run("status", run_id, "--json").stdout)
    assert [s["node"] for s in status["stragglers"]] == [node]
    top = orch.run("top", run_id, "--json")  # from the stored logs, as any shell later would
    assert top.returncode == 0, top.stderr
    report = json.loads(top.stdout)
    assert [s["node"] for s in report["stragglers"]] == [node], report["stragglers"]
    assert [n["node"] for n in report["nodes"] if "straggler" in n["flags"]] == [node]
    assert all(n["ranks"] and n["ranks"][0]["images_per_s"] for n in report["nodes"])
    merged = (orch.run_dir(run_id) / "merged.log").read_text()  # as the attached orch up wrote it, live
    said = run["stragglers"][0]["line"]
    assert [ln.split()[1:3] for ln in merged.splitlines() if said in ln] == [["orch", "-"]], merged[-3000:]
    logs = orch.run("logs", run_id)  # rewrites merged.log from the copies and controller.log
    assert logs.returncode == 0, logs.stderr
    assert [ln for ln in logs.stdout.splitlines() if said in ln] == [ln for ln in merged.splitlines() if said in ln]
    assert said in (orch.run_dir(run_id) / "merged.log").read_text()
    assert said in orch.run("status", run_id).stdout
    rep = orch.run("report", run_id)
    assert rep.returncode == 0, rep.stderr
    page = (orch.run_dir(run_id) / "report" / "index.html").read_text()
    assert "ranks over time" in page and f"on {node} at" in page


@pytest.mark.foreground
def test_a_node_under_a_cpu_quota_is_named_compute_bound_and_no_other(
    netns_cluster: TestCluster, tmp_path: Path
) -> None:
    """The issue's 20 % of a core, once every rank trains: node3 then computes at about half the
    others' speed on this 2-core machine (measured 0.54x the median at load 3, 0.48x at load 7: the
    others share what the load leaves them, node3 never more than its fifth of a core), under the
    1.25x threshold by far, and it alone is named, a few seconds after its first slow window.
    After start-up rather than from it: the ranks' imports and model build at a fifth of a core
    would add a minute or more to a test the suite already waits long for, and prove nothing more
    (the detector judges training windows only)."""
    c = netns_cluster
    inv = straggler_inventory(c, tmp_path, "cpu", epochs=50)
    orch = Orch(tmp_path / "home", env={"COLUMNS": "150"})
    up = orch.start(str(inv), "--skip-checks", "--run-id", "slowcpu")
    try:
        up.run_id(180)  # a loaded machine may take a while to bring orch up
        up.wait_running(180)
        wait_for(
            lambda: all(
                "timing epoch" in node_log(run_root(c), "slowcpu", n) for n in ("node1", "node2", "node3", "node4")
            ),
            300,
            "every rank's first timing window",
        )
        c.cpu_quota("node3", 20)
        wait_for(
            lambda: orch.run_json("slowcpu").get("stragglers") or up.proc.poll() is not None, 300, "a straggler named"
        )
        assert up.proc.poll() is None, up.err[-3000:]
        live = orch.run("top", "slowcpu", "--once")  # while it runs: the screen the README shows
        assert live.returncode == 0, live.stderr
        print(live.stdout)
        assert re.search(r"node3 .*straggler", live.stdout), live.stdout
        assert "straggler: rank 2 on node3" in live.stdout
    finally:
        up.proc.send_signal(signal.SIGINT)  # enough seen: Ctrl-C tears the run down
        code = up.wait(120)
    assert code == 130, up.err[-3000:]
    found = named(up.err)
    assert [(node, reason) for _r, node, reason in found] == [("node3", "compute-bound on node3")], up.err[-3000:]
    first = orch.run_json("slowcpu")["stragglers"][0]
    assert first["at"] - first["since"] < 120, first  # named within two minutes of its first slow window
    check_everywhere(orch, "slowcpu", "node3", "compute-bound on node3")
    assert leftover(c, "slowcpu") == {}


@pytest.mark.foreground
def test_a_node_whose_data_comes_late_is_named_for_its_input_pipeline(
    netns_cluster: TestCluster, tmp_path: Path
) -> None:
    c = netns_cluster
    slow = {"PYTHONPATH": str(SLOW_DATA), "ORCH_TEST_SLOW_DATA_S": "1.5"}
    inv = straggler_inventory(c, tmp_path, "data", node_env={"node2": slow}, epochs=2)
    orch = Orch(tmp_path / "home")
    res = orch.run("up", str(inv), "--skip-checks", "--run-id", "slowdata", timeout=840)
    assert res.returncode == 0, res.stderr[-4000:]
    found = named(res.stderr)
    assert [node for _r, node, _why in found] == ["node2"], res.stderr[-3000:]
    assert found[0][2].startswith("input pipeline on node2"), found
    check_everywhere(orch, "slowdata", "node2", "input pipeline on node2")
    assert leftover(c, "slowdata") == {}
