"""The probe session: one SSH command per node per `orch check`, with the clock ping and the
reachability targets on that command's own channel (real sshd nodes, and `transport: local`)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import yaml

from orchestrator.config.inventory import load
from orchestrator.contract import CHECK_NAMES
from orchestrator.preflight.facts import collect
from orchestrator.preflight.runner import run_preflight
from orchestrator.transport import Cluster
from tests.cluster import TestCluster
from tests.integration.test_check import MakeCluster, write_inventory
from tests.ports import job_port

# bash sources ~/.bashrc once for each command sshd starts it for (and not for the scripts it
# runs); the test nodes get a HOME (sshd's SetEnv) whose .bashrc counts those shells per node.
COUNT_SHELLS = 'echo "$ORCH_TEST_NODE" >> {log}\n'


def shells_per_node(log: Path) -> dict[str, int]:
    lines = log.read_text().split() if log.exists() else []
    return {name: lines.count(name) for name in sorted(set(lines))}


def test_one_command_per_node_and_the_clock_over_its_channel(make_cluster: MakeCluster, tmp_path: Path) -> None:
    log = tmp_path / "shells.log"
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text(COUNT_SHELLS.format(log=log))
    names = ["node1", "node2", "node3"]
    c: TestCluster = make_cluster(3, node_env={n: {"HOME": str(home)} for n in names})
    c.skew_clock("node2", "+2s")
    inv = load(
        write_inventory(c, checks={"clock": {"ntp_server": None}}, job={"workdir": str(c.root), "args": {"batch": 3}})
    )
    # the counter counts what it must: two commands over SSH are two shells
    with Cluster(inv) as cluster:
        cluster["node1"].run(["true"]).check()
        cluster["node1"].run(["true"]).check()
    assert shells_per_node(log) == {"node1": 2}, log.read_text()
    log.unlink()

    # without an NTP server the clock check rests on the pings: three of them, still one command
    report = run_preflight(inv, save=False)
    assert shells_per_node(log) == {n: 1 for n in names}, log.read_text()
    assert {(r.check, r.node) for r in report.results if r.status == "fail"} == {("clock", "node2")}
    assert 1900 <= report.offsets_ms["node2"] <= 2100, report.offsets_ms
    assert all(abs(report.offsets_ms[n]) < 50 for n in ("node1", "node3")), report.offsets_ms
    ports = [r for r in report.results if r.check == "ports"]
    assert [r.status for r in ports] == ["ok"] * 3, ports
    assert len(report.results) == len(CHECK_NAMES) * 3

    # every fact comes from that one command: offset, round trip, reachability
    log.unlink()
    with Cluster(inv) as cluster:
        facts = collect(inv, cluster, list(CHECK_NAMES))
    assert shells_per_node(log) == {n: 1 for n in names}, log.read_text()
    for name, nf in facts.items():
        assert nf.ok, nf.error
        assert nf.rtt_ms is not None and 0 < nf.rtt_ms < 1000, (name, nf.rtt_ms)
        assert nf.ssh_offset_ms is not None, name
        kinds = sorted(r["kind"] for r in nf.reach)
        assert kinds == (["ring"] if name == "node1" else ["master", "ring"]), (name, nf.reach)
        assert all(r["ok"] for r in nf.reach), nf.reach
    assert 1900 <= facts["node2"].ssh_offset_ms - facts["node1"].ssh_offset_ms <= 2100  # type: ignore[operator]


def test_probes_end_when_the_controller_hangs_up(cluster: TestCluster) -> None:
    inv = load(write_inventory(cluster))
    with Cluster(inv) as c:
        facts = collect(inv, c, ["ssh", "clock", "ports"])
        assert all(nf.ok for nf in facts.values())
    deadline = time.monotonic() + 5
    while [p for n in cluster.nodes for p in cluster.processes(n.name, "b64decode")]:
        assert time.monotonic() < deadline, "probes still running after the channels closed"
        time.sleep(0.1)


def test_local_transport_session(tmp_path: Path) -> None:
    """`transport: local`: the same session over a local process's stdin and stdout."""
    marker = f"orch-session-test-{os.getpid()}-{time.monotonic_ns()}"
    inv_path = tmp_path / "local.yaml"
    inv_path.write_text(
        yaml.safe_dump(
            {
                "name": "ls",
                "transport": "local",
                "env": {"ORCH_SESSION_TEST": marker},
                "nodes": [
                    {"host": "localhost", "name": "n0", "addr": "127.0.0.1"},
                    {"host": "localhost", "name": "n1", "addr": "127.0.0.1"},
                ],
                "master": {"port": job_port()},
                "checks": {"clock": {"ntp_server": None}},
                "job": {"python": sys.executable, "workdir": str(tmp_path)},
            }
        )
    )
    inv = load(inv_path)
    with Cluster(inv) as c:
        facts = collect(inv, c, ["ssh", "clock", "ports"])
    for name, nf in facts.items():
        assert nf.ok, nf.error
        assert nf.rtt_ms is not None and nf.ssh_offset_ms is not None and abs(nf.ssh_offset_ms) < 50
        assert nf.reach and all(r["ok"] for r in nf.reach), (name, nf.reach)
    assert facts["n0"].raw["env"] == {} and "ORCH_SESSION_TEST" in facts["n0"].raw["inventory_env"]
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _environ_has(pid, marker)], "probe left running"


def _environ_has(pid: str, marker: str) -> bool:
    try:
        return marker.encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
