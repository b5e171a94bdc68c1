"""Issue #25, the conventions users bring: state found from any shell (`~/.orch`), `orch runs`,
run id prefixes and `latest`, overrides on the command line, and the report's summary."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.store import orch_home


def test_orch_home_defaults_to_the_users_home_not_the_current_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`orch logs -f` from another shell in another directory finds the same runs (SkyPilot's ~/.sky)."""
    monkeypatch.delenv("ORCH_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.chdir(tmp_path)
    assert orch_home() == tmp_path / "user" / ".orch"
    monkeypatch.setenv("ORCH_HOME", "~/elsewhere")
    assert orch_home() == tmp_path / "user" / "elsewhere"
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "explicit"))
    assert orch_home() == tmp_path / "explicit"


def test_a_test_that_asks_for_no_home_never_reaches_the_real_one() -> None:
    """The conftest guard: every test (and every orch it starts) has a private $ORCH_HOME."""
    home = orch_home()
    assert home != Path("~/.orch").expanduser()
    assert Path(os.environ["ORCH_HOME"]) == home
    assert "test_a_test_that_asks_for_no_home" in home.name


# ----------------------------------------------------------------------------- orch runs, RUN prefixes

REPO = Path(__file__).resolve().parents[2]
V100 = REPO / "inventory" / "v100.yaml"


def _runs(home: Path) -> dict[str, Any]:
    """Four recorded runs of the v100 inventory (4 nodes × 8), oldest first: a success, a failure
    on attempt 2 of 3, a stopped one and one still running."""
    from orchestrator.config import inventory
    from orchestrator.store import RunStore

    inv = inventory.load(V100)
    store = RunStore(home)
    nodes = [{"node": f"v100-{i}", "nproc": 8} for i in range(1, 5)]
    made = {}
    for i, (run_id, fields) in enumerate(
        [
            ("20261201-093000-v100", {"state": "succeeded", "wall_s": 52.4}),
            (
                "20261201-101500-v100",
                {
                    "state": "failed",
                    "wall_s": 130.0,
                    "attempt": 2,
                    "max_attempts": 3,
                    "first_failure": {
                        "node": "v100-3",
                        "rank": 17,
                        "exit_code": 1,
                        "reason": "exit code 1",
                        "cause": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                    },
                },
            ),
            ("20261201-101533-v100", {"state": "stopped", "wall_s": 7.25}),
            ("20261201-193300-v100", {"state": "running"}),
        ]
    ):
        run = store.create(inv, run_id)
        made[run_id] = run.update(created=round(time.time()) - 4000.0 + 1000 * i, nodes=nodes, **fields)
    return made


def test_orch_runs_lists_newest_first_with_state_attempt_wall_time_shape_and_failure(orch_home: Path) -> None:
    from click.testing import CliRunner

    from orchestrator.cli import cli

    _runs(orch_home)
    result = CliRunner().invoke(cli, ["runs"])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if "20261201-" in line]
    assert [r.split()[1] for r in rows] == [
        "20261201-193300-v100",
        "20261201-101533-v100",
        "20261201-101500-v100",
        "20261201-093000-v100",
    ]
    assert "running for" in rows[0]
    assert "52.4 s" in rows[3] and "succeeded" in rows[3] and "4×8" in rows[3]
    assert "2/3" in rows[2] and "v100-3 rank 17: torch.OutOfMemoryError" in rows[2]


def test_orch_runs_json_and_the_limit(orch_home: Path) -> None:
    from click.testing import CliRunner

    from orchestrator.cli import cli

    made = _runs(orch_home)
    out = json.loads(CliRunner().invoke(cli, ["runs", "--json", "-n", "2"]).stdout)
    assert [r["run"] for r in out["runs"]] == ["20261201-193300-v100", "20261201-101533-v100"]
    assert out["left_out"] == 2
    every = json.loads(CliRunner().invoke(cli, ["runs", "--all", "--json"]).stdout)
    assert every["left_out"] == 0 and len(every["runs"]) == 4
    failed = every["runs"][2]
    assert failed == {
        **failed,
        "state": "failed",
        "attempt": 2,
        "max_attempts": 3,
        "wall_s": 130.0,
        "nodes": 4,
        "procs": 32,
        "procs_per_node": [8] * 4,
        "running": False,
        "inventory": "v100",
        "started": made["20261201-101500-v100"]["created"],
    }
    assert every["runs"][0]["running"] is True and every["runs"][0]["wall_s"] > 0


def test_runs_default_count_is_defined_once() -> None:
    from orchestrator.cli import commands
    from orchestrator.run.history import DEFAULT_LIMIT

    assert commands.DEFAULT_RUNS == DEFAULT_LIMIT


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("20261201-093000-v100", "20261201-093000-v100"),
        ("20261201-09", "20261201-093000-v100"),
        ("2026120", None),  # all four
        ("20261201-1015", None),  # two
        ("20261201-10153", "20261201-101533-v100"),
        ("1933", "20261201-193300-v100"),  # the date left out
        ("latest", "20261201-193300-v100"),
    ],
)
def test_any_unique_prefix_names_a_run_and_an_ambiguous_one_lists_the_candidates(
    orch_home: Path, given: str, expected: str | None
) -> None:
    from orchestrator.errors import UsageError
    from orchestrator.store import RunStore

    _runs(orch_home)
    if expected is not None:
        assert RunStore().get(given).run_id == expected
        return
    with pytest.raises(UsageError) as info:
        RunStore().get(given)
    assert info.value.exit_code == 2 and "ambiguous" in info.value.message
    assert all(r in info.value.message for r in RunStore().matching(given) for r in [r.run_id])


def test_a_prefix_works_wherever_a_run_is_taken_and_an_ambiguous_one_exits_2(
    orch_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main

    _runs(orch_home)
    with pytest.raises(SystemExit) as info:
        main(["status", "--json", "1015"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "20261201-101500-v100" in err and "20261201-101533-v100" in err
    with pytest.raises(SystemExit) as info:
        main(["logs", "20261201-0930"])
    assert info.value.code == 0


def test_latest_cannot_be_a_run_id(orch_home: Path) -> None:
    from orchestrator.config import inventory
    from orchestrator.errors import UsageError
    from orchestrator.store import RunStore

    with pytest.raises(UsageError):
        RunStore().create(inventory.load(V100), "latest")


# ----------------------------------------------------------------------------- overrides on the command line


def _dry(*args: str) -> dict[str, Any]:
    from click.testing import CliRunner

    from orchestrator.cli import cli

    result = CliRunner().invoke(cli, ["up", str(V100), "--dry-run", "--json", *args])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def _job_words(plan: dict[str, Any], node: int = 0) -> list[str]:
    argv = plan["nodes"][node]["argv"]
    return list(argv[argv.index("trainer") + 1 :])


def test_words_after_dashes_reach_the_job_and_replace_the_inventorys_same_setting() -> None:
    """`orch up INV -- --epochs 1 --batch 64`: the trainer refuses one setting given twice with two
    values, so the command line's --batch replaces the inventory's instead of following it."""
    plan = _dry("--", "--epochs", "1", "--batch", "64")
    words = _job_words(plan)
    assert words[-4:] == ["--epochs", "1", "--batch", "64"]
    assert words.count("--batch") == 1 and words.count("--epochs") == 1 and "384" not in words and "100" not in words
    assert words[:2] == ["--model", "yolo12m.yaml"] and "--save-period" in words  # the rest is kept
    assert plan["overrides"]["args"] == ["--epochs", "1", "--batch", "64"]
    assert all(_job_words(plan, i) == words for i in range(4))


@pytest.mark.parametrize("spelling", [["--batch-size", "64"], ["batch=64"], ["--batch=64"]])
def test_every_spelling_of_a_trainer_setting_replaces_the_inventorys(spelling: list[str]) -> None:
    words = _job_words(_dry("--", *spelling))
    assert words[-len(spelling) :] == spelling
    assert "--batch" not in words and "384" not in words


def test_the_trainer_accepts_the_overridden_arguments() -> None:
    """What orch builds parses in the trainer itself: one batch, the command line's."""
    from trainer.config import parse_config

    words = _job_words(_dry("--", "--batch-size", "64", "lr0=0.02", "--epochs", "1"))
    cfg = parse_config(words)
    assert (cfg.batch, cfg.lr, cfg.epochs, cfg.imgsz) == (64, 0.02, 1, 640)


def test_the_same_setting_table_is_the_trainers() -> None:
    from trainer.config import ALIASES
    from trainer.interface import SAME_SETTING
    from trainer.settings import FIELD_OF_SETTING

    spelled = {alias[2:].replace("-", "_"): name for alias, (name, _t) in ALIASES.items()}
    spelled.update({k: v for k, v in FIELD_OF_SETTING.items() if k != v and k not in ("model", "pretrained")})
    assert spelled == SAME_SETTING


def test_a_script_job_gets_the_words_appended(tmp_path: Path) -> None:
    from orchestrator.config import inventory
    from orchestrator.config.overrides import Overrides, apply

    path = tmp_path / "inv.yaml"
    path.write_text("nodes:\n  - host: a\n  - host: b\njob:\n  script: /srv/train.py\n  args: [--lr, '0.1']\n")
    inv = apply(inventory.load(path), Overrides(args=("--lr", "0.2")))
    assert inv.job.args == ("--lr", "0.1", "--lr", "0.2")  # argparse keeps the last


def test_the_preflight_judges_the_overridden_batch() -> None:
    from orchestrator.config import inventory
    from orchestrator.config.overrides import Overrides, apply
    from orchestrator.preflight.checks import cluster_job_findings

    inv = inventory.load(V100)
    assert not cluster_job_findings(inv)
    bad = apply(inv, Overrides(args=("--batch", "100")))
    assert bad.job.raw_args["batch"] == 100
    assert any("global batch 100" in f[1] for f in cluster_job_findings(bad))


def test_include_exclude_and_nodes_replan_ranks_exactly_as_a_smaller_inventory(tmp_path: Path) -> None:
    from orchestrator.config import inventory
    from orchestrator.config.overrides import Overrides, apply
    from orchestrator.config.plan import make_plan

    text = V100.read_text()
    ranged = (
        "  - host: 192.168.1.[11-13]         # a range expands to one node per value, in order\n"
        "    name: v100-[2-4]                # ranges in name/addr expand alongside host\n"
    )
    assert ranged in text
    smaller = tmp_path / "v100.yaml"
    smaller.write_text(text.replace(ranged, "  - host: 192.168.1.[12-13]\n    name: v100-[3-4]\n"))
    expected = make_plan(inventory.load(smaller)).to_json()
    assert [n["node"] for n in expected["nodes"]] == ["v100-1", "v100-3", "v100-4"]
    inv = inventory.load(V100)
    for ov in (
        Overrides(include="v100-1,v100-[3-4]"),
        Overrides(exclude="v100-2"),
        Overrides(include="v100-[1-4]", exclude="v100-2", first=3),
    ):
        got = make_plan(apply(inv, ov)).to_json()
        strip = [{k: v for k, v in n.items() if k != "host"} for n in got["nodes"]]
        assert strip == [{k: v for k, v in n.items() if k != "host"} for n in expected["nodes"]]
        assert got["world_size"] == 24 and got["master_addr"] == expected["master_addr"]
    first = make_plan(apply(inv, Overrides(first=2))).to_json()
    assert [(n["node"], n["node_rank"], n["global_ranks"]) for n in first["nodes"]] == [
        ("v100-1", 0, [0, 7]),
        ("v100-2", 1, [8, 15]),
    ]
    assert "--nnodes=2" in first["nodes"][1]["argv"]


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`orch ARGS` through the console entry point (errors rendered, exit codes as users see them)."""
    from orchestrator.cli import main

    with pytest.raises(SystemExit) as info:
        main(list(args))
    return int(info.value.code or 0), capsys.readouterr().err


def test_leaving_the_master_out_says_which_node_to_make_master(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _main(capsys, "up", str(V100), "--dry-run", "--exclude", "v100-1")
    assert code == 2
    assert "master v100-1 is not among the chosen nodes" in err and "--master v100-2" in err
    plan = _dry("--exclude", "v100-1", "--master", "v100-3")
    assert [(n["node"], n["node_rank"]) for n in plan["nodes"]] == [("v100-3", 0), ("v100-2", 1), ("v100-4", 2)]
    assert plan["master_addr"] == "192.168.1.12" and "--master-addr=192.168.1.12" in plan["nodes"][1]["argv"]
    for bad in (["--include", "v100-9"], ["--nodes", "5"], ["--master", "v100-9"], ["--nodes", "0"]):
        code, err = _main(capsys, "up", str(V100), "--dry-run", *bad)
        assert code == 2 and bad[0] in err, (bad, err)


def test_nodes_takes_a_set_too_like_exec() -> None:
    plan = _dry("--nodes", "v100-[2-3]", "--master", "v100-2")
    assert [n["node"] for n in plan["nodes"]] == ["v100-2", "v100-3"]


def test_env_is_added_over_the_inventorys_for_this_run_and_validated(capsys: pytest.CaptureFixture[str]) -> None:
    plan = _dry("--env", "NCCL_DEBUG=INFO", "--env", "EXTRA=1", "--show-env")
    for node in plan["nodes"]:
        assert node["env"]["NCCL_DEBUG"] == "INFO" and node["env"]["EXTRA"] == "1"
        assert node["env"]["NCCL_IB_HCA"] == "mlx5_0"
    assert plan["overrides"]["env"] == {"NCCL_DEBUG": "INFO", "EXTRA": "1"}
    hidden = _dry("--env", "EXTRA=secret")  # hidden like the inventory's own values without --show-env
    assert "secret" not in json.dumps(hidden) and hidden["overrides"]["env"] == {"EXTRA": "***"}
    for bad in ("NOEQUALS", "1BAD=x", "A=$(reboot)", "A=x;y"):
        code, err = _main(capsys, "up", str(V100), "--dry-run", "--env", bad)
        assert code == 2 and "--env" in err, (bad, err)


def test_the_run_record_keeps_the_overrides_and_the_run_reads_its_inventory_as_it_ran(orch_home: Path) -> None:
    from orchestrator.config import inventory
    from orchestrator.config.overrides import Overrides, apply
    from orchestrator.store import RunStore

    ov = Overrides(args=("--epochs", "1"), env={"A": "1"}, exclude="v100-1", master="v100-2")
    inv = apply(inventory.load(V100), ov)
    run = RunStore().create(inv, "r1")
    run.update(overrides=ov.to_json())
    again = RunStore().get("r1").inventory()
    assert [n.name for n in again.nodes] == ["v100-2", "v100-3", "v100-4"]
    assert again.job.args == inv.job.args and again.nodes[0].env["A"] == "1"
    assert [n.name for n in RunStore().get("r1").inventory(as_run=False).nodes][0] == "v100-1"


def test_check_takes_the_node_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    """`orch check --exclude` probes only the chosen nodes (the probe itself is stubbed here)."""
    from click.testing import CliRunner

    from orchestrator.cli import cli
    from orchestrator.preflight import runner

    seen: list[list[str]] = []

    def fake(inv: Any, **kw: Any) -> Any:
        seen.append([n.name for n in inv.nodes])
        return runner.CheckReport([], {})

    monkeypatch.setattr(runner, "run_preflight", fake)
    result = CliRunner().invoke(cli, ["check", str(V100), "--json", "--exclude", "v100-[3-4]"])
    assert result.exit_code == 0, result.output
    assert seen == [["v100-1", "v100-2"]]


def test_an_ssh_config_alias_keeps_its_own_port_unless_the_inventory_gives_another() -> None:
    """Port 22 is ssh's default, not a choice: with an ssh config file the alias's `Port` applies
    (`orch exec -w alias`, `orch sync`), as `ssh alias` would; an inventory's other port wins."""
    from orchestrator.config.nodes import SSHOptions
    from orchestrator.transport.ssh import openssh_argv

    assert "-p" not in openssh_argv(SSHOptions(), "/home/me/.ssh/config")
    assert openssh_argv(SSHOptions(port=2222), "/home/me/.ssh/config")[3:5] == ["-p", "2222"]
    assert openssh_argv(SSHOptions(), None)[1:5] == ["-F", "none", "-p", "22"]


def test_a_port_22_the_inventory_writes_wins_over_the_ssh_configs_port(tmp_path: Path) -> None:
    """`port: 22` written in the inventory lost to the ssh config's `Port` for that host (22 was
    taken for "unsaid"): the inventory's word must win, and only an unsaid port defers."""
    from orchestrator.config.inventory import parse
    from orchestrator.transport.ssh import openssh_argv

    def argv(doc: str) -> list[str]:
        return openssh_argv(parse(doc, "inv.yaml").nodes[0].ssh, "/home/me/.ssh/config", "gpu1")

    assert "-p" not in argv("name: x\nnodes: [{host: gpu1}]\n")
    assert argv("name: x\nnodes: [{host: gpu1, port: 22}]\n")[3:5] == ["-p", "22"]
    assert argv("name: x\nssh: {port: 22}\nnodes: [{host: gpu1}]\n")[3:5] == ["-p", "22"]
    assert argv("name: x\nnodes: [{host: gpu1, port: 2222}]\n")[3:5] == ["-p", "2222"]


# ----------------------------------------------------------------------------- shell completion


def _complete(words: str, env: dict[str, str] | None = None) -> list[str]:
    """What bash completion offers for the last word of `words` (click's bash_complete protocol)."""
    from click.testing import CliRunner

    from orchestrator.cli import cli

    parts = words.split(" ")
    result = CliRunner().invoke(
        cli,
        [],
        prog_name="orch",
        env={"_ORCH_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1), **(env or {})},
    )
    return [line.split(",", 1)[1] for line in result.output.splitlines() if "," in line]


def test_completion_offers_run_ids_newest_first_and_latest(orch_home: Path) -> None:
    _runs(orch_home)
    assert _complete("orch status ") == [
        "latest",
        "20261201-193300-v100",
        "20261201-101533-v100",
        "20261201-101500-v100",
        "20261201-093000-v100",
    ]
    assert _complete("orch logs 20261201-10") == ["20261201-101533-v100", "20261201-101500-v100"]
    assert _complete("orch report 2026120") and _complete("orch down l") == ["latest"]
    assert _complete("orch logs 20261201-093000-v100 --node v100-[") == []
    assert _complete("orch logs 1933 --node v100-") == ["v100-1", "v100-2", "v100-3", "v100-4"]


def test_completion_offers_node_names_check_names_and_inventory_files(
    orch_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _complete(f"orch check {V100} --only cl") == ["clock"]
    assert _complete(f"orch check {V100} --skip ssh,r") == ["ssh,rdma"]
    assert _complete(f"orch up {V100} --exclude v100-") == ["v100-1", "v100-2", "v100-3", "v100-4"]
    assert _complete(f"orch exec {V100} --nodes v100-1,v100-") == [f"v100-1,v100-{i}" for i in range(1, 5)]
    monkeypatch.setenv("ORCH_INVENTORY", str(V100))
    assert _complete("orch up --master v100-4") == ["v100-4"]
    monkeypatch.chdir(REPO)
    assert "inventory/" in _complete("orch check inv")
    files = _complete("orch up inventory/")
    assert "inventory/v100.yaml" in files and "inventory/local.yaml" in files
    assert not [f for f in files if not f.endswith((".yaml", ".yml", "/"))]


# ----------------------------------------------------------------------------- training progress


def _trainer_log(path: Path, t0: float = 1_796_000_000.0) -> list[str]:
    """A master's node.log as the trainer writes it (its own line writers), 2 epochs of 10, rank 0
    and rank 1 interleaved, one validation."""
    from orchestrator.logs.lines import format_ts
    from trainer.logs import done_line, step_line, val_line

    rows = [
        (0, f"[default0]:[rank 0] {step_line(1, 10, 10, 20, {'box_loss': 1.5}, 0.01, 410.0, 0.12)}"),
        (1, f"[default1]:[rank 1] {step_line(1, 10, 10, 20, {'box_loss': 9.9}, 0.01, 1.0, 0.99)}"),
        (50, f"[default0]:[rank 0] {val_line(1, 10, {'metrics/mAP50(B)': 0.25, 'metrics/mAP50-95(B)': 0.125})}"),
        (100, f"[default0]:[rank 0] {step_line(2, 10, 10, 20, {'box_loss': 1.2}, 0.01, 420.5, 0.04)}"),
    ]
    lines = [f"{format_ts(t0 + dt)} out {text}\n" for dt, text in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines))
    del done_line
    return lines


def test_progress_is_read_from_rank_0s_lines_with_an_eta(tmp_path: Path) -> None:
    from orchestrator.logs.progress import progress_of

    p = progress_of(_trainer_log(tmp_path / "node0.log"))
    assert p is not None
    assert (p.epoch, p.epochs, p.batch, p.batches, p.images_per_s, p.data_wait) == (2, 10, 10, 20, 420.5, 0.04)
    assert (p.val_epoch, p.map50_95, p.map50) == (1, 0.125, 0.25)
    # 0.05 -> 0.15 of the run in 100 s: 0.85 left takes 850 s
    assert p.eta_s == pytest.approx(850.0)
    assert progress_of(["2026-11-30T09:32:05.123456Z out [default0]:hello\n"]) is None


def test_status_json_and_table_show_a_trainer_runs_progress(
    orch_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.run import control
    from orchestrator.run.control import NodeReport, StatusReport
    from orchestrator.store import RunStore

    _runs(orch_home)
    run = RunStore().get("1933")
    fresh = _trainer_log(run.path / "nodes" / "v100-1.log")
    (run.path / "nodes" / "v100-1.log").write_text("".join(fresh[:2]))  # the copy lags; the agent's tail has it all
    report = StatusReport(
        run.run_id,
        "running",
        [
            NodeReport(
                node="v100-1",
                node_rank=0,
                host="h",
                state="running",
                exit_code=None,
                pid=1,
                pgid=1,
                uptime_s=1.0,
                last_log=None,
                last_log_age_s=None,
                agent_alive=True,
                error=None,
            )
        ],
        master_tail=tuple(line.rstrip("\n") for line in fresh),
    )
    monkeypatch.setattr(control, "status", lambda run_id: report)
    from orchestrator.cli import main

    with pytest.raises(SystemExit) as info:
        main(["status", "--json", "1933"])
    doc = json.loads(capsys.readouterr().out)
    assert info.value.code == 0
    assert doc["progress"] == {
        "epoch": 2,
        "epochs": 10,
        "batch": 10,
        "batches": 20,
        "images_per_s": 420.5,
        "data_wait": 0.04,
        "val_epoch": 1,
        "map50_95": 0.125,
        "map50": 0.25,
        "eta_s": 850.0,
        "done": False,
    }
    with pytest.raises(SystemExit):
        main(["status", "1933"])
    assert (
        "training: epoch 2/10 (batch 10/20) · 420.5 images/s · data 4% · mAP50-95 0.125 (epoch 1) · ETA 14m10s"
        in capsys.readouterr().out
    )


def test_up_keeps_one_live_progress_line_under_the_log_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from orchestrator.cli import render
    from orchestrator.logs.lines import LogLine
    from trainer.logs import step_line

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    err, out = Tty(), io.StringIO()
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setattr("sys.stdout", out)
    printer = render.UpPrinter()
    printer.log = render.LogPrinter((5, 2))
    step = step_line(3, 10, 5, 20, {"box_loss": 1.0}, 0.01, 512.0, 0.04)
    printer.line(LogLine(1.0, "node0", 0, 0, 0, "out", step))
    printer.line(LogLine(2.0, "node1", 1, 1, 0, "out", "other rank"))
    printer.log_event("node1", "reconnected")
    assert out.getvalue().count("\n") == 2 and "other rank" in out.getvalue()
    shown = err.getvalue()
    assert shown.count("epoch 3/10 (batch 5/20) · 512.0 images/s · data 4%") == 2  # drawn, then redrawn after a line
    after = shown.rsplit("\r\x1b[K", 1)[1]  # a message erases the live line first
    assert "node1: reconnected" in after and "epoch" not in after
    assert "\r\x1b[K" in shown


def test_orch_runs_lists_a_run_whose_record_is_broken_instead_of_failing(orch_home: Path) -> None:
    from orchestrator.run.history import list_runs

    _runs(orch_home)
    broken = orch_home / "runs" / "20261201-200000-v100"
    broken.mkdir()
    (broken / "run.json").write_text("{not json")
    runs = {r.run: r for r in list_runs(None).runs}
    assert runs["20261201-200000-v100"].state == "unknown" and len(runs) == 5


LEASE = (
    "the controller (orch up) was not heard from for 31 s (lease 30 s): a cut link or a dead controller; "
    "the job was stopped"
)


def test_a_run_its_nodes_stopped_on_their_own_has_their_reason_and_a_wall_time(orch_home: Path) -> None:
    """Issue 54.8, the pure part: a stopped run whose nodes said why (their agents' lease ran out
    after the controller was killed: no `wall_s`, no reason recorded by `orch up`). The status
    report names the first node's reason by node rank (and each node's own), `orch runs` the wall
    time from the run's creation to its last node's end and the reason; the report counts the same
    wall time. A run stopped without a word (`orch down`) has no reason."""
    from click.testing import CliRunner

    from orchestrator.cli import cli
    from orchestrator.contract import NodeState
    from orchestrator.report import run_wall
    from orchestrator.run.agents import NodeStatus
    from orchestrator.run.control import status_report, stopped_reason
    from orchestrator.run.history import list_runs
    from orchestrator.store import recorded_nodes

    made = _runs(orch_home)
    run_id = "20261201-101533-v100"
    info = made[run_id]
    created = info["created"]
    nodes = [dict(n, node_rank=i, state="stopped", finished_at=created + 60.0 + i) for i, n in enumerate(info["nodes"])]
    from orchestrator.store import RunStore

    run = RunStore().get(run_id)
    run.update(nodes=nodes, wall_s=None)
    data = run.read()
    statuses = {
        n["node"]: NodeStatus(NodeState.STOPPED, exit_code=1, reason=LEASE.replace("31", str(31 + i)))
        for i, n in enumerate(reversed(nodes))
    }
    records = recorded_nodes(data)
    assert stopped_reason("stopped", records, statuses) == f"v100-1: {LEASE.replace('31', '34')}"
    assert stopped_reason("failed", records, statuses) is None
    assert stopped_reason("stopped", records, {n: NodeStatus(NodeState.STOPPED) for n in statuses}) is None
    run.update(reason=stopped_reason("stopped", records, statuses))
    report = status_report(run.read(), statuses)
    assert report.to_json()["reason"] == f"v100-1: {LEASE.replace('31', '34')}"
    assert [n["reason"] for n in report.to_json()["nodes"]] == [LEASE.replace("31", str(34 - i)) for i in range(4)]
    listed = {r.run: r for r in list_runs(None).runs}
    assert listed[run_id].wall_s == 63.0 and listed[run_id].reason == report.reason
    assert run_wall(run.read(), now=created + 1e6) == (63.0, False)
    assert listed["20261201-093000-v100"].reason is None and listed["20261201-093000-v100"].wall_s == 52.4
    out = json.loads(CliRunner().invoke(cli, ["runs", "--all", "--json"]).stdout)
    assert {r["run"]: r["reason"] for r in out["runs"]}[run_id] == report.reason
    table = " ".join(CliRunner().invoke(cli, ["runs"]).output.split())
    assert "1m03s" in table and "v100-1: the controller (orch up) was not heard from for 34 …" in table, table


def test_the_node_log_copys_path_is_spelled_once(tmp_path: Path) -> None:
    """`<run dir>/nodes/<node>.log` (docs/CONTRACT.md) is `RunDir.node_log`: fetch, status, top and
    the report all ask it, so the copies cannot be written in one place and read in another."""
    from orchestrator.store import RunDir

    run = RunDir(tmp_path)
    assert run.node_log("n1") == tmp_path / "nodes" / "n1.log"
    for name in ("n2", "n1"):
        run.node_log(name).parent.mkdir(exist_ok=True)
        run.node_log(name).write_text("")
    (tmp_path / "nodes" / "n1.log.tmp").write_text("")
    assert run.node_logs() == [run.node_log("n1"), run.node_log("n2")]
    package = Path(__file__).resolve().parents[2] / "orchestrator"
    spelled = sorted(
        str(p.relative_to(package)) for p in package.rglob("*.py") if re.search(r'/ "nodes"', p.read_text())
    )
    assert spelled == ["store.py"]


def test_a_status_reports_progress_is_read_by_the_library(orch_home: Path) -> None:
    """`orch status`'s progress line: the master's copy, then the tail its agent answered
    (`logs.progress.status_progress`); the CLI only shows it."""
    from orchestrator.logs.progress import status_progress
    from orchestrator.run.control import NodeReport, StatusReport
    from orchestrator.store import RunStore

    _runs(orch_home)
    run = RunStore().get("1933")
    fresh = _trainer_log(run.node_log("v100-1"))
    run.node_log("v100-1").write_text("".join(fresh[:2]))
    node = NodeReport(
        node="v100-1",
        node_rank=0,
        host="h",
        state="running",
        exit_code=None,
        pid=1,
        pgid=1,
        uptime_s=1.0,
        last_log=None,
        last_log_age_s=None,
        agent_alive=True,
        error=None,
    )
    progress = status_progress(StatusReport(run.run_id, "running", [node], master_tail=tuple(fresh)))
    assert progress is not None and (progress.epoch, progress.epochs, progress.val_epoch) == (2, 10, 1)
    lagging = status_progress(StatusReport(run.run_id, "running", [node]))
    assert lagging is not None and (lagging.epoch, lagging.images_per_s) == (1, 410.0)  # the copy's first lines alone
    assert status_progress(StatusReport(run.run_id, "running", [])) is None  # no node of rank 0
