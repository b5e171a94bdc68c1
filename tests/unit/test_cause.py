"""The first failure's cause line, read from recorded node logs and torchrun failure summaries
(tests/fixtures/nodelog: real `orch up` runs on this machine; tests/fixtures/torchrun_*: real
torchrun output, provenance in tests/fixtures/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import render
from orchestrator.run.cause import (
    cause,
    exception_line,
    gpu_error,
    rank_lines,
    summary,
    terminated,
)
from orchestrator.run.supervise import Failure, log_text
from orchestrator.up import UpOutcome

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def texts(name: str) -> list[str]:
    return [log_text(r) for r in (FIXTURES / name).read_text().splitlines()]


def raw(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def test_a_rank_that_raises_is_named_by_its_exception_line() -> None:
    found = cause(texts("nodelog/raise_rank3_failing-node_torch2.14.log"), node="n1")
    assert found is not None and found.text == "RuntimeError: injected failure on rank 3 at step 2"
    assert found.signal is None


def test_the_blamed_rank_wins_over_a_later_traceback_of_another_rank() -> None:
    """n1's rank 2 printed its own traceback (a lost peer) after rank 3 raised; torchrun blames 3."""
    lines = texts("nodelog/raise_rank3_failing-node_torch2.14.log")
    assert any("Connection closed by peer" in t for t in lines)
    s = summary(lines)
    assert s is not None and (s.rank, s.local_rank, s.exit_code, s.signal) == (3, 1, 1, None)
    assert exception_line(s.traceback) == "RuntimeError: injected failure on rank 3 at step 2"


def test_without_the_summary_traceback_the_ranks_own_lines_say_it() -> None:
    lines = texts("nodelog/raise_rank3_failing-node_torch2.14.log")
    s = summary(lines)
    assert s is not None
    mine = rank_lines(lines[: s.first], 1)
    assert mine[0].startswith("up world=4") and all(not t.startswith("[") for t in mine)
    assert exception_line(mine) == "RuntimeError: injected failure on rank 3 at step 2"


def test_a_sigkilled_rank_is_a_signal_with_the_oom_hint_never_exit_code_1() -> None:
    found = cause(texts("nodelog/sigkill_rank3_failing-node_torch2.14.log"), node="n1")
    assert found is not None and found.text == "killed by SIGKILL" and found.signal == "SIGKILL"
    assert found.hint is not None and "OOM killer" in found.hint and "orch exec --nodes n1" in found.hint


def test_argparse_error_of_the_trainer_is_the_cause_not_its_usage_text() -> None:
    found = cause(texts("nodelog/trainer_argparse-typo_torch2.14.log"))
    assert found is not None and found.text == "python -m trainer: error: unrecognized arguments: --epocs"
    assert found.hint is not None and "job.args" in found.hint


def test_the_trainers_own_error_line_is_the_cause() -> None:
    found = cause(texts("nodelog/trainer_error_epochs0_torch2.14.log"))
    assert found is not None and found.text == "error: --epochs must be >= 1, got 0"


@pytest.mark.parametrize(
    "name, text, sig",
    [
        ("torchrun_failure_summary_SIGKILL_CPPO-6.txt", "killed by SIGKILL", "SIGKILL"),
        ("torchrun_failure_summary_8rank_SIGABRT_tail_picotron-6.txt", "killed by SIGABRT", "SIGABRT"),
        ("torchrun_failure_summary_exitcode1_unsloth-4.txt", "exited with code 1", None),
        ("torchrun_tee3_2proc_exit3_stderr_torch2.14.txt", "exited with code 3", None),
    ],
)
def test_recorded_torchrun_summaries_of_other_torch_versions(name: str, text: str, sig: str | None) -> None:
    found = cause(texts(name), node="gpu7")
    assert found is not None and (found.text, found.signal) == (text, sig)
    if sig:
        assert found.hint


def test_a_cpp_exception_that_aborted_a_rank_names_its_type_and_what() -> None:
    lines = rank_lines(texts("torchrun_tee3_default3_CUDAError_crash_bloom176b.txt"), 3)
    assert terminated(lines) == "c10::CUDAError: CUDA error: unknown error"
    assert gpu_error(lines) == "what():  CUDA error: unknown error"
    # as torchrun reports that rank: killed by SIGABRT, with the C++ exception as the reason
    block = [
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2022-07-03_10:00:00",
        "  host      : jean-zay-iam01",
        "  rank      : 3 (local_rank: 3)",
        "  exitcode  : -6 (pid: 1234)",
        "  error_file: <N/A>",
        "  traceback : Signal 6 (SIGABRT) received by PID 1234",
        "============================================================",
    ]
    found = cause(texts("torchrun_tee3_default3_CUDAError_crash_bloom176b.txt") + block)
    assert found is not None and found.text == "c10::CUDAError: CUDA error: unknown error (killed by SIGABRT)"


def test_torchrun_killed_itself_and_torchrun_signalled_from_outside() -> None:
    found = cause(["started pid 42 (process group 42)"], node="n2", signal="SIGKILL")
    assert (
        found is not None
        and found.text == "torchrun was killed by SIGKILL"
        and "orch exec --nodes n2" in (found.hint or "")
    )
    # the recorded Ctrl-C log without its agent's stop line: torchrun's SignalException from a kill
    # that did not come through orch
    stopped = texts("nodelog/sigint_stop_node0_torch2.14.log")
    outside = [t for t in stopped if not t.startswith("agent received SIGTERM")]
    found = cause(outside, node="n0")
    assert found is not None and found.text == "torchrun got SIGTERM" and "outside orch on n0" in (found.hint or "")
    # ... and with it: what the node printed once its agent was told to stop is no cause (orch down
    # from another terminal: the failure keeps its reason)
    assert cause(stopped, node="n0") is None
    f = Failure("n0", 0, "was stopped from outside this `orch up` (orch down?)")
    f.explain(raw("nodelog/sigint_stop_node0_torch2.14.log"))
    assert f.to_json()["cause"] == "was stopped from outside this `orch up` (orch down?)"


def test_a_shells_exit_code_for_a_signal_is_read_as_the_signal() -> None:
    block = [
        "Root Cause (first observed failure):",
        "[0]:",
        "  rank      : 0 (local_rank: 0)",
        "  exitcode  : 137 (pid: 9)",
        "  traceback : To enable traceback see: https://pytorch.org/docs/",
        "====",
    ]
    found = cause(block)
    assert found is not None and found.signal == "SIGKILL" and "137 (128 + 9" in found.text


def test_hints_follow_the_error_line() -> None:
    oom = [
        "Root Cause (first observed failure):",
        "[0]:",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : 1 (pid: 9)",
        "  traceback : Traceback (most recent call last):",
        '    File "train.py", line 3, in <module>',
        "  torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "====",
    ]
    found = cause(oom)
    assert found is not None and found.text.startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert "smaller batch" in (found.hint or "")
    # a glog/c10 header is not part of the cause
    line = (
        "[default0]:[rank0]:[E1201 11:12:35.123456 1234 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:632] "
        "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4, OpType=ALLREDUCE) ran for "
        "600011 milliseconds before timing out."
    )  # written for this test in c10's format: no GPU here
    assert gpu_error(rank_lines([line], 0)) == (
        "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL("
        "SeqNum=4, OpType=ALLREDUCE) ran for 600011 milliseconds before timing out."
    )


def test_a_line_of_another_thread_inside_the_traceback_does_not_hide_its_exception() -> None:
    tb = [
        "Traceback (most recent call last):",
        '  File "train.py", line 9, in <module>',
        "    main()",
        "epoch 3 loss=0.41",
        '  File "train.py", line 5, in main',
        "    raise ValueError('bad shard 7')",
        "ValueError: bad shard 7",
    ]
    assert exception_line(tb) == "ValueError: bad shard 7"
    assert exception_line(tb[:-1] + ["KeyboardInterrupt"]) == "KeyboardInterrupt"
    assert exception_line(tb[:-1] + ["done", "saved", "bye", "exit", "x"]) is None  # words, not exceptions
    assert (
        exception_line(
            [
                "Traceback (most recent call last):",
                "  File 'run.py'",
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            ]
        )
        is None
    )


def test_nothing_known_is_none_and_the_reason_stays() -> None:
    assert cause(["some line", "another"]) is None
    f = Failure("n1", 0, "exited with code 1", 1)
    f.explain(["2026-11-30T09:32:05.000000Z out some line"])
    assert f.to_json()["cause"] == "exited with code 1" and f.to_json()["hint"] is None


def test_explain_fills_the_failure_and_its_json() -> None:
    f = Failure("n1", 1, "exited with code 1", 1)
    f.explain(raw("nodelog/sigkill_rank3_failing-node_torch2.14.log"))
    doc = f.to_json()
    assert (doc["rank"], doc["local_rank"], doc["signal"], doc["cause"]) == (3, 1, "SIGKILL", "killed by SIGKILL")
    assert doc["exit_code"] == 1 and doc["reason"] == "exited with code 1"  # the node's, as before
    assert not any("Root Cause" in x for x in doc["excerpt"])  # torchrun's summary stays in the log only


def said(capsys: pytest.CaptureFixture[str]) -> str:
    return " ".join(capsys.readouterr().err.split())


def test_orch_up_ends_with_the_cause_and_its_hint_after_the_excerpt(capsys: pytest.CaptureFixture[str]) -> None:
    """The last lines a user reads say why; torchrun's summary and telemetry are left to the log."""
    f = Failure("n1", 1, "exited with code 1", 1)
    lines = raw("nodelog/raise_rank3_failing-node_torch2.14.log")
    lines.insert(-1, '2026-12-01T21:41:12.000000Z orch telemetry {"v":1,"gpus":[],"cpu_pct":1.0}')
    f.explain(lines)
    render.up_outcome(UpOutcome("failed", run_id="r1", failure=f, teardown_s=1.0))
    out = capsys.readouterr().err.rstrip("\n").splitlines()
    head = (
        "run r1 failed: first failure on n1 (node rank 1, rank 3, exit code 1):"
        " RuntimeError: injected failure on rank 3 at step 2"
    )
    assert out[-1] == head, out[-3:]
    assert out[-2] == "stopped every other node in 1.0 s"
    err = " ".join(out)
    assert "[default1]:[rank3]: RuntimeError: injected failure on rank 3 at step 2" in err  # the excerpt stays
    for boilerplate in ("Root Cause", "ChildFailedError", "error_file", "Failures:", "telemetry {", "FAILED"):
        assert boilerplate not in err, boilerplate
    f.hint = "a hint"
    render.up_outcome(UpOutcome("failed", run_id="r1", failure=f, teardown_s=1.0))
    assert capsys.readouterr().err.rstrip("\n").splitlines()[-2:] == [head, "  hint: a hint"]


@pytest.mark.parametrize(
    "name",
    [
        "torchrun_failure_summary_exitcode1_unsloth-4.txt",
        "torchrun_failure_summary_SIGKILL_CPPO-6.txt",
        "torchrun_failure_summary_8rank_SIGABRT_tail_picotron-6.txt",
        "torchrun_tee3_2proc_exit3_stderr_torch2.14.txt",
    ],
)
def test_torchruns_recorded_summaries_are_left_out_of_the_excerpt(name: str) -> None:
    from orchestrator.run.supervise import select_excerpt

    lines = (FIXTURES / name).read_text().splitlines()
    excerpt, _rank, _local = select_excerpt(lines)
    for boilerplate in ("Root Cause (first observed failure)", "ChildFailedError", "error_file", "Failures:"):
        assert not any(boilerplate in x for x in excerpt), (boilerplate, excerpt)
    f = Failure("n1", 0, "exited with code 1", 1)
    f.explain(lines)  # the summary still names the rank and the cause
    assert f.cause is not None


def test_orch_up_names_a_killed_rank_by_its_signal(capsys: pytest.CaptureFixture[str]) -> None:
    f = Failure("n1", 1, "exited with code 1", 1)
    f.explain(raw("nodelog/sigkill_rank3_failing-node_torch2.14.log"))
    render.up_outcome(UpOutcome("failed", run_id="r1", failure=f, teardown_s=1.0))
    err = said(capsys)
    assert "first failure on n1 (node rank 1, rank 3): killed by SIGKILL hint: SIGKILL on a training node" in err
    assert "exit code 1" not in err


def test_orch_status_shows_cause_and_hint_and_reads_an_older_run_json(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.run import control

    f = Failure("n1", 1, "exited with code 1", 1)
    f.explain(raw("nodelog/trainer_argparse-typo_torch2.14.log"))
    data = {"run": "r1", "state": "failed", "nodes": [], "first_failure": f.to_json()}
    render.status_table(control.status_report(data, {}))
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "first failure: n1 (node rank 1, rank 1, exit code 1): python -m trainer: error: unrecognized "
        "arguments: --epocs"
        in out
        and "hint: the job's arguments" in out
        and "orch logs r1 --node n1" in out
    )
    old = {
        "run": "r0",
        "state": "failed",
        "nodes": [],  # run.json written before causes existed
        "first_failure": {"node": "n1", "rank": 3, "exit_code": 1, "reason": "exited with code 1", "excerpt": []},
    }
    render.status_table(control.status_report(old, {}))
    assert "first failure: n1 (rank 3, exit code 1): exited with code 1" in " ".join(capsys.readouterr().out.split())


def test_orch_status_headline_is_one_line_whatever_the_run_id_length(capsys: pytest.CaptureFixture[str]) -> None:
    """Run ids carry the controller's host: as a table title the headline wrapped to the table's
    width and split "(attempt 2 of 2)" across two lines."""
    from orchestrator.run.control import NodeReport, StatusReport

    run = "20261202-033827-tc14-a-rather-long-controller-hostname-0xtp"
    nodes = [NodeReport("n1", 0, "h", "succeeded", 0, 1, 1, 5.0, None, 1.0, None, None)]
    render.status_table(StatusReport(run, "succeeded", nodes, attempt=2, max_attempts=2))
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"run {run}: succeeded (attempt 2 of 2)", first


def test_a_lost_peer_first_is_a_consequence_and_the_rank_that_raised_is_named() -> None:
    """Rank 1 lost its peer 13 ms before rank 0 raised on the same node; torchrun names rank 1."""
    from orchestrator.run.supervise import NodeSpec, blame

    lines = raw("nodelog/seg-on-detect_peer-lost-first_derived.log")
    f = Failure("gpu1", 0, "exited with code 1", 1, order=1.0)
    f.explain(lines)
    assert (f.rank, f.cause) == (1, f.cause) and f.cause is not None and "Connection closed by peer" in f.cause
    real = blame(f, {"gpu1": lines}, {"gpu1": NodeSpec("gpu1", 0, 0, 2)})
    assert (real.node, real.node_rank, real.rank, real.local_rank) == ("gpu1", 0, 0, 0)
    assert real.cause == "ValueError: Segment dataset requires equal numbers of boxes and segments"
    assert real.hint is not None and real.hint == (
        "rank 1 on gpu1 lost its peer 0.013 s before this (Connection closed by peer): a consequence of it"
    )
    assert real.exit_code == 1 and real.reason == "exited with code 1"
    assert any("ValueError: Segment dataset" in x for x in real.excerpt)


def test_a_lost_peer_on_the_first_node_blames_the_rank_that_raised_on_another() -> None:
    """n0's rank 1 lost its peer (first to fail, by its node's clock); n1's rank 3 raised 7.4 s before."""
    from orchestrator.run.supervise import NodeSpec, blame

    n0, n1 = raw("nodelog/raise_rank3_other-node_torch2.14.log"), raw("nodelog/raise_rank3_failing-node_torch2.14.log")
    f = Failure("n0", 0, "exited with code 1", 1, order=1.0)
    f.explain(n0)
    assert f.cause is not None and "Connection closed by peer" in f.cause and f.rank == 1
    specs = {"n0": NodeSpec("n0", 0, 0, 2), "n1": NodeSpec("n1", 1, 2, 2)}
    real = blame(f, {"n0": n0, "n1": n1}, specs)
    assert (real.node, real.node_rank, real.rank, real.local_rank) == ("n1", 1, 3, 1)
    assert real.cause == "RuntimeError: injected failure on rank 3 at step 2"
    assert real.to_json()["cause"] == real.cause
    assert real.hint == "rank 1 on n0 lost its peer 7.430 s after this (Connection closed by peer): a consequence of it"
    # too far apart on the reference clock (a node's offset): not its cause, the first failure stays
    assert blame(f, {"n0": n0, "n1": n1}, specs, {"n1": -120.0}) is f
    # a real exception first is never replaced
    g = Failure("n1", 1, "exited with code 1", 1)
    g.explain(n1)
    assert blame(g, {"n0": n0, "n1": n1}, specs) is g


def test_a_lost_peer_after_a_preemption_on_another_node_names_the_preempted_rank() -> None:
    """n0's rank 1 lost its peer (recorded); nobody raised: n1's ranks stopped for a preemption 4 s
    before (rank 2 wrote the checkpoint). The preempted rank is named, so `orch up` says the trainer
    wrote its checkpoint (`resume.preempted`), not a lost peer."""
    from orchestrator.run import resume
    from orchestrator.run.supervise import NodeSpec, blame

    n0 = raw("nodelog/raise_rank3_other-node_torch2.14.log")
    n1 = [
        "2026-12-01T21:41:07.100000Z out [default0]:[rank 2] step 2 sum=10 ok",
        "2026-12-01T21:41:07.883000Z err [default0]:[rank 2] preempted (SIGUSR2): checkpoint /ck/last.pt after "
        "step 2; --resume continues from it",
        "2026-12-01T21:41:07.890000Z err [default1]:[rank 3] preempted (SIGUSR2): checkpoint /ck/last.pt after "
        "step 2; --resume continues from it",
        "2026-12-01T21:41:08.400000Z orch torchrun exited with code 1",
    ]
    f = Failure("n0", 0, "exited with code 1", 1, order=1.0)
    f.explain(n0)
    assert f.cause is not None and "Connection closed by peer" in f.cause and not resume.preempted(f.cause, f.excerpt)
    specs = {"n0": NodeSpec("n0", 0, 0, 2), "n1": NodeSpec("n1", 1, 2, 2)}
    real = blame(f, {"n0": n0, "n1": n1}, specs)
    assert (real.node, real.rank, real.local_rank) == ("n1", 2, 0), real
    assert real.cause is not None and real.cause.startswith("preempted (SIGUSR2): checkpoint /ck/last.pt")
    assert real.reason.startswith("a rank stopped: preempted (SIGUSR2)") and real.hint is not None
    assert "rank 1 on n0 lost its peer 4.006 s after this" in real.hint, real.hint
    assert resume.preempted(real.cause, real.excerpt)
    # out of the window on the reference clock: the lost peer stays the first failure
    assert blame(f, {"n0": n0, "n1": n1}, specs, {"n1": -120.0}) is f


def test_the_supervisor_names_the_real_exception_for_runs_and_status() -> None:
    """`orch up`'s outcome (and so run.json's first_failure, `orch runs`, `orch status`)."""
    from orchestrator.contract import NodeState
    from orchestrator.run.agents import NodeStatus, StopResult
    from orchestrator.run.supervise import NodeSpec, Supervisor

    n0, n1 = raw("nodelog/raise_rank3_other-node_torch2.14.log"), raw("nodelog/raise_rank3_failing-node_torch2.14.log")
    rounds = iter(
        [
            {
                "n0": NodeStatus(NodeState.FAILED, exit_code=1, finished_at=50.0),
                "n1": NodeStatus(NodeState.RUNNING, agent_alive=True, job_alive=True),
            }
        ]
    )
    specs = [NodeSpec("n0", 0, 0, 2), NodeSpec("n1", 1, 2, 2)]
    sup = Supervisor(
        specs,
        observe=lambda: next(rounds),
        stop_all=lambda: {s.name: StopResult(None) for s in specs},
        excerpt=lambda node: n0 if node == "n0" else n1,
        interval=1.0,
        unreachable_grace=10.0,
        clock=lambda: 0.0,
        sleep=lambda s: None,
    )
    out = sup.run()
    assert out.failure is not None and (out.failure.node, out.failure.rank) == ("n1", 3)
    assert out.failure.cause == "RuntimeError: injected failure on rank 3 at step 2"
