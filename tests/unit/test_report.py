"""The run report, built from a run directory (its rendering in Chromium: tests/local/test_report_chromium.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.logs.trainer import parse_throughput
from orchestrator.report import build_report, read_results_csv
from tests.report_support import RESULTS, card, make_run, node_log


def test_throughput_keeps_the_latest_epoch() -> None:
    tp = parse_throughput(node_log(0).splitlines() + node_log(1).splitlines())
    assert tp.epoch == 2
    assert tp.ips == {0: 20.0, 1: 21.0}
    assert tp.wait_share[1] == pytest.approx(0.125)
    assert (tp.total, tp.efficiency) == (41.0, pytest.approx(0.911))


def test_results_csv_columns_are_stripped() -> None:
    import io
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as fh:
        fh.write(RESULTS)
    cols = read_results_csv(Path(fh.name))
    assert cols["epoch"] == [1, 2, 3]
    assert cols["metrics/mAP50-95(B)"] == [0.001, 0.008, 0.03]
    del io


def test_report_has_every_section_and_its_pngs(tmp_path: Path) -> None:
    run = make_run(tmp_path, failed=True)
    page = build_report(run)
    text = page.read_text()
    for section in (
        "summary",
        "timeline",
        "loss and mAP",
        "throughput",
        "attempts",
        "nodes",
        "configuration",
        "preflight",
        "first failure",
    ):
        assert f"<h2>{section}</h2>" in text
    assert text.count("data:image/png;base64,") == 4
    assert "RuntimeError: boom &lt;&amp;&gt;" in text  # escaped, not injected
    # the cause above the excerpt (in the root-cause box at the top): a killed rank by its signal,
    # not torchrun's exit code
    assert "node node1, rank 1, signal SIGKILL" in text and "exit code 1</" not in text
    assert text.index(">killed by SIGKILL<") < text.index("hint: the OOM killer &lt;usually&gt;") < text.index("<pre>")
    assert "http" not in text.replace("http-equiv", "")  # nothing fetched from the network
    for png in ("timeline.png", "curves.png", "throughput.png", "throughput_nodes.png"):
        data = (page.parent / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    assert page.stat().st_mode & 0o777 == 0o600


def test_report_without_results_or_preflight_says_so(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    (run.path / "results.csv").unlink()
    (run.path / "check.json").unlink()
    for log in (run.path / "nodes").glob("*.log"):  # no trainer lines either: nothing to draw curves from
        log.write_text(log.read_text().splitlines()[0] + "\n")
    text = build_report(run).read_text()
    assert "no data for loss and mAP curves" in text
    assert "no preflight recorded" in text


def test_report_command_fetches_results_and_says_where_everything_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main

    home = tmp_path / "home"
    run = make_run(home / "runs")
    (home / "latest").write_text(run.run_id + "\n")
    (run.path / "results.csv").unlink()
    out_dir = tmp_path / "trainer-out"
    out_dir.mkdir()
    (out_dir / "results.csv").write_text(RESULTS)
    (run.path / "inventory.yaml").write_text("transport: local\nnodes:\n  - host: localhost\n    name: node[0-1]\n")
    with open(run.path / "nodes" / "node0.log", "a") as fh:
        fh.write(
            f"2026-11-30T09:33:00.000000Z out [default0]:[rank 0] done: 3 epochs in 9.0 s; weights in "
            f"{out_dir}/weights, results in {out_dir}/results.csv\n"
        )
    monkeypatch.setenv("ORCH_HOME", str(home))
    with pytest.raises(SystemExit) as exc:
        main(["report"])
    assert exc.value.code == 0
    err = capsys.readouterr().err
    assert f"weights: {out_dir}/weights (on node0)" in err
    assert f"results: {out_dir}/results.csv (on node0)" in err
    assert "report:" in err and "index.html" in err
    assert (run.path / "results.csv").read_text() == RESULTS  # fetched over the (local) transport
    assert "validation mAP" not in (run.path / "report" / "index.html").read_text()  # plots are images
    assert (run.path / "report" / "curves.png").exists()


def test_report_shows_each_ranks_speed_over_time_and_the_straggler(tmp_path: Path) -> None:
    """The detector replayed on the node logs: a heatmap of every rank window by window, and the
    straggler's line (rank 2 on n3 computes 2.5 x as long as the others)."""
    from orchestrator.report import rank_pace
    from tests.telemetry_support import make_top_run

    run = make_top_run(tmp_path, [None, None, "h100x8", None], slow={2: (2.5, 0.01)})
    det = rank_pace(run)
    assert [(s.rank, s.node) for s in det.found] == [(2, "n3")]
    assert det.found[0].kind == "gpu"  # n3's recorded H100s throttle (HW slowdown, power brake)
    assert len(det.speeds) == 4 and det.speeds[0][2][2] == pytest.approx(1.01 / 2.51, rel=1e-3)
    text = build_report(run).read_text()
    assert "<h2>ranks over time</h2>" in text
    assert "straggler: rank 2 on n3 at 0.40× the median" in text and "GPU 0 on n3 throttles" in text
    data = (run.path / "report" / "pace.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_line_that_is_not_a_finite_record_is_ignored_and_counted_on_the_page(tmp_path: Path) -> None:
    """`wall_s 1e999` in the window that starts rank 2's slow streak: the page is written (it
    failed on an OverflowError naming the straggler), the straggler named from the other windows,
    and the page says how many lines it ignored."""
    from tests.telemetry_support import make_top_run

    run = make_top_run(tmp_path, [None, None, None, None], slow={2: (2.5, 0.01)})
    copy = run.path / "nodes" / "n3.log"
    text = copy.read_text().replace(
        "batch 10 steps 10 images 80 data_s 0.01 compute_s 2.5 wall_s 5",
        "batch 10 steps 10 images 80 data_s 0.01 compute_s 2.5 wall_s 1e999",
    )
    copy.write_text(
        text + "2026-11-30T09:33:00.000000Z out [default0]:[rank 2] timing epoch 9 batch 1 steps 1 "
        "images 8 data_s -0.5 compute_s 1 wall_s 2\n"
    )
    page = build_report(run).read_text()
    assert "straggler: rank 2 on n3 at 0.40× the median" in page
    assert "<p id='ignored-lines' class='warn'>2 lines of the node logs ignored" in page


def test_report_without_timing_lines_says_there_is_no_heatmap(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    text = build_report(run).read_text()
    assert "<h2>ranks over time</h2>" in text and "no data for per-rank speed heatmap" in text
    assert not (run.path / "report" / "pace.png").exists()


def test_a_finished_runs_wall_time_is_the_recorded_one_however_late_the_report(tmp_path: Path) -> None:
    """run.json says 52.4 s; the report said 500.1 s (the time since the run was created) and more
    each time it was regenerated."""
    import time

    run = make_run(tmp_path)
    info = run.read()
    info.pop("finished_at")
    run.write({**info, "created": time.time() - 500, "wall_s": 52.4})
    assert "wall time 52.4 s" in build_report(run).read_text()
    assert "wall time 52.4 s" in build_report(run).read_text()
    from orchestrator.report import run_wall

    now = time.time()
    assert run_wall({**info, "created": now - 30, "state": "running", "wall_s": 5.0}, now) == (30.0, True)


def test_orch_report_prints_only_the_pages_path_on_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`xdg-open "$(orch report)"`: stdout is the path alone, every other line on stderr."""
    from orchestrator.cli import main

    home = tmp_path / "home"
    run = make_run(home / "runs")
    (home / "latest").write_text(run.run_id + "\n")
    monkeypatch.setenv("ORCH_HOME", str(home))
    with pytest.raises(SystemExit) as exc:
        main(["report", "latest"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out == f"{(run.path / 'report' / 'index.html').resolve()}\n"


def test_the_summary_card_holds_what_results_csv_and_run_json_say(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    text = build_report(run).read_text()
    values = card(text)
    cols = read_results_csv(run.path / "results.csv")
    best = max(range(len(cols["epoch"])), key=lambda i: cols["metrics/mAP50-95(B)"][i])
    info = run.read()
    assert float(values["best_map50_95"]) == cols["metrics/mAP50-95(B)"][best]
    assert int(values["best_epoch"]) == cols["epoch"][best] == 3
    assert float(values["wall_s"]) == info["wall_s"]
    assert int(values["world_size"]) == sum(n["nproc"] for n in info["nodes"]) == 2
    assert int(values["attempts"]) == info["attempt"] and "2 of 3" in text
    assert values["state"] == "succeeded"
    assert float(values["final_val"]) == 0.0301  # the final validation line of best.pt
    assert values["weights"] == "/srv/runs/train/exp/weights"


def test_a_failed_run_shows_its_root_cause_at_the_top(tmp_path: Path) -> None:
    text = build_report(make_run(tmp_path, failed=True)).read_text()
    banner = text.index("<section id='root-cause'")
    assert banner < text.index("<h2>summary</h2>") < text.index("<h2>timeline</h2>")
    top = text[banner : text.index("</section>", banner)]
    assert ">killed by SIGKILL<" in top and "node node1, rank 1, signal SIGKILL" in top
    assert "hint: the OOM killer &lt;usually&gt;" in top


def test_configuration_masks_env_values_and_preflight_folds_ok_rows(tmp_path: Path) -> None:
    text = build_report(make_run(tmp_path)).read_text()
    config = text[text.index("<h2>configuration</h2>") : text.index("<h2>preflight</h2>")]
    assert "hunter2" not in text and "SECRET_TOKEN=***" in config
    assert "--epochs 3 --batch 16" in config and "node0" in config and "node1" in config
    pre = text[text.index("<h2>preflight</h2>") :]
    folded = pre[pre.index("<details id='preflight-ok'>") : pre.index("</details>")]
    assert "1 ok rows" in folded and ">ssh<" in folded
    assert ">gpus<" in pre[: pre.index("<details")]  # not ok: in view


def test_timeline_phases_and_throughput_per_node_over_the_epochs() -> None:
    from orchestrator.logs.progress import rank0_lines
    from orchestrator.logs.trainer import parse_phases, parse_throughput_epochs
    from orchestrator.report import node_throughput
    from orchestrator.store import NodeRecord

    phases = parse_phases(rank0_lines(node_log(0).splitlines()))
    vals = [(p.epoch, p.end - p.start) for p in phases if p.kind == "validation"]
    assert vals == [(1, 4.0), (2, 4.0), (3, 4.0)]
    ckpt = [(p.epoch, p.end - p.start) for p in phases if p.kind == "checkpoint"]
    assert ckpt == [(1, 6.0), (2, 6.0), (3, 11.0)]  # to rank 0's next line (the next epoch, the final val)
    per_node = node_throughput(
        parse_throughput_epochs(node_log(0).splitlines() + node_log(1).splitlines()),
        [NodeRecord("node0", base_rank=0, nproc=1), NodeRecord("node1", base_rank=1, nproc=1)],
    )
    assert per_node == {"node0": {1: (10.0, 0.125), 2: (20.0, 0.125)}, "node1": {1: (11.0, 0.125), 2: (21.0, 0.125)}}


def test_the_heatmaps_time_axis_tells_its_ticks_apart() -> None:
    """A run of under a minute read `0 0 0` in minutes."""
    from orchestrator.report import time_ticks

    ticks, labels, unit = time_ticks([1000.0 + 5 * i for i in range(9)])
    assert (
        unit == "seconds" and labels == ["0", "5", "10", "15", "20", "25", "30", "35", "40"] and ticks == list(range(9))
    )
    _, labels, unit = time_ticks([1000.0 + 0.5 * i for i in range(4)])
    assert labels == ["0.0", "0.5", "1.0", "1.5"]
    _, labels, unit = time_ticks([60.0 * i for i in range(100)])
    assert unit == "minutes" and len(set(labels)) == len(labels) and labels[0] == "0"
    assert time_ticks([])[0] == []


def test_text_from_the_log_is_text_in_every_plot(tmp_path: Path) -> None:
    """A `$` in a metric name (matplotlib would read `$\\foo$` as mathtext and fail on the unknown
    symbol) is drawn as written: every label the log gives a plot is plain text."""
    from trainer.logs import epoch_line

    run = make_run(tmp_path)
    (run.path / "results.csv").unlink()  # the curves come from the log's epoch lines
    t = "2026-11-30T09:34:{:02d}.000000Z out [default0]:[rank 0] "
    with open(run.path / "nodes" / "node0.log", "a") as fh:
        for epoch in (1, 2):
            fh.write(
                t.format(epoch)
                + epoch_line(
                    epoch, 2, {"$\\foo$loss": 1.0 / epoch, "a$b$loss": 2.0, "x^2_{y}loss": 3.0}, {"lr/pg0": 0.001}
                )
                + "\n"
            )
    page = build_report(run)
    assert (page.parent / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from orchestrator import report

    assert report._pyplot().rcParams["text.parse_math"] is False


BIG = "9" * 400
HOSTILE = [  # the trainer's own lines with numbers no float holds, or not finite, or too big to lay out
    f"train epoch {BIG}/3 box_loss 1 lr/pg0 0.1",
    "train epoch 4/3 box_loss 1.7e308 cls_loss -1.7e308 dfl_loss 1e999 lr/pg0 nan",
    f"val epoch 4/3 mAP50 {BIG} mAP50-95 1e999 P nan R -inf box_loss 1e308",
    f"throughput epoch {BIG}: rank  images/s  data-wait",
    f"throughput epoch {BIG}:    0      5.0      1.0%",
    f"throughput epoch 5:    0  {BIG}.5  {BIG}.0%",
    f"throughput epoch 5: total {BIG} images/s over {BIG} ranks, scaling efficiency {BIG}%",
    f"final val best.pt (epoch {BIG}) mAP50 1e999 mAP50-95 nan",
    f"epoch 1/1 batch 1{'0' * 400}/1 box_loss 1 lr 0.1 images/s {BIG} data 1% nonfinite 0 skipped 0",
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_no_trainer_line_a_rank_prints_crashes_the_report(tmp_path: Path, text: str) -> None:
    """What rank 0 prints in the shape of an epoch, validation, throughput or final line, with
    numbers no float holds or none matplotlib can lay out: the page is written, the value a gap."""
    run = make_run(tmp_path)
    (run.path / "results.csv").unlink()
    with open(run.path / "nodes" / "node0.log", "a") as fh:
        fh.write(f"2026-11-30T09:35:00.000000Z out [default0]:[rank 0] {text}\n")
    assert "<h2>summary</h2>" in build_report(run).read_text()


def test_a_results_csv_of_numbers_no_plot_can_lay_out_still_gives_a_page(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    (run.path / "results.csv").write_text(
        "epoch,train/box_loss,metrics/mAP50-95(B),lr/pg0\nnan,1.7e308,nan,1e999\n1,-1.7e308,inf,0.1\n1e400,1,0.5,-inf\n"
    )
    assert "<h2>summary</h2>" in build_report(run).read_text()


def test_a_metric_name_starting_with_an_underscore_keeps_its_place_in_the_legend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """matplotlib leaves a label starting with `_` out of the legend: a metric named so by the log
    would vanish from the plot's key without a word."""
    from orchestrator import report

    figures = []
    monkeypatch.setattr(report, "_png", lambda fig: figures.append(fig) or b"")
    report.plot_curves({"epoch": [1.0, 2.0], "train/_aux_loss": [1.0, 0.5], "train/$x$_loss": [2.0, 1.0]})
    report.plot_node_throughput({"_n1": {1: (10.0, 0.1)}})
    shown = [t.get_text() for fig in figures for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert [t.strip() for t in shown] == ["_aux_loss", "$x$_loss", "_n1", "_n1"]


def test_a_container_run_names_its_runtime_image_and_the_image_id_it_ran(tmp_path: Path) -> None:
    """The configuration section of a container launch: the runtime, the image as written and the
    image ID every node ran (the preflight pins it: a tag may move after the run)."""
    import html as html_lib

    from orchestrator.config import inventory
    from orchestrator.config.container import Pins
    from orchestrator.config.plan import make_plan

    run = make_run(tmp_path)
    text = (
        "name: demo\ntransport: local\nnodes:\n  - host: localhost\n    name: node[0-1]\n"
        "job:\n  module: trainer\n  args: {epochs: 3}\n  container:\n    runtime: podman\n"
        "    image: yolo:latest\n    python: /opt/conda/bin/python\n    mounts: [/data]\n"
    )
    (run.path / "inventory.yaml").write_text(text)
    pinned = "sha256:" + "ab" * 32
    plan = make_plan(inventory.parse(text, "inv.yaml"), run.run_id, nonce="n1", pins=Pins(pinned, {}))
    run.write(plan.to_json(), "plan.json")
    page = html_lib.unescape(build_report(run).read_text())
    assert "podman: yolo:latest (image ID sha256:abababababab" in page, page[page.find("configuration") :][:3000]
    assert "/opt/conda/bin/python" in page and "/data" in page
    data = plan.to_json()
    assert data["nodes"][0]["environment"]["image_id"] == pinned  # type: ignore[index]
    data["nodes"][0]["argv"] = ["podman", "run", "other:1", "/opt/conda/bin/python"]  # type: ignore[index]
    run.write(data, "plan.json")  # what ran is plan.json's environment, not a word of the argv
    assert "(image ID sha256:abababababab" in html_lib.unescape(build_report(run).read_text())
    old = plan.to_json()
    for node in old["nodes"]:  # type: ignore[attr-defined]
        del node["environment"]  # a plan.json written before the environment was recorded
    run.write(old, "plan.json")
    assert "(image ID sha256:abababababab" in html_lib.unescape(build_report(run).read_text())
