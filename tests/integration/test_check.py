"""`orch check` on the real test cluster (real sshd per node, real chronyd, libfaketime).

One test per fault, injected on one named node: exactly that node fails exactly that check, and
a clean cluster passes everything this machine can pass (gpus/rdma are `skip` without hardware).
GPU/RDMA parsing runs on recorded tool output selected per node with ORCH_PROBE_FIXTURES.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.inventory import load
from orchestrator.preflight.runner import CheckReport, run_preflight
from tests.cluster import NetemUnsupported, TestCluster, is_root, kernel_limit, missing
from tests.ports import job_port

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "probe"
ORCH = str(Path(sys.executable).with_name("orch"))
MakeCluster = Callable[..., TestCluster]
# torch is imported once per node by the software check; fault tests that do not need it skip it
FAST = ("software",)


REPO = Path(__file__).resolve().parents[2]
SCRIPT_JOB = {"script": str(REPO / "tests" / "ddp_job.py")}
"""The job of the tests that are about the checks, not the job: a script (its file is checked on
every node); the trainer's own check has its tests (test_check_job.py)."""


def write_inventory(c: TestCluster, **kw: Any) -> Path:
    """The cluster's inventory on a free master port (in loopback mode every node, and every other
    test on this machine, shares one network namespace, so the default 29500 may be in use), with
    a script job unless the test names one; in netns mode with GLOO_SOCKET_IFNAME=eth0 unless the
    test sets it (None: unset), as a cluster whose hostnames resolve to nothing needs."""
    kw.setdefault("master", {"port": job_port()})
    env = {"GLOO_SOCKET_IFNAME": "eth0"} if c.mode == "netns" else {}
    env.update(kw.pop("env", None) or {})
    kw["env"] = {k: v for k, v in env.items() if v is not None} or None
    job = dict(kw.pop("job", None) or {})
    if "module" not in job and "script" not in job:
        job.update(SCRIPT_JOB)
    return c.write_inventory(job=job, **kw)


def preflight(inv_path: Path, skip: Iterable[str] = FAST) -> CheckReport:
    return run_preflight(load(inv_path), skip=list(skip), save=False)


def failures(report: CheckReport) -> set[tuple[str, str]]:
    return {(r.check, r.node) for r in report.results if r.status == "fail"}


def result(report: CheckReport, check: str, node: str) -> dict[str, str]:
    return next(r.to_json() for r in report.results if r.check == check and r.node == node)


def gone(c: TestCluster, marker: str, within: float = 5.0) -> bool:
    """True once no process of the cluster's nodes has marker in its command line or env."""
    deadline = time.monotonic() + within
    while [p for n in c.nodes for p in c.processes(n.name, marker)]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def need_private_fs(c: TestCluster) -> None:
    if not c._private_fs:
        missing("per-node files need root and unshare (mount namespaces)")


def orch_check_json(inv_path: Path, home: Path, *extra: str) -> tuple[int, dict[str, object], str]:
    env = dict(os.environ, ORCH_HOME=str(home), NO_COLOR="1")
    proc = subprocess.run(
        [ORCH, "check", str(inv_path), "--json", *extra], capture_output=True, text=True, env=env, timeout=300
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {}, proc.stderr


def test_clean_cluster_passes_and_hardware_checks_skip(cluster: TestCluster, tmp_path: Path) -> None:
    inv = write_inventory(cluster, job={"workdir": str(cluster.root), "args": {"batch": 8}})
    code, data, err = orch_check_json(inv, tmp_path)
    assert code == 0, (err, data)
    results = data["results"]
    assert isinstance(results, list) and len(results) == 11 * 4
    bad = [r for r in results if r["status"] == "fail"]
    assert not bad, bad
    for r in results:
        if r["check"] == "fabric":  # opt-in: a plain check says how to turn it on, never a silent ok
            assert r["status"] == "skip" and r["detail"].startswith("opt-in:"), r
        elif r["check"] in ("gpus", "rdma", "container"):
            assert r["status"] == "skip" and r["detail"], r
        elif r["check"] != "ssh":  # ssh may warn when this shared 2-core machine is loaded
            assert r["status"] == "ok", r
    saved = json.loads((tmp_path / "checks" / f"{load(inv).name}.json").read_text())
    assert set(saved["offsets_ms"]) == {"node1", "node2", "node3", "node4"}
    assert "NTP server" in saved["offset_reference"]
    assert gone(cluster, "b64decode"), "probes left running"


def test_clock_skewed_with_faketime_against_chronyd(cluster: TestCluster) -> None:
    c = cluster  # the session's, reset after this test (its environment, sshd, known_hosts)
    c.skew_clock("node3", "+2s")
    report = preflight(write_inventory(c))
    assert failures(report) == {("clock", "node3")}
    r = result(report, "clock", "node3")
    assert 1800 <= report.offsets_ms["node3"] <= 2200, r
    assert r["value"].startswith("+") and "chronyc makestep" in r["hint"]
    # without an NTP server the controller measures each node against its own clock over SSH
    report = preflight(write_inventory(c, checks={"clock": {"ntp_server": None}}))
    assert failures(report) == {("clock", "node3")}, [r for r in report.results if r.check == "clock"]
    assert "offset to the controller" in result(report, "clock", "node3")["detail"]
    assert 1800 <= report.offsets_ms["node3"] <= 2200 and abs(report.offsets_ms["node1"]) < 200


def test_the_controllers_own_clock_is_measured_against_the_ntp_server(cluster: TestCluster) -> None:
    """With checks.clock.ntp_server (the test cluster's chronyd), the controller asks it too
    (ntplib): here, on the same machine, it is within a few ms, and every clock row says so. Then
    the measurement itself, in a controller whose clock libfaketime sets 3 s fast: +3000 ms."""
    from tests.cluster import FAKETIME_LIB

    report = preflight(write_inventory(cluster), skip=("software", "job", "ports", "rdma", "gpus", "nccl_env"))
    cc = report.controller_clock
    assert cc is not None and cc.server == cluster.ntp_server and cc.error is None, cc
    assert cc.offset_ms is not None and abs(cc.offset_ms) < 100 and cc.delay_ms is not None
    for node in ("node1", "node2", "node3", "node4"):
        assert (
            f"the controller is {cc.offset_ms:+.1f} ms off {cluster.ntp_server}"
            in result(report, "clock", node)["detail"]
        )
    assert report.to_json("i.yaml")["controller_clock"]["server"] == cluster.ntp_server
    code = (
        "import json,sys; from orchestrator.preflight.controller_clock import measure; "
        "print(json.dumps(measure(sys.argv[1]).to_json()))"
    )
    env = dict(os.environ, LD_PRELOAD=FAKETIME_LIB, FAKETIME="+3s", FAKETIME_DONT_FAKE_MONOTONIC="1")
    proc = subprocess.run(
        [sys.executable, "-c", code, cluster.ntp_server], capture_output=True, text=True, env=env, cwd=REPO, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    skewed = json.loads(proc.stdout)
    assert 2800 <= skewed["offset_ms"] <= 3200, skewed


def test_timezone_differs_on_one_node(make_cluster: MakeCluster) -> None:
    c = make_cluster(4, node_env={"node2": {"TZ": "Asia/Shanghai"}})
    report = preflight(write_inventory(c))
    assert failures(report) == {("timezone", "node2")}
    r = result(report, "timezone", "node2")
    assert "Asia/Shanghai" in r["value"] and "login environment" in r["detail"]


def test_ib_disable_on_one_node_of_an_rdma_cluster(make_cluster: MakeCluster) -> None:
    env = {f"node{i}": {"ORCH_PROBE_FIXTURES": str(FIX / "v100")} for i in range(1, 5)}
    env["node3"]["NCCL_IB_DISABLE"] = "1"
    c = make_cluster(4, node_env=env)
    report = preflight(write_inventory(c, checks={"rdma": {"devices": ["mlx5_0"]}}, env={"NCCL_IB_HCA": "mlx5_0"}))
    assert failures(report) == {("nccl_env", "node3")}
    assert "NCCL_IB_DISABLE=1" in result(report, "nccl_env", "node3")["detail"]
    rdma = result(report, "rdma", "node1")
    assert rdma["status"] == "ok" and "400 Gb/sec (4X NDR) InfiniBand" in rdma["value"] and "TCP" in rdma["detail"]


def test_rdma_ring_over_verbs_when_the_tool_exists(make_cluster: MakeCluster) -> None:
    env = {"node1": "verbs", "node2": "verbs", "node3": "v100"}  # node3 has no ibv_rc_pingpong
    c = make_cluster(3, node_env={n: {"ORCH_PROBE_FIXTURES": str(FIX / s)} for n, s in env.items()})
    report = preflight(
        write_inventory(c, checks={"rdma": {"devices": ["mlx5_0"]}}), skip=("software", "clock", "timezone", "job")
    )
    assert failures(report) == set(), [r for r in report.results if r.status == "fail"]
    one = result(report, "rdma", "node1")
    assert one["status"] == "ok" and "over verbs (ibv_rc_pingpong)" in one["detail"]
    assert "8192000 bytes in 0.01 seconds" in one["detail"]
    # node2's successor runs no verbs server, node3 has no tool: both say they used TCP instead
    assert "TCP" in result(report, "rdma", "node2")["detail"]
    assert "not installed" in result(report, "rdma", "node3")["detail"]
    # node1's server never gets a client (node3 has no tool): it ends with its probe, which
    # notices within about a second that the controller hung up
    assert gone(c, "ibv_rc_pingpong"), "verbs servers left running"


def test_unreachable_node(cluster: TestCluster) -> None:
    c = cluster  # the session's, reset after this test (its environment, sshd, known_hosts)
    c.stop_node("node4")
    report = preflight(write_inventory(c))
    assert failures(report) == {("ssh", "node4")}
    assert "refused" in result(report, "ssh", "node4")["detail"]
    rest = [r for r in report.results if r.node == "node4" and r.check != "ssh"]
    assert rest and all(r.status == "skip" and "not probed" in r.detail for r in rest)


def test_unknown_host_key(cluster: TestCluster) -> None:
    c = cluster  # the session's, reset after this test (its environment, sshd, known_hosts)
    node = c.node("node2")
    lines = c.known_hosts.read_text().splitlines()
    keep = [ln for ln in lines if not ln.startswith((f"[{node.host}]:{node.port} ", f"{node.host} "))]
    assert len(keep) == len(lines) - 1
    c.known_hosts.write_text("\n".join(keep) + "\n")
    report = preflight(write_inventory(c))
    assert failures(report) == {("ssh", "node2")}
    r = result(report, "ssh", "node2")
    assert "host_key_unknown" in r["detail"] and "ssh-keyscan" in r["hint"]


def test_changed_host_key(cluster: TestCluster) -> None:
    c = cluster  # the session's, reset after this test (its environment, sshd, known_hosts)
    node = c.node("node3")
    other = c.keys.new_key("changed-host").with_suffix(".pub").read_text().split()
    name = f"[{node.host}]:{node.port}" if node.port != 22 else node.host
    lines = [ln for ln in c.known_hosts.read_text().splitlines() if not ln.startswith(name + " ")]
    c.known_hosts.write_text("\n".join(lines + [f"{name} {other[0]} {other[1]}"]) + "\n")
    report = preflight(write_inventory(c))
    assert failures(report) == {("ssh", "node3")}
    r = result(report, "ssh", "node3")
    assert "host_key_changed" in r["detail"] and "CHANGED" in r["detail"] and "ssh-keygen -R" in r["hint"]


def test_auth_refused(cluster: TestCluster) -> None:
    c = cluster  # the session's, reset after this test (its environment, sshd, known_hosts)
    wrong = c.keys.new_key("wrong-identity")
    report = preflight(write_inventory(c, nodes_extra={"node2": {"identity": str(wrong)}}))
    assert failures(report) == {("ssh", "node2")}
    r = result(report, "ssh", "node2")
    assert "auth" in r["detail"] and "authorized_keys" in r["hint"]


def test_relative_weights_path(cluster: TestCluster) -> None:
    inv = write_inventory(cluster, job={"workdir": str(cluster.root), "args": {"weights": "yolo12n.pt"}})
    report = preflight(inv)
    assert failures(report) == {("job", "node1")}  # a job-wide problem is reported on the master
    r = result(report, "job", "node1")
    assert "relative path" in r["detail"] and f"weights: {cluster.root}/yolo12n.pt" in r["hint"]


def _data_on_nodes(c: TestCluster, text_for: dict[str, str | None]) -> str:
    for node, text in text_for.items():
        target = c.node(node).local_dir / "data.yaml"
        if text is not None:
            target.write_text(text)
    return f"{c.NODE_LOCAL}/data.yaml"


def test_data_file_missing_on_one_node(cluster: TestCluster) -> None:
    need_private_fs(cluster)
    good = "path: /data\ntrain: images\nnames: {0: person}\n"
    path = _data_on_nodes(cluster, {"node1": good, "node2": good, "node3": None, "node4": good})
    report = preflight(write_inventory(cluster, job={"args": {"data": path}}))
    assert failures(report) == {("job", "node3")}
    assert "does not exist on this node" in result(report, "job", "node3")["detail"]


def test_data_yaml_without_names(cluster: TestCluster) -> None:
    need_private_fs(cluster)
    good = "path: /data\ntrain: images\nnames: {0: person}\n"
    path = _data_on_nodes(
        cluster, {"node1": good, "node2": "path: /data\ntrain: images\n", "node3": good, "node4": good}
    )
    report = preflight(write_inventory(cluster, job={"args": {"data": path}}))
    assert failures(report) == {("job", "node2")}
    assert "has no `names`" in result(report, "job", "node2")["detail"]


def test_batch_not_divisible(cluster: TestCluster) -> None:
    report = preflight(write_inventory(cluster, job={"args": {"batch": 6}}))
    assert failures(report) == {("job", "node1")}
    r = result(report, "job", "node1")
    assert "global batch 6 does not divide by world size 4" in r["detail"] and "4 or 8" in r["hint"]


def test_master_port_taken(cluster: TestCluster) -> None:
    master = cluster.node("node1")
    with socket.socket() as s:
        s.bind((master.addr, 0))
        s.listen()
        port = s.getsockname()[1]
        report = preflight(write_inventory(cluster, master={"port": port}))
    assert failures(report) == {("ports", "node1")}
    assert f"master port {port} is taken" in result(report, "ports", "node1")["detail"]
    assert "not tested" in result(report, "ports", "node2")["detail"]


@pytest.mark.slow
def test_bad_python_path_is_a_software_failure(cluster: TestCluster) -> None:
    inv = write_inventory(cluster, nodes_extra={"node2": {"python": "/nonexistent/bin/python"}})
    report = preflight(inv, skip=())
    assert {c for c, n in failures(report) if n == "node2"} == {"software"}
    assert {n for _, n in failures(report)} == {"node2"}
    assert "/nonexistent/bin/python does not work here" in result(report, "software", "node2")["detail"]


def test_gpu_and_rdma_faults_from_recorded_output(make_cluster: MakeCluster) -> None:
    """Recorded V100 nodes (driver 535) with this machine's torch (a CUDA 13 build): every node
    also fails on the driver torch needs, which is true of such a node, and the fault each set
    carries is named on its node."""
    sets = {
        "node1": "v100",
        "node2": "v100-missing-gpu",
        "node3": "v100-driver-mismatch",
        "node4": "mlx5-port-down",
        "node5": "mlx5-missing",
    }
    c = make_cluster(5, node_env={n: {"ORCH_PROBE_FIXTURES": str(FIX / s)} for n, s in sets.items()})
    inv = write_inventory(
        c,
        nodes_extra={n: {"gpus": 8} for n in sets},
        job={"nproc_per_node": 8},
        checks={"rdma": {"devices": ["mlx5_0"]}},
    )
    report = preflight(inv, skip=("software", "clock", "timezone"))
    assert failures(report) == {("gpus", n) for n in sets} | {("rdma", "node4"), ("rdma", "node5")}
    for node in sets:
        assert "is too old for torch" in result(report, "gpus", node)["detail"], result(report, "gpus", node)
    assert "7 GPUs visible but nproc_per_node is 8" in result(report, "gpus", "node2")["detail"]
    assert "535.104.05 differs from the majority" in result(report, "gpus", "node3")["detail"]
    assert "1: DOWN" in result(report, "rdma", "node4")["detail"]
    assert "mlx5_0 missing" in result(report, "rdma", "node5")["detail"]
    busy = result(report, "gpus", "node1")  # the recorded V100 node runs 8 python ranks: a warning besides
    assert "GPUs 0,1,2,3,4,5,6,7 already in use" in busy["detail"] and "no kernel image" in busy["detail"]


@pytest.mark.slow
@pytest.mark.netns
def test_netns_three_faults_reported_exactly(netns_cluster: TestCluster, tmp_path: Path) -> None:
    c = netns_cluster
    for i, node in enumerate(("node1", "node2", "node3"), start=1):
        c.add_interface(node, "ens2f1", f"10.77.0.{i}/24")
    c.set_env("node2", TZ="Asia/Shanghai")
    c.skew_clock("node3", "+2s")
    inv = write_inventory(c, env={"NCCL_SOCKET_IFNAME": "ens2f1"})
    code, data, err = orch_check_json(inv, tmp_path)
    assert code == 1, err
    results = data["results"]
    assert isinstance(results, list)
    got = {(r["check"], r["node"]) for r in results if r["status"] == "fail"}
    assert got == {("nccl_env", "node4"), ("timezone", "node2"), ("clock", "node3")}, results
    nccl = next(r for r in results if r["check"] == "nccl_env" and r["node"] == "node4")
    assert "no such interface" in nccl["detail"] and "eth0" in nccl["detail"]


@pytest.mark.netns
def test_netns_an_inventory_setting_only_nccl_socket_ifname_is_told_where_gloo_listens(
    netns_cluster: TestCluster,
) -> None:
    """inventory/v100.yaml's env on nodes whose hostname resolves to nothing: every Gloo group would
    listen on loopback and time out in connectFullMesh; the default preflight says so on every
    node, naming the key, and passes once it is set."""
    c = netns_cluster
    for i, node in enumerate(("node1", "node2", "node3", "node4"), start=1):
        c.add_interface(node, "ens2f1", f"10.77.0.{i}/24")
    report = preflight(
        write_inventory(c, env={"NCCL_SOCKET_IFNAME": "ens2f1", "GLOO_SOCKET_IFNAME": None}), skip=("software", "job")
    )
    assert failures(report) == {("nccl_env", f"node{i}") for i in range(1, 5)}, report.results
    row = result(report, "nccl_env", "node2")
    assert "hostname 'node2' resolves to nothing: Gloo would listen on 127.0.0.1 (loopback)" in row["detail"], row
    assert "GLOO_SOCKET_IFNAME=eth0 in the inventory env (the interface of this node's addr" in row["hint"], row
    fixed = preflight(write_inventory(c, env={"NCCL_SOCKET_IFNAME": "ens2f1"}), skip=("software", "job"))
    assert failures(fixed) == set(), [r for r in fixed.results if r.status == "fail"]


@pytest.mark.netns
def test_netns_slow_link_is_an_ssh_warning(netns_cluster: TestCluster) -> None:
    c = netns_cluster
    try:
        c.netem("node2", "delay 150ms")
    except NetemUnsupported as exc:
        kernel_limit(str(exc))
    report = preflight(write_inventory(c, checks={"ssh": {"warn_ms": 600}}), skip=("software", "job"))
    assert failures(report) == set(), [r for r in report.results if r.status == "fail"]
    slow = result(report, "ssh", "node2")
    assert slow["status"] == "warn" and "slower than 600 ms" in slow["detail"], slow
    assert int(slow["value"].split()[0]) >= 600


@pytest.mark.waits  # mostly waits: runs beside the slow tests (tests/conftest.py)
@pytest.mark.netns
def test_netns_link_down_node_is_unreachable(netns_cluster: TestCluster) -> None:
    """The cable is pulled, sshd on the node still runs: packets are lost (a connect timeout),
    not refused, and only that node fails."""
    c = netns_cluster
    c.link_down("node2")
    sshd = c.node("node2").sshd
    assert sshd is not None and sshd.poll() is None
    report = preflight(write_inventory(c, ssh={"connect_timeout": 2}))
    assert failures(report) == {("ssh", "node2")}, [r for r in report.results if r.status == "fail"]
    r = result(report, "ssh", "node2")
    assert "refused" not in r["detail"] and "did not answer within 2 s" in r["detail"], r
    assert sshd.poll() is None, "sshd on node2 must still be running: only its link was down"


def test_v100_inventory_fails_cleanly(tmp_path: Path) -> None:
    """The field guide's inventory names 192.168.1.x, which must never be contacted from here: the
    command runs in a fresh network namespace that has no route at all, so every node fails fast,
    each saying why in words; the table has one row per node and one line for the rest."""
    if not is_root() or not shutil.which("unshare"):
        missing("needs root and unshare for an isolated network namespace")
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, ORCH_HOME=str(tmp_path), NO_COLOR="1", COLUMNS="250")
    v100 = str(repo / "inventory" / "v100.yaml")
    proc = subprocess.run(
        ["unshare", "--net", ORCH, "check", v100, "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    results = data["results"]
    assert {r["status"] for r in results if r["check"] == "ssh"} == {"fail"}
    assert {r["status"] for r in results if r["check"] != "ssh"} == {"skip"} and len(results) == 44
    for r in (r for r in results if r["check"] == "ssh"):
        assert r["detail"].startswith("unreachable: network unreachable: this machine has no route to 192.168.1."), r
        assert "Unknown error" not in r["detail"] and "ip route get 192.168.1." in r["hint"]
    assert set(data["not_probed"]) == {"v100-1", "v100-2", "v100-3", "v100-4"}
    assert "Traceback" not in proc.stderr
    table = subprocess.run(
        ["unshare", "--net", ORCH, "check", v100], capture_output=True, text=True, env=env, timeout=120
    )
    rows = [line for line in table.stdout.splitlines() if " v100-" in line and (" fail " in line or " skip " in line)]
    assert len(rows) == 4 and all(" fail " in line for line in rows), table.stdout
    assert (
        "not probed, so 40 other results skipped: 10 checks (clock, timezone, nccl_env, rdma, gpus, software, "
        "job, ports, container, fabric) on v100-[1-4]"
    ) in table.stdout
    # a name no resolver knows (RFC 6761 .invalid): said so, never `Unknown error -2`
    text = (repo / "inventory" / "v100.yaml").read_text().replace("192.168.1.[11-13]", "gpu-node-[02-04].invalid")
    odd = tmp_path / "names.yaml"
    odd.write_text(text)
    proc = subprocess.run(
        ["unshare", "--net", ORCH, "check", str(odd), "--json", "--only", "ssh"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    ssh = {r["node"]: r for r in json.loads(proc.stdout)["results"]}
    assert ssh["v100-2"]["detail"].startswith("unreachable: cannot resolve the name gpu-node-02.invalid: "), ssh
    assert "getent hosts gpu-node-02.invalid" in ssh["v100-2"]["hint"]


def test_no_env_value_is_on_any_remote_command_line(
    make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The inventory's env reaches the probe (it reports the values), yet no command line sent to
    sshd (what `ps` on the node and `orch -v` show) carries a value."""
    import logging
    import secrets

    import paramiko

    from orchestrator.preflight.facts import collect
    from orchestrator.transport import Cluster

    c = make_cluster(2)
    secret = "s3cr3t-" + secrets.token_hex(8)
    inv = load(write_inventory(c, env={"NCCL_ORCH_TOKEN": secret, "TZ": "Asia/Tokyo"}))
    sent: list[str] = []
    real = paramiko.Channel.exec_command

    def spy(self: paramiko.Channel, command: str | bytes) -> None:
        sent.append(command.decode() if isinstance(command, bytes) else command)
        real(self, command)

    monkeypatch.setattr(paramiko.Channel, "exec_command", spy)
    caplog.set_level(logging.DEBUG)
    with Cluster(inv) as cluster:
        got = collect(inv, cluster, ["ssh", "nccl_env", "timezone", "software"])
    assert len(sent) >= 2 and all("probe" in line or "python" in line for line in sent)
    assert not [line for line in sent if secret in line or "Asia/Tokyo" in line], sent
    assert secret not in caplog.text and "Asia/Tokyo" not in caplog.text
    for n in inv.nodes:
        nf = got[n.name]
        assert nf.ok and not nf.malformed, nf.error
        assert nf.env.get("NCCL_ORCH_TOKEN") == secret and nf.raw["tz"]["TZ"] == "Asia/Tokyo"
