"""The run glue without any node: launch.json, agent answers, the preflight gate, status JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator import up
from orchestrator.config import inventory
from orchestrator.config.plan import make_plan
from orchestrator.contract import NodeState
from orchestrator.errors import OrchError
from orchestrator.run import agents, control, records
from orchestrator.run.agents import NodeStatus
from orchestrator.transport import Result

REPO = Path(__file__).resolve().parents[2]
V100 = REPO / "inventory" / "v100.yaml"


def test_launch_spec_carries_env_apart_from_argv() -> None:
    plan = make_plan(inventory.load(V100), "r1")
    spec = agents.launch_spec(plan, plan.nodes[2])
    assert spec["node"] == "v100-3" and spec["node_rank"] == 2 and spec["run"] == "r1"
    assert spec["argv"] == list(plan.nodes[2].argv)
    assert spec["env"]["NCCL_SOCKET_IFNAME"] == "ens2f1" and spec["env"]["ORCH_RUN_ID"] == "r1"
    assert not any("NCCL_SOCKET_IFNAME" in a for a in spec["argv"])
    assert spec["cwd"] == "/mnt/nfs/yolov12" and spec["grace"] == 10.0 and spec["torchrun_log_dir"] is True
    json.dumps(spec)  # it must travel as JSON


def test_node_records_point_at_per_node_run_dirs() -> None:
    plan = make_plan(inventory.load(V100), "r1")
    recs = records.node_records(plan)
    assert [r.remote_dir for r in recs] == [f"~/.orch/nodes/r1/v100-{i}" for i in range(1, 5)]
    assert [r.base_rank for r in recs] == [0, 8, 16, 24]


def res(code: int, out: str = "", err: str = "") -> Result:
    return Result("n2", ("py", "agent.py"), code, out, err, 1.0)


def test_parse_agent_reads_the_last_json_line() -> None:
    data = agents.parse_agent(res(1, 'noise\n{"state": "failed", "reason": "x"}\n'), "py")
    assert data == {"state": "failed", "reason": "x"}
    status = NodeStatus.from_json(data)
    assert status.state is NodeState.FAILED and status.reason == "x" and status.exit_code is None
    assert NodeStatus.from_json({"state": "dancing"}).state is NodeState.UNKNOWN
    assert NodeStatus.from_json({"exists": False}).state is None  # no state.json there (yet)


def test_missing_python_gets_a_clear_message_and_hint() -> None:
    with pytest.raises(OrchError) as exc:
        agents.parse_agent(res(127, err="sh: 1: exec: /opt/bad/python: not found"), "/opt/bad/python")
    assert "n2: cannot run the node agent with python '/opt/bad/python'" in exc.value.message
    assert exc.value.hint and "job.python" in exc.value.hint


def test_an_agent_that_cannot_run_is_its_own_error() -> None:
    """Callers tell "the agent cannot run with that python" from other failures by its type
    (`stop_node` asks `python3` then), never by the words of its message."""
    from orchestrator.errors import AgentUnavailable

    with pytest.raises(AgentUnavailable) as exc:
        agents.parse_agent(res(127, err="sh: 1: exec: /opt/bad/python: not found"), "/opt/bad/python")
    assert (exc.value.node, exc.value.python) == ("n2", "/opt/bad/python")
    with pytest.raises(OrchError) as other:
        agents.parse_agent(res(1, err="Traceback: cannot run the node agent with python 'x'"), "py")
    assert not isinstance(other.value, AgentUnavailable)


class StopT:
    """A node whose run's python cannot start the agent (`py`: not found) and whose `python3` can;
    `broken`: the agent fails some other way under any python."""

    def __init__(self, broken: bool = False) -> None:
        self.broken, self.calls = broken, []  # type: list[str]

    def run(self, argv: list[str], **k: Any) -> Result:
        self.calls.append(argv[0])
        if argv == ["true"]:
            return res(0)
        if self.broken:
            return res(1, err="cannot run the node agent with python 'py': a traceback's words")
        if argv[0] == "py":
            return res(127, err="sh: 1: exec: py: not found")
        return res(0, out=json.dumps({"state": "stopped", "stopped": [41]}))


def test_a_stop_falls_back_to_python3_only_when_the_agent_cannot_run() -> None:
    t = StopT()
    out = agents.stop_node(t, "py", "/x", 5)  # type: ignore[arg-type]
    assert out.stopped == (41,) and t.calls == ["py", "true", agents.FALLBACK_PYTHON]
    t = StopT(broken=True)
    with pytest.raises(OrchError, match="the node agent failed"):
        agents.stop_node(t, "py", "/x", 5)  # type: ignore[arg-type]
    assert t.calls == ["py", "true"]


def test_missing_run_dir_reads_as_unknown_state() -> None:
    class T:
        def run(self, *a: Any, **k: Any) -> Result:
            return res(2, err="sh: 1: cd: can't cd to /x")

    st = agents.status_node(T(), "py", "/x")  # type: ignore[arg-type]
    assert st.state == "unknown" and st.agent_alive is False and st.error and "can't cd" in st.error


def test_failed_preflight_launches_nothing_and_exits_3(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main
    from orchestrator.preflight.checks import CheckResult
    from orchestrator.preflight.runner import CheckReport

    failed = CheckReport([CheckResult("ssh", "v100-1", "fail", detail="connection refused")])
    shown: list[object] = []

    class Progress(up.Quiet):
        def preflight_done(self, report: CheckReport, elapsed_s: float) -> None:
            shown.append(report)

    monkeypatch.setattr(up, "run_preflight", lambda inv, **kw: failed)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    outcome = up.up(inventory.load(V100), progress=Progress())
    assert outcome.result == "preflight_failed" and outcome.run_id is None and shown == [failed]
    assert not (tmp_path / "home" / "runs").exists()
    with pytest.raises(SystemExit) as exc:  # the CLI: the table, the verdict, exit 3
        main(["up", str(V100)])
    err = capsys.readouterr().err
    assert exc.value.code == 3 and "connection refused" in err and "nothing was launched" in err
    assert not (tmp_path / "home" / "runs").exists()


def test_status_json_follows_the_contract() -> None:
    data = {
        "run": "r1",
        "state": "running",
        "nodes": [
            {"node": "a", "node_rank": 0, "host": "h", "state": "running", "exit_code": None, "pid": 1},
            {"node": "b", "node_rank": 1, "host": "h2", "state": "running", "exit_code": None, "pid": 2},
        ],
    }
    statuses = {
        "a": NodeStatus(NodeState.RUNNING, pid=11, started_at=100.0, now=160.0, log_mtime=158.0, agent_alive=True),
        "b": NodeStatus(NodeState.UNREACHABLE, error="timed out"),
    }
    out = control.status_report(data, statuses).to_json()
    assert out["run"] == "r1" and out["state"] == "running"
    a, b = out["nodes"]
    assert {"node", "node_rank", "state", "exit_code"} <= set(a)
    assert a["pid"] == 11 and a["uptime_s"] == 60.0 and a["last_log_age_s"] == 2.0
    assert b["state"] == "unreachable" and b["error"] == "timed out" and b["pid"] == 2
    assert "first_failure" not in out
    out = control.status_report(
        {**data, "first_failure": {"node": "a", "rank": 3, "exit_code": 1, "excerpt": []}}, {}
    ).to_json()
    assert out["first_failure"]["rank"] == 3
    assert out["stragglers"] == []
    named = {"rank": 2, "node": "b", "kind": "compute", "line": "straggler: rank 2 on b at 0.45× the median ..."}
    assert control.status_report({**data, "stragglers": [named]}, {}).to_json()["stragglers"] == [named]


def test_status_says_which_nodes_run_root_is_full(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import render

    full = "run_root /scratch is full (No space left on device): the node's log and state are not all written"
    data = {
        "run": "r1",
        "state": "running",
        "nodes": [{"node": "a", "node_rank": 0, "host": "h", "state": "running", "exit_code": None, "pid": 1}],
    }
    report = control.status_report(data, {"a": NodeStatus(NodeState.RUNNING, agent_alive=True, disk_full=full)})
    assert report.to_json()["nodes"][0]["disk_full"] == full
    render.status_table(report)
    assert f"node a: {full}" in " ".join(capsys.readouterr().out.split())


def test_merge_status_keeps_the_record_and_takes_the_agents_facts() -> None:
    rec = {"node": "a", "remote_dir": "/r", "python": "py", "state": "pending", "pid": None}
    out = records.merge_status(rec, NodeStatus(NodeState.RUNNING, pid=5, pgid=5, agent_alive=True, now=1.0))
    assert out == {**rec, "state": "running", "pid": 5, "pgid": 5}
    assert records.merge_status(rec, NodeStatus(None, agent_alive=False)) == rec  # no state.json: nothing new


def test_local_inventory_resolves_python_against_its_directory() -> None:
    inv = inventory.load(REPO / "inventory" / "local.yaml")
    assert inv.transport == "local" and [n.name for n in inv.nodes] == ["node0", "node1"]
    assert inv.nodes[0].python == str(REPO / ".venv" / "bin" / "python")
    assert inv.job.workdir == str(REPO)


def test_down_of_an_unknown_run_is_a_usage_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from orchestrator.errors import UsageError

    monkeypatch.setenv("ORCH_HOME", str(tmp_path))
    with pytest.raises(UsageError):
        control.down("nope")


def test_check_json_is_this_launchs_preflight_not_an_older_check(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from orchestrator.preflight.runner import CheckReport, save_to_run
    from orchestrator.store import RunStore

    monkeypatch.setenv("ORCH_HOME", str(tmp_path))
    inv = inventory.load(V100)
    (tmp_path / "checks").mkdir()
    (tmp_path / "checks" / "v100.json").write_text(json.dumps({"ok": True, "offsets_ms": {"v100-2": 999.0}}))

    fresh = RunStore().create(inv, "fresh")
    save_to_run(fresh, inv, CheckReport([], {"v100-2": 1.5}))
    assert fresh.read("check.json")["offsets_ms"] == {"v100-2": 1.5}
    skipped = RunStore().create(inv, "skipped")
    save_to_run(skipped, inv, None)  # --skip-checks: the last `orch check` is all there is
    assert skipped.read("check.json")["offsets_ms"] == {"v100-2": 999.0}


# ----------------------------------------------------------------------------- names that become paths


@pytest.mark.parametrize("bad", ["../x", "a/b", "..", ".hidden", "x\n", "run id", "-rf", "r" * 101])
def test_a_run_id_that_would_leave_its_directory_is_refused(
    bad: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.errors import UsageError
    from orchestrator.store import RunStore

    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    inv = inventory.load(V100)
    with pytest.raises(UsageError) as exc:
        RunStore().create(inv, bad)
    assert exc.value.exit_code == 2 and "a run id" in exc.value.message and "\n" not in exc.value.message.strip()
    assert sorted(p.name for p in tmp_path.rglob("*")) == []  # nothing created anywhere
    # nor is an existing directory outside $ORCH_HOME/runs read as a run
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "run.json").write_text('{"run": "x"}')
    with pytest.raises(UsageError):
        RunStore().get("../../elsewhere")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "latest").write_text("../../elsewhere\n")
    with pytest.raises(UsageError) as exc:
        RunStore().get()
    assert "latest" in exc.value.message


def test_orch_up_with_a_bad_run_id_is_exit_2_before_anything(tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {"ORCH_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    for extra in ([], ["--dry-run"]):
        r = subprocess.run(
            [sys.executable, "-m", "orchestrator", "up", str(V100), "--run-id", "../x", *extra],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=60,
        )
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith("orch: --run-id '../x': a run id may only use") and "Traceback" not in r.stderr
        assert r.stdout == "" and not (tmp_path / "home").exists()


# ----------------------------------------------------------------------------- no silent downgrade


def test_orch_up_whose_preflight_cannot_import_exits_3_and_launches_nothing(tmp_path: Path) -> None:
    """A broken install (the checks do not import) stops `orch up` with exit 3 and why, in one
    line: never a launch without checks, never a traceback."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['orchestrator.preflight.checks'] = None\n"
        "from orchestrator.cli.commands import main\n"
        f"main(['up', {str(REPO / 'inventory' / 'local.yaml')!r}, '--detach'])"
    )
    env = {"ORCH_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr and "orch: the preflight cannot run: importing its checks failed" in r.stderr
    assert "--skip-checks" in r.stderr
    assert not (tmp_path / "home" / "runs").exists()


def test_new_run_ids_are_readable_and_differ_within_one_second(tmp_path: Path) -> None:
    """Two controllers (two ORCH_HOMEs) starting a run of one inventory in the same second get
    different ids: time, inventory name, 4 random characters."""
    import re

    from orchestrator.store import RunStore

    inv = inventory.load(V100)
    ids = {RunStore(tmp_path / f"home{i}").new_run_id(inv, now=1796031125.0) for i in range(50)}
    assert len(ids) == 50
    assert all(re.fullmatch(r"\d{8}-\d{6}-v100-[0-9a-km-np-z]{4}", i) for i in ids), ids


def test_run_json_is_written_in_place_when_the_disk_is_full(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """ENOSPC on the atomic rewrite: run.json is rewritten in the blocks it has (it keeps a
    reserve), so a run that ends on a full disk still records how it ended."""
    import errno

    from orchestrator import store
    from orchestrator.store import RunDir

    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    run.write({"run": "r", "state": "running", "nodes": [{"node": "n0", "state": "running"}]})

    def full(path: Path, data: str | bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "write_private", full)
    run.update(state="succeeded", wall_s=12.5, teardown_s=0.1)
    assert run.read()["state"] == "succeeded" and run.read()["wall_s"] == 12.5


def test_a_record_the_disk_refuses_warns_once_and_is_written_later(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import errno

    from orchestrator.store import RunDir

    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    run.write({"run": "r", "state": "running", "nodes": [{"node": "n0", "state": "running"}]})
    warned: list[str] = []
    rec = records.RunRecord(run, warn=warned.append)
    real = RunDir.write

    def refuse(self: RunDir, data: dict[str, Any], name: str = "run.json") -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RunDir, "write", refuse)
    assert rec.update_nodes({"n0": NodeStatus(NodeState.SUCCEEDED, exit_code=0)}, state="succeeded") is False
    assert rec.update_nodes({}, wall_s=3.0) is False
    assert len(warned) == 1 and "No space left on device" in warned[0]
    monkeypatch.setattr(RunDir, "write", real)
    assert rec.update_nodes({}, teardown_s=0.5) is True
    data = run.read()
    assert data["state"] == "succeeded" and data["wall_s"] == 3.0 and data["teardown_s"] == 0.5
    assert data["nodes"][0]["state"] == "succeeded" and data["nodes"][0]["exit_code"] == 0
    assert "written again" in warned[-1]


def test_a_preflight_failed_by_nodes_that_cannot_be_reached_hints_exclude_not_skip_checks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--skip-checks cannot launch on a node that is down; --exclude NODE can launch without it."""
    from orchestrator.cli import render
    from orchestrator.preflight.checks import CheckResult
    from orchestrator.preflight.runner import CheckReport

    down = CheckReport(
        [
            CheckResult("ssh", "gpu4", "fail", detail="timed out"),
            CheckResult("ssh", "gpu3", "fail", detail="connection refused"),
            CheckResult("ssh", "gpu1", "ok"),
        ]
    )
    render.up_outcome(up.UpOutcome("preflight_failed", preflight=down))
    err = " ".join(capsys.readouterr().err.split())
    assert "gpu[3-4] cannot be reached: leave them out with --exclude gpu[3-4]" in err, err
    assert "--skip-checks" not in err
    both = CheckReport([*down.results, CheckResult("clock", "gpu1", "fail", detail="off by 2 s")])
    render.up_outcome(up.UpOutcome("preflight_failed", preflight=both))
    err = " ".join(capsys.readouterr().err.split())
    assert "--exclude gpu[3-4]" in err and "--skip-checks" in err


def test_a_node_that_never_started_is_said_so_not_an_unconfirmed_stop(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import render
    from orchestrator.errors import ConnectionLost, TransportError

    reached = up.never_started(
        {
            "gpu4": TransportError("gpu4", "unreachable", "timed out: gpu4:22 did not answer"),
            "gpu2": ConnectionLost("gpu2"),
            "gpu3": TransportError("gpu3", "timeout", "command timed out after 60 s"),
        }
    )
    assert reached == {"gpu4": "gpu4: timed out: gpu4:22 did not answer"}
    render.up_outcome(up.UpOutcome("start_failed", run_id="r1", teardown_s=0.5, never_started=reached))
    err = " ".join(capsys.readouterr().err.split())
    assert "could not confirm the stop" not in err
    assert "gpu4 never started (gpu4: timed out: gpu4:22 did not answer): launch without it with --exclude gpu4" in err


@pytest.mark.parametrize(
    ("why", "said"),
    [
        (
            "straggler: rank 2 on gpu03 at 0.45× the median for 3 min",
            "gpu03 was stopped as a straggler (rank 2 on gpu03 at 0.45× the median for 3 min):"
            " spare gpu08 takes its place",
        ),
        ("sync: rsync: Permission denied", "gpu03 could not receive job.sync (rsync: Permission denied): spare gpu08"),
        ("ssh: timed out", "gpu03 failed the preflight (ssh: timed out): spare gpu08 takes its place"),
    ],
)
def test_a_spare_replacing_a_node_says_why_the_node_was_replaced(
    why: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import render

    render.UpPrinter().replacing("gpu03", "gpu08", why)
    assert said in " ".join(capsys.readouterr().err.split())
