"""The test cluster itself: real sshd nodes, per-node env/FS/clock, chronyd, namespaces, cleanup."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import ntplib
import pytest

from orchestrator.config import inventory
from orchestrator.errors import TransportError
from orchestrator.transport import Cluster, SSHTransport
from tests.cluster import TestCluster, cluster_pids, leftovers

MODES = [pytest.param("loopback"), pytest.param("netns", marks=pytest.mark.netns)]


def _cluster_of(c: TestCluster) -> Cluster:
    return Cluster(inventory.load(c.write_inventory()))


@pytest.mark.parametrize("mode", MODES)
def test_every_node_answers_as_itself(cluster_in, mode):
    c = cluster_in(mode)
    with _cluster_of(c) as cl:
        names = cl.fan_out(lambda t: t.run(["sh", "-c", "echo $ORCH_TEST_NODE"]).check().stdout.strip())
        hosts = cl.fan_out(lambda t: t.run(["hostname"]).check().stdout.strip())
    assert names == {f"node{i}": f"node{i}" for i in range(1, 5)}
    if mode == "netns":  # own UTS namespace: hostname = node name
        assert hosts == names
    else:
        assert len(set(hosts.values())) == 1


@pytest.mark.parametrize("mode", MODES)
def test_node_local_dir_is_private_to_its_node(cluster_in, mode):
    c = cluster_in(mode)
    c.node("node3").local_dir.joinpath("data.yaml").write_text("names: [a]\n")
    with _cluster_of(c) as cl:
        seen = cl.fan_out(
            lambda t: t.run(
                ["sh", "-c", f"cat {TestCluster.NODE_LOCAL}/data.yaml 2>/dev/null || echo absent"]
            ).stdout.strip()
        )
    assert seen == {"node1": "absent", "node2": "absent", "node3": "names: [a]", "node4": "absent"}
    assert c.exec("node3", ["cat", f"{TestCluster.NODE_LOCAL}/data.yaml"]).stdout == "names: [a]\n"
    assert c.exec("node1", ["ls", TestCluster.NODE_LOCAL]).stdout == ""


def test_set_env_tz_seen_by_remote_date(cluster):
    cluster.set_env("node2", TZ="Asia/Shanghai")
    with _cluster_of(cluster) as cl:
        zones = cl.fan_out(
            lambda t: t.run(["date", "+%Z"]).check().stdout.strip(), nodes=[cl.inv.node("node1"), cl.inv.node("node2")]
        )
    assert zones["node2"] == "CST"
    assert zones["node1"] != "CST"


def test_node_env_given_at_start(make_cluster):
    c = make_cluster(2, node_env={"node2": {"NCCL_SOCKET_IFNAME": "ens2f1"}})
    with _cluster_of(c) as cl:
        got = cl.fan_out(lambda t: t.run(["sh", "-c", "echo ${NCCL_SOCKET_IFNAME:-unset}"]).stdout.strip())
    assert got == {"node1": "unset", "node2": "ens2f1"}


def test_faketime_skews_one_node_clock(cluster):
    cluster.skew_clock("node4", "+2s")
    probe = ["python3", "-c", "import time; print(repr(time.time()))"]
    with _cluster_of(cluster) as cl:
        cl.fan_out(lambda t: t.connect())
        t0 = time.time()
        skewed = float(cl["node4"].run(probe).check().stdout)
        t1 = time.time()
        plain = float(cl["node1"].run(probe).check().stdout)
        t2 = time.time()
        # the login still works normally under libfaketime: a shell pipeline, sleep and exit code
        shell = cl["node4"].run(["sh", "-c", "sleep 0.1; echo ok | tr a-z A-Z; exit 3"])
    # the remote clock was read between t0 and t1 on ours: shifted by 2 s, within a little slack
    assert t0 + 2 - 0.05 <= skewed <= t1 + 2 + 0.05
    assert t1 - 0.05 <= plain <= t2 + 0.05
    assert (shell.exit_code, shell.stdout) == (3, "OK\n")


def test_chronyd_serves_time_without_upstream(cluster):
    host, port = cluster.ntp_server.rsplit(":", 1)
    resp = ntplib.NTPClient().request(host, port=int(port), version=3, timeout=2)
    assert resp.stratum == 8  # `local stratum 8`: serves its own clock
    assert abs(resp.offset) < 0.05


@pytest.mark.parametrize("mode", MODES)
def test_chronyd_reachable_from_a_node_over_ssh(make_cluster, mode):
    cluster = make_cluster(2, mode)
    host, port = cluster.ntp_server.rsplit(":", 1)
    code = (
        f"import json,ntplib; r=ntplib.NTPClient().request({host!r}, port={port}, version=3, timeout=2); "
        "print(json.dumps([r.stratum, r.offset]))"
    )
    with _cluster_of(cluster) as cl:
        out = cl["node2"].run([cluster.python, "-c", code]).check().stdout
    stratum, offset = json.loads(out)
    assert stratum == 8 and abs(offset) < 0.05


def test_inventory_matches_cluster_and_merges_overrides(cluster, tmp_path):
    path = cluster.write_inventory(
        tmp_path / "inv.yaml",
        env={"NCCL_DEBUG": "WARN"},
        job={"nproc_per_node": 2},
        nodes_extra={"node3": {"gpus": 8}},
        checks={"clock": {"max_offset_ms": 20}},
        master={"node": "node2"},
    )
    inv = inventory.load(path)
    assert [n.name for n in inv.nodes] == ["node2", "node1", "node3", "node4"]
    assert {n.name: (n.host, n.ssh.port) for n in inv.nodes} == {n.name: (n.host, n.port) for n in cluster.nodes}
    assert inv.node("node3").gpus == 8 and inv.node("node1").gpus is None
    assert inv.env["NCCL_DEBUG"] == "WARN" and inv.node("node1").nproc_per_node == 2
    assert inv.checks.clock.ntp_server == cluster.ntp_server and inv.checks.clock.max_offset_ms == 20
    assert inv.job.python == cluster.python
    assert inv.nodes[0].ssh.host_key_policy == "strict"
    assert (
        inventory.load(
            cluster.write_inventory(tmp_path / "b.yaml", checks={"clock": {"ntp_server": None}})
        ).checks.clock.ntp_server
        is None
    )


def test_a_root_that_does_not_exist_yet_is_made(cluster_keys, tmp_path):
    """What the benchmarks do (bench/launch_latency.py, fabric.py, check_fanout.py): a cluster
    rooted in a directory of their temporary one, not made yet."""
    with TestCluster(cluster_keys, n=2, mode="loopback", root=tmp_path / "bench" / "c") as c:
        inv = inventory.load(c.write_inventory(only=["node2"]))
        assert [n.name for n in inv.nodes] == ["node2"]
        with SSHTransport(inv.node("node2")) as t:
            assert t.run(["true"]).ok
        with pytest.raises(AssertionError, match=r"no node \['node9'\]"):
            c.write_inventory(only=["node9"])


def test_stop_and_start_node(cluster):
    cluster.stop_node("node2")
    inv = inventory.load(cluster.write_inventory())
    with pytest.raises(TransportError) as err, SSHTransport(inv.node("node2")) as t:
        t.connect()
    assert err.value.kind == "unreachable"
    cluster.start_node("node2")
    with SSHTransport(inv.node("node2")) as t:
        assert t.run(["true"]).ok


def test_processes_finds_detached_grandchildren_per_node(cluster):
    marker = "run-20261130-abcdef"
    with _cluster_of(cluster) as cl:
        # a detached grandchild (setsid, double fork) that outlives the SSH session
        cl["node2"].run(["sh", "-c", f"setsid sh -c 'sleep 300; : {marker}' </dev/null >/dev/null 2>&1 &"]).check()
        cl["node3"].run(["sh", "-c", "setsid sleep 301 </dev/null >/dev/null 2>&1 &"], env={"ORCH_RUN": marker}).check()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not (
        cluster.processes("node2", marker) and cluster.processes("node3", marker)
    ):
        time.sleep(0.05)
    assert len(cluster.processes("node2", marker)) == 1  # via its command line
    assert len(cluster.processes("node3", marker)) == 1  # via its environment
    assert cluster.processes("node1", marker) == []
    assert cluster.processes("node2", "no-such-marker") == []


@pytest.mark.parametrize("mode", MODES)
def test_stop_leaves_nothing_behind(make_cluster, mode):
    c = make_cluster(2, mode)
    cl = _cluster_of(c)
    cl["node1"].run(["sh", "-c", "setsid sleep 600 </dev/null >/dev/null 2>&1 &"]).check()
    c.stop_node("node1")  # its open connection outlives the listener, as with `systemctl stop ssh`
    assert cl["node1"].run(["true"]).ok
    ours = cluster_pids(c.id)
    names = [Path(f"/proc/{p}/cmdline").read_bytes() for p in ours]
    assert any(b"sleep\x00600" in n for n in names)
    # sshd hides its environment under its process title; found by its stderr (the node's log)
    assert any(n.startswith(b"sshd: root") for n in names), names
    assert c.node("node2").sshd.pid in ours  # a listener
    c.stop()
    cl.close()
    assert [x for x in leftovers() if c.id in x or any(f"namespace {n.netns}" in x for n in c.nodes if n.netns)] == []
    assert cluster_pids(c.id) == []
    if mode == "netns":
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert all(n.netns not in names for n in c.nodes)


def test_leftovers_reports_what_a_cluster_did_not_stop(make_cluster):
    """The session-finish check is not vacuous: a stray session process is reported until killed.
    (Its own cluster: the shared ones are still running, and count, until the session ends.)"""
    c = make_cluster(2)
    with _cluster_of(c) as cl:
        cl["node1"].run(["sh", "-c", "setsid sleep 600 </dev/null >/dev/null 2>&1 &"]).check()
    deadline = time.monotonic() + 5
    while not [x for x in leftovers() if "sleep 600" in x] and time.monotonic() < deadline:
        time.sleep(0.05)
    stray = [x for x in leftovers() if "sleep 600" in x]
    assert len(stray) == 1
    ours = {f"process {pid}:" for pid in cluster_pids(c.id)}
    assert any(x.startswith(tuple(ours)) and "sshd" in x for x in leftovers())  # a running cluster counts
    c.stop()
    assert [x for x in leftovers() if x.startswith(tuple(ours)) or "sleep 600" in x] == []


# ----------------------------------------------------------------------------- netns only


@pytest.mark.foreground  # bounds a connect to 3.5 s
@pytest.mark.netns
def test_link_down_makes_node_unreachable_within_connect_timeout(netns_cluster):
    inv = inventory.load(netns_cluster.write_inventory(ssh={"connect_timeout": 2}))
    netns_cluster.link_down("node3")
    start = time.monotonic()
    with pytest.raises(TransportError) as err, SSHTransport(inv.node("node3")) as t:
        t.connect()
    elapsed = time.monotonic() - start
    assert err.value.kind == "unreachable"
    assert elapsed < 2 + 1.5
    netns_cluster.link_up("node3")
    with SSHTransport(inv.node("node3")) as t:
        assert t.run(["hostname"]).check().stdout.strip() == "node3"


@pytest.mark.netns
def test_nodes_reach_each_other_and_chronyd(netns_cluster):
    n2 = netns_cluster.node("node2")
    ping = netns_cluster.exec(
        "node1",
        [netns_cluster.python, "-c", f"import socket; socket.create_connection(('{n2.addr}', 22), 2); print('ok')"],
    )
    assert ping.stdout.strip() == "ok", ping.stderr
    assert netns_cluster.ntp_server.startswith(f"198.18.{netns_cluster.subnet}.254:")


@pytest.mark.netns
def test_add_interface_visible_on_that_node_only(netns_cluster):
    netns_cluster.add_interface("node2", "ens2f1", "10.0.0.2/24")
    netns_cluster.add_interface("node3", "ens2f1", "10.0.0.3/24", up=False)
    inv = inventory.load(netns_cluster.write_inventory())
    code = "cat /sys/class/net/ens2f1/operstate /sys/class/net/ens2f1/flags 2>/dev/null || echo missing"
    with Cluster(inv) as cl:
        got = cl.fan_out(lambda t: t.run(["sh", "-c", code]).stdout.split())
    assert got["node1"] == ["missing"]
    assert int(got["node2"][1], 16) & 1 == 1  # IFF_UP
    assert int(got["node3"][1], 16) & 1 == 0
    addrs = netns_cluster.exec("node2", ["ip", "-4", "-o", "addr", "show", "ens2f1"]).stdout
    assert "10.0.0.2/24" in addrs


@pytest.mark.netns
def test_netem_adds_latency(netns_cluster):
    from tests.cluster import NetemUnsupported, kernel_limit

    n1 = netns_cluster.node("node1")
    try:
        netns_cluster.netem("node1", "delay 200ms")
    except NetemUnsupported as exc:
        kernel_limit(str(exc))
    start = time.monotonic()
    with __import__("socket").create_connection((n1.host, 22), 5):
        pass
    assert time.monotonic() - start >= 0.18
    netns_cluster.netem("node1", "")


@pytest.mark.parametrize("strict", ["", "1"])
def test_what_this_machine_lacks_skips_here_and_fails_under_orch_test_strict(tmp_path, strict):
    """.ci/run sets ORCH_TEST_STRICT=1: a test that cannot run for lack of netns/root/chromium fails
    there; a kernel limit (no tc netem) still skips, saying so."""
    import sys

    (tmp_path / "test_lacks.py").write_text(
        "from tests.cluster import kernel_limit, missing\n"
        "def test_needs_chromium():\n    missing('chromium is not installed')\n"
        "def test_needs_netem():\n    kernel_limit('no sch_netem')\n"
    )
    env = dict(os.environ, ORCH_TEST_STRICT=strict, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rsf",
            "-p",
            "no:cacheprovider",
            "-c",
            os.devnull,
            str(tmp_path / "test_lacks.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    if strict:
        assert proc.returncode == 1 and "1 failed, 1 skipped" in proc.stdout, proc.stdout
        assert "ORCH_TEST_STRICT=1, and this test cannot run: chromium is not installed" in proc.stdout
    else:
        assert proc.returncode == 0 and "2 skipped" in proc.stdout, proc.stdout
    assert "kernel limit, skipped even under ORCH_TEST_STRICT: no sch_netem" in proc.stdout
