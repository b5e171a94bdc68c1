"""`orch logs` end to end on nodes reached through the local transport (no SSH): live follow of
writers at different rates, a silent node, a killed reader, resumption, and the CLI's filters."""

from __future__ import annotations

import json
import os
import signal
import statistics
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli import cli
from orchestrator.logs.fetch import fetch_all, node_sources
from orchestrator.logs.follow import Follower, NodeStream
from orchestrator.logs.lines import LogLine, parse_ts
from orchestrator.logs.merge import LiveMerge
from orchestrator.store import remote_dir
from orchestrator.transport import Cluster
from tests.logs_support import (
    late_inversions,
    make_run,
    reader_pids,
    seqs_by_node,
    start_writer,
    write_state,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("orch_home")]


def follow_all(follower: Follower, stop: threading.Event | None = None) -> list[tuple[float, LogLine]]:
    """Every line the follower releases, with the wall time it came out."""
    return [(time.time(), line) for line in follower.lines(stop)]


@pytest.mark.foreground  # bounds the lag: median 1.6 s, max 5 s
def test_follow_orders_nodes_writing_at_different_rates_and_a_silent_one(tmp_path: Path) -> None:
    names = ["n1", "n2", "n3", "quiet"]
    inv, run = make_run(tmp_path, names)
    rates = {"n1": (120, 0.01), "n2": (40, 0.04), "n3": (12, 0.15)}
    write_state(inv, run, "quiet", "running")  # alive, prints nothing: must not stall the others
    writers = [start_writer(inv, run, n, c, dt) for n, (c, dt) in rates.items()]
    follower = Follower(run, inv, Cluster(inv), watermark=1.0, poll_s=0.1)
    stop_quiet = threading.Timer(3.5, write_state, args=(inv, run, "quiet", "succeeded"))
    stop_quiet.start()
    try:
        out = follow_all(follower)
    finally:
        stop_quiet.cancel()
        for w in writers:
            w.wait(timeout=30)
    lines = [ln for _, ln in out]
    seqs = seqs_by_node([(ln.node, ln.text) for ln in lines])
    for node, (count, _) in rates.items():
        assert seqs[node] == list(range(count)), f"{node}: lines lost, duplicated or reordered"
    bad, inversions = late_inversions(out, LiveMerge.HEARTBEAT_MARGIN)
    assert not bad, f"{len(bad)} lines out of time order although they arrived in time:\n" + "\n".join(bad[:5])
    # Lines come out about a watermark after they were written, not when the silent node ends.
    lag = [emitted - ln.ts for emitted, ln in out if ln.node != "quiet" and ln.ts < out[-1][1].ts - 1.5]
    assert lag and statistics.median(lag) < 1.6 and max(lag) < 5.0, f"lag median {statistics.median(lag):.2f} s"
    # Ranks: trainer prefix, or base_rank + local_rank from the static plan (2 workers per node).
    worker = [ln for ln in lines if " seq=" in ln.text]
    assert all(ln.rank == 2 * ln.node_rank + (ln.local_rank or 0) for ln in worker)
    assert all(not ln.text.startswith("[") for ln in worker)
    # The copies are byte for byte the nodes' logs; merged.log holds every line once.
    for src in node_sources(run, inv):
        remote = Path(os.path.expanduser(src.remote_dir)) / "node.log"
        assert src.copy.read_bytes() == (remote.read_bytes() if remote.exists() else b"")
    assert len(run.merged_log.read_text().splitlines()) == len(lines)


@pytest.mark.waits  # mostly waits: runs beside the slow tests (tests/conftest.py)
def test_a_second_follower_gets_the_controllers_lines_said_while_it_follows(tmp_path: Path) -> None:
    """`orch up` names a straggler in controller.log while another shell runs `orch logs -f`: that
    follower merges the line too (it reads controller.log on as it grows), and the one that said
    it has it once, not again from the file."""
    inv, run = make_run(tmp_path, ["a", "b"])
    writers = [start_writer(inv, run, "a", 80, 0.05), start_writer(inv, run, "b", 80, 0.05)]
    second: list[tuple[float, LogLine]] = []
    other = threading.Thread(target=lambda: second.extend(follow_all(Follower(run, inv, Cluster(inv), poll_s=0.1))))
    other.start()
    said = "straggler: rank 1 on b at 0.45x the median for 3 min"
    first = []
    controller = Follower(run, inv, Cluster(inv), poll_s=0.1, write_merged=False)
    for line in controller.lines():
        first.append(line)
        if line.node == "a" and "seq=20 " in line.text + " ":
            controller.say(time.time(), said)
    other.join(timeout=60)
    for w in writers:
        w.wait(timeout=30)
    assert [ln.text for ln in first].count(said) == 1
    got = [ln for _, ln in second if ln.text == said]
    assert len(got) == 1 and got[0].node == "orch" and got[0].stream == "orch", [ln.text for _, ln in second][-5:]
    seqs = seqs_by_node([(ln.node, ln.text) for _, ln in second])
    assert seqs["a"] == list(range(80)) and seqs["b"] == list(range(80))  # nothing lost around it


@pytest.mark.waits  # mostly waits: runs beside the slow tests (tests/conftest.py)
def test_reader_killed_mid_stream_resumes_at_the_byte_offset(tmp_path: Path) -> None:
    inv, run = make_run(tmp_path, ["a", "b"])
    writers = [start_writer(inv, run, "a", 150, 0.02), start_writer(inv, run, "b", 60, 0.05)]
    events: list[tuple[str, str]] = []
    follower = Follower(run, inv, Cluster(inv), watermark=0.5, poll_s=0.1, on_event=lambda n, m: events.append((n, m)))
    node_dir = os.path.expanduser(remote_dir(inv, inv.node("a"), run.run_id))
    killed: list[int] = []

    def kill_reader() -> None:
        for _ in range(2):  # twice, a second apart: each time the stream resumes
            time.sleep(1.0)
            for pid in reader_pids(node_dir):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    killer = threading.Thread(target=kill_reader)
    killer.start()
    out = follow_all(follower)
    killer.join()
    for w in writers:
        w.wait(timeout=30)
    assert len(killed) >= 2
    assert follower.reconnects["a"] >= 2 and any("resuming at byte" in m for n, m in events if n == "a")
    seqs = seqs_by_node([(ln.node, ln.text) for _, ln in out])
    assert seqs["a"] == list(range(150)) and seqs["b"] == list(range(60))


@pytest.mark.foreground  # bounds the stop to 8 s
def test_stop_event_ends_follow_and_leaves_no_reader_behind(tmp_path: Path) -> None:
    inv, run = make_run(tmp_path, ["a"])
    write_state(inv, run, "a", "running")
    stop = threading.Event()
    threading.Timer(1.5, stop.set).start()
    started = time.monotonic()
    assert follow_all(Follower(run, inv, Cluster(inv), poll_s=0.1), stop) == []
    assert time.monotonic() - started < 8
    node_dir = os.path.expanduser(remote_dir(inv, inv.node("a"), run.run_id))
    deadline = time.monotonic() + 5
    while reader_pids(node_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert reader_pids(node_dir) == []


@pytest.mark.foreground  # bounds the give-up to 10 s
def test_a_node_that_never_started_is_given_up_once_the_run_has_ended(tmp_path: Path) -> None:
    inv, run = make_run(tmp_path, ["a", "never"])
    assert start_writer(inv, run, "a", 5, 0.001).wait(timeout=30) == 0
    events: list[tuple[str, str]] = []
    threading.Timer(1.0, run.update, kwargs={"state": "failed"}).start()
    started = time.monotonic()
    lines = list(Follower(run, inv, Cluster(inv), poll_s=0.1, on_event=lambda n, m: events.append((n, m))).lines())
    assert time.monotonic() - started < 10
    assert len([ln for ln in lines if ln.node == "a"]) == 7
    assert [n for n, m in events if "never started" in m] == ["never"]


def test_ctrl_c_ends_orch_logs_follow_with_0_and_stops_the_readers(tmp_path: Path, orch_home: Path) -> None:
    import subprocess
    import sys

    inv, run = make_run(tmp_path, ["a", "b"])
    writer = start_writer(inv, run, "a", 400, 0.02)
    write_state(inv, run, "b", "running")
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "logs", "r1", "--follow"],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, ORCH_HOME=str(orch_home)),
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # something is being followed
        assert " a " in first
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err[-3000:]
    finally:
        proc.kill()
        writer.kill()
        writer.wait()
    for node in ("a", "b"):
        node_dir = os.path.expanduser(remote_dir(inv, inv.node(node), run.run_id))
        deadline = time.monotonic() + 5
        while reader_pids(node_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert reader_pids(node_dir) == [], node


def test_ctrl_c_while_orch_logs_follow_tail_prints_the_backlog_exits_0(tmp_path: Path, orch_home: Path) -> None:
    """Ctrl-C during the first part of `--follow --tail N` (the last N lines, before the live ones)
    ended it as interrupted (130). The backlog outgrows the pipe and the test reads one line, so
    the command is held writing the backlog when the signal comes."""
    import subprocess
    import sys

    inv, run = make_run(tmp_path, ["a"])
    assert start_writer(inv, run, "a", 4000, 0, state="running").wait(timeout=60) == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "logs", "r1", "--follow", "--tail", "4000"],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, ORCH_HOME=str(orch_home)),
    )
    try:
        assert proc.stdout is not None
        assert " a " in proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err[-2000:]
        assert "Traceback" not in err and "Aborted" not in err, err[-2000:]
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.waits  # mostly waits: runs beside the slow tests (tests/conftest.py)
def test_orch_logs_beside_a_live_follower_leaves_its_copies_and_merged_log_whole(tmp_path: Path) -> None:
    inv, run = make_run(tmp_path, ["a", "b"])
    writers = [start_writer(inv, run, "a", 100, 0.02), start_writer(inv, run, "b", 50, 0.04)]
    out: list[LogLine] = []
    follow = threading.Thread(target=lambda: out.extend(Follower(run, inv, Cluster(inv), poll_s=0.1).lines()))
    follow.start()
    deadline = time.monotonic() + 30
    while not out:  # the follower streams: its copies are being written now
        assert time.monotonic() < deadline, "the follower printed nothing"
        time.sleep(0.02)
    side = CliRunner().invoke(cli, ["logs", "r1", "--json"])  # a second process-like reader, mid-run
    follow.join(timeout=60)
    for w in writers:
        w.wait(timeout=30)
    assert side.exit_code == 0 and 0 < len(side.stdout.splitlines()) < len(out)
    assert len(out) == 2 + 100 + 2 + 50
    assert len(run.merged_log.read_text().splitlines()) == len(out)
    for src in node_sources(run, inv):
        remote = Path(os.path.expanduser(src.remote_dir)) / "node.log"
        assert src.copy.read_bytes() == remote.read_bytes()


def test_repeated_fetches_resume_and_never_duplicate(tmp_path: Path) -> None:
    inv, run = make_run(tmp_path, ["a", "b"])
    writers = [start_writer(inv, run, "a", 60, 0.02), start_writer(inv, run, "b", 30, 0.04)]
    with Cluster(inv) as cluster:
        states = []
        while any(w.poll() is None for w in writers):
            states.append(fetch_all(run, inv, cluster))
            time.sleep(0.15)
        states.append(fetch_all(run, inv, cluster))
    assert len(states) > 3 and states[-1] == {"a": "succeeded", "b": "succeeded"}
    for src in node_sources(run, inv):
        remote = Path(os.path.expanduser(src.remote_dir)) / "node.log"
        assert src.copy.read_bytes() == remote.read_bytes()


class TestCommand:
    """`orch logs` through click, on a finished 3-node run."""

    @pytest.fixture
    def finished(self, tmp_path: Path) -> Path:
        inv, run = make_run(tmp_path, ["gpu01", "gpu02", "gpu03"])
        writers = [start_writer(inv, run, n, 10, 0.005) for n in ("gpu01", "gpu02", "gpu03")]
        for w in writers:
            assert w.wait(timeout=30) == 0
        return run.path

    def invoke(self, *args: str) -> tuple[int, str]:
        result = CliRunner().invoke(cli, ["logs", *args], catch_exceptions=False)
        return result.exit_code, result.stdout

    def test_all_lines_merged_and_written_to_the_run_dir(self, finished: Path) -> None:
        code, out = self.invoke("r1")
        lines = [ln for ln in out.splitlines() if ln[:4].isdigit()]
        assert code == 0 and len(lines) == 3 * 12
        stamps = [ln[:27] for ln in lines]
        assert stamps == sorted(stamps)
        assert (finished / "merged.log").read_text().splitlines() == lines
        assert {ln.split()[1] for ln in lines} == {"gpu01", "gpu02", "gpu03"}

    def test_json_filters_and_tail(self, finished: Path) -> None:
        code, out = self.invoke("r1", "--json", "--node", "gpu[02-03]", "--rank", "2-3")
        objs = [json.loads(x) for x in out.splitlines()]
        assert code == 0 and objs and {o["node"] for o in objs} == {"gpu02"}
        assert {o["rank"] for o in objs} == {2, 3} and all(o["local_rank"] in (0, 1) for o in objs)
        assert [parse_ts(o["ts"]) for o in objs] == sorted(parse_ts(o["ts"]) for o in objs)
        _, out = self.invoke("r1", "--json", "--tail", "2")
        per_node = [json.loads(x)["node"] for x in out.splitlines()]
        assert sorted(per_node) == ["gpu01"] * 2 + ["gpu02"] * 2 + ["gpu03"] * 2
        _, out = self.invoke("r1", "--json", "--grep", r"seq=[0-1]$", "--tail", "1")
        assert sorted(json.loads(x)["line"] for x in out.splitlines()) == [f"gpu0{i} seq=1" for i in (1, 2, 3)]

    def test_tail_then_follow_prints_each_line_once(self, finished: Path) -> None:
        code, out = self.invoke("r1", "--json", "--tail", "3", "--follow")
        lines = [(o["node"], o["line"]) for o in map(json.loads, out.splitlines())]
        assert code == 0 and len(lines) == 9 and len(set(lines)) == 9
        assert ("gpu02", "gpu02 seq=9") in lines and ("gpu02", "gpu02 seq=8") in lines

    def test_since(self, finished: Path) -> None:
        _, out = self.invoke("r1", "--json", "--since", "1h")
        assert len(out.splitlines()) == 36
        _, out = self.invoke("r1", "--json", "--since", "2999-01-01T00:00:00")
        assert out == ""

    def test_skew_correction_is_announced_once_and_reorders(self, finished: Path) -> None:
        # gpu02's clock said to be an hour ahead: all its lines belong before the others.
        (finished / "check.json").write_text(json.dumps({"offsets_ms": {"gpu02": 3_600_000.0}}))
        result = CliRunner().invoke(cli, ["logs", "r1"])
        nodes = [ln.split()[1] for ln in result.stdout.splitlines()]
        assert nodes[:12] == ["gpu02"] * 12
        said = " ".join(result.stderr.split())  # the console wraps at its width, wherever the path ends
        assert said.count("clock offsets") == 1 and "gpu02 +3600000.0 ms" in said
        result = CliRunner().invoke(cli, ["logs", "r1", "--no-skew-correct"])
        assert [ln.split()[1] for ln in result.stdout.splitlines()][:12] != ["gpu02"] * 12
        assert "clock offsets" not in result.stderr

    def test_offsets_within_measurement_noise_are_not_announced_unless_verbose(self, finished: Path) -> None:
        # what `orch check` measures between loopback nodes: each "+0.0 ms"
        (finished / "check.json").write_text(json.dumps({"offsets_ms": {"gpu01": 0.04, "gpu02": -0.03, "gpu03": 0.0}}))
        result = CliRunner().invoke(cli, ["logs", "r1"])
        assert result.exit_code == 0 and len(result.stdout.splitlines()) == 36
        assert "clock offsets" not in result.stderr and result.stderr == "", result.stderr
        result = CliRunner().invoke(cli, ["-v", "logs", "r1"])
        assert result.stderr.count("clock offsets") == 1 and "gpu02 -0.0 ms" in result.stderr

    def test_bad_usage_exits_2(self, finished: Path) -> None:
        from orchestrator.cli import main

        for args in (
            ["logs", "nope"],
            ["logs", "r1", "--rank", "x"],
            ["logs", "r1", "--node", "gpu09"],
            ["logs", "r1", "--grep", "("],
            ["logs", "r1", "--since", "later"],
        ):
            with pytest.raises(SystemExit) as exc:
                main(args)
            assert exc.value.code == 2, args


def test_catch_up_merges_the_copies_in_one_pass_up_to_where_every_copy_is_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`orch logs -f` of a long run: the lines every copy is known to hold (up to the earliest
    `.drained` stamp, from the fetch) come out of one k-way merge; only the lines after it, and
    the live stream, go through the watermark merge. Nothing lost, nothing twice, in order."""
    from orchestrator.logs.fetch import drained_path
    from orchestrator.logs.lines import format_ts

    names = ["a", "b", "c"]
    inv, run = make_run(tmp_path, names)
    t0 = time.time() - 600
    for i, name in enumerate(names):
        write_state(inv, run, name, "succeeded")
        d = Path(os.path.expanduser(remote_dir(inv, inv.node(name), run.run_id)))
        (d / "node.log").write_text(
            "".join(f"{format_ts(t0 + k * 0.01 + i * 0.001)} out [default0]:step seq={k}\n" for k in range(3000))
        )
    assert all(isinstance(v, str) for v in fetch_all(run, inv, Cluster(inv)).values())
    sources = {s.node: s for s in node_sources(run, inv)}
    assert all(drained_path(s).exists() for s in sources.values())
    # b's copy is known complete only up to line 2000 (as if fetched earlier than the others)
    drained_path(sources["b"]).write_text(f"{t0 + 20.0 + 0.001 + LiveMerge.HEARTBEAT_MARGIN:.6f}")
    pushed: list[str] = []
    real_push = NodeStream._push

    def counting_push(self: NodeStream, line: LogLine) -> None:
        pushed.append(line.text)
        real_push(self, line)

    monkeypatch.setattr(NodeStream, "_push", counting_push)
    # the order is the merge's own (every node's copy is whole and ends): no timer may release a line
    # ahead of one from a reader the machine starved (a 0.5 s watermark did, once, in CI)
    out = [ln for _, ln in follow_all(Follower(run, inv, Cluster(inv), watermark=60.0, poll_s=0.1))]
    assert seqs_by_node([(ln.node, ln.text) for ln in out]) == {n: list(range(3000)) for n in names}
    keys = [(ln.ts, ln.node_rank) for ln in out]
    assert keys == sorted(keys)
    # every line at or before b's horizon came from the one-pass merge, the rest through the queue
    assert 2900 < len(pushed) < 3100, len(pushed)
    assert len(run.merged_log.read_text().splitlines()) == 9000


def test_without_drain_stamps_catch_up_goes_through_the_live_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.logs.fetch import drained_path
    from orchestrator.logs.lines import format_ts

    inv, run = make_run(tmp_path, ["a", "b"])
    for i, name in enumerate(["a", "b"]):
        write_state(inv, run, name, "succeeded")
        d = Path(os.path.expanduser(remote_dir(inv, inv.node(name), run.run_id)))
        (d / "node.log").write_text("".join(f"{format_ts(1e9 + k + i / 10)} out x{k}\n" for k in range(50)))
    fetch_all(run, inv, Cluster(inv))
    drained_path(node_sources(run, inv)[1]).unlink()  # one node's completeness is unknown
    pushed: list[str] = []
    real_push = NodeStream._push
    monkeypatch.setattr(NodeStream, "_push", lambda self, line: (pushed.append(line.text), real_push(self, line)))
    out = [ln.text for _, ln in follow_all(Follower(run, inv, Cluster(inv), watermark=0.2, poll_s=0.1))]
    assert len(out) == 100 and len(pushed) == 100


@pytest.mark.parametrize(
    ("states", "ended", "code"),
    [
        (("succeeded", "succeeded"), "succeeded", 0),
        (("succeeded", "failed"), "failed", 1),
        (("stopped", "stopped"), "stopped", 130),
    ],
)
def test_follow_ends_with_the_state_the_run_ended_in_and_its_exit_code(
    tmp_path: Path, states: tuple[str, str], ended: str, code: int
) -> None:
    """run.json still says `running` (a detached run nobody asked about): the nodes' own final
    states say how it ended, and the exit code is orch up's for that end."""
    inv, run = make_run(tmp_path, ["a", "b"])
    run.update(state="running")
    writers = [start_writer(inv, run, n, 5, 0.01, state=s) for n, s in zip(("a", "b"), states)]
    for w in writers:
        assert w.wait(timeout=30) == 0
    result = CliRunner().invoke(cli, ["logs", "r1", "--follow"], catch_exceptions=False)
    assert result.stderr.strip().splitlines()[-1] == f"orch: every node's log is drained (run r1: {ended})", (
        result.stderr
    )
    assert result.exit_code == code


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs: needs root")
def test_orch_logs_on_a_full_controller_disk_shows_every_line_and_says_what_it_could_not_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 53.8: $ORCH_HOME's disk fills after the copies were fetched once; the nodes' logs
    grow on. `orch logs` (plain, and filtered: the two ways it merges) shows every line of every
    node, reading what the copies lack from the nodes, exit 0; it says which copy and that
    merged.log could not be written, and leaves merged.log as it was. Once there is room again,
    the same command prints the same bytes and writes them to merged.log."""
    from tests.disk_support import fill, small_disk
    from tests.up_helpers import Orch

    with small_disk(tmp_path / "disk", "2m") as disk:
        monkeypatch.setenv("ORCH_HOME", str(disk))
        inv, run = make_run(tmp_path, ["a", "b"])
        orch = Orch(disk)
        for w in [start_writer(inv, run, n, 1200, 0.0) for n in ("a", "b")]:
            assert w.wait(timeout=60) == 0
        assert orch.run("logs", timeout=60).returncode == 0  # the copies hold these lines
        before = run.merged_log.read_bytes()
        for w in [start_writer(inv, run, n, 1200, 0.0) for n in ("a", "b")]:
            assert w.wait(timeout=60) == 0
        filler = fill(disk)
        try:
            full = orch.run("logs", timeout=60)
            node_a = orch.run("logs", "--node", "a", timeout=60)
            assert run.merged_log.read_bytes() == before
        finally:
            filler.unlink()
        assert full.returncode == 0 and "internal error" not in full.stderr, full.stderr
        said = " ".join(full.stderr.split())
        for node in ("a", "b"):
            assert f"{node}: cannot write {run.node_log(node)}: No space left on device" in said, said
        assert f"cannot write {run.merged_log}: No space left on device" in said, said
        seqs = seqs_by_node([(ln.split()[1], ln) for ln in full.stdout.splitlines()])
        assert seqs == {n: list(range(1200)) * 2 for n in ("a", "b")}
        assert node_a.returncode == 0, node_a.stderr
        assert [ln for ln in full.stdout.splitlines() if ln.split()[1] == "a"] == node_a.stdout.splitlines()
        roomy = orch.run("logs", timeout=60)
        assert roomy.returncode == 0 and "warning" not in roomy.stderr, roomy.stderr
        assert roomy.stdout == full.stdout and run.merged_log.read_text() == full.stdout
