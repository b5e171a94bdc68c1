"""Pure checks on fabricated facts: each fault on one node fails exactly that node's check."""

from __future__ import annotations

import copy
import io
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from orchestrator.cli.render import check_table
from orchestrator.config.inventory import Inventory, parse
from orchestrator.errors import UsageError
from orchestrator.preflight import checks
from orchestrator.preflight.checks import CheckResult, IfSpec
from orchestrator.preflight.facts import NodeFacts, probe_args
from orchestrator.preflight.jobargs import job_files
from orchestrator.preflight.runner import CheckReport, select_checks

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "probe"
NODES = ["n1", "n2", "n3", "n4"]


def inventory(extra: str = "", gpus: bool = False, rdma: bool = False, ntp: bool = True) -> Inventory:
    text = f"""
name: t
nodes:
  - host: 10.0.0.[1-4]
    name: n[1-4]
    {"gpus: 8" if gpus else ""}
master: {{port: 29500}}
checks:
  clock: {{{"ntp_server: 10.0.0.1" if ntp else ""}}}
  rdma: {{devices: {"[mlx5_0]" if rdma else "[]"}}}
job:
  python: /opt/py/bin/python
  workdir: /srv/job
  nproc_per_node: {8 if gpus else 2}
  args:
    model: yolo12n.yaml
    data: /data/coco.yaml
    batch: 64
{extra}
"""
    return parse(text, "t.yaml")


def base_raw(name: str) -> dict[str, Any]:
    return {
        "env": {},
        "inventory_env": [],
        "tz": {
            "TZ": None,
            "localtime": "/usr/share/zoneinfo/Asia/Shanghai",
            "etc_timezone": None,
            "abbr": "CST",
            "utcoffset": "+0800",
        },
        "ifaces": [
            {"name": "lo", "up": True, "ipv4": ["127.0.0.1"]},
            {"name": "ens2f1", "up": True, "ipv4": [f"10.0.0.{name[-1]}"]},
        ],
        "ib": {"devices": {}},
        "gpus": {
            "source": "nvidia-smi",
            "query": {"rc": None, "out": "", "err": "nvidia-smi: not found"},
            "table": {"rc": None, "out": "", "err": "nvidia-smi: not found"},
        },
        "software": {
            "python": "3.10.12",
            "torch": "2.1.0+cu121",
            "cuda": "12.1",
            "nccl": "2.18.1",
            "ultralytics": "8.2.37",
        },
        "ntp": {"server": "10.0.0.1", "offset_ms": 1.5, "delay_ms": 0.4, "errors": []},
        "paths": {
            "data": {
                "path": "/data/coco.yaml",
                "exists": True,
                "is_file": True,
                "size": 20,
                "sha256": "aa" * 32,
                "text": "path: /data\nnames: {0: person}\n",
            }
        },
        "workdir": {"path": "/srv/job", "exists": True, "is_dir": True},
        "listen": {"ring": {"addr": "x", "port": 40000}},
    }


TRAINER_ACCEPTS = {
    "kind": "trainer",
    "rc": 0,
    "err": "",
    "seconds": 3.2,
    "out": json.dumps(
        {
            "trainer_check": 1,
            "ok": True,
            "rank": 0,
            "world_size": 8,
            "local_world_size": 2,
            "launched": True,
            "device": "cpu",
            "amp": "off",
            "model": "yolo12n.yaml",
            "task": "detect",
            "yoloe": False,
            "weights": None,
            "data": "/data/coco.yaml",
            "classes": 1,
            "batch": 64,
            "epochs": 100,
            "device_ids": None,
            "out": "/srv/job/runs/train/preflight-1a2b3c4d",
            "resume": None,
            "resume_epoch": None,
        }
    )
    + "\n",
}
"""What the probe brings back from `python -m trainer --check` on the master (the JSON line as
trainer/check.py prints it)."""


def make_facts(inv: Inventory, edit: dict[str, Any] | None = None) -> dict[str, NodeFacts]:
    """Healthy facts for every node; `edit[node](raw, nf)` injects one fault."""
    out = {}
    names = [n.name for n in inv.nodes]
    for i, node in enumerate(inv.nodes):
        succ = names[(i + 1) % len(names)]
        nf = NodeFacts(node, connect_ms=20, rtt_ms=4, ssh_offset_ms=0.5, raw=base_raw(node.name))
        nf.listen = copy.deepcopy(nf.raw["listen"])
        if node.name == inv.master.name:
            nf.listen["master_port"] = {"port": 29500, "bound": True, "error": None}
            nf.raw["job_check"] = copy.deepcopy(TRAINER_ACCEPTS)
        else:
            nf.reach.append({"kind": "master", "node": "n1", "addr": "10.0.0.1", "port": 29500, "ok": True, "ms": 0.3})
        nf.reach.append({"kind": "ring", "node": succ, "addr": "10.0.0.9", "port": 40000, "ok": True, "ms": 0.2})
        if edit and node.name in edit:
            edit[node.name](nf.raw, nf)
        out[node.name] = nf
    return out


def by(results: list[CheckResult], check: str) -> dict[str, CheckResult]:
    return {r.node: r for r in results if r.check == check}


def only_failure(results: list[CheckResult]) -> set[tuple[str, str]]:
    return {(r.check, r.node) for r in results if r.status == "fail"}


def run(inv: Inventory, facts: dict[str, NodeFacts]) -> list[CheckResult]:
    return checks.run_checks(inv, facts, select_checks(None, None))


def test_clean_cluster_passes_and_hardware_checks_skip() -> None:
    inv = inventory()
    results = run(inv, make_facts(inv))
    assert only_failure(results) == set()
    assert len(results) == 11 * 4  # one result per (check, node)
    skipped = ("gpus", "rdma", "container", "fabric")  # fabric: opt-in; container: the job runs on the host
    assert {r.status for r in results if r.check in skipped} == {"skip"}
    assert all(r.status == "ok" for r in results if r.check not in skipped), [
        r for r in results if r.status != "ok" and r.check not in skipped
    ]


def test_unreachable_node_fails_ssh_and_skips_the_rest() -> None:
    inv = inventory()
    facts = make_facts(inv)
    facts["n3"] = NodeFacts(
        inv.node("n3"),
        error="n3: connection to root@10.0.0.3:22 refused",
        error_kind="unreachable",
        hint="is sshd running on that port?",
    )
    for nf in facts.values():  # nobody reaches n3's ring port
        nf.reach = [r for r in nf.reach if r["node"] != "n3"]
    results = run(inv, facts)
    assert only_failure(results) == {("ssh", "n3")}
    ssh = by(results, "ssh")["n3"]
    assert "refused" in ssh.detail and ssh.hint
    others = [r for r in results if r.node == "n3" and r.check != "ssh"]
    assert len(others) == 10 and all(r.status == "skip" and "not probed" in r.detail for r in others)


def test_unreachable_nodes_fill_one_row_each_in_the_table_and_every_row_in_json() -> None:
    """v100.yaml with its 4 nodes down: 4 ssh rows with their errors and one line for the 40 skipped
    results, not 44 rows; the JSON keeps one result per (check, node) and names who was not probed."""
    inv = inventory()
    facts = {
        n.name: NodeFacts(
            n,
            error=f"{n.name}: cannot resolve the name {n.host}: Name or service not known",
            error_kind="unreachable",
            hint="check host:",
        )
        for n in inv.nodes
    }
    results = run(inv, facts)
    report = CheckReport(results, not_probed={n: f"cannot resolve the name 10.0.0.{n[-1]}" for n in facts})
    data = report.to_json("t.yaml")
    assert len(data["results"]) == 44 and set(data["not_probed"]) == set(NODES)
    buf = io.StringIO()
    check_table(report, Console(file=buf, width=250, no_color=True))
    text = buf.getvalue()
    rows = [line for line in text.splitlines() if any(f" {n} " in line for n in NODES)]
    assert len(rows) == 4 and all("ssh" in rows[0] and "cannot resolve the name" in r for r in rows), text
    assert (
        "not probed, so 40 other results skipped: 10 checks (clock, timezone, nccl_env, rdma, gpus, software, "
        "job, ports, container, fabric) on n[1-4] (why: their ssh rows)"
    ) in text
    assert "preflight failed: 4 fail, 40 skip" in text


def test_clock_over_limit_on_one_node_via_ntp() -> None:
    inv = inventory()
    facts = make_facts(inv, {"n2": lambda raw, nf: raw["ntp"].update(offset_ms=2034.0)})
    results = run(inv, facts)
    assert only_failure(results) == {("clock", "n2")}
    r = by(results, "clock")["n2"]
    assert r.value == "+2034 ms" and "limit 50 ms" in r.detail and "chronyc makestep" in r.hint
    offsets, _, ref = checks.clock_offsets(inv, facts)
    assert offsets["n2"] == 2034.0 and "10.0.0.1" in ref


def test_the_controllers_own_clock_is_reported_in_the_clock_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli.render import skew_note
    from orchestrator.preflight.controller_clock import ControllerClock
    from orchestrator.preflight.runner import save_report
    from orchestrator.store import clock_reference

    inv = inventory()
    facts = make_facts(inv)
    for nf in facts.values():
        nf.controller_clock = ControllerClock("10.0.0.1", 2034.2, 0.8)
    rows = by(run(inv, facts), "clock")
    assert (
        rows["n1"].status == "warn"
        and "the controller is +2034.2 ms off 10.0.0.1: orch logs --since" in rows["n1"].detail
    )
    assert rows["n3"].status == "ok" and "the controller is +2034.2 ms off 10.0.0.1" in rows["n3"].detail
    for nf in facts.values():
        nf.controller_clock = ControllerClock("10.0.0.1", error="timed out")
    assert by(run(inv, facts), "clock")["n1"].status == "warn"
    # without a server: said once that every offset is relative to the controller's own clock
    plain = inventory(ntp=False)
    rows = by(run(plain, make_facts(plain)), "clock")
    assert "relative to the controller's own clock" in rows["n1"].detail
    assert "relative to the controller" not in rows["n2"].detail
    # saved with the report, read back for the merged log's notice
    monkeypatch.setenv("ORCH_HOME", str(tmp_path))
    facts = make_facts(inv, {"n2": lambda raw, nf: raw["ntp"].update(offset_ms=-12.5)})
    offsets, _, ref = checks.clock_offsets(inv, facts)
    save_report(
        inv, CheckReport(run(inv, facts), offsets, ref, controller_clock=ControllerClock("10.0.0.1", -3.25, 0.5))
    )
    assert clock_reference(None, inv.name) == ("NTP server 10.0.0.1", -3.25)
    skew_note(offsets, "checks/t.json", *clock_reference(None, inv.name))
    assert "against NTP server 10.0.0.1, which this controller was -3.2 ms off: n1 +1.5 ms" in capsys.readouterr().err


def test_clock_warns_over_half_and_fails_without_answer() -> None:
    inv = inventory()
    facts = make_facts(
        inv,
        {
            "n2": lambda raw, nf: raw["ntp"].update(offset_ms=-30.0),
            "n4": lambda raw, nf: raw.update(ntp={"server": "10.0.0.1", "errors": ["timed out"]}),
        },
    )
    c = by(checks.check_clock(inv, facts), "clock")
    assert c["n2"].status == "warn" and c["n2"].value == "-30 ms"
    assert c["n4"].status == "fail" and "timed out" in c["n4"].detail
    assert c["n1"].status == "ok"


def test_clock_without_ntp_server_judges_spread_from_ssh_estimates() -> None:
    inv = inventory(ntp=False)

    def skew(raw: dict[str, Any], nf: NodeFacts) -> None:
        nf.ssh_offset_ms = 2000.0

    facts = make_facts(inv, {"n3": skew})
    c = by(checks.check_clock(inv, facts), "clock")
    # each node against the controller (± rtt/2): n3 is 2000 ms off, the others 0.5 ms
    assert c["n3"].status == "fail" and c["n3"].value == "+2000 ms"
    assert {c[n].status for n in ("n1", "n2", "n4")} == {"ok"}
    assert "offset to the controller (SSH round-trip estimate) is +0.5 ms (±2.0)" in c["n1"].detail


def test_clock_without_ntp_server_blames_the_node_that_is_off_even_with_two_nodes() -> None:
    """Against the median of two nodes a 100 ms skew was split in half (50 ms each, a warning on
    both); against the controller the skewed node fails and the other passes."""
    inv = parse(
        inventory(ntp=False).source.replace("10.0.0.[1-4]", "10.0.0.[1-2]").replace("n[1-4]", "n[1-2]"), "t.yaml"
    )

    def skew(raw: dict[str, Any], nf: NodeFacts) -> None:
        nf.ssh_offset_ms = 100.5

    facts = make_facts(inv, {"n2": skew})
    c = by(checks.check_clock(inv, facts), "clock")
    assert c["n2"].status == "fail" and c["n2"].value == "+100 ms", c["n2"]
    assert c["n1"].status == "ok" and c["n1"].value == "+0 ms", c["n1"]
    offsets, unc, ref = checks.clock_offsets(inv, facts)
    assert offsets == {"n1": 0.5, "n2": 100.5} and unc == {"n1": 2.0, "n2": 2.0} and ref.startswith("the controller")


def test_timezone_majority_and_expected() -> None:
    inv = inventory()
    facts = make_facts(inv, {"n4": lambda raw, nf: raw["tz"].update(TZ="UTC", abbr="UTC", utcoffset="+0000")})
    tz = by(checks.check_timezone(inv, facts), "timezone")
    assert tz["n4"].status == "fail" and "majority (3 nodes) is in Asia/Shanghai" in tz["n4"].detail
    assert "timedatectl set-timezone Asia/Shanghai" in tz["n4"].hint and "TZ=UTC" in tz["n4"].hint
    assert {tz[n].status for n in ("n1", "n2", "n3")} == {"ok"}
    inv2 = parse(inv.source.replace("checks:\n", "checks:\n  timezone: Etc/UTC\n"), "t.yaml")
    tz2 = by(checks.check_timezone(inv2, facts), "timezone")
    assert tz2["n4"].status == "ok"  # UTC and Etc/UTC are the same zone
    assert tz2["n1"].status == "fail" and "checks.timezone is Etc/UTC" in tz2["n1"].detail


@pytest.mark.parametrize(
    "value,status",
    [
        ("ens2f1", "ok"),
        ("ens", "ok"),
        ("=ens2f1", "ok"),
        ("=ens2", "fail"),
        ("eth9", "fail"),
        ("^lo,ens", "fail"),
        ("^docker,lo", "ok"),
        ("ib0,ens2f1", "warn"),
    ],
)
def test_socket_ifname_syntax(value: str, status: str) -> None:
    inv = inventory(f"env:\n  NCCL_SOCKET_IFNAME: '{value}'")
    facts = make_facts(inv, {n: (lambda raw, nf: raw["env"].update(NCCL_SOCKET_IFNAME=value)) for n in NODES})
    res = by(checks.check_nccl_env(inv, facts), "nccl_env")
    assert {r.status for r in res.values()} == {status}, res["n1"]


def test_ifname_parse() -> None:
    assert IfSpec.parse("^=docker0,lo") == IfSpec(True, True, ("docker0", "lo"))
    assert IfSpec.parse("eth,ib") == IfSpec(False, False, ("eth", "ib"))
    assert IfSpec.parse("eth0", exact_default=True).exact


def test_interface_missing_or_down_on_one_node() -> None:
    inv = inventory()

    def lacks(raw: dict[str, Any], nf: NodeFacts) -> None:
        raw["ifaces"] = [i for i in raw["ifaces"] if i["name"] != "ens2f1"]

    def down(raw: dict[str, Any], nf: NodeFacts) -> None:
        raw["ifaces"][1].update(up=False)

    edits = {n: (lambda raw, nf: raw["env"].update(NCCL_SOCKET_IFNAME="ens2f1")) for n in NODES}
    facts = make_facts(inv, edits)
    lacks(facts["n2"].raw, facts["n2"])
    down(facts["n4"].raw, facts["n4"])
    res = checks.run_checks(inv, facts, ["nccl_env"])
    assert only_failure(res) == {("nccl_env", "n2"), ("nccl_env", "n4")}
    r = by(res, "nccl_env")
    assert "no such interface" in r["n2"].detail and "have: lo" in r["n2"].detail
    assert "not up" in r["n4"].detail


def test_ib_disable_with_rdma_required_fails_that_node_only() -> None:
    inv = inventory(rdma=True)
    ib = {
        "devices": {
            "mlx5_0": {
                "ports": {
                    "1": {
                        "state": "4: ACTIVE",
                        "phys_state": "5: LinkUp",
                        "rate": "100 Gb/sec (4X EDR)",
                        "link_layer": "InfiniBand",
                    }
                }
            }
        }
    }
    edits = {n: (lambda raw, nf: raw.update(ib=copy.deepcopy(ib))) for n in NODES}
    facts = make_facts(inv, edits)
    facts["n3"].raw["env"]["NCCL_IB_DISABLE"] = "1"
    res = run(inv, facts)
    assert only_failure(res) == {("nccl_env", "n3")}
    r = by(res, "nccl_env")["n3"]
    assert "silently fall back to TCP" in r.detail and "login environment" in r.detail
    assert by(res, "rdma")["n1"].status == "ok" and "100 Gb/sec" in by(res, "rdma")["n1"].value


def test_env_differing_from_majority_is_a_warning_naming_both() -> None:
    inv = inventory()
    facts = make_facts(inv, {"n2": lambda raw, nf: raw["env"].update(NCCL_DEBUG="INFO")})
    r = by(checks.check_nccl_env(inv, facts), "nccl_env")
    assert r["n2"].status == "warn" and "NCCL_DEBUG=INFO here" in r["n2"].detail
    assert "NCCL_DEBUG=unset" in r["n2"].detail and r["n1"].status == "ok"


def gloo_host(addrs: list[str], usable: list[str] | None = None) -> Any:
    """The probe's `gloo_host` fact: the hostname resolves to `addrs`, of which `usable` bind."""
    return lambda raw, nf: raw.update(
        gloo_host={
            "hostname": nf.node.name,
            "addrs": addrs,
            "usable": addrs if usable is None else usable,
            "error": None,
        }
    )


def test_gloo_listening_on_loopback_fails_every_node_of_a_cpu_job_naming_the_key() -> None:
    """inventory/v100.yaml's env: NCCL_SOCKET_IFNAME only. A hostname that resolves to nothing (the
    netns test bed) or to Ubuntu's 127.0.1.1: Gloo listens on loopback on every node."""
    inv = inventory("env:\n  NCCL_SOCKET_IFNAME: ens2f1")
    nowhere = {n: gloo_host([]) for n in NODES} | {"n2": gloo_host(["127.0.1.1"])}
    res = by(checks.check_nccl_env(inv, make_facts(inv, nowhere)), "nccl_env")
    assert {n: r.status for n, r in res.items()} == dict.fromkeys(NODES, "fail")
    assert "hostname 'n1' resolves to nothing: Gloo would listen on 127.0.0.1 (loopback)" in res["n1"].detail
    assert "resolves to 127.0.1.1: Gloo would listen on 127.0.1.1 (loopback)" in res["n2"].detail
    assert (
        "GLOO_SOCKET_IFNAME=ens2f1 in the inventory env (the interface of this node's addr 10.0.0.3)" in res["n3"].hint
    )
    gpus = inventory("env:\n  NCCL_SOCKET_IFNAME: ens2f1", gpus=True)  # the trainer on GPUs: NCCL, no Gloo group
    res = by(checks.check_nccl_env(gpus, make_facts(gpus, nowhere)), "nccl_env")
    assert {r.status for r in res.values()} == {"warn"} and "GLOO_SOCKET_IFNAME=ens2f1" in res["n1"].hint
    gpus_cpu = replace(gpus, job=replace(gpus.job, raw_args={**gpus.job.raw_args, "device": "cpu"}))  # Gloo again
    assert {r.status for r in checks.check_nccl_env(gpus_cpu, make_facts(gpus_cpu, nowhere))} == {"fail"}
    fixed = inventory("env:\n  NCCL_SOCKET_IFNAME: ens2f1\n  GLOO_SOCKET_IFNAME: ens2f1")
    edits = {
        n: (lambda raw, nf: (gloo_host([])(raw, nf), raw["env"].update(GLOO_SOCKET_IFNAME="ens2f1"))) for n in NODES
    }
    assert {r.status for r in checks.check_nccl_env(fixed, make_facts(fixed, edits))} == {"ok"}
    routed = {n: gloo_host([f"10.0.0.{n[-1]}"]) for n in NODES}
    res = by(checks.check_nccl_env(inv, make_facts(inv, routed)), "nccl_env")
    assert res["n4"].status == "ok" and "Gloo would listen on 10.0.0.4 (hostname n4)" in res["n4"].detail


def test_ib_hca_missing() -> None:
    inv = inventory()
    facts = make_facts(inv, {"n1": lambda raw, nf: raw["env"].update(NCCL_IB_HCA="=mlx5_0:1")})
    r = by(checks.check_nccl_env(inv, facts), "nccl_env")
    assert r["n1"].status == "fail" and "mlx5_0:1 not under /sys/class/infiniband" in r["n1"].detail


def _fixture_ib(name: str) -> dict[str, Any]:
    import os

    from orchestrator.node import probe

    old = os.environ.get("ORCH_PROBE_FIXTURES")
    os.environ["ORCH_PROBE_FIXTURES"] = str(FIX / name)
    try:
        return probe.gather_ib()
    finally:
        if old is None:
            del os.environ["ORCH_PROBE_FIXTURES"]
        else:
            os.environ["ORCH_PROBE_FIXTURES"] = old


def _fixture_gpus(name: str) -> dict[str, Any]:
    return {
        "source": f"fixture {name}",
        "query": {"rc": None, "out": "", "err": "absent"},
        "table": {"rc": 0, "out": (FIX / name / "nvidia-smi.txt").read_text(), "err": ""},
    }


def test_rdma_port_down_and_device_missing_from_fixtures() -> None:
    inv = inventory(rdma=True)
    edits = {
        "n1": lambda raw, nf: raw.update(ib=_fixture_ib("v100")),
        "n2": lambda raw, nf: raw.update(ib=_fixture_ib("mlx5-port-down")),
        "n3": lambda raw, nf: raw.update(ib=_fixture_ib("mlx5-missing")),
        "n4": lambda raw, nf: raw.update(ib=_fixture_ib("v100")),
    }
    res = checks.run_checks(inv, make_facts(inv, edits), ["rdma"])
    assert only_failure(res) == {("rdma", "n2"), ("rdma", "n3")}
    r = by(res, "rdma")
    assert "no ACTIVE LinkUp port" in r["n2"].detail and "1: DOWN" in r["n2"].detail
    assert "mlx5_0 missing" in r["n3"].detail
    assert "400 Gb/sec (4X NDR) InfiniBand" in r["n1"].value and "TCP" in r["n1"].detail


def test_rdma_ring_unreachable_fails_the_connecting_node() -> None:
    inv = inventory(rdma=True)
    edits = {n: (lambda raw, nf: raw.update(ib=_fixture_ib("v100"))) for n in NODES}
    facts = make_facts(inv, edits)
    facts["n2"].reach[-1].update(ok=False, error="No route to host")
    r = by(checks.check_rdma(inv, facts), "rdma")
    assert r["n2"].status == "fail" and "No route to host" in r["n2"].detail
    assert r["n1"].status == "ok"


def test_gpus_missing_gpu_and_driver_mismatch_from_fixtures() -> None:
    inv = inventory(gpus=True)
    edits = {
        "n1": lambda raw, nf: raw.update(gpus=_fixture_gpus("v100")),
        "n2": lambda raw, nf: raw.update(gpus=_fixture_gpus("v100-missing-gpu")),
        "n3": lambda raw, nf: raw.update(gpus=_fixture_gpus("v100-driver-mismatch")),
        "n4": lambda raw, nf: raw.update(gpus=_fixture_gpus("v100")),
    }
    res = checks.run_checks(inv, make_facts(inv, edits), ["gpus", "job"])
    # nproc_per_node > visible GPUs is judged once, under gpus (the inventory already refuses
    # nproc_per_node > declared gpus before anything connects)
    assert only_failure(res) == {("gpus", "n2"), ("gpus", "n3")}
    g = by(res, "gpus")
    assert "7 GPUs visible but nproc_per_node is 8" in g["n2"].detail
    assert "driver 535.104.05 differs from the majority (3 nodes: 535.129.03)" in g["n3"].detail
    # the recorded V100 node runs 8 python processes: busy GPUs are a warning
    assert g["n1"].status == "warn" and "pid 1552275 /usr/bin/python3" in g["n1"].detail
    assert g["n1"].value == "8 × Tesla V100-SXM2-16GB, driver 535.129.03"


def test_gpus_absent_nvidia_smi_fails_when_declared() -> None:
    inv = inventory(gpus=True)
    g = by(checks.check_gpus(inv, make_facts(inv)), "gpus")
    assert {r.status for r in g.values()} == {"fail"} and "not found" in g["n1"].detail


def test_software_mismatch_missing_torch_and_bad_python() -> None:
    inv = inventory()

    def fallback(raw: dict[str, Any], nf: NodeFacts) -> None:
        nf.python_fallback = "/opt/py/bin/python could not run the probe: No such file or directory"

    edits = {
        "n2": lambda raw, nf: raw["software"].update(torch="2.2.0+cu121"),
        "n3": lambda raw, nf: raw["software"].update(torch=None, torch_error="ModuleNotFoundError"),
        "n4": fallback,
    }
    s = by(checks.check_software(inv, make_facts(inv, edits)), "software")
    assert s["n1"].status == "ok"
    assert (
        s["n2"].status == "fail"
        and "torch 2.2.0+cu121 differs from the majority (2 nodes: 2.1.0+cu121)" in s["n2"].detail
    )
    assert s["n3"].status == "fail" and "not importable" in s["n3"].detail
    assert s["n4"].status == "fail" and "job.python /opt/py/bin/python does not work here" in s["n4"].detail


def module_answer(found: bool, module: str = "mytrain") -> dict[str, Any]:
    """What the probe brings back from node/findmodule.py for a module job."""
    out = {"module": module, "found": found, "origin": f"/srv/job/{module}.py" if found else None}
    return {"kind": "module", "rc": 0, "out": json.dumps(out) + "\n", "err": "", "seconds": 0.1}


def trainer_refuses(message: str, stage: str = "topology") -> dict[str, Any]:
    out = {"trainer_check": 1, "ok": False, "error": message, "stage": stage}
    return {"kind": "trainer", "rc": 2, "out": json.dumps(out) + "\n", "err": "", "seconds": 0.4}


def test_job_relative_path_and_batch_are_reported_once_on_the_master() -> None:
    """A job-wide problem is said once, on the master's row; the other rows say what they checked
    and that the relative paths were checked nowhere, never `every file argument in place`."""
    text = inventory().source.replace("data: /data/coco.yaml", "data: coco.yaml\n    weights: yolo12n.pt")
    inv = parse(text.replace("batch: 64", "batch: 18").replace("  python:", "  module: mytrain\n  python:"), "t.yaml")
    facts = make_facts(inv, {"n1": lambda raw, nf: raw.update(job_check=module_answer(True))})
    res = checks.run_checks(inv, facts, ["job"])
    assert only_failure(res) == {("job", "n1")}
    r = by(res, "job")["n1"]
    assert "global batch 18 does not divide by world size 8" in r.detail and "16 or 24" in r.hint
    assert "'coco.yaml' is a relative path" in r.detail and "data: /srv/job/coco.yaml" in r.hint
    assert "weights: /srv/job/yolo12n.pt" in r.hint
    assert "model" not in r.detail  # yolo12n.yaml is a built-in config name
    n2 = by(res, "job")["n2"]
    assert n2.status == "ok" and "in place" not in n2.detail.split(";")[1], n2
    assert n2.detail == (
        "workdir /srv/job in place and identical on every node; not checked on any node: data, weights "
        "(relative path: cluster-wide, on n1's row); the job's own check runs on n1"
    )


def test_the_trainers_refusal_is_the_job_finding_and_not_repeated() -> None:
    from trainer.config import check_topology, parse_config
    from trainer.errors import TrainerError

    inv = parse(inventory().source.replace("batch: 64", "batch: 18"), "t.yaml")
    with pytest.raises(TrainerError) as said:  # what the trainer itself says for this batch on 8 ranks
        check_topology(parse_config(list(inv.job.args)), 8, True, 2)
    facts = make_facts(inv, {"n1": lambda raw, nf: raw.update(job_check=trainer_refuses(str(said.value)))})
    res = checks.run_checks(inv, facts, ["job"])
    assert only_failure(res) == {("job", "n1")}
    r = by(res, "job")["n1"]
    assert r.detail == f"the trainer refuses the arguments: {said.value}"
    assert r.detail.count("does not divide") == 1 and "use 16 or 24" in r.detail
    assert "fix job.args in t.yaml" in r.hint


def test_a_typo_in_the_trainers_arguments_is_argparses_line() -> None:
    inv = parse(inventory().source.replace("batch: 64", "batch: 64\n    epocs: 24"), "t.yaml")
    line = "python -m trainer: error: unrecognized arguments: --epocs (did you mean --epochs?)"
    facts = make_facts(inv, {"n1": lambda raw, nf: raw.update(job_check=trainer_refuses(line, "arguments"))})
    r = by(checks.run_checks(inv, facts, ["job"]), "job")["n1"]
    assert (r.status, r.detail) == ("fail", f"the trainer refuses the arguments: {line}")


def test_a_module_that_does_not_import_and_a_trainer_that_cannot_start() -> None:
    inv = parse(inventory().source.replace("  python:", "  module: trainr\n  python:"), "t.yaml")
    facts = make_facts(inv, {"n1": lambda raw, nf: raw.update(job_check=module_answer(False, "trainr"))})
    r = by(checks.run_checks(inv, facts, ["job"]), "job")["n1"]
    assert r.status == "fail"
    assert r.detail == "module trainr is not importable by /opt/py/bin/python in /srv/job: No module named 'trainr'"
    assert r.hint.startswith("did you mean module: trainer?")
    inv = inventory()
    crashed = {
        "kind": "trainer",
        "rc": 1,
        "out": "",
        "seconds": 0.1,
        "err": "/opt/py/bin/python: No module named trainer\n",
    }
    r = by(
        checks.run_checks(inv, make_facts(inv, {"n1": lambda raw, nf: raw.update(job_check=crashed)}), ["job"]), "job"
    )["n1"]
    assert r.status == "fail" and r.detail == (
        "`python -m trainer` cannot start with /opt/py/bin/python in /srv/job:"
        " /opt/py/bin/python: No module named trainer"
    )
    slow = {"kind": "trainer", "rc": None, "out": "", "err": "", "seconds": 90.0, "error": "no answer within 90 s"}
    r = by(checks.run_checks(inv, make_facts(inv, {"n1": lambda raw, nf: raw.update(job_check=slow)}), ["job"]), "job")[
        "n1"
    ]
    assert r.status == "warn" and "no answer within 90 s: not verified" in r.detail


def test_the_job_check_runs_on_the_master_as_its_first_rank_and_never_carries_env_values() -> None:
    from orchestrator.preflight import jobcheck

    inv = parse(inventory().source.replace("nodes:", "env: {NCCL_SECRET: s3cr3t}\nnodes:"), "t.yaml")
    asked = {n.name: jobcheck.request(inv, n, "20261130-093205-t") for n in inv.nodes}
    assert [n for n, req in asked.items() if req] == ["n1"]
    req = asked["n1"]
    assert req is not None and req["inner"][:3] == ["-m", "trainer", "--check"]
    assert req["inner"][3:] == list(inv.job.args) and req["cwd"] == "/srv/job"
    assert probe_args(inv, inv.nodes[0], ["job"], "tok", 4)["job_python"] == ["/opt/py/bin/python"]  # runs it
    assert {k: req["env"][k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ORCH_RUN_ID")} == {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "2",
        "ORCH_RUN_ID": "20261130-093205-t",
    }
    assert "s3cr3t" not in json.dumps(req)
    synced = parse(inv.source.replace("  workdir: /srv/job", "  workdir: /srv/job\n  sync: [/data]"), "t.yaml")
    ranks = [(jobcheck.request(synced, n, "r") or {}).get("env", {}).get("RANK") for n in synced.nodes]
    assert ranks == ["0", "2", "4", "6"]  # copies on every node: each node checked as its first rank


def test_job_data_missing_differs_or_without_names_on_one_node() -> None:
    inv = inventory()
    edits = {
        "n2": lambda raw, nf: raw["paths"]["data"].update(exists=False, is_file=False),
        "n3": lambda raw, nf: raw["paths"]["data"].update(sha256="bb" * 32, text="path: /data\n"),
        "n4": lambda raw, nf: raw["workdir"].update(exists=False, is_dir=False),
    }
    res = checks.run_checks(inv, make_facts(inv, edits), ["job"])
    assert only_failure(res) == {("job", "n2"), ("job", "n3"), ("job", "n4")}
    r = by(res, "job")
    assert "/data/coco.yaml does not exist on this node" in r["n2"].detail
    assert "differs from the majority" in r["n3"].detail and "has no `names`" in r["n3"].detail
    assert "workdir /srv/job does not exist" in r["n4"].detail


def test_job_files_add_an_absolute_script_and_the_sync_entries_once() -> None:
    inv = parse(
        inventory().source.replace(
            "  workdir: /srv/job\n",
            "  workdir: /srv/job\n  script: /srv/job/train.py\n  sync: [/srv/job, /data/coco.yaml, /data/extra.yaml]\n",
        ),
        "t.yaml",
    )
    assert job_files(inv) == {
        "model": "yolo12n.yaml",
        "data": "/data/coco.yaml",
        "script": "/srv/job/train.py",
        "sync[0]": "/srv/job",
        "sync[2]": "/data/extra.yaml",
    }
    relative = parse(
        inventory().source.replace("  workdir: /srv/job\n", "  workdir: /srv/job\n  script: train.py\n"), "t.yaml"
    )
    assert job_files(relative)["script"] == "/srv/job/train.py"  # where torchrun, started in the workdir, finds it


def test_job_synced_files_are_compared_and_the_hint_is_orch_sync() -> None:
    inv = parse(
        inventory().source.replace(
            "  workdir: /srv/job\n",
            "  workdir: /srv/job\n  script: /srv/job/train.py\n  sync: [/srv/job, /data/coco.yaml]\n",
        ),
        "t.yaml",
    )
    script = {"path": "/srv/job/train.py", "exists": True, "is_file": True, "size": 9, "sha256": "cc" * 32}
    work = {"path": "/srv/job", "exists": True, "is_file": False, "is_dir": True}

    def healthy(raw: dict[str, Any], nf: NodeFacts) -> None:
        raw["paths"].update({"script": dict(script), "sync[0]": dict(work)})

    def edit(fault: Any) -> Any:
        return lambda raw, nf: (healthy(raw, nf), fault(raw))

    edits = {n: healthy for n in NODES}
    edits.update(
        {
            "n2": edit(lambda raw: raw["paths"]["script"].update(sha256="dd" * 32)),
            "n3": edit(
                lambda raw: (
                    raw["paths"]["sync[0]"].update(exists=False, is_dir=False),
                    raw["workdir"].update(exists=False, is_dir=False),
                    raw["paths"]["script"].update(exists=False, is_file=False),
                )
            ),
            "n4": edit(lambda raw: raw["paths"]["data"].update(sha256="bb" * 32)),
        }
    )
    res = checks.run_checks(inv, make_facts(inv, edits), ["job"])
    assert only_failure(res) == {("job", "n2"), ("job", "n3"), ("job", "n4")}
    r = by(res, "job")
    assert "script: /srv/job/train.py differs from the majority" in r["n2"].detail
    assert "sync[0]: /srv/job does not exist on this node" in r["n3"].detail
    assert "workdir /srv/job does not exist" in r["n3"].detail
    assert "data: /data/coco.yaml differs from the majority" in r["n4"].detail
    for node in ("n2", "n3", "n4"):
        assert "orch sync copies it to every node" in r[node].hint, node


def test_ports_taken_on_master_and_unreachable_from_one_node() -> None:
    inv = inventory()
    facts = make_facts(
        inv,
        {
            "n1": lambda raw, nf: nf.listen.update(
                master_port={
                    "port": 29500,
                    "bound": False,
                    "error": "Address already in use (errno 98)",
                    "holder": "python3 pid 99",
                }
            )
        },
    )
    p = by(checks.check_ports(inv, facts), "ports")
    assert p["n1"].status == "fail" and "taken by python3 pid 99" in p["n1"].detail and "master.port" in p["n1"].hint
    assert {p[n].status for n in ("n2", "n3", "n4")} == {"ok"} and "not tested" in p["n2"].detail
    facts = make_facts(inv, {"n3": lambda raw, nf: nf.reach[0].update(ok=False, error="Connection refused")})
    p = by(checks.check_ports(inv, facts), "ports")
    assert p["n3"].status == "fail" and "cannot connect to the master at 10.0.0.1:29500" in p["n3"].detail
    assert {p[n].status for n in ("n1", "n2", "n4")} == {"ok"}


def resolves(*addrs: str, error: str | None = None) -> Any:
    return lambda raw, nf: raw.update(master_addr={"addr": "n1", "addrs": list(addrs), "error": error})


def test_the_masters_address_resolving_to_loopback_on_a_node_of_separate_machines_fails_there() -> None:
    """Debian's `127.0.1.1 <hostname>` line on the master: its own name is loopback there, so the
    store, Gloo and NCCL of rank 0 listen where no other node can reach them, while the others'
    connect test passes (they resolve the real address)."""
    inv = inventory()
    edits = {"n1": resolves("127.0.1.1"), **{n: resolves("10.0.0.1") for n in ("n2", "n3", "n4")}}
    p = by(checks.check_ports(inv, make_facts(inv, edits)), "ports")
    assert p["n1"].status == "fail" and "resolves to 127.0.1.1 on this node: loopback (127.0.1.1)" in p["n1"].detail
    assert "127.0.1.1 n1" in p["n1"].hint
    assert {p[n].status for n in ("n2", "n3", "n4")} == {"ok"}
    edits["n3"] = resolves(error="gaierror: [Errno -2] Name or service not known")
    p = by(checks.check_ports(inv, make_facts(inv, edits)), "ports")
    assert p["n3"].status == "fail" and "does not resolve on this node: gaierror" in p["n3"].detail


def test_loopback_is_the_masters_address_where_every_node_is_one_machine() -> None:
    inv = inventory()
    one = [{"name": "lo", "up": True, "ipv4": ["127.0.0.1"]}, {"name": "eth0", "up": True, "ipv4": ["10.9.9.9"]}]

    def same(raw: dict[str, Any], nf: NodeFacts) -> None:
        resolves("127.0.0.1")(raw, nf)
        raw["ifaces"] = one

    p = by(checks.check_ports(inv, make_facts(inv, {n: same for n in NODES})), "ports")
    assert {r.status for r in p.values()} == {"ok"} and "resolves to 127.0.0.1" in p["n2"].detail


def test_one_machine_is_known_by_its_network_stack_not_by_interfaces_that_came_and_went_between_probes() -> None:
    """Four nodes of one machine probed a few ms apart while a container or a netns bed added a veth
    in between: their interface lists differ, their network stack (the boot's id and the network
    namespace) does not, so loopback is still every node's; separate stacks are separate machines
    whatever their interfaces say."""
    inv = inventory()

    def seen(stack: str, extra: list[dict[str, Any]]) -> Any:
        def edit(raw: dict[str, Any], nf: NodeFacts) -> None:
            resolves("127.0.0.1")(raw, nf)
            raw["ifaces"] = [{"name": "lo", "up": True, "ipv4": ["127.0.0.1"]}, *extra]
            raw["net_stack"] = stack

        return edit

    veth = [{"name": "veth9", "up": True, "ipv4": []}]
    edits = {n: seen("b00t net:[4026531840]", veth if n == "n3" else []) for n in NODES}
    p = by(checks.check_ports(inv, make_facts(inv, edits)), "ports")
    assert {r.status for r in p.values()} == {"ok"}, {n: r.detail for n, r in p.items()}
    edits["n2"] = seen("b00t net:[4026532999]", [])  # another namespace: a machine of its own
    p = by(checks.check_ports(inv, make_facts(inv, edits)), "ports")
    assert p["n2"].status == "fail" and "loopback" in p["n2"].detail


CONTAINER = "  container: {runtime: podman, image: img:1}\n"


def test_a_container_left_by_a_run_of_this_cluster_fails_naming_it_and_orch_down() -> None:
    """Before a launch: a container of this cluster's orch runs still on a node holds its GPUs and
    ports; the row names it and the command that removes it. The probe lists them by label."""
    inv = inventory(CONTAINER)
    args = probe_args(inv, inv.nodes[1], ["container"], "tok", 4)
    assert args["container_leftovers"][:5] == ["podman", "ps", "-a", "--filter", "label=orch.cluster=t"]
    assert probe_args(inventory(), inv.nodes[1], ["container"], "tok", 4)["container_leftovers"] is None
    listed = {"rc": 0, "err": "", "out": "3f2a\torch-r7-n2-abcd\tr7\trunning\n"}
    clean = {"rc": 0, "err": "", "out": ""}
    facts = make_facts(
        inv, {n: (lambda raw, nf, n=n: raw.update(containers=listed if n == "n2" else clean)) for n in NODES}
    )
    c = by(checks.check_container(inv, facts), "container")
    assert c["n2"].status == "fail" and "container orch-r7-n2-abcd of run r7 is still here (running)" in c["n2"].detail
    assert c["n2"].hint == "orch down r7 (or podman rm -f orch-r7-n2-abcd)"
    assert {c[n].status for n in ("n1", "n3", "n4")} == {"ok"} and c["n1"].value == "podman"
    gone = {"rc": 127, "err": "podman: not found in PATH", "out": ""}
    facts = make_facts(inv, {"n3": lambda raw, nf: raw.update(containers=gone)})
    c = by(checks.check_container(inv, facts), "container")
    assert c["n3"].status == "fail" and "does not answer: podman: not found" in c["n3"].detail
    assert by(checks.check_container(inventory(), make_facts(inventory())), "container")["n1"].status == "skip"


def test_selection_inventory_skip_and_unknown_names() -> None:
    assert select_checks(["ssh", "clock"], None) == ["ssh", "clock"]
    assert "ports" not in select_checks(None, ["ports"])
    with pytest.raises(UsageError):
        select_checks(["nope"], None)
    inv = parse(inventory().source.replace("checks:\n", "checks:\n  skip: [clock]\n"), "t.yaml")
    res = checks.run_checks(inv, make_facts(inv), ["ssh", "clock"])
    assert [r.status for r in res if r.check == "clock"] == ["skip"] * 4
    assert "checks.skip" in res[-1].detail


def test_report_json_shape_exit_code_and_table() -> None:
    inv = inventory()
    facts = make_facts(inv, {"n2": lambda raw, nf: raw["ntp"].update(offset_ms=2034.0)})
    results = run(inv, facts)
    offsets, _, ref = checks.clock_offsets(inv, facts)
    report = CheckReport(results, offsets, ref)
    assert not report.ok
    data = json.loads(json.dumps(report.to_json("inventory/t.yaml")))
    assert data["inventory"] == "inventory/t.yaml" and data["ok"] is False
    assert set(data["results"][0]) == {"check", "node", "status", "value", "detail", "hint"}
    assert data["offsets_ms"]["n2"] == 2034.0
    buf = io.StringIO()
    check_table(report, Console(file=buf, width=200, no_color=True))
    text = buf.getvalue()
    assert "+2034 ms" in text and "preflight failed" in text and "1 fail" in text
    assert CheckReport([r for r in results if r.status != "fail"]).ok


def test_cli_exits_1_when_a_check_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main

    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        f"transport: local\nnodes:\n  - host: a\njob:\n  workdir: {tmp_path / 'missing'}\n  python: {sys.executable}\n"
    )
    with pytest.raises(SystemExit) as exc:
        main(["check", str(inv), "--only", "job", "--json"])
    assert exc.value.code == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["results"][0]["status"] == "fail"


def test_cli_unknown_check_name_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import main

    inv = tmp_path / "inv.yaml"
    inv.write_text("transport: local\nnodes:\n  - host: a\n")
    with pytest.raises(SystemExit) as exc:
        main(["check", str(inv), "--only", "ssh,nope"])
    assert exc.value.code == 2
    assert "unknown check 'nope'" in capsys.readouterr().err


def test_chrony_view_of_the_node() -> None:
    inv = inventory()
    local = (FIX / "chrony" / "chronyc_tracking_local-refid-7F7F0101_no-leap-line_omicron-5192.txt").read_text()
    slow = (FIX / "chrony" / "chronyc_tracking_large-offset_omnios-2576.txt").read_text()
    unsynced = slow.replace("Leap status     : Normal", "Leap status     : Not synchronised")
    edits = {
        "n2": lambda raw, nf: raw.update(chrony={"rc": 0, "out": local, "err": ""}),
        "n3": lambda raw, nf: raw.update(chrony={"rc": 0, "out": slow, "err": ""}),
        "n4": lambda raw, nf: raw.update(chrony={"rc": 0, "out": unsynced, "err": ""}),
    }
    c = by(checks.check_clock(inv, make_facts(inv, edits)), "clock")
    # a local reference is normal on the cluster's own time server: a note, not a warning
    assert c["n2"].status == "ok" and "its own local clock" in c["n2"].detail
    assert c["n3"].status == "warn" and "-7811 ms off its source" in c["n3"].detail
    assert c["n4"].status == "warn" and "not synchronised" in c["n4"].detail and "chronyc sources" in c["n4"].hint
    assert c["n1"].status == "ok"


def test_verbs_ring_failure_names_the_tool() -> None:
    inv = inventory(rdma=True)
    edits = {n: (lambda raw, nf: raw.update(ib=_fixture_ib("v100"))) for n in NODES}
    facts = make_facts(inv, edits)
    facts["n1"].reach.append(
        {
            "kind": "verbs",
            "node": "n2",
            "addr": "10.0.0.2",
            "port": 18515,
            "device": "mlx5_0",
            "ok": False,
            "error": "Couldn't connect to 10.0.0.2:18515",
        }
    )
    facts["n3"].reach.append(
        {
            "kind": "verbs",
            "node": "n4",
            "addr": "10.0.0.4",
            "port": 18515,
            "device": "mlx5_0",
            "ok": True,
            "ms": 12.0,
            "result": "8192000 bytes in 0.01 seconds = 9496.59 Mbit/sec",
        }
    )
    r = by(checks.check_rdma(inv, facts), "rdma")
    assert r["n1"].status == "fail" and "over verbs (ibv_rc_pingpong)" in r["n1"].detail
    assert "ibv_rc_pingpong -d mlx5_0 10.0.0.2" in r["n1"].hint
    assert r["n3"].status == "ok" and "9496.59 Mbit/sec" in r["n3"].detail
    assert r["n2"].status == "ok" and "TCP" in r["n2"].detail


def test_saved_report_carries_offsets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.preflight.runner import save_report
    from orchestrator.store import RunDir, checks_path, clock_offsets

    monkeypatch.setenv("ORCH_HOME", str(tmp_path))
    inv = inventory()
    facts = make_facts(inv, {"n2": lambda raw, nf: raw["ntp"].update(offset_ms=-12.5)})
    offsets, _, ref = checks.clock_offsets(inv, facts)
    path = save_report(inv, CheckReport(run(inv, facts), offsets, ref))
    assert path == checks_path(inv.name) == tmp_path / "checks" / "t.json"
    assert (path.stat().st_mode & 0o777) == 0o600
    assert clock_offsets(None, inv.name) == ({"n1": 1.5, "n2": -12.5, "n3": 1.5, "n4": 1.5}, str(path))
    assert clock_offsets(RunDir(tmp_path / "runs" / "r1"), inv.name)[1] == str(path)  # the run has none of its own
    assert clock_offsets(None, "other") == ({}, None)


def test_addr_that_is_not_the_nodes_own_fails_ports() -> None:
    inv = inventory()
    facts = make_facts(
        inv,
        {
            "n2": lambda raw, nf: nf.listen.update(
                ring={"addr": "10.0.0.2", "port": None, "error": "Cannot assign requested address (errno 99)"}
            )
        },
    )
    p = by(checks.check_ports(inv, facts), "ports")
    assert p["n2"].status == "fail" and "cannot listen on this node's addr 10.0.0.2" in p["n2"].detail
    assert "ip -br addr" in p["n2"].hint and p["n1"].status == "ok"


def test_slow_ssh_is_a_warning_over_the_threshold() -> None:
    inv = inventory()

    def slow(raw: dict[str, Any], nf: NodeFacts) -> None:
        nf.connect_ms, nf.rtt_ms = 900.0, 300.0

    s = by(checks.check_ssh(inv, make_facts(inv, {"n4": slow})), "ssh")
    assert s["n4"].status == "warn" and s["n4"].value == "1200 ms" and "slower than 1000 ms" in s["n4"].detail
    assert s["n1"].status == "ok" and s["n1"].value == "24 ms"


def test_job_output_directories_need_only_be_creatable() -> None:
    """`project: /runs/exp` names a directory the job creates: missing is fine, a file or an
    unwritable place is not (an input path must exist; an output path must not have to)."""
    inv = parse(
        inventory().source.replace(
            "    batch: 64\n", "    batch: 64\n    project: /runs/yolo\n    out: /scratch/exp1\n"
        ),
        "t.yaml",
    )

    def outputs(project: dict[str, Any], out: dict[str, Any]) -> Any:
        def edit(raw: dict[str, Any], nf: NodeFacts) -> None:
            raw["paths"]["project"] = {"path": "/runs/yolo", "output": True, **project}
            raw["paths"]["out"] = {"path": "/scratch/exp1", "output": True, **out}

        return edit

    missing_ok = {
        "exists": False,
        "is_file": False,
        "is_dir": False,
        "ancestor": "/",
        "ancestor_is_dir": True,
        "ancestor_writable": True,
    }
    edits = {
        n: outputs(missing_ok, {"exists": True, "is_file": False, "is_dir": True, "writable": True})
        for n in ("n1", "n2")
    }
    edits["n3"] = outputs(
        {**missing_ok, "ancestor_writable": False}, {"exists": True, "is_file": True, "is_dir": False}
    )
    edits["n4"] = outputs(
        {"exists": True, "is_file": False, "is_dir": True, "writable": False},
        {**missing_ok, "ancestor": "/scratch", "ancestor_is_dir": False, "ancestor_writable": False},
    )
    res = checks.run_checks(inv, make_facts(inv, edits), ["job"])
    assert only_failure(res) == {("job", "n3"), ("job", "n4")}
    r = by(res, "job")
    assert "project: /runs/yolo cannot be created: / is not writable" in r["n3"].detail
    assert "out: /scratch/exp1 exists and is not a directory" in r["n3"].detail
    assert "project: /runs/yolo is not writable" in r["n4"].detail
    assert "out: /scratch/exp1 cannot be created: /scratch is a file" in r["n4"].detail
    assert set(probe_args(inv, inv.nodes[0], ["job"], "tok", 4)["outputs"]) == {"project", "out"}


def test_probe_output_facts_on_a_real_filesystem(tmp_path: Any) -> None:
    from orchestrator.node.probe import output_facts

    (tmp_path / "file").write_text("x")
    deep = output_facts(str(tmp_path / "a" / "b" / "c"))
    assert deep["exists"] is False and deep["ancestor"] == str(tmp_path) and deep["ancestor_writable"] is True
    under_file = output_facts(str(tmp_path / "file" / "runs"))
    assert under_file["ancestor"] == str(tmp_path / "file") and under_file["ancestor_is_dir"] is False
    assert output_facts(str(tmp_path))["writable"] is True
    assert output_facts(str(tmp_path / "file"))["is_file"] is True


def test_a_relative_script_is_looked_for_under_the_workdir_on_every_node() -> None:
    inv = parse(inventory().source.replace("  python:", "  script: train.py\n  python:"), "t.yaml")
    assert job_files(inv)["script"] == "/srv/job/train.py"
    here = {
        "path": "/srv/job/train.py",
        "exists": True,
        "is_file": True,
        "is_dir": False,
        "size": 9,
        "sha256": "bb" * 32,
    }
    facts = make_facts(inv, {n: (lambda raw, nf: raw["paths"].update(script=dict(here))) for n in ("n1", "n2", "n4")})
    res = by(checks.run_checks(inv, facts, ["job"]), "job")
    assert res["n3"].status == "fail" and res["n3"].detail == "script: /srv/job/train.py does not exist on this node"
    assert {n for n, r in res.items() if r.status == "fail"} == {"n3"}


def test_the_offsets_and_their_reference_come_from_the_same_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's check.json whose offsets are not a mapping: `clock_offsets` passed over it to the
    inventory's last check, `clock_reference` (its own read loop) took that run file's reference,
    so the notice named the wrong server for the offsets it showed."""
    import json

    from orchestrator.store import RunStore, checks_path, clock_offsets, clock_reference

    monkeypatch.setenv("ORCH_HOME", str(tmp_path))
    inv = inventory()
    run = RunStore().create(inv, "r1")
    run.check_path.write_text(
        json.dumps(
            {"offsets_ms": [1.0, 2.0], "offset_reference": "NTP server bad", "controller_clock": {"offset_ms": 99.0}}
        )
    )
    saved = checks_path(inv.name)
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(
        json.dumps(
            {"offsets_ms": {"n1": 1.5}, "offset_reference": "NTP server good", "controller_clock": {"offset_ms": -3.0}}
        )
    )
    assert clock_offsets(run, inv.name) == ({"n1": 1.5}, str(saved))
    assert clock_reference(run, inv.name) == ("NTP server good", -3.0)
    run.check_path.write_text(json.dumps({"offsets_ms": {"n2": 4.0}, "offset_reference": "controller"}))
    assert clock_offsets(run, inv.name) == ({"n2": 4.0}, str(run.check_path))
    assert clock_reference(run, inv.name) == ("controller", None)


def test_failures_are_recapped_under_the_table_folded_by_reason() -> None:
    """On a big cluster the table runs to hundreds of rows: the failures come again just above the
    verdict, one line per check and reason with its nodes folded, so the reason stays on screen."""
    inv = inventory()
    facts = make_facts(inv, {n: (lambda raw, nf: raw["ntp"].update(offset_ms=2034.0)) for n in ("n2", "n3", "n4")})
    facts["n1"].listen["master_port"] = {
        "port": 29500,
        "bound": False,
        "error": "Address already in use (errno 98)",
        "holder": "python3 pid 99",
    }
    report = CheckReport(run(inv, facts), *checks.clock_offsets(inv, facts)[::2])
    buf = io.StringIO()
    check_table(report, Console(file=buf, width=200, no_color=True))
    lines = buf.getvalue().splitlines()
    recap = lines[lines.index("failed:") + 1 : -1]
    assert lines[-1].startswith("preflight failed:"), lines[-3:]
    assert any(line.startswith("  clock on n[2-4]: ") for line in recap), recap
    assert any(line.startswith("  ports on n1: master port 29500 is taken by python3 pid 99") for line in recap), recap
    fails = {(r.check, r.node) for r in report.results if r.status == "fail"}
    assert len(recap) == len({(r.check, r.detail) for r in report.results if r.status == "fail"}) and fails


def test_the_failure_recap_is_capped() -> None:
    from orchestrator.cli import render

    results = [CheckResult("job", f"n{i}", "fail", "", f"reason {i}", "") for i in range(render.RECAP_LINES + 3)]
    buf = io.StringIO()
    check_table(CheckReport(results), Console(file=buf, width=200, no_color=True))
    lines = buf.getvalue().splitlines()
    recap = lines[lines.index("failed:") + 1 : -1]
    assert len(recap) == render.RECAP_LINES + 1 and recap[-1] == "  and 3 more (in the table above)", recap


def _dataset(train: int, val: int = 12, listing: str = "l", sample: str = "s") -> dict[str, Any]:
    return {
        "train": {
            "path": "/data/images/train",
            "files": train,
            "bytes": train * 6000,
            "listing": listing + str(train),
            "sample": sample,
            "capped": False,
        },
        "val": {
            "path": "/data/images/val",
            "files": val,
            "bytes": val * 6000,
            "listing": f"v{val}",
            "sample": "v",
            "capped": False,
        },
    }


def test_a_stale_dataset_copy_on_one_node_fails_naming_the_node_and_the_split() -> None:
    """The data YAML was the same on every node, so the `job` check said ok while one node's
    images/ held 26 of the 48 files: what the YAML lists is compared node against node."""
    inv = inventory()

    def with_data(train: int, **kw: Any) -> Any:
        return lambda raw, nf: raw["paths"]["data"].update(dataset=_dataset(train, **kw))

    res = checks.run_checks(
        inv,
        make_facts(inv, {"n1": with_data(48), "n2": with_data(48), "n3": with_data(26), "n4": with_data(48)}),
        ["job"],
    )
    assert only_failure(res) == {("job", "n3")}
    bad = by(res, "job")["n3"]
    assert "the train split of /data/coco.yaml (/data/images/train) differs here" in bad.detail
    assert "26 files, 152.3 KB here, 48 files, 281.2 KB on 3 node(s)" in bad.detail
    assert "val" not in bad.detail.split("differs here")[1] and "rsync" in bad.hint
    assert (
        "lists (train 48 files, 281.2 KB, val 12 files, 70.3 KB) the same on every node" in by(res, "job")["n2"].detail
    )

    same_size = checks.run_checks(
        inv,
        make_facts(
            inv, {"n1": with_data(48), "n2": with_data(48), "n3": with_data(48, sample="x"), "n4": with_data(48)}
        ),
        ["job"],
    )
    assert only_failure(same_size) == {("job", "n3")}
    assert "the same count and size, but other names or contents" in by(same_size, "job")["n3"].detail

    tie = checks.run_checks(
        inv,
        make_facts(inv, {"n1": with_data(48), "n2": with_data(48), "n3": with_data(26), "n4": with_data(30)}),
        ["job"],
    )
    assert only_failure(tie) == {("job", "n3"), ("job", "n4")}
    two = parse(inv.source.replace("10.0.0.[1-4]", "10.0.0.[1-2]").replace("n[1-4]", "n[1-2]"), "t.yaml")
    res2 = checks.run_checks(two, make_facts(two, {"n1": with_data(48), "n2": with_data(26)}), ["job"])
    assert only_failure(res2) == {("job", "n1"), ("job", "n2")}  # two that disagree: both, each naming the other
    assert "no majority" in by(res2, "job")["n1"].detail and "n2: 26 files" in by(res2, "job")["n1"].detail

    slow = checks.run_checks(
        inv,
        make_facts(
            inv,
            {n: with_data(48) for n in ("n1", "n2", "n4")}
            | {
                "n3": lambda raw, nf: raw["paths"]["data"].update(
                    dataset={
                        split: {
                            "path": f"/data/images/{split}",
                            "files": 9,
                            "bytes": 9,
                            "listing": "",
                            "sample": "",
                            "capped": False,
                            "error": "listing stopped after 9 files (60 s)",
                        }
                        for split in ("train", "val")
                    }
                )
            },
        ),
        ["job"],
    )
    assert only_failure(slow) == set()
    assert by(slow, "job")["n3"].status == "warn" and "not compared" in by(slow, "job")["n3"].detail
