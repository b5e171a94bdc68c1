"""Automatic retries without any node: spares in the inventory, the trainer's checkpoint path and
`--resume`, the retry loop of `orch up` (attempts, preflight again, spares, resume) on fakes, and
the attempt in run.json and `orch status`."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator import up
from orchestrator.cli import main
from orchestrator.config import inventory
from orchestrator.errors import InventoryError, TransportError
from orchestrator.preflight.checks import CheckResult
from orchestrator.preflight.runner import CheckReport
from orchestrator.run import control, resume
from orchestrator.run.agents import StopResult
from orchestrator.run.supervise import Failure
from orchestrator.store import RunStore
from orchestrator.transport import GroupResult, Hold

SPARES = """\
name: c
nodes:
  - host: gpu[01-03]
    gpus: 2
spare:
  - host: gpu[08-09]
    gpus: 2
job:
  module: trainer
  workdir: /srv/job
  retries: 2
  args:
    data: /data/coco.yaml
"""


def inv(text: str = SPARES, **job: Any) -> inventory.Inventory:
    parsed = inventory.parse(text, "c.yaml")
    return dataclasses.replace(parsed, job=dataclasses.replace(parsed.job, **job)) if job else parsed


# ----------------------------------------------------------------------------- inventory


def test_spares_resolve_like_nodes_and_are_not_nodes() -> None:
    i = inv()
    assert [n.name for n in i.nodes] == ["gpu01", "gpu02", "gpu03"]
    assert [(n.name, n.nproc_per_node) for n in i.spares] == [("gpu08", 2), ("gpu09", 2)]
    assert (i.job.retries, i.job.stall_timeout_s, i.job.on_stall) == (2, 600.0, "stop")
    assert inventory.parse("nodes:\n  - host: a\n", "t.yaml").spares == ()


def test_a_spare_takes_the_place_and_rank_of_the_node_it_replaces() -> None:
    i = inv()
    r = inventory.with_replacements(i, {"gpu02": "gpu08"})
    assert [n.name for n in r.nodes] == ["gpu01", "gpu08", "gpu03"] and [n.name for n in r.spares] == ["gpu09"]
    assert r.master.name == "gpu01"
    # the master too, and a spare that fails in its turn
    r = inventory.with_replacements(i, {"gpu01": "gpu09", "gpu09": "gpu08"})
    assert [n.name for n in r.nodes] == ["gpu08", "gpu02", "gpu03"] and r.master.name == "gpu08" and r.spares == ()
    from orchestrator.config.plan import make_plan

    plan = make_plan(r, "x")
    assert plan.master_addr == "gpu08" and [p.global_ranks for p in plan.nodes] == [
        range(0, 2),
        range(2, 4),
        range(4, 6),
    ]
    assert inventory.with_replacements(i, {}) is i
    with pytest.raises(KeyError, match="gpu07"):
        inventory.with_replacements(i, {"gpu02": "gpu07"})


def test_negative_retries_and_stall_timeout_are_refused_with_their_line() -> None:
    with pytest.raises(InventoryError) as info:
        inventory.parse("nodes:\n  - host: a\njob:\n  retries: -2\n  stall_timeout_s: -1\n", "t.yaml")
    assert [(i.line, i.key) for i in info.value.issues] == [(5, "job.stall_timeout_s"), (4, "job.retries")]


def test_a_run_reads_its_inventory_with_the_spares_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_HOME", str(tmp_path))
    run = RunStore().create(inv(), "r1")
    run.update(replaced={"gpu03": "gpu09"})
    assert [n.name for n in run.inventory().nodes] == ["gpu01", "gpu02", "gpu09"]
    assert [n.name for n in run.inventory(as_run=False).nodes] == ["gpu01", "gpu02", "gpu03"]
    run.update(replaced={"gpu03": "nope"})
    with pytest.raises(Exception, match="does not match its inventory"):
        run.inventory()


# ----------------------------------------------------------------------------- the trainer's checkpoint


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), ("--resume", "auto")),
        (("--epochs", "3"), ("--epochs", "3", "--resume", "auto")),
        (("--resume", "--epochs", "3"), ("--epochs", "3", "--resume", "auto")),
        (("--resume", "epochs=3"), ("epochs=3", "--resume", "auto")),
        (("--resume=",), ("--resume", "auto")),
        (("resume=True", "project=/nfs/p", "name=r1"), ("project=/nfs/p", "name=r1", "--resume", "auto")),
        (("--resume", "auto"), ("--resume", "auto")),
        (("--epochs", "3", "--resume"), ("--epochs", "3", "--resume", "auto")),
        # an explicit checkpoint: the run trains in its run directory, whose last.pt is this run's own
        (("--resume", "/old/weights/last.pt", "--epochs", "3"), ("--resume", "/old/weights/last.pt", "--epochs", "3")),
        (("--resume=/old/weights/last.pt",), ("--resume=/old/weights/last.pt",)),
        (("resume=/old/weights/last.pt",), ("resume=/old/weights/last.pt",)),
    ],
)
def test_a_retry_lets_the_trainer_find_its_own_checkpoint(args: tuple[str, ...], expected: tuple[str, ...]) -> None:
    """orch keeps no copy of where the trainer writes: a retry passes `--resume auto`, and the
    trainer (trainer/output.py resolve_auto) finds its run directory by its own rule."""
    assert resume.with_resume(args) == expected


def test_only_the_trainer_module_is_the_trainer() -> None:
    assert resume.is_trainer(inv().job)
    assert not resume.is_trainer(dataclasses.replace(inv().job, module=None, script="train.py"))
    assert not resume.is_trainer(dataclasses.replace(inv().job, module="mypkg.train"))


# ----------------------------------------------------------------------------- the retry loop, on fakes


class Say(up.Quiet):
    def __init__(self) -> None:
        self.said: list[tuple[Any, ...]] = []

    def preflight_done(self, report: CheckReport, elapsed_s: float) -> None:
        self.said.append(("preflight", report.ok))

    def retrying(self, attempt: int, attempts: int, why: str, excerpt: Any = ()) -> None:
        self.said.append(("retrying", attempt, attempts, why, list(excerpt)))

    def replacing(self, node: str, spare: str, why: str) -> None:
        self.said.append(("replacing", node, spare, why))

    def resuming(self, how: str) -> None:
        self.said.append(("resuming", how))


def fake_attempts(monkeypatch: pytest.MonkeyPatch, results: list[str]) -> list[dict[str, Any]]:
    """`_attempt` replaced: each call records the inventory it launched and ends as scripted."""
    launched: list[dict[str, Any]] = []
    it = iter(results)

    def attempt(
        say: Any, run: Any, i: inventory.Inventory, report: Any, detach: bool, t0: float, t_launch: float, n: int
    ) -> up.UpOutcome:
        launched.append({"attempt": n, "nodes": [x.name for x in i.nodes], "args": i.job.args, "run_json": run.read()})
        result = next(it)
        failure = (
            Failure("gpu02", 1, "exited with code 1", 1, rank=3, excerpt=["Traceback", "ValueError: x"])
            if result == "failed"
            else None
        )
        return up.UpOutcome(result, run.run_id, report, 1.0, failure)  # type: ignore[arg-type]

    monkeypatch.setattr(up, "_attempt", attempt)
    return launched


def reports(monkeypatch: pytest.MonkeyPatch, script: list[dict[str, str]]) -> list[list[str]]:
    """run_preflight replaced: each call fails the scripted nodes ({node: check}); records the nodes asked."""
    asked: list[list[str]] = []
    it = iter(script)

    def preflight(i: inventory.Inventory, **kw: Any) -> CheckReport:
        asked.append([n.name for n in i.nodes])
        bad = next(it)
        return CheckReport(
            [CheckResult(check, node, "fail", detail=f"{check} broke") for node, check in bad.items()]
            + [CheckResult("ssh", n.name, "ok") for n in i.nodes if n.name not in bad]
        )

    monkeypatch.setattr(up, "run_preflight", preflight)
    return asked


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_failed_run_is_checked_again_and_relaunched_with_resume(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    launched = fake_attempts(monkeypatch, ["failed", "succeeded"])
    asked = reports(monkeypatch, [{}, {}])
    say = Say()
    out = up.up(inv(), run_id="r1", progress=say)
    assert out.result == "succeeded" and (out.attempt, out.attempts) == (2, 3)
    assert [a["attempt"] for a in launched] == [1, 2] and asked == [["gpu01", "gpu02", "gpu03"]] * 2
    assert launched[0]["args"] == ("--data", "/data/coco.yaml")
    assert launched[1]["args"] == ("--data", "/data/coco.yaml", "--resume", "auto")
    assert ("resuming", "--resume auto") in say.said
    assert ("retrying", 2, 3, "gpu02 rank 3: exited with code 1", ["Traceback", "ValueError: x"]) in say.said
    assert launched[1]["run_json"]["attempt"] == 2
    assert launched[1]["run_json"]["attempts"][0]["first_failure"]["node"] == "gpu02"
    assert out.earlier[0]["result"] == "failed"


def test_the_retry_preflight_judges_the_args_it_launches_as_this_run(
    monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    """The trainer's own check (in the preflight) must see `--resume auto` and the run id: without them
    an `--out` holding attempt 1's checkpoint would be refused, and the retry would never start."""
    fake_attempts(monkeypatch, ["failed", "succeeded"])
    seen: list[tuple[tuple[str, ...], Any]] = []

    def preflight(i: inventory.Inventory, **kw: Any) -> CheckReport:
        seen.append((i.job.args, kw.get("run_id")))
        return CheckReport([CheckResult("ssh", n.name, "ok") for n in i.nodes])

    monkeypatch.setattr(up, "run_preflight", preflight)
    assert up.up(inv(), run_id="r1", progress=Say()).result == "succeeded"
    assert seen == [(("--data", "/data/coco.yaml"), "r1"), (("--data", "/data/coco.yaml", "--resume", "auto"), "r1")]


def test_every_retry_passes_resume_auto_once(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """The first attempt runs the args as written; each retry adds `--resume auto` once (whether a
    checkpoint exists is the trainer's question: it starts over in the same directory without one)."""
    launched = fake_attempts(monkeypatch, ["failed", "failed", "failed"])
    reports(monkeypatch, [{}, {}, {}])
    out = up.up(inv(), run_id="r1", progress=Say())
    assert out.result == "failed" and (out.attempt, out.attempts) == (3, 3) and len(out.earlier) == 2
    assert [a["args"] for a in launched] == [
        ("--data", "/data/coco.yaml"),
        *[("--data", "/data/coco.yaml", "--resume", "auto")] * 2,
    ]


def test_a_node_failing_the_retry_preflight_is_replaced_by_the_next_healthy_spare(
    monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    launched = fake_attempts(monkeypatch, ["failed", "succeeded"])
    # attempt 1's preflight passes; the retry's fails gpu02; the spare gpu08 fails too; gpu09 passes
    asked = reports(monkeypatch, [{}, {"gpu02": "ssh"}, {"gpu08": "software"}, {}])
    say = Say()
    out = up.up(inv(), run_id="r1", progress=say)
    assert out.result == "succeeded"
    assert asked[1:] == [["gpu01", "gpu02", "gpu03"], ["gpu01", "gpu08", "gpu03"], ["gpu01", "gpu09", "gpu03"]]
    assert launched[1]["nodes"] == ["gpu01", "gpu09", "gpu03"]
    assert ("replacing", "gpu02", "gpu08", "ssh: ssh broke") in say.said
    assert ("replacing", "gpu08", "gpu09", "software: software broke") in say.said
    assert RunStore().get("r1").read()["replaced"] == {"gpu02": "gpu08", "gpu08": "gpu09"}
    assert [n.name for n in RunStore().get("r1").inventory().nodes] == ["gpu01", "gpu09", "gpu03"]


def test_a_node_stopped_as_a_straggler_is_replaced_by_a_spare_on_the_retry(
    monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    """`job.straggler.action: stop` fails the run on the slow node; the retry puts a spare in its
    place before its preflight, even though the slow node itself passes every check."""
    launched: list[list[str]] = []
    results = iter(["failed", "succeeded"])

    def attempt(say: Any, run: Any, i: inventory.Inventory, *a: Any) -> up.UpOutcome:
        launched.append([x.name for x in i.nodes])
        failure = Failure(
            "gpu03",
            2,
            "straggler: rank 2 on gpu03 at 0.45× the median for 3 min; data-wait 4 %, "
            "CPU 100 %: compute-bound on gpu03",
            rank=2,
            local_rank=0,
        )
        result = next(results)
        return up.UpOutcome(result, run.run_id, None, 1.0, failure if result == "failed" else None)  # type: ignore[arg-type]

    monkeypatch.setattr(up, "_attempt", attempt)
    asked = reports(monkeypatch, [{}, {}])
    say = Say()
    out = up.up(inv(), run_id="r1", progress=say)
    assert out.result == "succeeded"
    assert launched == [["gpu01", "gpu02", "gpu03"], ["gpu01", "gpu02", "gpu08"]]
    assert asked[1] == ["gpu01", "gpu02", "gpu08"]
    assert (
        "replacing",
        "gpu03",
        "gpu08",
        "straggler: rank 2 on gpu03 at 0.45× the median for 3 min; data-wait 4 %, CPU 100 %: compute-bound on gpu03",
    ) in say.said
    assert up.straggler_of(Failure("gpu02", 1, "exited with code 1")) == {}


def test_a_retry_runs_the_same_preflight_as_the_first_attempt_fabric_included(
    monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    fake_attempts(monkeypatch, ["failed", "succeeded"])
    asked: list[bool] = []

    def preflight(i: inventory.Inventory, **kw: Any) -> CheckReport:
        asked.append(kw.get("fabric", False))
        return CheckReport([CheckResult("ssh", n.name, "ok") for n in i.nodes])

    monkeypatch.setattr(up, "run_preflight", preflight)
    assert up.up(inv(), run_id="r1", progress=Say(), fabric=True).result == "succeeded"
    assert asked == [True, True]


def test_a_retry_syncs_again_and_a_spare_is_synced_before_its_preflight(
    monkeypatch: pytest.MonkeyPatch, home: Path, tmp_path: Path
) -> None:
    from orchestrator.remote import sync as remote_sync

    code = tmp_path / "code"
    code.mkdir()
    launched = fake_attempts(monkeypatch, ["failed", "succeeded"])
    events: list[tuple[str, list[str]]] = []
    checks = reports(monkeypatch, [{}, {}])
    real_preflight = up.run_preflight

    def preflight(i: inventory.Inventory, **kw: Any) -> CheckReport:
        events.append(("preflight", [n.name for n in i.nodes]))
        return real_preflight(i, **kw)

    # the first sync reaches every node; the retry's cannot write on gpu02, then reaches its spare
    failing = iter([set(), {"gpu02"}, set()])

    def sync_nodes(i: inventory.Inventory, nodes: Any, *a: Any, **kw: Any) -> remote_sync.SyncReport:
        names = [n.name for n in nodes]
        events.append(("sync", names))
        bad = next(failing)
        return remote_sync.SyncReport(
            i.job.sync,
            remote_sync.SyncOptions(),
            tuple(
                remote_sync.NodeSync(n, None, error="rsync: Permission denied")
                if n in bad
                else remote_sync.NodeSync(n, remote_sync.Transfer(0, 0, 0, ()))
                for n in names
            ),
        )

    monkeypatch.setattr(up, "run_preflight", preflight)
    monkeypatch.setattr(up, "sync_nodes", sync_nodes)
    say = Say()
    out = up.up(inv(sync=(str(code),)), run_id="r1", progress=say)
    assert out.result == "succeeded" and len(launched) == 2
    assert events == [
        ("sync", ["gpu01", "gpu02", "gpu03"]),
        ("preflight", ["gpu01", "gpu02", "gpu03"]),
        ("sync", ["gpu01", "gpu02", "gpu03"]),
        ("sync", ["gpu01", "gpu08", "gpu03"]),
        ("preflight", ["gpu01", "gpu08", "gpu03"]),
    ]
    assert len(checks) == 2
    assert ("replacing", "gpu02", "gpu08", "sync: rsync: Permission denied") in say.said
    assert launched[1]["nodes"] == ["gpu01", "gpu08", "gpu03"]
    assert RunStore().get("r1").read()["replaced"] == {"gpu02": "gpu08"}
    assert out.sync is not None and [n.node for n in out.sync.nodes] == ["gpu01", "gpu08", "gpu03"]


def test_a_retry_whose_sync_cannot_run_here_is_not_launched(
    monkeypatch: pytest.MonkeyPatch, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.errors import OrchError
    from orchestrator.remote import sync as remote_sync

    code = tmp_path / "code"
    code.mkdir()
    launched = fake_attempts(monkeypatch, ["failed"])
    reports(monkeypatch, [{}])
    calls = iter([None, OrchError("rsync is not installed on this machine", "apt install rsync")])

    def sync_nodes(i: inventory.Inventory, nodes: Any, *a: Any, **kw: Any) -> remote_sync.SyncReport:
        exc = next(calls)
        if exc is not None:
            raise exc
        return remote_sync.SyncReport(
            i.job.sync,
            remote_sync.SyncOptions(),
            tuple(remote_sync.NodeSync(n.name, remote_sync.Transfer(0, 0, 0, ())) for n in nodes),
        )

    monkeypatch.setattr(up, "sync_nodes", sync_nodes)
    out = up.up(inv(sync=(str(code),)), run_id="r1", progress=Say())
    assert out.result == "retry_preflight_failed" and len(launched) == 1
    assert out.sync_error is not None and out.failure is not None and out.failure.node == "gpu02"
    assert RunStore().get("r1").read()["state"] == "failed"
    from orchestrator.cli import render

    render.up_outcome(out)
    err = capsys.readouterr().err
    assert "attempt 2 of 3 was not launched: the sync failed on gpu01: sync: rsync is not installed" in err
    assert "hint: apt install rsync" in err


def test_without_a_spare_the_node_is_named_and_nothing_is_relaunched(
    monkeypatch: pytest.MonkeyPatch, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    launched = fake_attempts(monkeypatch, ["failed"])
    reports(monkeypatch, [{}, {"gpu03": "job"}])
    text = SPARES.split("spare:")[0] + "job:" + SPARES.split("job:")[1]
    out = up.up(inv(text), run_id="r1", progress=Say())
    assert out.result == "retry_preflight_failed" and len(launched) == 1
    assert out.retry_failed == {"gpu03": "job: job broke"} and out.no_retry == "no spare left"
    assert out.failure is not None and out.failure.node == "gpu02"
    data = RunStore().get("r1").read()
    assert data["state"] == "failed" and data["first_failure"]["node"] == "gpu02"
    assert data["retry_failed"] == {"gpu03": "job: job broke"}
    from orchestrator.cli import render

    render.up_outcome(out)
    err = capsys.readouterr().err
    assert "attempt 2 of 3 was not launched: the preflight failed on gpu03: job: job broke (no spare left)" in err
    assert "the failure it was to retry: gpu02" in err


def test_nothing_is_retried_after_ctrl_c_a_preflight_failure_or_an_unconfirmed_stop(
    monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    launched = fake_attempts(monkeypatch, ["interrupted"])
    reports(monkeypatch, [{}])
    assert up.up(inv(), run_id="r1", progress=Say()).result == "interrupted" and len(launched) == 1
    reports(monkeypatch, [{"gpu01": "ssh"}])
    assert up.up(inv(), run_id="r2", progress=Say()).result == "preflight_failed"

    def unconfirmed(*a: Any) -> up.UpOutcome:
        return up.UpOutcome("failed", "r3", None, 1.0, Failure("gpu02", 1, "x"), not_stopped={"gpu02": "unreachable"})

    monkeypatch.setattr(up, "_attempt", unconfirmed)
    reports(monkeypatch, [{}])
    out = up.up(inv(), run_id="r3", progress=Say())
    assert out.result == "failed" and out.attempt == 1 and out.no_retry and "gpu02" in out.no_retry


@pytest.mark.parametrize("confirmed", [True, False], ids=["confirmed", "still-unconfirmed"])
def test_a_stop_the_ending_allocation_hid_is_asked_again_in_its_renewal_before_a_relaunch(
    monkeypatch: pytest.MonkeyPatch, home: Path, confirmed: bool
) -> None:
    """A Slurm allocation requeued under the teardown: Slurm starts no step in a completing job, so a
    node's stop (its containers' sweep) could not be confirmed then. Once the allocation runs again
    the node is stopped and swept again in it, and only a confirmed stop lets the retry launch."""
    events: list[str] = []

    class Requeued(Hold):
        def ended(self) -> str | None:
            return "Slurm job 7 was requeued"

        def renew(self, say: Any = None) -> inventory.Inventory:
            events.append("renewed")
            return self.inventory

    def stop_all(cluster: Any, records: Any, grace: float) -> GroupResult[Any]:
        events.append(f"stop {[r.node for r in records]}")
        return GroupResult({"gpu02": StopResult(None) if confirmed else TransportError("gpu02", "gone", "ended")})

    class Nodes:
        def __init__(self, run: Any, warn: Any = None) -> None:
            pass

        def nodes(self) -> list[Any]:
            return [SimpleNamespace(node="gpu02")]

    launched = fake_attempts(monkeypatch, ["succeeded"])
    first = up._attempt

    def attempt(*a: Any) -> up.UpOutcome:
        if a[-1] == 1:
            failure = Failure("gpu01", 1, "x")
            return up.UpOutcome("failed", "r1", None, 1.0, failure, not_stopped={"gpu02": "the allocation has ended"})
        events.append("launched")
        return first(*a)

    monkeypatch.setattr(up, "_attempt", attempt)
    monkeypatch.setattr(up, "transport_of", lambda i: SimpleNamespace(hold=lambda i, say: Requeued(i)))
    monkeypatch.setattr(up, "stop_all", stop_all)
    monkeypatch.setattr(up, "RunRecord", Nodes)
    monkeypatch.setattr(up, "Cluster", lambda i: contextlib.nullcontext())
    reports(monkeypatch, [{}, {}])
    out = up.up(inv(), run_id="r1", progress=Say())
    if confirmed:
        assert events == ["renewed", "stop ['gpu02']", "launched"] and out.result == "succeeded", (events, out)
        assert [a["attempt"] for a in launched] == [2]
    else:
        assert events == ["renewed", "stop ['gpu02']"] and out.result == "failed" and out.attempt == 1, (events, out)
        assert out.no_retry == (
            "not relaunched: the stop of gpu02 is unconfirmed, and a second copy of the job must not start beside "
            "the first"
        )


def test_a_detached_run_is_never_retried_and_the_flags_say_so(
    monkeypatch: pytest.MonkeyPatch, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    launched = fake_attempts(monkeypatch, ["detached"])
    reports(monkeypatch, [{}])
    out = up.up(inv(), run_id="r1", detach=True, progress=Say())
    assert out.result == "detached" and out.attempts == 1 and len(launched) == 1
    for flags in (["--retries", "2"], ["--stall-timeout", "60"]):
        with pytest.raises(SystemExit) as exc:
            main(["up", "--detach", *flags, str(Path(__file__).parents[2] / "inventory" / "v100.yaml")])
        assert exc.value.code == 2
        assert "need an attached orch up" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["up", "--retries", "-1", "x.yaml"])
    assert exc.value.code == 2
    # job.retries in the inventory is not applied to a detached run: said, not silently dropped
    monkeypatch.setattr(up, "up", lambda i, **kw: up.UpOutcome("detached", "r9"))
    path = home.parent / "c.yaml"
    for retries, said in ((2, True), (0, False)):
        path.write_text(SPARES.replace("retries: 2", f"retries: {retries}"))
        with pytest.raises(SystemExit) as exc:
            main(["up", "--detach", str(path)])
        assert exc.value.code == 0
        err = capsys.readouterr().err
        assert ("job.retries (2) and the hang watchdog apply to an attached orch up only" in err) is said, err


def test_the_command_line_overrides_the_inventory(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    seen: list[inventory.Inventory] = []

    def attempt(say: Any, run: Any, i: inventory.Inventory, *a: Any) -> up.UpOutcome:
        seen.append(i)
        return up.UpOutcome("succeeded", run.run_id)

    monkeypatch.setattr(up, "_attempt", attempt)
    reports(monkeypatch, [{}])
    out = up.up(inv(), run_id="r1", progress=Say(), retries=0, stall_timeout_s=0)
    assert out.attempts == 1 and (seen[0].job.retries, seen[0].job.stall_timeout_s) == (0, 0)
    data = RunStore().get("r1").read()
    assert (data["max_attempts"], data["stall_timeout_s"], data["on_stall"]) == (1, 0, "stop")


def test_status_shows_the_attempt() -> None:
    data = {
        "run": "r1",
        "state": "running",
        "attempt": 2,
        "max_attempts": 3,
        "replaced": {"gpu02": "gpu08"},
        "nodes": [],
    }
    out = control.status_report(data, {}).to_json()
    assert (out["attempt"], out["max_attempts"], out["replaced"]) == (2, 3, {"gpu02": "gpu08"})
    plain = control.status_report({"run": "r0", "state": "running", "nodes": []}, {}).to_json()
    assert (plain["attempt"], plain["max_attempts"]) == (1, 1) and "replaced" not in plain


def test_orch_down_during_an_attempt_is_final_no_retry(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """`orch down` from another shell (run.json `down_requested`) while attempt 1 runs: its nodes
    read as stopped from outside, and that is not retried: the run ends `stopped` (exit 130)."""
    launched: list[int] = []

    def attempt(
        say: Any, run: Any, i: Any, report: Any, detach: bool, t0: float, t_launch: float, n: int
    ) -> up.UpOutcome:
        launched.append(n)
        run.update(down_requested=1.0)  # what control.down records before it stops the nodes
        return up.UpOutcome("failed", run.run_id, report, 1.0, Failure("gpu02", 1, "was stopped from outside"))

    monkeypatch.setattr(up, "_attempt", attempt)
    reports(monkeypatch, [{}, {}])
    out = up.up(inv(), run_id="r1", progress=Say())
    assert out.result == "stopped" and launched == [1]
    assert RunStore().get("r1").read()["state"] == "stopped"
    from orchestrator.cli.commands import UP_EXIT

    assert UP_EXIT["stopped"] == 130


def test_orch_down_while_a_retry_is_prepared_relaunches_nothing(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    launched = fake_attempts(monkeypatch, ["failed", "succeeded"])
    calls = iter([{}, {}])

    def preflight(i: inventory.Inventory, **kw: Any) -> CheckReport:
        bad = next(calls)
        if len(launched) == 1:  # the retry's preflight: someone runs `orch down` meanwhile
            RunStore().get("r1").update(down_requested=2.0)
        return CheckReport([CheckResult("ssh", n.name, "ok") for n in i.nodes if n.name not in bad])

    monkeypatch.setattr(up, "run_preflight", preflight)
    out = up.up(inv(), run_id="r1", progress=Say())
    assert out.result == "stopped" and [a["attempt"] for a in launched] == [1]
    assert RunStore().get("r1").read()["state"] == "stopped"


def test_check_json_is_written_once_per_preflight_not_once_per_attempt(
    monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    """Each preflight's report is saved into the run once, when it is made; a retry without one
    (--skip-checks) leaves check.json as it was."""
    saved: list[Any] = []
    monkeypatch.setattr(up, "save_to_run", lambda run, i, report: saved.append(report))
    fake_attempts(monkeypatch, ["failed", "succeeded"])
    reports(monkeypatch, [{}, {}])
    assert up.up(inv(), run_id="r1", progress=Say()).result == "succeeded"
    assert len(saved) == 2 and saved[0] is not saved[1] and all(r is not None for r in saved)
    saved.clear()
    fake_attempts(monkeypatch, ["failed", "failed", "succeeded"])
    assert up.up(inv(), run_id="r2", progress=Say(), skip_checks=True).result == "succeeded"
    assert saved == [None]  # the last `orch check` copied in once
