"""The trainer's log lines and their parsers (trainer/logs.py): what is written is what is read back."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainer import logs


def test_epoch_and_val_lines_read_back_as_results_csv_columns() -> None:
    lines = []
    for epoch, (box, m) in enumerate([(2.5, 0.0), (1.75, 0.123456789), (1.5, 0.3)], start=1):
        lines.append(
            "2026-11-30T09:32:01.000000Z out [default0]:"
            + logs.prefixed(
                logs.epoch_line(
                    epoch,
                    3,
                    {"box_loss": box, "cls_loss": 3.0, "dfl_loss": 1.0},
                    {"lr/pg0": 0.001, "lr/pg1": 0.001, "lr/pg2": 0.05},
                )
            )
        )
        if epoch != 2:  # epoch 2 has no validation: results.csv repeats the last metrics
            lines.append(
                logs.prefixed(
                    logs.val_line(
                        epoch,
                        3,
                        {
                            "metrics/precision(B)": 0.5,
                            "metrics/recall(B)": 0.25,
                            "metrics/mAP50(B)": m * 2,
                            "metrics/mAP50-95(B)": m,
                            "metrics/mAP50(M)": m,
                            "metrics/mAP50-95(M)": m / 2,
                            "val/box_loss": 1.0,
                            "val/seg_loss": 2.0,
                        },
                    )
                )
            )
    cols = logs.parse_results(lines)
    assert cols["epoch"] == [1, 2, 3]
    assert cols["train/box_loss"] == [2.5, 1.75, 1.5]
    assert cols["lr/pg2"] == [0.05] * 3
    assert cols["metrics/mAP50-95(B)"] == [0.0, 0.0, 0.3]
    assert cols["metrics/mAP50-95(M)"] == [0.0, 0.0, 0.15]
    assert cols["val/seg_loss"] == [2.0, 2.0, 2.0]
    assert "mask-mAP50 0.3 " in logs.val_line(1, 1, {"metrics/mAP50(M)": 0.3, "metrics/mAP50-95(M)": 0.1})


def test_numbers_are_printed_as_results_csv_prints_them() -> None:
    value = 0.123456789
    assert logs.number(value) == f"{value:.6g}"
    cols = logs.parse_results([logs.epoch_line(1, 1, {"box_loss": value}, {})])
    assert cols["train/box_loss"] == [float(f"{value:.6g}")]


def test_final_line_and_throughput_table_read_back() -> None:
    line = logs.prefixed(logs.final_line("best.pt", 7, {"metrics/mAP50(B)": 0.5, "metrics/mAP50-95(B)": 0.25}))
    assert logs.parse_final(["noise", line]) == ("best.pt", 7, {"metrics/mAP50(B)": 0.5, "metrics/mAP50-95(B)": 0.25})
    table = logs.throughput_table(2, [[100, 1.0, 10.0], [90, 2.0, 10.0]], ref_ips=10.0)
    assert "total 19.0 images/s over 2 ranks, scaling efficiency 95.0%" in table
    assert "   1       9.0     20.0%" in table
    tp = logs.parse_throughput(table.splitlines())
    assert tp.epoch == 2 and tp.ips == {0: 10.0, 1: 9.0} and tp.total == 19.0 and tp.efficiency == 0.95


def test_done_line_names_weights_and_results() -> None:
    line = logs.done_line(3, 9.0, "/r/exp/weights", "/r/exp/results.csv")
    assert logs.WEIGHTS_DIR.search(line).group(1) == "/r/exp/weights"  # type: ignore[union-attr]
    assert logs.RESULTS_PATH.search(line).group(1) == "/r/exp/results.csv"  # type: ignore[union-attr]
    assert logs.announced(["a", logs.prefixed(line), "b"]) == ("/r/exp/weights", "/r/exp/results.csv")


def test_the_rank_prefix_regex_reads_what_the_trainer_writes() -> None:
    import re

    for rank in (0, 7, 123):
        m = re.match(logs.RANK_PREFIX, logs.rank_prefix(rank) + "text")
        assert m is not None and m.group(1) == str(rank) and m.end() == len(logs.rank_prefix(rank))


def test_every_line_gets_the_rank_prefix(capsys) -> None:  # noqa: ANN001
    logs.set_rank(3)
    try:
        logs.say("a\nb")
    finally:
        logs.set_rank(0)
    assert capsys.readouterr().out == "[rank 3] a\n[rank 3] b\n"


def test_the_report_reads_the_trainers_lines_without_torch() -> None:
    """`orch` runs on the controller: importing it and the trainer's parsers must not import torch."""
    code = (
        "import sys; import orchestrator.cli, orchestrator.report, orchestrator.logs.lines, trainer.logs; "
        "assert orchestrator.report.parse_results is trainer.logs.parse_results; "
        "assert orchestrator.logs.lines.RANK_PREFIX is trainer.logs.RANK_PREFIX; "
        "print('torch' in sys.modules, 'ultralytics' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_timing_line_round_trips_with_and_without_the_rank_prefix() -> None:
    from trainer.logs import parse_timing, rank_prefix, timing_line

    text = timing_line(3, 40, 10, 80, 0.0123456, 1.5234, 3.1)
    t = parse_timing(rank_prefix(2) + text)
    assert t is not None and parse_timing(text) == t
    assert (t.epoch, t.batch, t.steps, t.images) == (3, 40, 10, 80)
    assert t.data_s == pytest.approx(0.01235) and t.compute_s == pytest.approx(1.523) and t.wall_s == pytest.approx(3.1)
    assert t.outside_s == pytest.approx((0.01235 + 1.523) / 10)
    assert t.ips == pytest.approx(80 / 3.1) and t.data_share == pytest.approx(0.01235 / 3.1)
    tiny = parse_timing(timing_line(1, 2, 1, 8, 1.5e-06, 2e-7, 0.5))
    assert tiny is not None and tiny.data_s == pytest.approx(1.5e-06)
    assert parse_timing("[rank 0] epoch 1/3 batch 4/8 box_loss 1 lr 0.01 images/s 3.0 data 2%") is None


def test_progress_line_counts_troubled_steps_and_reads_back() -> None:
    line = logs.prefixed(
        logs.step_line(2, 10, 7, 50, {"box_loss": 1.25, "cls_loss": 2.5}, 0.00125, 123.4, 0.05, nonfinite=3, skipped=2)
    )
    assert line.endswith(" nonfinite 3 skipped 2")
    step = logs.parse_step("2026-11-30T09:32:01.000000Z out [default0]:" + line)
    assert step == logs.Step(2, 10, 7, 50, {"box_loss": 1.25, "cls_loss": 2.5}, 0.00125, 123.4, 0.05, 3, 2)
    assert logs.parse_step(logs.epoch_line(1, 1, {"box_loss": 1.0}, {})) is None


def test_epoch_line_counts_become_results_csv_steps_columns() -> None:
    counts = {"steps/nonfinite": 4, "steps/skipped": 1, "steps/recoveries": 2}
    line = logs.epoch_line(1, 2, {"box_loss": 1.5}, {"lr/pg0": 0.01}, counts)
    cols = logs.parse_results([logs.prefixed(line)])
    assert cols["steps/nonfinite"] == [4.0] and cols["steps/skipped"] == [1.0] and cols["train/box_loss"] == [1.5]
    assert cols["steps/recoveries"] == [2.0]
    assert set(logs.STEP_COUNTS) <= set(cols)


def test_a_rank_with_nothing_measured_says_n_a_not_zero() -> None:
    table = logs.throughput_table(1, [[8, 0.1, 0.5], [0, 0.0, 0.0]], ref_ips=None)
    assert "throughput epoch 1:    1       n/a       n/a" in table
    tp = logs.parse_throughput(table.splitlines())
    assert tp.ips == {0: 16.0} and 1 not in tp.ips


def test_ultralytics_colours_are_left_out_off_a_terminal() -> None:
    """ultralytics colours its lines whatever its stream; under torchrun (a pipe) they reached the
    node log as `\\x1b[34m` and the live view showed them escaped."""
    import io
    import logging

    record = logging.LogRecord(
        "ultralytics",
        logging.INFO,
        __file__,
        1,
        "\x1b[34m\x1b[1mtrain: \x1b[0mScanning /data/labels... 8 images",
        None,
        None,
    )
    pipe = logs.library_formatter(io.StringIO())
    assert pipe.format(record) == logs.prefixed("train: Scanning /data/labels... 8 images")

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert "\x1b[34m" in logs.library_formatter(Tty()).format(record)  # a terminal keeps them
    # a handler whose stream was closed under it (ultralytics' handler installed at its import, in a
    # process whose stdout was replaced since: a test's capture, a closed pipe) is no terminal, not
    # a ValueError out of the trainer's start
    closed = io.StringIO()
    closed.close()
    assert logs.library_formatter(closed).format(record) == logs.prefixed("train: Scanning /data/labels... 8 images")


def test_a_progress_line_of_numbers_no_float_holds_is_ignored_not_a_crash() -> None:
    """`orch up`'s live line and `orch status` read rank 0's progress lines: a batch of 400 digits
    (its fraction of the run raised OverflowError, which stopped the log stream) or images/s past
    a float's range is not a record; the next good line is."""
    from trainer.logs import Progress, step_line

    p = Progress()
    big = "1" + "0" * 400
    assert not p.feed(f"epoch 1/1 batch {big}/1 box_loss 1 lr 0.1 images/s 1.0 data 1% nonfinite 0 skipped 0", 1.0)
    assert not p.feed(
        f"epoch 1/2 batch 1/4 box_loss 1 lr 0.1 images/s {'9' * 400}.0 data 1% nonfinite 0 skipped 0", 1.0
    )
    assert not p.feed(f"val epoch {big}/2 mAP50 0.5 mAP50-95 0.3", 1.0)
    assert p.feed("val epoch 1/2 mAP50 0.5 mAP50-95 1e999", 1.0) and p.map50_95 is None and p.map50 == 0.5
    assert p.feed(step_line(1, 2, 1, 4, {"box_loss": 1.0}, 0.1, 12.5, 0.01), 2.0) and p.fraction() == 0.125
