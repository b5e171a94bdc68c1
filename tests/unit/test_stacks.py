"""`orch stacks` and the hang watchdog, pure parts: py-spy dumps recorded from real runs
(tests/fixtures/pyspy/) parsed, grouped, folded and summarised; the watchdog's clock; a hang as
a first failure; the supervisor's watch hook."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.contract import NodeState, RunState
from orchestrator.run.agents import NodeStatus, StopResult
from orchestrator.run.stacks import (
    Frame,
    RankStack,
    StacksReport,
    dump_problem,
    fold,
    group_stacks,
    grouped_text,
    node_stacks,
    odd_ranks,
    parse_dump,
    summary,
)
from orchestrator.run.supervise import Failure, NodeSpec, Supervisor
from orchestrator.run.watchdog import Watchdog, hang_failure

PYSPY = Path(__file__).resolve().parents[1] / "fixtures" / "pyspy"
ALLREDUCE = (PYSPY / "dump_gloo_allreduce_rank0.txt").read_text()
SLEEP = (PYSPY / "dump_gloo_sleep_rank2.txt").read_text()
TORCHRUN = (PYSPY / "dump_torchrun_agent.txt").read_text()
DENIED = (PYSPY / "dump_permission_denied.txt").read_text()
SPECS = [NodeSpec("n1", 0, 0, 1), NodeSpec("n2", 1, 1, 1), NodeSpec("n3", 2, 2, 1), NodeSpec("n4", 3, 3, 1)]


def rank(r: int, text: str, node: str | None = None) -> RankStack:
    return RankStack(node or f"n{r + 1}", r, r, 0, 1000 + r, parse_dump(text), None, text)


# ----------------------------------------------------------------------------- parsing


def test_a_rank_blocked_in_all_reduce() -> None:
    (main,) = parse_dump(ALLREDUCE)
    assert (main.ident, main.status, main.name) == ("18741", "idle", "MainThread")
    assert [f.function for f in main.frames] == [
        "all_reduce",
        "_exception_logger.<locals>.wrapper",
        "main",
        "record.<locals>.wrap.<locals>.wrapper",
        "<module>",
    ]
    inner = main.frames[0]
    assert inner.file.endswith("/site-packages/torch/distributed/distributed_c10d.py") and inner.line == 3913
    assert inner.library and inner.short_file == "torch/distributed/distributed_c10d.py"
    own = main.frames[2]
    assert not own.library and own.short_file == "ddp_job.py" and own.line == 72
    assert summary(main.frames) == ("all_reduce (torch/distributed/distributed_c10d.py:3913) in main (ddp_job.py:72)")


def test_a_sleeping_rank_is_summarised_by_its_own_function() -> None:
    (main,) = parse_dump(SLEEP)
    assert summary(main.frames) == "sleep_forever (ddp_job.py:50)"


def test_every_thread_of_torchrun_with_frozen_and_stdlib_frames() -> None:
    threads = parse_dump(TORCHRUN)
    assert threads[0].name == "MainThread" and len(threads) == 9
    assert [t.name for t in threads[1:5]] == [f"TailLog_default_{i}" for i in range(4)]
    last = threads[0].frames[-1]
    assert (last.function, last.file, last.line) == ("_run_module_as_main", "<frozen runpy>", 198)
    assert last.library
    assert threads[1].frames[-1].short_file == "threading.py" and threads[1].frames[-1].library
    assert all(len(t.frames) > 0 for t in threads)


def test_output_that_is_not_a_dump_has_no_threads() -> None:
    assert parse_dump(DENIED) == ()
    assert parse_dump("") == ()


def test_locals_and_foreign_lines_are_skipped() -> None:
    text = (
        'Thread 0x7F00 (active+gil): "MainThread"\n    f (/app/x.py:3)\n        Arguments:\n'
        "            n: 1\n    g (/app/x.py:9)\nThread 12 (idle)\n    h (/app/y.py:1)\n"
    )
    main, other = parse_dump(text)
    assert [f.function for f in main.frames] == ["f", "g"] and main.status == "active+gil"
    assert other.name == "" and [f.function for f in other.frames] == ["h"]


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 31], "0-6,8-10,31"),
        ([7], "7"),
        ([3, 1, 2], "1-3"),
        ([0, 2, 4], "0,2,4"),
        ([], ""),
    ],
)
def test_fold(ranks: list[int], text: str) -> None:
    assert fold(ranks) == text


# ----------------------------------------------------------------------------- grouping


def test_the_odd_rank_stands_apart() -> None:
    ranks = [rank(0, ALLREDUCE), rank(1, ALLREDUCE), rank(2, SLEEP), rank(3, ALLREDUCE)]
    groups = group_stacks(ranks)
    assert [(g.label, g.nodes) for g in groups] == [("ranks 0-1,3", ("n1", "n2", "n4")), ("rank 2", ("n3",))]
    assert odd_ranks(groups) == (2,)
    report = StacksReport("r1", 0.0, ranks)
    assert report.complete
    lines = grouped_text(report)
    assert lines == [
        "ranks 0-1,3  all_reduce (torch/distributed/distributed_c10d.py:3913) in main (ddp_job.py:72)",
        "rank 2       sleep_forever (ddp_job.py:50)",
    ]
    data = report.to_json()
    assert data["odd_ranks"] == [2] and [g["ranks_text"] for g in data["groups"]] == ["0-1,3", "2"]
    assert data["ranks"][2]["threads"][0]["frames"][0] == {
        "function": "sleep_forever",
        "file": "/home/dev/orch/tests/ddp_job.py",
        "line": 50,
    }
    detail = grouped_text(report, detail=True)
    assert "== rank 2 on n3 (pid 1002)" in detail and "    sleep_forever (ddp_job.py:50)" in detail


def test_of_two_ranks_in_two_places_the_odd_one_is_not_in_the_collective() -> None:
    groups = group_stacks([rank(0, ALLREDUCE), rank(1, SLEEP)])
    assert [g.ranks for g in groups] == [(0,), (1,)] and odd_ranks(groups) == (1,)
    groups = group_stacks([rank(0, SLEEP), rank(1, ALLREDUCE)])
    assert odd_ranks(groups) == (0,)


def test_the_odd_group_is_never_the_majority() -> None:
    # seven ranks stuck outside any collective, one already waiting in all_reduce: that one differs
    groups = group_stacks([rank(r, SLEEP) for r in range(7)] + [rank(7, ALLREDUCE)])
    assert odd_ranks(groups) == (7,)
    # among smaller groups, the one not waiting in torch.distributed, then the smallest
    loader = (
        'Thread 9 (idle): "MainThread"\n    __next__ (/v/lib/python3.11/site-packages/torch/utils/data/'
        "dataloader.py:733)\n    train_epoch (/app/loop.py:322)\n"
    )
    barrier = (
        'Thread 9 (idle): "MainThread"\n    barrier (/v/lib/python3.11/site-packages/torch/distributed/'
        "distributed_c10d.py:4800)\n    main (/app/loop.py:400)\n"
    )
    groups = group_stacks([rank(r, ALLREDUCE) for r in range(4)] + [rank(4, barrier), rank(5, loader), rank(6, loader)])
    assert [g.ranks for g in groups] == [(0, 1, 2, 3), (5, 6), (4,)] and odd_ranks(groups) == (5, 6)
    assert grouped_text(StacksReport("r", 0.0, [])) == []


def test_one_place_for_everyone_has_no_odd_rank() -> None:
    groups = group_stacks([rank(r, ALLREDUCE) for r in range(4)])
    assert len(groups) == 1 and groups[0].label == "ranks 0-3" and odd_ranks(groups) == ()


def test_ranks_without_a_stack_are_left_out_of_the_groups_and_named() -> None:
    broken = RankStack("n2", 1, 1, 0, 1001, (), "py-spy did not answer within 20 s")
    report = StacksReport("r1", 0.0, [rank(0, ALLREDUCE), broken], {"n3": "ssh: unreachable"})
    assert [g.ranks for g in report.groups] == [(0,)] and not report.complete
    assert grouped_text(report)[1:] == ["n3: ssh: unreachable", "rank 1 on n2: py-spy did not answer within 20 s"]
    assert not StacksReport("r1", 0.0, []).complete


def test_summary_without_own_code_or_frames() -> None:
    lib = Frame("wait", "/usr/lib/python3.11/threading.py", 320)
    assert summary([lib]) == "wait (threading.py:320)"
    assert summary([]) == "(no Python frames)"


# ----------------------------------------------------------------------------- what a node answered


def answer(**kw: Any) -> dict[str, Any]:
    base = {
        "state": "running",
        "py_spy": "/venv/bin/py-spy",
        "python": "/venv/bin/python",
        "euid": 1000,
        "ptrace_scope": None,
        "ranks": [],
    }
    return {**base, **kw}


def test_a_node_without_py_spy_says_how_to_install_it() -> None:
    got, problem = node_stacks("n2", 1, answer(py_spy=None, ranks=[{"pid": 5, "rank": 1, "local_rank": 0}]))
    assert got == [] and problem == (
        "py-spy is not installed next to /venv/bin/python nor on PATH: "
        "`/venv/bin/python -m pip install py-spy` on this node (1 ranks not dumped)"
    )


def test_a_node_whose_job_is_over_has_no_rank() -> None:
    assert node_stacks("n2", 1, answer(state="failed")) == (
        [],
        "no rank process is running here (the node's job is failed)",
    )
    assert node_stacks("n2", 1, {"error": "nothing was started here", "ranks": []}) == ([], "nothing was started here")


def test_a_refused_ptrace_names_yama_and_the_fix() -> None:
    rank1 = {"pid": 5, "rank": 1, "local_rank": 0, "code": 1, "dump": "", "error": DENIED.strip()}
    (got,), problem = node_stacks("n2", 1, answer(ptrace_scope=1, ranks=[rank1]))
    assert problem is None and got.threads == ()
    assert got.error is not None
    assert "/proc/sys/kernel/yama/ptrace_scope is 1" in got.error and "kernel.yama.ptrace_scope=0" in got.error
    assert "setcap cap_sys_ptrace+ep /venv/bin/py-spy" in got.error
    # without Yama (a container without CAP_SYS_PTRACE): the capability is the fix
    assert "--cap-add SYS_PTRACE" in dump_problem(answer(), rank1)


def test_a_dump_is_parsed_with_its_rank() -> None:
    ok = {"pid": 5, "rank": 2, "local_rank": 1, "code": 0, "dump": SLEEP, "error": None}
    (got,), problem = node_stacks("n3", 2, answer(ranks=[ok]))
    assert problem is None and (got.node, got.node_rank, got.rank, got.local_rank, got.pid) == ("n3", 2, 2, 1, 5)
    assert got.main[0].function == "sleep_forever" and got.raw == SLEEP


@pytest.mark.parametrize(
    "ranks", [7, "x", [1, None, "r"], [{"rank": "0", "local_rank": True, "pid": 1.5, "code": 0, "dump": SLEEP}]]
)
def test_an_answer_of_the_wrong_shape_is_no_stack_not_a_crash(ranks: Any) -> None:
    """What a node answers is not trusted: entries that are not objects are left out, a rank that
    is not an integer is no rank (and is grouped with none)."""
    got, problem = node_stacks("n3", 2, answer(ranks=ranks))
    assert all(r.rank is None and r.local_rank is None and r.pid is None for r in got)
    assert problem is None or problem.startswith("no rank process")
    report = StacksReport("r", 0.0, got)
    assert report.groups == [] and report.to_json()["odd_ranks"] == []


# ----------------------------------------------------------------------------- the watchdog


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_watchdog_starts_with_the_first_line_and_fires_once_per_silence() -> None:
    clock = Clock()
    dog = Watchdog(10.0, clock)
    clock.t = 1000.0
    assert dog.stalled() is None and dog.silent_s() is None  # start-up is not judged
    dog.progress()
    clock.t += 9.9
    assert dog.stalled() is None
    clock.t += 0.1
    assert dog.stalled() == pytest.approx(10.0)
    clock.t += 30
    assert dog.stalled() is None  # the same silence, reported once
    dog.progress()  # a line ends it
    clock.t += 10
    assert dog.stalled() == pytest.approx(10.0)  # a new silence


def test_the_watchdog_is_off_at_zero_and_blind_without_log_streams() -> None:
    clock = Clock()
    off = Watchdog(0.0, clock)
    off.progress()
    clock.t += 1e6
    assert off.stalled() is None
    dog = Watchdog(5.0, clock)
    dog.progress()
    dog.off("log streaming stopped")
    clock.t += 60
    assert dog.stalled() is None


def test_a_hang_fails_on_the_odd_ranks_node() -> None:
    report = StacksReport("r1", 0.0, [rank(0, ALLREDUCE), rank(1, ALLREDUCE), rank(2, SLEEP), rank(3, ALLREDUCE)])
    f = hang_failure(12.3, 10.0, report, SPECS)
    assert (f.node, f.node_rank, f.rank, f.local_rank, f.exit_code) == ("n3", 2, 2, 0, None)
    assert f.reason == (
        "hung: no rank wrote a line for 12 s (stall timeout 10 s); rank 2 stands apart: "
        "sleep_forever (ddp_job.py:50); ranks 0-1,3: all_reduce "
        "(torch/distributed/distributed_c10d.py:3913) in main (ddp_job.py:72)"
    )


def test_a_hang_where_every_rank_waits_alike_or_without_stacks() -> None:
    same = StacksReport("r1", 0.0, [rank(r, ALLREDUCE) for r in range(4)])
    f = hang_failure(600, 600, same, SPECS)
    assert f.node == "n1" and f.rank is None
    assert f.reason.endswith(
        "every rank stands in the same place: all_reduce "
        "(torch/distributed/distributed_c10d.py:3913) in main (ddp_job.py:72)"
    )
    none = hang_failure(600, 600, StacksReport("r1", 0.0, [], {"n2": "py-spy is not installed"}), SPECS)
    assert none.node == "n1" and none.reason.endswith("no stack could be taken (n2: py-spy is not installed)")
    assert hang_failure(600, 600, None, SPECS, "ssh refused").reason.endswith("(ssh refused)")


def test_the_supervisors_watch_hook_fails_the_run_and_tears_down() -> None:
    stops: list[int] = []
    calls: list[int] = []
    hang = Failure("n3", 2, "hung", rank=2, local_rank=0, excerpt=["[rank 2] hanging at step 3"])

    def watch() -> Failure | None:
        calls.append(1)
        return hang if len(calls) == 3 else None

    def stop_all() -> dict[str, Any]:
        stops.append(1)
        return {s.name: StopResult(None) for s in SPECS}

    running = {s.name: NodeStatus(NodeState.RUNNING, agent_alive=True, job_alive=True) for s in SPECS}
    clock = Clock()
    sup = Supervisor(
        SPECS,
        observe=lambda: running,
        stop_all=stop_all,
        excerpt=lambda name: ["after the stop"],
        clock=clock,
        sleep=lambda s: None,
        watch=watch,
    )
    out = sup.run()
    assert out.state == RunState.FAILED and stops == [1] and len(calls) == 3
    assert out.failure is hang and hang.rank == 2 and hang.excerpt == ["[rank 2] hanging at step 3"]


class Told:
    """A HangReporter that records what it is told."""

    def __init__(self) -> None:
        self.said: list[tuple[Any, ...]] = []

    def stalled(self, silent_s: float, timeout_s: float) -> None:
        self.said.append(("stalled", silent_s, timeout_s))

    def stacks(self, report: StacksReport | None, problem: str | None, stop: bool) -> None:
        self.said.append(("stacks", report, problem, stop))


@pytest.mark.parametrize("on_stall", ["stop", "warn"])
def test_the_hang_watch_takes_and_saves_every_stack_then_stops_or_warns(
    on_stall: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.run import watchdog
    from orchestrator.store import RunDir

    report = StacksReport("r1", 0.0, [rank(0, ALLREDUCE), rank(1, ALLREDUCE), rank(2, SLEEP), rank(3, ALLREDUCE)])
    taken: list[str] = []
    monkeypatch.setattr(watchdog, "take_stacks", lambda cluster, run_id, records: taken.append(run_id) or report)
    clock = Clock()
    dog = Watchdog(5.0, clock)
    told = Told()
    run = RunDir(tmp_path / "r1")
    watch = watchdog.HangWatch(
        dog,
        on_stall,
        None,
        run,
        [],
        SPECS,
        told,  # type: ignore[arg-type]
        excerpt=lambda node: [f"2026-11-30T09:32:05.000001Z err [rank 2] last words on {node}"],
    )
    assert watch() is None and taken == []  # no rank has written yet: start-up is not judged
    dog.progress()
    clock.t += 4.9
    assert watch() is None and taken == []
    clock.t += 0.2
    got = watch()
    assert taken == ["r1"] and told.said[0] == ("stalled", pytest.approx(5.1), 5.0)
    assert told.said[1] == ("stacks", report, None, on_stall == "stop")
    assert len(list((tmp_path / "r1" / "stacks").glob("*-hang.json"))) == 1
    if on_stall == "warn":
        assert got is None
    else:
        assert got is not None and (got.node, got.rank) == ("n3", 2) and "sleep_forever" in got.reason
        assert got.excerpt == ["[rank 2] last words on n3"]
    assert watch() is None and len(taken) == 1  # one report per silence


def test_the_hang_watch_stops_without_stacks_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.errors import OrchError
    from orchestrator.run import watchdog
    from orchestrator.store import RunDir

    def refuse(*_a: Any) -> StacksReport:
        raise OrchError("n2: connection refused")

    monkeypatch.setattr(watchdog, "take_stacks", refuse)
    clock = Clock()
    dog = Watchdog(5.0, clock)
    dog.progress()
    clock.t += 6

    def unreadable(node: str) -> list[str]:
        raise OrchError(f"{node}: unreachable")

    told = Told()
    got = watchdog.HangWatch(dog, "stop", None, RunDir(tmp_path / "r1"), [], SPECS, told, unreadable)()  # type: ignore[arg-type]
    assert told.said[1] == ("stacks", None, "n2: connection refused", True)
    assert got is not None and got.node == "n1" and got.reason.endswith("(n2: connection refused)")
    assert got.excerpt == ["(cannot read the node's log: n1: unreachable)"]


# ----------------------------------------------------------------------------- the command


def test_orch_stacks_help_teaches_and_an_unknown_run_is_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from click.testing import CliRunner

    from orchestrator.cli import main
    from orchestrator.cli.commands import cli

    result = CliRunner().invoke(cli, ["stacks", "--help"])
    assert result.exit_code == 0 and "Example" in result.output and "orch stacks" in result.output
    monkeypatch.setenv("ORCH_HOME", str(tmp_path))
    with pytest.raises(SystemExit) as info:
        main(["stacks", "no-such-run"])
    assert info.value.code == 2 and "hint:" in capsys.readouterr().err


@pytest.mark.parametrize("complete", [True, False])
def test_orch_stacks_prints_groups_or_json_and_exits_by_completeness(
    complete: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from orchestrator.cli import main
    from orchestrator.run import stacks as stacks_mod

    report = StacksReport("r1", 0.0, [rank(0, ALLREDUCE), rank(1, SLEEP)], {} if complete else {"n3": "no py-spy"})
    monkeypatch.setattr(stacks_mod, "stacks", lambda run, timeout: report)
    with pytest.raises(SystemExit) as info:
        main(["stacks", "r1", "--json"])
    assert info.value.code == (0 if complete else 1)
    data = json.loads(capsys.readouterr().out)
    assert data["complete"] is complete and [g["ranks_text"] for g in data["groups"]] == ["0", "1"]
    with pytest.raises(SystemExit) as info:
        main(["stacks", "r1"])
    out = capsys.readouterr().out
    assert "rank 0  all_reduce (torch/distributed/distributed_c10d.py:3913) in main (ddp_job.py:72)" in out
    assert ("n3: no py-spy" in out) is not complete


# ----------------------------------------------------------------------------- the prime suspect of a hang


def unread(r: int, state: str | None, error: str = "Error: Failed to find python version") -> RankStack:
    return RankStack(f"n{r + 1}", r, r, 0, 1000 + r, (), error, "", state)


def test_a_stopped_rank_that_gave_no_stack_is_the_prime_suspect_not_the_master() -> None:
    """Issue 54 item 4: a rank frozen by SIGSTOP (or stuck in D state on an NFS read) gives no stack,
    and every other rank waits for it in the same collective: the verdict once named the master
    ("every rank stands in the same place"). It names the stopped rank, on its node."""
    stopped = unread(2, "T", "its process is stopped (SIGSTOP or a debugger) (state T): Error: no python version")
    report = StacksReport("r1", 0.0, [rank(0, ALLREDUCE), rank(1, ALLREDUCE), stopped, rank(3, ALLREDUCE)])
    f = hang_failure(12.3, 10.0, report, SPECS)
    assert (f.node, f.node_rank, f.rank, f.local_rank) == ("n3", 2, 2, 0)
    assert f.reason == (
        "hung: no rank wrote a line for 12 s (stall timeout 10 s); rank 2 on n3 gave no stack, the prime "
        "suspect: its process is stopped (SIGSTOP or a debugger) (state T): Error: no python version; "
        "ranks 0-1,3: all_reduce (torch/distributed/distributed_c10d.py:3913) in main (ddp_job.py:72)"
    )
    # stuck in D state beats a rank that merely stands apart; without any stack it is still named
    stuck = unread(1, "D", "its process is in uninterruptible sleep (...) (state D): py-spy did not answer")
    odd = StacksReport("r1", 0.0, [rank(0, ALLREDUCE), stuck, rank(2, SLEEP), rank(3, ALLREDUCE)])
    assert (hang_failure(600, 600, odd, SPECS).node, hang_failure(600, 600, odd, SPECS).rank) == ("n2", 1)
    alone = hang_failure(600, 600, StacksReport("r1", 0.0, [stuck]), SPECS)
    assert alone.node == "n2" and "rank 1 on n2 gave no stack, the prime suspect" in alone.reason


def test_a_rank_without_a_stack_beside_ranks_that_agree_is_named_and_an_odd_one_first() -> None:
    silent = unread(3, "S", "py-spy did not answer within 20 s")
    report = StacksReport("r1", 0.0, [rank(0, ALLREDUCE), rank(1, ALLREDUCE), rank(2, ALLREDUCE), silent])
    assert (hang_failure(60, 60, report, SPECS).node, hang_failure(60, 60, report, SPECS).rank) == ("n4", 3)
    odd = StacksReport("r1", 0.0, [rank(0, ALLREDUCE), rank(1, ALLREDUCE), rank(2, SLEEP), silent])
    assert hang_failure(60, 60, odd, SPECS).rank == 2  # the one that stands apart, where nothing is stuck
    nothing = StacksReport("r1", 0.0, [unread(0, "S"), unread(1, "S")])
    assert hang_failure(60, 60, nothing, SPECS).reason.endswith("no stack could be taken (no rank found)")


# ----------------------------------------------------------------------------- bringing py-spy


def test_the_controllers_py_spy_goes_only_to_a_node_of_its_architecture(tmp_path: Path) -> None:
    from orchestrator.run.stacks import bring, elf_machine

    x86 = tmp_path / "x86"
    x86.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(11) + (62).to_bytes(2, "little") + bytes(100))
    arm = tmp_path / "arm"
    arm.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(11) + (183).to_bytes(2, "little") + bytes(100))
    (tmp_path / "script").write_text("#!/bin/sh\n")
    assert (elf_machine(x86.read_bytes()[:20]), elf_machine(arm.read_bytes()[:20])) == ("x86_64", "aarch64")
    none_here = answer(py_spy=None, machine="x86_64", ranks=[{"pid": 5, "rank": 0}])
    assert bring(none_here, x86) == (True, None)
    assert bring(none_here, arm) == (False, f"and this controller's {arm} is for aarch64, not this node's x86_64")
    assert bring(none_here, tmp_path / "script")[1] == (
        f"and this controller's {tmp_path / 'script'} is for another system, not this node's x86_64"
    )
    assert (
        bring(none_here, None)[1]
        == "and this controller has no py-spy to bring (`pip install py-spy` here or on the node)"
    )
    assert bring(answer(machine="x86_64", ranks=[{"pid": 5}]), x86) == (False, None)  # the node has one
    assert bring(answer(py_spy=None, machine="x86_64"), x86) == (False, None)  # nothing to dump there
    said = node_stacks("n1", 0, {**none_here, "ship_error": "and this controller has no py-spy to bring"})[1]
    assert said is not None and said.startswith(
        "py-spy is not installed next to /venv/bin/python nor on PATH; and this controller has no py-spy to bring: "
    )
