"""The fabric check's judging (`fabric_judge.check_fabric`, `fabric_judge.fabric_summary`) on fabricated job
results and on real recorded NCCL_DEBUG=INFO logs, its plan, its opt-in, and how it is shown."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from orchestrator.cli.render import fabric_report
from orchestrator.config.inventory import Inventory, parse
from orchestrator.errors import InventoryError
from orchestrator.node.jobs import allreduce as job
from orchestrator.preflight import checks
from orchestrator.preflight.fabric import job as fabric_mod
from orchestrator.preflight.fabric import judge as fabric_judge
from orchestrator.preflight.fabric.job import (
    JOB_FILE,
    FabricFacts,
    FabricNode,
    fabric_plan,
    job_line,
    marked,
)
from orchestrator.preflight.facts import NodeFacts
from orchestrator.preflight.runner import CheckReport

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NCCL = FIXTURES / "nccl"
MB = 1 << 20


def inventory(fabric: str = "true", gpus: bool = False, rdma: bool = False, n: int = 4) -> Inventory:
    return parse(
        f"""
name: t
nodes:
  - host: 10.0.0.[1-{n}]
    name: n[1-{n}]
    {"gpus: 8" if gpus else ""}
env: {{NCCL_SOCKET_IFNAME: ens2f1, NCCL_DEBUG: WARN}}
checks:
  rdma: {{devices: {"[mlx5_0]" if rdma else "[]"}}}
  fabric: {fabric}
job:
  python: /opt/py/bin/python
  nproc_per_node: {8 if gpus else 1}
  torchrun_args: [--monitor-interval=1]
  max_restarts: 3
""",
        "t.yaml",
    )


def job_result(
    inv: Inventory,
    rates: dict[tuple[int, int], float] | None = None,
    wrong: int = 0,
    sizes: tuple[int, ...] = (MB, 4 * MB),
    seconds: float = 0.002,
) -> dict[str, Any]:
    """An ORCH_FABRIC_RESULT as the job prints it: node ids 0..n-1 named like the inventory."""
    names = [n.name for n in inv.nodes]
    world = sum(n.nproc_per_node for n in inv.nodes)
    rates = (
        rates if rates is not None else {(s, d): 2.0 for s in range(len(names)) for d in range(len(names)) if s != d}
    )
    factor = 2 * (world - 1) / world
    sweep = [
        {
            "size_bytes": size,
            "count": size // 4,
            "type": "float",
            "redop": "sum",
            "root": -1,
            "iters": 5,
            "time_us": seconds * 1e6 * size / MB,
            "algbw_gbps": MB / seconds / 1e9,
            "busbw_gbps": MB / seconds / 1e9 * factor,
            "wrong": wrong if size == sizes[-1] else 0,
        }
        for size in sizes
    ]
    transfers = [
        {
            "pass": p,
            "round": 0,
            "src_node": s,
            "dst_node": d,
            "rail": 0,
            "bytes": 4 * MB,
            "seconds": 4 * MB / (v * 1e9),
            "gbps": v * (1 if p else 0.9),
        }
        for (s, d), v in rates.items()
        for p in (0, 1)
    ]
    return {
        "schema": 1,
        "backend": "gloo",
        "device": "cpu",
        "torch": "2.14.1",
        "nccl": None,
        "world_size": world,
        "nnodes": len(names),
        "nodes": [
            {"node": i, "host": name, "hostname": name, "ranks": [i], "boot_id": "b"} for i, name in enumerate(names)
        ],
        "ranks": [],
        "op": "all_reduce",
        "dtype": "float32",
        "bus_factor": factor,
        "sweep": sweep,
        "skipped": [],
        "links": {
            "method": "pairwise",
            "rounds": 3,
            "passes": 2,
            "rails": 1,
            "pairs_at_once": "one",
            "pairs_why": "nodes share a machine",
            "transfers": transfers,
        },
        "elapsed_s": 9.5,
        "phase_s": {"import": 3.0, "init": 0.1, "sweep": 4.0, "links": 5.0},
    }


def facts_for(inv: Inventory, ff: FabricFacts | None) -> dict[str, NodeFacts]:
    out = {}
    for node in inv.nodes:
        nf = NodeFacts(node, connect_ms=10, rtt_ms=2)
        nf.fabric = ff
        out[node.name] = nf
    return out


def measured(
    inv: Inventory,
    result: dict[str, Any] | None,
    logs: dict[str, str] | None = None,
    errors: dict[str, str] | None = None,
    backend: str = "gloo",
    timed_out: bool = False,
) -> FabricFacts:
    nodes = {
        n.name: FabricNode(n.name, log=(logs or {}).get(n.name, ""), error=(errors or {}).get(n.name))
        for n in inv.nodes
    }
    return FabricFacts(backend, "fabric-test", nodes, result, timed_out=timed_out, wall_s=20.0)


def judged(inv: Inventory, ff: FabricFacts | None) -> dict[str, checks.CheckResult]:
    return {r.node: r for r in checks.run_checks(inv, facts_for(inv, ff), ["fabric"])}


def statuses(results: dict[str, checks.CheckResult]) -> dict[str, str]:
    return {n: r.status for n, r in results.items()}


# ----------------------------------------------------------------------------- rates


def test_a_healthy_cluster_passes_with_rates_and_busbw() -> None:
    inv = inventory()
    got = judged(inv, measured(inv, job_result(inv)))
    assert statuses(got) == {"n1": "ok", "n2": "ok", "n3": "ok", "n4": "ok"}
    assert got["n2"].value == "send 2 / recv 2 GB/s"
    assert "all_reduce busbw 0.786 GB/s at 4 MiB (gloo, 4 ranks on 4 nodes)" in got["n2"].detail
    assert "best pair: send 2 GB/s, recv 2 GB/s" in got["n2"].detail  # the best of the two passes


def test_the_slow_node_and_only_it_warns() -> None:
    inv = inventory()
    rates = {(s, d): 2.0 for s in range(4) for d in range(4) if s != d}
    rates.update({(s, 2): 0.006 for s in (0, 1, 3)})  # n3 receives at 50 Mbit/s
    got = judged(inv, measured(inv, job_result(inv, rates)))
    assert statuses(got) == {"n1": "ok", "n2": "ok", "n3": "warn", "n4": "ok"}
    r = got["n3"]
    assert r.value == "send 2 / recv 0.006 GB/s"
    assert "slow node: recv 0.006 GB/s is 0.00× the median node (2 GB/s; warn below 0.7×)" in r.detail
    assert "ethtool" in r.hint and "n1→n3 0.006" in r.hint


def test_a_slow_link_between_healthy_nodes_warns_on_both_ends() -> None:
    inv = inventory()
    rates = {(s, d): 2.0 for s in range(4) for d in range(4) if s != d}
    rates[(0, 3)] = 0.5
    got = judged(inv, measured(inv, job_result(inv, rates)))
    assert statuses(got) == {"n1": "warn", "n2": "ok", "n3": "ok", "n4": "warn"}
    assert "slow link n1→n4: 0.5 GB/s, below 0.7× what both its ends reach (2 GB/s)" in got["n4"].detail


def test_share_comes_from_the_inventory() -> None:
    rates = {(s, d): 2.0 for s in range(4) for d in range(4) if s != d}
    rates.update({(s, 2): 1.2 for s in (0, 1, 3)})  # 0.6 x the median
    assert statuses(judged(inventory(), measured(inventory(), job_result(inventory(), rates))))["n3"] == "warn"
    lax = inventory("{share: 0.5}")
    assert statuses(judged(lax, measured(lax, job_result(lax, rates))))["n3"] == "ok"


def test_min_busbw_fails_the_slow_node_or_cluster_wide() -> None:
    inv = inventory("{min_busbw_gbps: 5}")
    got = judged(inv, measured(inv, job_result(inv)))
    assert statuses(got) == {"n1": "fail", "n2": "ok", "n3": "ok", "n4": "ok"}
    assert got["n1"].detail.startswith(
        "cluster-wide: busbw 0.786 GB/s at 4 MiB is below checks.fabric.min_busbw_gbps 5"
    )
    rates = {(s, d): 2.0 for s in range(4) for d in range(4) if s != d}
    rates.update({(1, d): 0.006 for d in (0, 2, 3)})  # n2 sends slowly
    got = judged(inv, measured(inv, job_result(inv, rates)))
    assert statuses(got) == {"n1": "ok", "n2": "fail", "n3": "ok", "n4": "ok"}
    assert "(this node is the slow one)" in got["n2"].detail and "slow node: send" in got["n2"].detail
    assert statuses(judged(inventory("{min_busbw_gbps: 0.5}"), measured(inv, job_result(inv)))) == {
        "n1": "ok",
        "n2": "ok",
        "n3": "ok",
        "n4": "ok",
    }


def test_wrong_elements_fail_cluster_wide() -> None:
    inv = inventory()
    got = judged(inv, measured(inv, job_result(inv, wrong=12)))
    assert statuses(got) == {"n1": "fail", "n2": "ok", "n3": "ok", "n4": "ok"}
    assert "all_reduce returned 12 wrong element(s)" in got["n1"].detail


def test_two_nodes_name_a_direction_never_a_node() -> None:
    inv = inventory(n=2)
    got = judged(inv, measured(inv, job_result(inv, {(0, 1): 0.006, (1, 0): 2.0})))
    assert statuses(got) == {"n1": "warn", "n2": "warn"}
    assert all("slow link n1→n2" in r.detail and "slow node" not in r.detail for r in got.values())


def test_one_node_has_busbw_only() -> None:
    inv = inventory(n=1)
    result = job_result(inv, rates={})
    result["links"] = {"method": "pairwise", "skipped": "one node: no links between nodes", "transfers": []}
    got = judged(inv, measured(inv, result))
    assert got["n1"].status == "ok" and got["n1"].value == "busbw 0 GB/s"
    assert "one node: no links between nodes" in got["n1"].detail


# ----------------------------------------------------------------------------- when it does not run


def test_opt_in_and_not_run_are_skip_rows_with_the_reason() -> None:
    inv = inventory("false")
    got = judged(inv, FabricFacts.skipped(inv, fabric_mod.FABRIC_OPT_IN))
    assert statuses(got) == dict.fromkeys(["n1", "n2", "n3", "n4"], "skip")
    assert got["n1"].detail.startswith("opt-in:") and "--only fabric" in got["n1"].detail
    assert statuses(judged(inv, None)) == dict.fromkeys(["n1", "n2", "n3", "n4"], "skip")


def test_checks_skip_makes_skip_rows() -> None:
    inv = parse("nodes: [{host: a}, {host: b}]\nchecks: {fabric: true, skip: [fabric]}\n", "t.yaml")
    got = judged(inv, None)
    assert {r.status for r in got.values()} == {"skip"} and "checks.skip" in got["a"].detail


def test_a_failed_job_fails_every_node_and_quotes_the_error() -> None:
    inv = inventory()
    err = (
        '2026-12-01T10:00:00.000001Z err [default0]:ORCH_FABRIC_ERROR {"rank": "1", "host": "h2", "node": "n2", '
        '"phase": "init", "error": "RuntimeError: hostname \'h2\' resolves to nothing: gloo would listen on '
        'loopback; set GLOO_SOCKET_IFNAME"}'
    )
    ff = measured(inv, None, logs={"n2": err}, errors={"n2": "the job failed (exit code 1)"})
    got = judged(inv, ff)
    assert statuses(got) == dict.fromkeys(["n1", "n2", "n3", "n4"], "fail")
    assert "failed here in its init phase: RuntimeError: hostname 'h2'" in got["n2"].detail
    assert "GLOO_SOCKET_IFNAME" in got["n2"].hint
    assert got["n1"].detail == "no result: stopped after the job failed on n2"
    assert fabric_judge.fabric_summary(inv, ff)["job_errors"]["n2"]["phase"] == "init"


def test_a_hung_job_fails_on_timeout() -> None:
    inv = inventory()
    ff = measured(
        inv,
        None,
        errors={"n4": "still running after timeout_s 180 s (hung, or too slow for the sizes asked)"},
        timed_out=True,
    )
    got = judged(inv, ff)
    assert statuses(got) == dict.fromkeys(["n1", "n2", "n3", "n4"], "fail")
    assert got["n4"].detail.startswith("no result within timeout_s 180 s: still running")
    assert "timeout_s" in got["n4"].hint


# ----------------------------------------------------------------------------- NCCL's transport, on real logs


def nccl_logs(inv: Inventory, name: str) -> dict[str, str]:
    """The same recorded NCCL_DEBUG=INFO text as every node's log, under the agent's line prefix."""
    lines = (NCCL / name).read_text().splitlines()
    text = "\n".join(f"2026-12-01T10:00:00.000001Z err {line}" for line in lines)
    return {n.name: text for n in inv.nodes}


@pytest.mark.parametrize(
    "fixture",
    [
        "socket-fallback_ibext-no-device_channels_nccl-952.txt",
        "socket_nccl2.4-format_aws_rings_nccl-226.txt",
        "socket+shm_2node-same-hostname_nccl-tests-166.txt",
    ],
)
def test_nccl_over_sockets_on_an_rdma_cluster_fails_naming_node_and_lines(fixture: str) -> None:
    inv = inventory(gpus=True, rdma=True, n=2)
    ff = measured(inv, job_result(inv), logs=nccl_logs(inv, fixture), backend="nccl")
    got = judged(inv, ff)
    assert statuses(got) == {"n1": "fail", "n2": "fail"}
    r = got["n1"]
    assert r.detail.startswith("NCCL used TCP sockets between nodes, not RDMA (mlx5_0)")
    assert "via NET/Socket/" in r.detail  # the NCCL line itself, quoted
    assert "NCCL_IB_HCA" in r.hint
    s = fabric_judge.fabric_summary(inv, ff)
    assert s["nccl"]["n1"]["socket_findings"]


def test_nccl_over_ib_passes_and_says_which_hca() -> None:
    inv = inventory(gpus=True, rdma=True, n=2)
    ff = measured(
        inv, job_result(inv), logs=nccl_logs(inv, "ib_nccl2.4.7_2node_init_nv_peer_memory-56.txt"), backend="nccl"
    )
    got = judged(inv, ff)
    assert statuses(got) == {"n1": "ok", "n2": "ok"}
    assert "NCCL 2.4.7 network IB" in got["n1"].detail and "(mlx5_0:1/IB)" in got["n1"].detail


def test_nccl_on_other_hcas_than_the_inventory_names_warns() -> None:
    inv = inventory(gpus=True, rdma=True, n=2)
    logs = nccl_logs(inv, "roce_nccl2.19.3_2node_dgxh100_nccl-tests-185.txt")  # mlx5_10, mlx5_11
    got = judged(inv, measured(inv, job_result(inv), logs=logs, backend="nccl"))
    assert statuses(got) == {"n1": "warn", "n2": "warn"}
    assert "NCCL used mlx5_10:1/RoCE, mlx5_11:1/RoCE, not mlx5_0" in got["n1"].detail


def test_sockets_without_rdma_required_is_only_noted() -> None:
    inv = inventory(gpus=True, n=2)
    logs = nccl_logs(inv, "socket_lo_ib-disabled_topology_nccl-1053.txt")
    got = judged(inv, measured(inv, job_result(inv), logs=logs, backend="nccl"))
    assert statuses(got) == {"n1": "ok", "n2": "ok"}
    assert "TCP sockets between nodes; no RDMA required" in got["n1"].detail


def test_nccl_without_info_lines_warns() -> None:
    inv = inventory(gpus=True, n=2)
    got = judged(inv, measured(inv, job_result(inv), backend="nccl"))
    assert statuses(got) == {"n1": "warn", "n2": "warn"} and "no NCCL INFO lines" in got["n1"].detail


# ----------------------------------------------------------------------------- plan, log lines, output


def test_the_plan_is_the_trainings_with_the_job_in_place() -> None:
    inv = inventory(gpus=True)
    plan = fabric_plan(inv, "fabric-x", "nccl")
    p = plan.nodes[1]
    argv = list(p.argv)
    assert argv[:3] == ["/opt/py/bin/python", "-m", "torch.distributed.run"]
    assert "--nproc-per-node=8" in argv and "--node-rank=1" in argv and "--monitor-interval=1" in argv
    assert "--max-restarts=0" in argv  # the inventory's 3 restarts would hide a failing node
    # the job file in the run directory, by its absolute path (filled in on the node): a container's cwd is not it
    assert argv[argv.index("--tee=3") + 2 :] == [
        "{ORCH_RUN_DIR}/" + JOB_FILE,
        "--backend",
        "nccl",
        "--min-bytes",
        str(MB),
        "--max-bytes",
        str(256 * MB),
        "--budget-s",
        "30",
        "--timeout",
        "180",
        "--recheck-share",
        "0.7",
    ]
    assert p.workdir == "~/.orch/nodes/fabric-x/n2"  # the job file sits in the run directory
    assert p.env["NCCL_DEBUG"] == "INFO" and p.env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert p.env["NCCL_SOCKET_IFNAME"] == "ens2f1" and p.env["ORCH_NODE"] == "n2"
    gloo = fabric_plan(inventory("{max_bytes: 512K}"), "fabric-x", "gloo").nodes[0]
    assert "NCCL_DEBUG_SUBSYS" not in gloo.env and gloo.env["NCCL_DEBUG"] == "WARN"
    assert gloo.argv[-10:] == (
        "--min-bytes",
        str(512 << 10),
        "--max-bytes",
        str(512 << 10),
        "--budget-s",
        "30",
        "--timeout",
        "180",
        "--recheck-share",
        "0.7",
    )


def test_marked_lines_are_found_behind_any_prefix() -> None:
    log = (
        '2026-12-01T10:00:00.000001Z out [default0]:ORCH_FABRIC_RESULT {"a": 1}\n'
        '2026-12-01T10:00:00.000002Z err ORCH_FABRIC_PROGRESS {"phase": "sweep"}\n'
        "2026-12-01T10:00:00.000003Z out ORCH_FABRIC_RESULT {broken\n"
    )
    assert marked(log, job.MARKER) == [{"a": 1}]
    assert marked(log, job.PROGRESS_MARKER) == [{"phase": "sweep"}]
    assert job_line("2026-12-01T10:00:00.000001Z err [default0]:x y") == "[default0]:x y"
    assert job_line("not a node.log line") == "not a node.log line"


def test_the_report_shows_the_sweep_like_all_reduce_perf_and_the_nodes() -> None:
    inv = inventory()
    rates = {(s, d): 2.0 for s in range(4) for d in range(4) if s != d}
    rates.update({(s, 2): 0.006 for s in (0, 1, 3)})
    summary = fabric_judge.fabric_summary(inv, measured(inv, job_result(inv, rates)))
    buf = io.StringIO()
    fabric_report(summary, Console(file=buf, width=200, color_system=None))
    text = buf.getvalue().splitlines()
    real = (FIXTURES / "nccl-tests_all_reduce_perf_2node_16xH100_gcp-a3mega.txt").read_text().splitlines()
    names = next(line for line in real if "#wrong" in line)
    units = next(line for line in real if "(GB/s)" in line)
    ours_names = next(line for line in text if "#wrong" in line)
    ours_units = next(line for line in text if "(GB/s)" in line)
    assert names.startswith(ours_names) and units.startswith(ours_units)  # the same columns, the same units
    assert "     4194304       1048576     float     sum      -1   8000.0    0.52    0.79      0" in text
    assert any(line.startswith("n3 ") and line.endswith("slow recv") for line in text), text
    report = CheckReport([], fabric=summary)
    assert report.to_json("t.yaml")["fabric"]["slow_nodes"][0]["node"] == "n3"
    assert "fabric" not in CheckReport([]).to_json("t.yaml")


# ----------------------------------------------------------------------------- the inventory


def test_checks_fabric_true_a_mapping_or_nothing() -> None:
    assert inventory("true").checks.fabric.enabled is True
    assert parse("nodes: [{host: a}]\n", "t.yaml").checks.fabric.enabled is False
    f = inventory("{max_bytes: 64M, min_busbw_gbps: 10, share: 0.5, timeout_s: 60, budget_s: 20}").checks.fabric
    assert (f.enabled, f.max_bytes, f.min_busbw_gbps, f.share, f.timeout_s, f.budget_s) == (
        True,
        64 * MB,
        10.0,
        0.5,
        60.0,
        20.0,
    )
    assert inventory("{enabled: false, max_bytes: 1G}").checks.fabric.enabled is False
    assert inventory("{max_bytes: 1073741824}").checks.fabric.max_bytes == 1 << 30


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{max_bytes: lots}", "t.yaml:10: [checks.fabric.max_bytes] max_bytes 'lots' is not a size"),
        ("{max_bytes: 2}", "[checks.fabric.max_bytes] max_bytes 2 is below 4 bytes"),
        ("{share: 1.5}", "[checks.fabric.share] share must be in (0, 1]"),
        ("{timeout_s: 0}", "[checks.fabric.timeout_s] timeout_s must be positive"),
        ("{min_busbw_gbps: -1}", "[checks.fabric.min_busbw_gbps] min_busbw_gbps must be 0 or more"),
        ("{shares: 0.5}", "[checks.fabric.shares] unknown key 'shares' (did you mean 'share'?)"),
    ],
)
def test_bad_fabric_settings_are_refused_with_file_line_key(value: str, message: str) -> None:
    with pytest.raises(InventoryError) as exc:
        inventory(value)
    assert message in str(exc.value)


# ----------------------------------------------------------------------------- opt-in


def test_the_job_runs_only_when_asked_or_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.preflight import runner
    from orchestrator.preflight.fabric import job as fabric

    ran: list[str] = []
    monkeypatch.setattr(fabric, "measure", lambda inv, cluster, progress: ran.append(inv.name) or FabricFacts("gloo"))
    off, on = inventory("false"), inventory("true")
    ff = runner._fabric_facts(off, None, facts_for(off, None), False, None)  # type: ignore[arg-type]
    assert ff.not_run == fabric_mod.FABRIC_OPT_IN and ran == []
    assert runner._fabric_facts(off, None, facts_for(off, None), True, None).not_run is None  # type: ignore[arg-type]
    assert runner._fabric_facts(on, None, facts_for(on, None), False, None).not_run is None  # type: ignore[arg-type]
    assert len(ran) == 2
    down = facts_for(on, None)
    down["n2"] = NodeFacts(on.node("n2"), error="n2: refused")
    ff = runner._fabric_facts(on, None, down, True, None)  # type: ignore[arg-type]
    assert ff.not_run == "not run: the job needs every node, and n2 could not be probed (see ssh)" and len(ran) == 2


def test_orch_up_refuses_fabric_with_skip_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli.commands import main

    inv = tmp_path / "inv.yaml"
    inv.write_text("nodes: [{host: a}]\n")
    with pytest.raises(SystemExit) as exc:
        main(["up", str(inv), "--skip-checks", "--fabric"])
    assert exc.value.code == 2
    assert "--fabric is a check: it cannot run with --skip-checks" in capsys.readouterr().err


def test_the_run_report_draws_a_bar_per_node_and_the_sweep(tmp_path: Path) -> None:
    import json

    from orchestrator.report import build_report
    from orchestrator.store import RunDir

    inv = inventory()
    rates = {(s, d): 2.0 for s in range(4) for d in range(4) if s != d}
    rates.update({(s, 2): 0.006 for s in (0, 1, 3)})
    summary = fabric_judge.fabric_summary(inv, measured(inv, job_result(inv, rates, sizes=(MB, 4 * MB, 16 * MB))))
    run = RunDir(tmp_path / "20261201-100000-t")
    run.path.mkdir(parents=True)
    run.write({"run": run.run_id, "state": "succeeded", "nodes": []})
    run.write(json.loads(json.dumps(CheckReport([], fabric=summary).to_json("t.yaml"))), "check.json")
    page = build_report(run).read_text()
    assert "<h2>fabric</h2>" in page
    assert page.count('alt="fabric: ') == 2 and 'src="data:image/png;base64,' in page
    assert (run.path / "report" / "fabric_nodes.png").stat().st_size > 1000
    assert (run.path / "report" / "fabric_sweep.png").stat().st_size > 1000
    assert "<td>16777216</td>" in page and '<td class="warn">warn</td>' in page
    assert "<h2>fabric</h2>" not in build_report(RunDir(_plain_run(tmp_path))).read_text()


def _plain_run(tmp_path: Path) -> Path:
    from orchestrator.store import RunDir

    run = RunDir(tmp_path / "20261201-100001-t")
    run.path.mkdir(parents=True)
    run.write({"run": run.run_id, "state": "succeeded", "nodes": []})
    return run.path


def test_a_plain_orch_check_lists_fabric_as_opt_in_and_does_not_run_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI validates --only/--skip itself; the full selection it gets back must not read as
    "fabric was asked for" (it did: a plain `orch check` ran the job)."""
    import json

    from orchestrator.cli.commands import main

    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    inv = tmp_path / "inv.yaml"
    inv.write_text("transport: local\nnodes:\n  - host: a\n")
    with pytest.raises(SystemExit):
        main(["check", str(inv), "--skip", "software", "--json"])
    fab = [r for r in json.loads(capsys.readouterr().out)["results"] if r["check"] == "fabric"]
    assert [(r["node"], r["status"]) for r in fab] == [("a", "skip")]
    assert fab[0]["detail"].startswith("opt-in:")


def test_a_node_that_fails_after_the_result_still_fails() -> None:
    """Rank 0 printed its result, but node n4's torchrun then exited non-zero: the measurement is
    shown for the others, n4 fails with why."""
    inv = inventory()
    got = judged(inv, measured(inv, job_result(inv), errors={"n4": "the job failed (exit code 1)"}))
    assert statuses(got) == {"n1": "ok", "n2": "ok", "n3": "ok", "n4": "fail"}
    assert got["n4"].detail.startswith("the job failed (exit code 1)")


def test_summarizing_a_result_twice_gives_the_same_names_and_leaves_the_result_alone() -> None:
    """The check and `orch check --json` both summarize the job's result; naming the re-measured
    pairs must not rewrite the result itself (a second summary crashed on int('n1'))."""
    inv = inventory()
    ff = measured(inv, job_result(inv))
    assert ff.result is not None
    ff.result["links"]["rechecks"] = [{"pairs": [[0, 2], [1, 2]], "gbps": [0.01, 0.01]}]
    before = json.dumps(ff.result, sort_keys=True)
    first = fabric_judge.fabric_summary(inv, ff)
    second = fabric_judge.fabric_summary(inv, ff)
    assert first["links"]["rechecks"][0]["pairs"] == [["n1", "n3"], ["n2", "n3"]]
    assert second["links"] == first["links"] and json.dumps(ff.result, sort_keys=True) == before
