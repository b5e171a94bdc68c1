"""`orch logs` over real OpenSSH: follow 4 nodes writing at different rates, survive the SSH
connection being killed on the server side (no line lost, none twice), and an unreachable node."""

from __future__ import annotations

import json
import os
import signal
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli import cli
from orchestrator.config.inventory import Inventory, load
from orchestrator.logs.fetch import node_sources
from orchestrator.logs.follow import Follower
from orchestrator.logs.merge import LiveMerge
from orchestrator.store import RunDir, RunStore, remote_dir
from orchestrator.transport import Cluster
from tests.cluster import TestCluster
from tests.logs_support import late_inversions, reader_pids, seqs_by_node, start_writer, write_state

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("orch_home")]


def ppid(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rfind(")") + 2 :].split()[1])


def kill_ssh_session_of(cluster: TestCluster, node: str, pid: int) -> list[int]:
    """SIGKILL the per-connection sshd process(es) between that node's listening sshd and pid:
    the server side of the SSH connection dies, as when a node's sshd session is killed."""
    listener = cluster.node(node).sshd
    assert listener is not None
    chain, cur = [], ppid(pid)
    while cur not in (listener.pid, 1, 0):
        chain.append(cur)
        cur = ppid(cur)
    assert cur == listener.pid and chain, "the reader does not run under this node's sshd"
    for p in chain:
        os.kill(p, signal.SIGKILL)
    return chain


def make_run(cluster: TestCluster, run_id: str = "r1") -> tuple[Inventory, RunDir]:
    inv = load(cluster.write_inventory(job={"nproc_per_node": 2}))
    return inv, RunStore().create(inv, run_id)


@pytest.mark.foreground  # bounds the lag: median 1.6 s, max 5 s
def test_follow_four_ssh_nodes_ordered_within_about_a_second(cluster: TestCluster) -> None:
    inv, run = make_run(cluster)
    rates = {"node1": (250, 0.02), "node2": (125, 0.04), "node3": (50, 0.1), "node4": (20, 0.25)}
    writers = [start_writer(inv, run, n, c, dt) for n, (c, dt) in rates.items()]
    with Cluster(inv) as transports:
        started = time.time()
        out = [(time.time(), ln) for ln in Follower(run, inv, transports, watermark=1.0).lines()]
    for w in writers:
        w.wait(timeout=30)
    lines = [ln for _, ln in out]
    seqs = seqs_by_node([(ln.node, ln.text) for ln in lines])
    assert {n: seqs[n] for n in rates} == {n: list(range(c)) for n, (c, _) in rates.items()}
    bad, inversions = late_inversions(out, LiveMerge.HEARTBEAT_MARGIN)
    assert not bad, f"{len(bad)} lines out of time order although they arrived in time:\n" + "\n".join(bad[:5])
    # Once every node is connected (the first seconds, longer on a loaded machine), a line is on
    # the controller's stdout about a second after the node wrote it.
    lag = [t - ln.ts for t, ln in out if ln.ts > started + 3.0]
    print(
        f"lag over SSH: median {statistics.median(lag):.3f} s, max {max(lag):.3f} s, {len(lag)} lines; "
        f"{inversions} late lines out of order"
    )
    assert statistics.median(lag) < 1.6 and max(lag) < 5.0


@pytest.mark.waits  # mostly waits: runs beside the slow tests (tests/conftest.py)
def test_reconnect_after_the_ssh_connection_is_killed_server_side(cluster: TestCluster) -> None:
    inv, run = make_run(cluster)
    writers = [start_writer(inv, run, "node2", 400, 0.02), start_writer(inv, run, "node1", 80, 0.1)]
    for n in ("node3", "node4"):
        write_state(inv, run, n, "succeeded")  # finished nodes with an empty log
    events: list[tuple[str, str]] = []
    node_dir = os.path.expanduser(remote_dir(inv, inv.node("node2"), run.run_id))
    killed: list[list[int]] = []

    def killer() -> None:
        seen: set[int] = set()
        for _ in range(2):  # each time a new connection's reader is streaming, kill its session
            deadline = time.monotonic() + 15
            fresh: list[int] = []
            while not fresh and time.monotonic() < deadline:
                time.sleep(0.05)
                fresh = [p for p in reader_pids(node_dir) if p not in seen]
            if not fresh:
                return
            seen.update(fresh)
            time.sleep(0.7)
            killed.append(kill_ssh_session_of(cluster, "node2", fresh[0]))

    thread = threading.Thread(target=killer)
    with Cluster(inv) as transports:
        follower = Follower(run, inv, transports, watermark=0.5, on_event=lambda n, m: events.append((n, m)))
        thread.start()
        lines = list(follower.lines())
    thread.join()
    for w in writers:
        w.wait(timeout=30)
    assert len(killed) == 2, "the SSH session was not killed twice"
    assert follower.reconnects["node2"] >= 2, events
    seqs = seqs_by_node([(ln.node, ln.text) for ln in lines])
    assert seqs["node2"] == list(range(400)) and seqs["node1"] == list(range(80))
    texts = [(ln.node, ln.ts, ln.text) for ln in lines]
    assert len(texts) == len(set(texts)), "a line came out twice"
    src = {s.node: s for s in node_sources(run, inv)}["node2"]
    assert src.copy.read_bytes() == (Path(node_dir) / "node.log").read_bytes()


def test_unreachable_node_is_reported_and_its_earlier_copy_shown(cluster: TestCluster) -> None:
    inv, run = make_run(cluster)
    for n in ("node1", "node2", "node3", "node4"):
        assert start_writer(inv, run, n, 5, 0.001).wait(timeout=30) == 0
    first = CliRunner().invoke(cli, ["logs", "r1", "--json"])
    assert first.exit_code == 0 and len(first.stdout.splitlines()) == 4 * 7
    cluster.stop_node("node3")
    try:
        for n in ("node1", "node3"):  # both write more; node3's new lines cannot be fetched
            assert start_writer(inv, run, n, 3, 0.001).wait(timeout=30) == 0
        again = CliRunner().invoke(cli, ["logs", "r1", "--json"])
    finally:
        cluster.start_node("node3")
    assert again.exit_code == 0
    assert "node3: cannot fetch its log" in again.stderr
    per_node = [json.loads(x)["node"] for x in again.stdout.splitlines()]
    assert per_node.count("node1") == 7 + 5 and per_node.count("node3") == 7


@pytest.mark.waits  # mostly waits: runs beside the slow tests (tests/conftest.py)
def test_an_unreachable_node_is_given_up_after_the_run_ended(cluster: TestCluster) -> None:
    inv, run = make_run(cluster)
    for n in ("node1", "node2", "node3"):
        assert start_writer(inv, run, n, 3, 0.001).wait(timeout=30) == 0
    write_state(inv, run, "node4", "running")
    cluster.stop_node("node4")
    events: list[tuple[str, str]] = []
    threading.Timer(1.0, run.update, kwargs={"state": "failed"}).start()
    try:
        with Cluster(inv) as transports:
            started = time.monotonic()
            follower = Follower(
                run, inv, transports, giveup_s=2.0, startup_grace=1.0, on_event=lambda n, m: events.append((n, m))
            )
            lines = list(follower.lines())
    finally:
        cluster.start_node("node4")
    assert time.monotonic() - started < 30
    assert sorted({ln.node for ln in lines}) == ["node1", "node2", "node3"] and len(lines) == 15
    msgs = [m for n, m in events if n == "node4"]
    assert any("reconnecting" in m for m in msgs) and "unreachable for 2 s" in msgs[-1], msgs


@pytest.mark.foreground  # a 2 s heartbeat timeout
@pytest.mark.netns
def test_pulled_cable_is_detected_by_the_missing_heartbeat_and_resumed(netns_cluster: TestCluster) -> None:
    """node2's link goes down for 6 s while it writes: no EOF arrives, only silence. The follower
    notices the missing heartbeats, drops the connection, reconnects once the link is back, and
    resumes at its byte offset."""
    cluster = netns_cluster
    inv, run = make_run(cluster)
    writers = [start_writer(inv, run, "node2", 300, 0.04), start_writer(inv, run, "node1", 100, 0.12)]
    for n in ("node3", "node4"):
        write_state(inv, run, n, "succeeded")
    events: list[tuple[str, str]] = []

    def pull_cable() -> None:
        time.sleep(2.5)
        cluster.link_down("node2")
        time.sleep(6.0)
        cluster.link_up("node2")

    cable = threading.Thread(target=pull_cable)
    with Cluster(inv) as transports:
        follower = Follower(
            run, inv, transports, watermark=0.5, stall_s=2.0, on_event=lambda n, m: events.append((n, m))
        )
        cable.start()
        lines = list(follower.lines())
    cable.join()
    for w in writers:
        w.wait(timeout=30)
    msgs = [m for n, m in events if n == "node2"]
    assert any("no data or heartbeat for 2 s" in m for m in msgs), msgs
    seqs = seqs_by_node([(ln.node, ln.text) for ln in lines])
    assert seqs["node2"] == list(range(300)) and seqs["node1"] == list(range(100))


def test_a_chatty_login_shell_does_not_break_the_log_stream(
    make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    """Users' ~/.bashrc print (conda banners, `pyenv: cannot rehash` when logins race, a welcome
    line): whatever it writes ahead of the reader's frames is skipped, not a protocol error."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text(
        'echo "welcome to $ORCH_TEST_NODE"\necho "pyenv: cannot rehash: shims isn\'t writable" >&2\n'
    )
    c = make_cluster(2, node_env={n: {"HOME": str(home)} for n in ("node1", "node2")})
    inv = load(c.write_inventory(job={"nproc_per_node": 2, "run_root": str(tmp_path / "runs")}))
    run = RunStore().create(inv, "r1")
    for n in ("node1", "node2"):
        assert start_writer(inv, run, n, 5, 0.001).wait(timeout=30) == 0
    got = CliRunner().invoke(cli, ["logs", "r1", "--json"])
    assert got.exit_code == 0, got.output
    assert "cannot fetch" not in got.stderr, got.stderr
    nodes = [json.loads(x)["node"] for x in got.stdout.splitlines()]
    assert nodes.count("node1") == 7 and nodes.count("node2") == 7
    with Cluster(inv) as transports:
        events: list[str] = []
        lines = list(
            Follower(
                run,
                inv,
                transports,
                watermark=0.2,
                from_start=True,
                on_event=lambda node, msg: events.append(f"{node}: {msg}"),
            ).lines()
        )
    assert len(lines) == 14 and not any("reconnecting" in e for e in events), events
