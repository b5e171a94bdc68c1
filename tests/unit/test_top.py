"""`orch top`'s view of a run from its stored node logs (orchestrator/top.py), and its screen."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from orchestrator.top import TopView
from tests.telemetry_support import make_top_run

TS0 = 1_796_000_000.0


def view_of(tmp_path: Path, sets: list[str | None], **kw: object) -> TopView:
    run = make_top_run(tmp_path, sets, ts0=TS0, **kw)  # type: ignore[arg-type]
    view = TopView(run, run.inventory(), clock=lambda: TS0 + 250)
    view.read_copies()
    return view


def test_rows_flags_and_the_bad_gpu_from_the_recorded_sets(tmp_path: Path) -> None:
    report = view_of(tmp_path, ["h100x8", "v100x8", "a100", "err"]).report().to_json()
    nodes = {n["node"]: n for n in report["nodes"]}
    assert [len(n["gpus"]) for n in report["nodes"]] == [8, 8, 3, 1]
    h100 = nodes["n1"]
    assert h100["flags"] == [
        "throttle",
        "idle-gpu",
        "stale",
    ]  # 86 MHz, power brake; 0 % busy while rank 0 runs on GPU 0
    assert h100["gpus"][0]["throttle"] == ["hw_slowdown", "hw_power_brake"] and h100["gpus"][0]["sm_mhz"] == 86
    assert h100["gpus"][0]["flags"] == ["throttle", "idle"] and h100["gpus"][0]["rank"] == 0
    assert h100["gpus"][1]["flags"] == ["throttle"] and h100["gpus"][1]["rank"] is None
    v100 = nodes["n2"]
    assert v100["flags"] == ["stale"] and v100["gpus"][0]["util_pct"] == 100.0 and v100["gpus"][0]["throttle"] is None
    assert (v100["gpus"][0]["mem_used_mb"], v100["gpus"][0]["mem_total_mb"], v100["gpus"][0]["power_w"]) == (
        3087,
        16384,
        80.0,
    )
    assert nodes["n3"]["gpus"][0]["power_w"] is None and nodes["n3"]["gpus"][0]["name"] == "NVIDIA A100-SXM4-40GB"
    err = nodes["n4"]
    assert err["gpus"][0]["error"] == "fan.speed ERR!" and "gpu-error" in err["flags"]
    for n in report["nodes"]:
        assert n["ranks"][0]["images_per_s"] == pytest.approx(16.0) and n["ranks"][0]["cpu_pct"] == 98.0
        assert n["last_line_age_s"] == pytest.approx(250 - 240, abs=0.1) and n["sample_age_s"] == pytest.approx(249)
        assert "stale" in n["flags"]  # 249 s since the last sample at 10 s intervals
    assert report["stragglers"] == []


def test_a_slow_rank_is_named_in_the_report_and_on_its_node(tmp_path: Path) -> None:
    view = view_of(tmp_path, [None, None, None, None], slow={2: (2.5, 0.01)})
    report = view.report()
    data = report.to_json()
    assert [s["node"] for s in data["stragglers"]] == ["n3"] and data["stragglers"][0]["kind"] == "compute"
    flagged = [n["node"] for n in data["nodes"] if "straggler" in n["flags"]]
    assert flagged == ["n3"]
    assert data["nodes"][2]["ranks"][0]["flags"] == ["straggler"]
    assert data["nodes"][2]["ranks"][0]["speed"] == pytest.approx(1.01 / 2.51, rel=1e-3)
    assert data["nodes"][0]["gpu_error"] == "nvidia-smi: not found in PATH" and data["nodes"][0]["gpus"] == []
    assert data["nodes"][0]["no_gpu"] is True  # none declared: a CPU node, not an error
    assert len(report.speeds) == 4


def test_reading_again_reads_only_what_the_copies_gained(tmp_path: Path) -> None:
    view = view_of(tmp_path, [None, None], slow={})
    before = len(view.detector.speeds)
    view.read_copies()
    assert len(view.detector.speeds) == before == 4
    copy = view.run.path / "nodes" / "n1.log"
    with open(copy, "a") as fh:
        fh.write("2026-12-01T00:00:00.000000Z out [default0]:[rank 0] timing epoch 2 batch 10 steps 10 ")  # torn
    view.read_copies()
    assert len(view.detector.speeds) == before


def test_the_screen_shows_nodes_gpus_and_stragglers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from orchestrator.cli import render

    view = view_of(tmp_path, ["h100x8", "v100x8", "a100", "err"], slow={1: (3.0, 0.01)})
    buf = io.StringIO()
    monkeypatch.setattr(render.top, "console", lambda stderr=True: Console(file=buf, width=200, color_system=None))
    render.top_table(view.report(), gpus=False)
    text = buf.getvalue()
    assert "8× NVIDIA H100 80GB HBM3" in text and "throttle" in text and "gpu-error" in text
    assert "straggler: rank 1 on n2 at 0.34× the median" in text
    assert "straggler (compute-bound)" in text  # the flag says what it was named for: V100 0 is 100 % busy
    buf.truncate(0)
    render.top_table(view.report(), gpus=True)
    assert text.count("n1") < buf.getvalue().count("n1") and "86 MHz" in buf.getvalue()
    assert "straggler (compute-bound)" in buf.getvalue()


def test_the_flag_of_a_rank_waiting_on_others_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from orchestrator.cli import render

    view = view_of(tmp_path, ["v100x8", "v100x8"], slow={1: (3.0, 0.01)})
    # n2's GPU 0 barely busy: the recorded V100 row at 7 % (a rank whose forward waits in a collective)
    copy = view.run.path / "nodes" / "n2.log"
    lines = []
    for line in copy.read_text().splitlines():
        head, sep, body = line.partition(" orch telemetry ")
        if sep:
            sample = json.loads(body)
            sample["gpus"][0]["util_pct"] = 7.0
            line = head + sep + json.dumps(sample)
        lines.append(line + "\n")
    copy.write_text("".join(lines))
    view = TopView(view.run, view.run.inventory(), clock=lambda: TS0 + 250)
    view.read_copies()
    report = view.report()
    assert [s.kind for s in report.stragglers] == ["waiting"]
    buf = io.StringIO()
    monkeypatch.setattr(render.top, "console", lambda stderr=True: Console(file=buf, width=200, color_system=None))
    render.top_table(report, gpus=False)
    assert "straggler (waiting on others)" in buf.getvalue()
    assert "waiting on others: GPU 0 on n2 is 7 % busy" in buf.getvalue()


def test_the_live_view_off_a_terminal_prints_each_refresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from orchestrator.cli import render

    view = view_of(tmp_path, [None, None])
    buf = io.StringIO()
    monkeypatch.setattr(render.top, "console", lambda stderr=True: Console(file=buf, width=160, color_system=None))
    render.top_live(iter([view.report(), view.report()]), gpus=False)
    assert buf.getvalue().count("run 20261130-093200-toptest: running") == 2


def test_a_line_that_is_not_a_finite_record_is_ignored_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank printing `wall_s 1e999` in the window that starts its slow streak (the line that took
    `orch up` down with an OverflowError, and every later `orch top` with it): the line is ignored,
    counted, said; the straggler is named from the windows that are records."""
    from rich.console import Console

    from orchestrator.cli import render

    run = make_top_run(tmp_path, [None, None, None], ts0=TS0, slow={2: (2.5, 0.01)})
    copy = run.path / "nodes" / "n3.log"
    lines = copy.read_text().splitlines(keepends=True)
    bad = [i for i, ln in enumerate(lines) if "timing epoch 1 batch 10 " in ln][0]
    broken = [
        lines[bad].replace("wall_s 5", "wall_s 1e999"),
        lines[bad].replace("batch 10 ", "batch 11 ").replace("compute_s 2.5", "compute_s -1"),
        lines[bad].replace("batch 10 ", "batch 12 ").replace("steps 10", "steps " + "9" * 400),
        lines[bad]
        .replace("batch 10 ", "batch 13 ")
        .replace("data_s 0.01", "data_s 1e308")
        .replace("compute_s 2.5", "compute_s 1e308"),
    ]
    lines[bad : bad + 1] = broken
    lines.append(lines[1].replace('"cpu_pct":50.0', '"cpu_pct":1' + "0" * 400))  # float() of it overflows
    copy.write_text("".join(lines))
    view = TopView(run, run.inventory(), clock=lambda: TS0 + 250)
    view.read_copies()
    report = view.report()
    data = json.loads(json.dumps(report.to_json(), allow_nan=False))
    assert data["ignored_lines"] == 5
    assert [s["node"] for s in data["stragglers"]] == ["n3"] and data["stragglers"][0]["windows"] == 2
    buf = io.StringIO()
    monkeypatch.setattr(render.top, "console", lambda stderr=True: Console(file=buf, width=200, color_system=None))
    render.top_table(report, gpus=False)
    assert "5 lines of the node logs ignored: not a finite telemetry or timing record" in buf.getvalue()


def test_orch_top_once_is_the_librarys_one_look(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI parses and shows; the look itself (open the run, fetch, read the copies, report) is
    `top.top_once`, the one definition of it."""
    from orchestrator import top
    from orchestrator.cli import main
    from orchestrator.top import TopReport

    asked = []
    canned = TopReport("20261130-093200-toptest", "running", TS0, 10.0, [], [])
    monkeypatch.setattr(top, "top_once", lambda run_id: asked.append(run_id) or canned)
    with pytest.raises(SystemExit) as info:
        main(["top", "--json", "0932"])
    assert info.value.code == 0 and asked == ["0932"]
    assert json.loads(capsys.readouterr().out) == canned.to_json()


def test_each_refresh_fetches_then_reads_what_the_copies_gained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`TopView.frames`: the live view's refreshes, one cluster for all of them, `interval` apart."""
    import contextlib
    import itertools

    view = view_of(tmp_path, [None, None])
    done: list[str] = []
    monkeypatch.setattr(view, "inv_cluster", lambda: contextlib.nullcontext("cluster"))
    monkeypatch.setattr(view, "fetch", lambda cluster: done.append(f"fetch {cluster}"))
    frames = view.frames(2.5, sleep=lambda s: done.append(f"sleep {s}"))
    reports = list(itertools.islice(frames, 2))
    assert done == ["fetch cluster", "sleep 2.5", "fetch cluster"]
    assert [r.run for r in reports] == ["20261130-093200-toptest"] * 2 and len(reports[1].nodes) == 2


def test_a_cpu_node_shows_it_has_no_gpu_not_a_missing_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 54.10: a node without nvidia-smi and without `gpus:` is a CPU node; its GPU column said
    `nvidia-smi: not found in PATH`."""
    from rich.console import Console

    from orchestrator.cli import render

    view = view_of(tmp_path, [None, "v100x8"])
    buf = io.StringIO()
    monkeypatch.setattr(render.top, "console", lambda stderr=True: Console(file=buf, width=200, color_system=None))
    for per_gpu in (False, True):
        render.top_table(view.report(), gpus=per_gpu)
    text = buf.getvalue()
    assert text.count("no GPU (CPU node)") == 2 and "not found in PATH" not in text, text
