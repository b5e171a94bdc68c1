"""`orch up` over `transport: local`: two nodes that are processes on this machine, real torchrun."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.cluster import free_port
from tests.procs_support import received, stranger
from tests.up_helpers import DDP_JOB, REPO, Orch, ddp_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def marked(run_id: str) -> list[int]:
    """Pids on this machine whose environment carries the run id (what `orch down` must leave: none)."""
    want = f"ORCH_RUN_ID={run_id}".encode()
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as fh:
                    if want in fh.read().split(b"\0"):
                        out.append(int(name))
            except OSError:
                continue
    return out


def local_inventory(tmp_path: Path, job_env: dict[str, str]) -> Path:
    """Two local nodes running tests/ddp_job.py; job.python relative to the inventory's directory."""
    inv = tmp_path / "local.yaml"
    inv.write_text(yaml.safe_dump({
        "name": "lt", "transport": "local",
        "nodes": [{"host": "localhost", "name": "n0"}, {"host": "localhost", "name": "n1"}],
        "master": {"port": free_port("127.0.0.1")},
        "env": {"GLOO_SOCKET_IFNAME": "lo", **job_env},
        "job": {"python": os.path.relpath(REPO / ".venv" / "bin" / "python", tmp_path)
                if (REPO / ".venv" / "bin" / "python").exists() else "python3",
                "workdir": str(REPO), "run_root": str(tmp_path / "nodes"), "script": DDP_JOB,
                "nproc_per_node": 1, "stop_grace_s": 5},
    }))
    return inv


def test_two_local_nodes_succeed_then_status_and_down_and_a_recycled_pgid_is_left_alone(tmp_path: Path) -> None:
    """A run of two local nodes succeeds; status says so; down of the ended run finds nothing
    running. Then pid reuse, made to happen: each node's recorded pid and process group now name a
    stranger's process group, and `orch down` reports the strangers and signals neither."""
    inv = local_inventory(tmp_path, ddp_job(steps=4, sleep=0.1))
    orch = Orch(tmp_path / "home")
    up = orch.run("up", str(inv), "--skip-checks", timeout=180)
    assert up.returncode == 0, up.stderr
    run_id = (orch.home / "latest").read_text().strip()
    for node, rank in (("n0", 0), ("n1", 1)):
        assert any(node in ln and f"r{rank}" in ln and "allreduce_ok=True final_sum=9 expected=9" in ln
                   for ln in up.stdout.splitlines()), up.stdout[-2000:]
    # the relative job.python was resolved against the inventory's directory
    plan = json.loads((orch.run_dir(run_id) / "plan.json").read_text())
    assert all(os.path.isabs(n["argv"][0]) for n in plan["nodes"])
    state = (tmp_path / "nodes" / run_id / "n1" / "state.json")
    assert json.loads(state.read_text())["state"] == "succeeded"
    assert state.stat().st_mode & 0o077 == 0
    status = orch.run("status", "--json")
    doc = json.loads(status.stdout)
    assert doc["state"] == "succeeded" and [n["exit_code"] for n in doc["nodes"]] == [0, 0]
    down = orch.run("down")
    assert down.returncode == 0 and "nothing running" in down.stderr, down.stderr
    assert json.loads(orch.run("status", "--json").stdout)["state"] == "succeeded"
    assert marked(run_id) == []

    strangers = {}
    try:
        for node in ("n0", "n1"):
            strangers[node] = stranger()  # its own process group; it keeps any signal sent to it
            path = tmp_path / "nodes" / run_id / node / "state.json"
            st = json.loads(path.read_text())
            assert st["state"] == "succeeded" and st["pgid"] and st["pgid_start"]
            st.update(pid=strangers[node].pid, pgid=strangers[node].pid, procs=[[strangers[node].pid, st["pid_start"]]])
            path.write_text(json.dumps(st))
        down = orch.run("down", run_id)
        assert down.returncode == 0, down.stderr
        for node, proc in strangers.items():
            assert received(proc.pid) == set(), f"orch down signalled {node}'s stranger (pid {proc.pid})"
            assert f"{node}: left alone 1 processes" in down.stdout + down.stderr, down.stdout + down.stderr
            assert str(proc.pid) in down.stdout + down.stderr
    finally:
        for proc in strangers.values():
            proc.kill()
            proc.wait()


def test_a_detached_run_that_fails_is_named_by_status(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path, ddp_job(steps=400, sleep=0.1, fail_rank=1, fail_step=2))
    orch = Orch(tmp_path / "home")
    up = orch.run("up", str(inv), "--skip-checks", "--detach", timeout=120)
    assert up.returncode == 0, up.stderr
    run_id = (orch.home / "latest").read_text().strip()

    def final() -> dict | None:
        doc = json.loads(orch.run("status", "--json").stdout)
        return doc if doc["state"] != "running" else None

    from tests.up_helpers import wait_for

    doc = wait_for(final, 120, "the detached run to end")
    assert doc["state"] == "failed", doc
    ff = doc["first_failure"]
    assert ff["node"] == "n1" and ff["rank"] == 1 and ff["exit_code"] == 1
    assert any("RuntimeError: injected failure on rank 1 at step 2" in x for x in ff["excerpt"]), ff["excerpt"]
    assert orch.run("down").returncode == 0
    assert marked(run_id) == []


def test_overrides_on_the_command_line_run_and_every_later_command_sees_the_run_as_it_ran(tmp_path: Path) -> None:
    """`orch up INV --exclude n1 --env K=V -- ARGS` on three local nodes: two ranks run, re-planned
    as for a two-node inventory, with the command line's args and env; run.json keeps the
    overrides, and `orch status`, `orch runs` and `orch logs` (by a prefix of the id) see two nodes."""
    inv = local_inventory(tmp_path, ddp_job(steps=6, sleep=0.05))
    doc = yaml.safe_load(inv.read_text())
    doc["nodes"].append({"host": "localhost", "name": "n2"})
    inv.write_text(yaml.safe_dump(doc))
    orch = Orch(tmp_path / "home")
    up = orch.run("up", str(inv), "--skip-checks", "--exclude", "n1", "--env", "DDP_SLEEP=0.01", "--run-id",
                  "over-1", "--", "--steps", "3", timeout=180)
    assert up.returncode == 0, up.stderr
    assert sorted(ln.split()[1] for ln in up.stdout.splitlines() if "done steps=3 allreduce_ok=True" in ln) == ["n0", "n2"]
    record = orch.run_json("over-1")
    assert record["overrides"] == {"args": ["--steps", "3"], "env": {"DDP_SLEEP": "0.01"}, "include": None,
                                   "exclude": "n1", "nodes": None, "master": None}
    plan = json.loads((orch.run_dir("over-1") / "plan.json").read_text())
    assert [(n["node"], n["node_rank"]) for n in plan["nodes"]] == [("n0", 0), ("n2", 1)]
    assert all("DDP_SLEEP" in n["env"] and n["argv"][-2:] == ["--steps", "3"] for n in plan["nodes"])
    for node in ("n0", "n2"):  # what each node was given to run (plan.json may mask env values)
        launch = json.loads((tmp_path / "nodes" / "over-1" / node / "launch.json").read_text())
        assert launch["env"]["DDP_SLEEP"] == "0.01" and launch["env"]["DDP_STEPS"] == "6"
    assert not (tmp_path / "nodes" / "over-1" / "n1").exists()
    status = json.loads(orch.run("status", "--json", "over").stdout)
    assert [n["node"] for n in status["nodes"]] == ["n0", "n2"] and status["state"] == "succeeded"
    runs = json.loads(orch.run("runs", "--json").stdout)["runs"]
    assert (runs[0]["run"], runs[0]["nodes"], runs[0]["procs"], runs[0]["state"]) == ("over-1", 2, 2, "succeeded")
    logs = orch.run("logs", "over")
    assert logs.returncode == 0 and " n1 " not in logs.stdout and " n2 " in logs.stdout
