"""bench/steps.py, the step runner of bench/gpu_smoke.py: dependencies, budgets, the whole run's
deadline, what each way of ending a step records, teardown after every step, the table and the
files written. Steps here are plain functions on an injected clock: no process is started."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from bench.steps import (
    LOG_TAIL,
    Goal,
    Ran,
    Session,
    Step,
    StepContext,
    StepFailed,
    StepResult,
    StepSkipped,
    StepTimeout,
    counts,
    output_names,
    run_steps,
    table,
    write_outputs,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Procs:
    """Stands in for bench.steps.Procs: counts the teardowns run_steps asks for."""

    def __init__(self) -> None:
        self.stops = 0
        self.live: list[Any] = []

    def stop_all(self) -> None:
        self.stops += 1


def session(tmp_path: Path, clock: Clock, dry: bool = True) -> Session:
    return Session(dry=dry, settings=None, work=tmp_path, env={}, procs=Procs(), clock=clock)  # type: ignore[arg-type]


def test_each_ending_of_a_step_is_recorded_and_the_rest_still_run(tmp_path: Path) -> None:
    clock = Clock()
    seen: list[str] = []

    def passes(ctx: StepContext) -> None:
        clock.now += 5
        ctx.figures["summary"] = "fine"
        ctx.goal("a ratio", 1.2, ">= 1.0", True)
        ctx.skip_part("fp16", "CUDA only")
        seen.append("passes")

    def fails(ctx: StepContext) -> None:
        ctx.figures["partial"] = 7  # what a step found before it failed is kept
        raise StepFailed("orch up exited 1\nmore lines")

    def times_out(ctx: StepContext) -> None:
        clock.now += 30
        raise StepTimeout("gpu-syncs still running at the step's budget (30 s): stopped")

    def skips(ctx: StepContext) -> None:
        raise StepSkipped("tests/gpu does not exist in this tree")

    def crashes(ctx: StepContext) -> None:
        raise KeyError("sweep")

    def needs_the_failed_one(ctx: StepContext) -> None:
        seen.append("must not run")

    def last(ctx: StepContext) -> None:
        seen.append("last")

    steps = [
        Step("a", "passes", 10, 60, passes),
        Step("b", "fails", 10, 60, fails),
        Step("c", "times out", 10, 30, times_out),
        Step("d", "skips", 10, 60, skips),
        Step("e", "crashes", 10, 60, crashes),
        Step("f", "needs b", 10, 60, needs_the_failed_one, ("a", "b")),
        Step("g", "still runs", 10, 60, last, ("a",)),
    ]
    s = session(tmp_path, clock)
    saved: list[int] = []
    results = run_steps(steps, s, total_s=600, on_result=lambda rs: saved.append(len(rs)))
    by = {r.name: r for r in results}
    assert [r.status for r in results] == ["pass", "fail", "timeout", "skip", "fail", "skip", "pass"]
    assert by["a"].seconds == 5 and by["a"].budget_s == 60 and by["a"].skipped == {"fp16": "CUDA only"}
    assert by["a"].goals[0].met is True and by["a"].summary() == "fine"
    assert by["b"].error == "orch up exited 1\nmore lines" and by["b"].summary() == "orch up exited 1"
    assert by["b"].figures == {"partial": 7}
    assert by["c"].error.startswith("gpu-syncs still running") and by["c"].seconds == 30
    assert by["d"].reason == "tests/gpu does not exist in this tree"
    assert by["e"].error == "KeyError: 'sweep'"
    assert by["f"].reason == "needs b, which did not pass"
    assert seen == ["passes", "last"]
    assert s.procs.stops == 6  # whatever a step started is stopped after every step that ran
    assert saved == [1, 2, 3, 4, 5, 6, 7]  # the files are rewritten after each step
    assert counts(results) == {"pass": 2, "fail": 2, "timeout": 1, "skip": 2}


def test_the_whole_budget_cuts_a_step_and_skips_the_steps_after_it(tmp_path: Path) -> None:
    clock = Clock()
    deadlines: dict[str, tuple[float, str]] = {}

    def slow(ctx: StepContext) -> None:
        deadlines[ctx.result.name] = (ctx.deadline - clock(), ctx.limit)
        clock.now += 100

    steps = [Step("a", "a", 80, 80, slow), Step("b", "b", 80, 80, slow), Step("c", "c", 80, 80, slow)]
    results = run_steps(steps, session(tmp_path, clock, dry=False), total_s=150)
    assert deadlines["a"] == (80, "the step's budget (80 s)")
    assert deadlines["b"] == (50, "the end of the whole run's budget (150 s)")
    assert results[2].status == "skip" and results[2].reason == "the whole budget (150 s) was spent before this step"


def test_a_budget_override_and_the_dry_run_budget(tmp_path: Path) -> None:
    clock = Clock()
    got: list[float] = []
    steps = [
        Step("a", "a", 10, 99, lambda ctx: got.append(ctx.deadline - clock())),
        Step("b", "b", 10, 99, lambda ctx: got.append(ctx.deadline - clock())),
    ]
    run_steps(steps, session(tmp_path, clock, dry=True), total_s=1000, budgets={"b": 3})
    assert got == [99, 3]


def test_ctrl_c_stops_the_step_and_skips_the_rest(tmp_path: Path) -> None:
    def interrupted(ctx: StepContext) -> None:
        raise KeyboardInterrupt

    steps = [Step("a", "a", 10, 10, interrupted), Step("b", "b", 10, 10, lambda ctx: None)]
    s = session(tmp_path, Clock())
    results = run_steps(steps, s, total_s=100)
    assert (results[0].status, results[0].error) == ("fail", "interrupted")
    assert (results[1].status, results[1].reason) == ("skip", "interrupted before this step")
    assert s.procs.stops == 1


def test_need_and_ok_fail_the_step_with_the_message(tmp_path: Path) -> None:
    ctx = StepContext(session(tmp_path, Clock()), StepResult("x", "x", budget_s=5), deadline=0)
    assert ctx.need({"a": 1}, "nothing") == {"a": 1}
    with pytest.raises(StepFailed, match="no final val line"):
        ctx.need(None, "no final val line")
    log = tmp_path / "01-x.log"
    log.write_text("$ cmd\n" + "".join(f"line {i}\n" for i in range(40)))
    with pytest.raises(StepFailed) as e:
        ctx.ok(Ran(["cmd"], 3, 1.0, log), "python -m trainer")
    assert str(e.value).startswith("python -m trainer exited 3 (log 01-x.log):") and "line 39" in str(e.value)
    assert ctx.ok(Ran(["cmd"], 3, 1.0, log), "trainer", codes=(3,)).code == 3


def doc_of(results: list[StepResult]) -> dict[str, Any]:
    return {
        "benchmark": "gpu_smoke",
        "mode": "cpu-dry-run",
        "counts": counts(results),
        "wall_s": 12.3,
        "budget_s": 420.0,
    }


def test_the_table_has_a_row_per_step_then_the_goals() -> None:
    ok = StepResult(
        "trainer",
        "t",
        "pass",
        61.2,
        180,
        figures={"summary": "40.1 vs 38.0 images/s " + "x" * 200},
        skipped={"fp16": "CUDA only"},
    )
    ok.goals.append(Goal("training images/s ratio", 1.0553, ">= 1.0", True))
    bad = StepResult("fabric", "f", "timeout", 60.0, 60, error="orch-check-fabric still running at the step's budget")
    skip = StepResult("sync_bn", "s", "skip", 0.0, 0, reason="SyncBatchNorm needs >= 2 GPUs")
    text = table([ok, bad, skip], doc_of([ok, bad, skip]), width=100)
    lines = text.splitlines()
    assert lines[0] == "gpu_smoke (cpu-dry-run): 3 steps, 1 pass, 0 fail, 1 timeout, 1 skip; 12 s of 420 s"
    row = next(ln for ln in lines if ln.startswith("trainer "))
    assert " pass " in row and "61.2s" in row and "180s" in row
    assert row.endswith("[skipped here: fp16]")  # the skipped parts survive the cut of a long result
    assert len(row) <= 40 + 100
    assert any(ln.startswith("fabric ") and " timeout " in ln and "still running" in ln for ln in lines)
    assert any(ln.startswith("sync_bn ") and "needs >= 2 GPUs" in ln for ln in lines)
    goal = next(ln for ln in lines if ln.startswith("training images/s ratio"))
    assert goal.split()[-4:] == ["1.06", ">=", "1.0", "yes"]


def test_write_outputs_writes_json_table_and_each_logs_tail(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "trainer").mkdir(parents=True)
    (logs / "trainer" / "01-trainer-fp16.log").write_bytes(b"X" * 10 + b"b" * LOG_TAIL)
    (logs / "environment").mkdir()
    (logs / "environment" / "02-orch-check.json").write_text('{"ok": true}')
    (logs / "environment" / "02-orch-check.log").write_text("$ orch check\n")
    out = tmp_path / "out"
    write_outputs(out, "gpu_smoke", {"ok": True, "steps": []}, "the table", logs)
    js, txt, tgz = output_names("gpu_smoke")
    assert sorted(p.name for p in out.iterdir()) == sorted([js, txt, tgz])  # nothing else (8 files come back)
    assert json.loads((out / js).read_text()) == {"ok": True, "steps": []}
    assert (out / txt).read_text() == "the table\n"
    with tarfile.open(out / tgz) as tar:
        names = tar.getnames()
        assert sorted(names) == [
            "logs/environment/02-orch-check.json",
            "logs/environment/02-orch-check.log",
            "logs/trainer/01-trainer-fp16.log",
        ]
        data = tar.extractfile("logs/trainer/01-trainer-fp16.log").read()  # type: ignore[union-attr]
    assert data.startswith(b"[... cut") and data.endswith(b"b" * LOG_TAIL) and b"X" not in data


def test_what_a_command_left_running_in_a_session_of_its_own_is_stopped_and_named(tmp_path: Path) -> None:
    """A node agent's child runs in a session of its own, out of reach of the process group the
    script stops (orch up's preflight probe, when orch up is stopped during its preflight): the
    script finds it by its scratch directory in the environment, stops it, and says so."""
    import os
    import subprocess

    from bench.steps import stop_strays, strays

    marker = str(tmp_path / "work")
    child = subprocess.Popen(
        ["sleep", "300"], env={**os.environ, "ORCH_HOME": f"{marker}/home"}, start_new_session=True
    )
    try:
        assert strays(marker) == [child.pid]
        assert stop_strays(marker, grace_s=10) == ["sleep 300"]
        assert child.wait(timeout=30) == -15  # SIGTERM was enough
        assert strays(marker) == [] and stop_strays(marker) == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
