"""The rank plan: golden argv for the field guide's cluster, rank order, dry-run output."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.config import inventory
from orchestrator.config.plan import NODE_VALUES, job_command, job_python, job_stop, make_plan
from orchestrator.node import agent

REPO = Path(__file__).resolve().parents[2]
V100 = REPO / "inventory" / "v100.yaml"
PY = "/opt/conda/envs/yolov12-dist/bin/python"
TRAINER_ARGS = [
    "-m",
    "trainer",
    "--model",
    "yolo12m.yaml",
    "--data",
    "/mnt/nfs/datasets/coco.yaml",
    "--epochs",
    "100",
    "--batch",
    "384",
    "--imgsz",
    "640",
    "--lr",
    "0.01",
    "--workers",
    "8",
    "--save-period",
    "10",
]


def golden(node_rank: int) -> list[str]:
    return [
        PY,
        "-m",
        "torch.distributed.run",
        "--log-dir={ORCH_RUN_DIR}/torchrun",
        "--nnodes=4",
        "--nproc-per-node=8",
        f"--node-rank={node_rank}",
        "--master-addr=192.168.1.10",
        "--master-port=29500",
        "--max-restarts=0",
        "--tee=3",
        *TRAINER_ARGS,
    ]


def test_v100_plan_is_golden() -> None:
    plan = make_plan(inventory.load(V100), "r1")
    assert plan.world_size == 32
    assert [p.node_rank for p in plan.nodes] == [0, 1, 2, 3]
    assert [p.node.host for p in plan.nodes] == ["192.168.1.10", "192.168.1.11", "192.168.1.12", "192.168.1.13"]
    for p in plan.nodes:
        assert list(p.argv) == golden(p.node_rank)
        assert p.global_ranks == range(8 * p.node_rank, 8 * p.node_rank + 8)
        assert p.workdir == "/mnt/nfs/yolov12"
        assert p.env["NCCL_SOCKET_IFNAME"] == "ens2f1"
        assert p.env["ORCH_NODE_RANK"] == str(p.node_rank) and p.env["ORCH_RUN_ID"] == "r1"


def test_job_command_is_the_jobs_interpreter_around_the_inner_argv() -> None:
    """The seam: what runs the job on a node (the launch, the job's check, the probe's software
    facts, the fabric job) is `job_command`; without a container, the node's python (its
    `python:` or job.python) before the arguments, and no stop hook beyond the process group."""
    inv = inventory.parse(
        "nodes:\n  - host: a\n  - host: b\n    python: /b/bin/python\njob: {python: /opt/py/bin/python}\n", "t.yaml"
    )
    a, b = inv.nodes
    assert job_command(inv, a, ["-m", "trainer", "--check", "--epochs", "1"]) == [
        "/opt/py/bin/python",
        "-m",
        "trainer",
        "--check",
        "--epochs",
        "1",
    ]
    assert job_command(inv, b, ["-c", "print(1)"]) == ["/b/bin/python", "-c", "print(1)"]
    assert job_python(inv, b) == "/b/bin/python" == b.python
    assert job_stop(inv, a, "r1", "abcd") == []
    plan = make_plan(inv, "r1", nonce="abcd")
    assert plan.nodes[1].argv[:4] == (
        "/b/bin/python",
        "-m",
        "torch.distributed.run",
        "--log-dir={ORCH_RUN_DIR}/torchrun",
    )
    assert all(p.stop == () for p in plan.nodes)
    assert "stop_hook" not in plan.to_json()["nodes"][0]  # type: ignore[index]


def test_the_node_values_are_spelled_alike_by_plan_and_agent() -> None:
    assert NODE_VALUES == agent.NODE_VALUES
    assert set(agent.node_values("/r")) == set(NODE_VALUES)


def test_node_rank_is_inventory_order_not_the_ip() -> None:
    """The field guide's launcher took `cut -d. -f4` of 192.168.1.11 as node rank 11."""
    inv = inventory.parse("nodes:\n  - host: 192.168.1.13\n  - host: 192.168.1.11\n  - host: 192.168.1.12\n", "t.yaml")
    plan = make_plan(inv)
    assert [(p.node.host, p.node_rank) for p in plan.nodes] == [
        ("192.168.1.13", 0),
        ("192.168.1.11", 1),
        ("192.168.1.12", 2),
    ]


def test_master_addr_is_the_data_plane_address() -> None:
    inv = inventory.parse(
        "nodes:\n  - host: gpu[1-2]\n    addr: 10.10.0.[1-2]\n    gpus: 2\nmaster: {node: gpu2, port: 29400}\n",
        "t.yaml",
    )
    plan = make_plan(inv)
    assert plan.nodes[0].node.name == "gpu2"
    assert "--master-addr=10.10.0.2" in plan.nodes[1].argv
    assert "--master-port=29400" in plan.nodes[1].argv


def test_c10d_allows_heterogeneous_nodes() -> None:
    inv = inventory.parse(
        "nodes:\n  - host: a\n    gpus: 8\n  - host: b\n    gpus: 4\n"
        "job: {rdzv: c10d, script: /w/train.py, args: [--steps, 3]}\n",
        "t.yaml",
    )
    plan = make_plan(inv, "run-7")
    a, b = plan.nodes
    assert plan.world_size == 12
    assert "--rdzv-backend=c10d" in a.argv and "--rdzv-endpoint=a:29500" in b.argv and "--rdzv-id=run-7" in b.argv
    assert not any(arg.startswith("--node-rank") for arg in a.argv)
    assert a.argv[-3:] == ("/w/train.py", "--steps", "3")
    assert b.global_ranks == range(8, 12)


@pytest.fixture
def refuse_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("dry-run must not connect")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def test_dry_run_prints_the_plan_and_connects_to_nothing(
    refuse_network: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["up", str(V100), "--dry-run"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "4 nodes, world size 32" in out
    for i, host in enumerate(["192.168.1.10", "192.168.1.11", "192.168.1.12", "192.168.1.13"]):
        assert host in out
        assert f"--node-rank={i}" in out


def test_dry_run_json(refuse_network: None, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["up", str(V100), "--dry-run", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert plan["world_size"] == 32
    assert [n["node_rank"] for n in plan["nodes"]] == [0, 1, 2, 3]
    assert plan["nodes"][3]["argv"] == golden(3)
    assert plan["nodes"][3]["global_ranks"] == [24, 31]


SECRETS = """\
name: sec
nodes:
  - {host: 10.0.0.1, name: a, env: {NODE_TOKEN: node-secret-123}}
  - {host: 10.0.0.2, name: b}
env: {WANDB_API_KEY: wandb-secret-456, NCCL_SOCKET_IFNAME: ens2f1}
job: {python: /opt/py, script: /w/train.py}
"""


def dry_run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    inv = tmp_path / "sec.yaml"
    inv.write_text(SECRETS)
    with pytest.raises(SystemExit) as info:
        main(["up", str(inv), *flags])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_dry_run_shows_env_names_and_hides_the_inventorys_values(
    refuse_network: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, table, _ = dry_run(tmp_path, capsys, "--dry-run")
    assert code == 0 and "secret" not in table
    assert "WANDB_API_KEY=*** NCCL_SOCKET_IFNAME=*** NODE_TOKEN=***" in table and "--show-env prints them" in table
    code, out, _ = dry_run(tmp_path, capsys, "--dry-run", "--json")
    doc = json.loads(out)
    assert code == 0 and "secret" not in out and doc["env_values"] == "hidden"
    a, b = (n["env"] for n in doc["nodes"])
    assert a == {
        "WANDB_API_KEY": "***",
        "NCCL_SOCKET_IFNAME": "***",
        "NODE_TOKEN": "***",
        "PYTHONUNBUFFERED": "1",
        "ORCH_RUN_ID": "dry-run",
        "ORCH_NODE": "a",
        "ORCH_NODE_RANK": "0",
        "ORCH_NNODES": "2",
        "ORCH_ATTEMPT": "1",
    }
    assert "NODE_TOKEN" not in b and b["WANDB_API_KEY"] == "***"


def test_show_env_prints_the_values_and_only_with_dry_run(
    refuse_network: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = dry_run(tmp_path, capsys, "--dry-run", "--json", "--show-env")
    doc = json.loads(out)
    assert code == 0 and doc["env_values"] == "shown"
    assert doc["nodes"][0]["env"]["NODE_TOKEN"] == "node-secret-123"
    assert doc["nodes"][1]["env"]["WANDB_API_KEY"] == "wandb-secret-456"
    code, table, _ = dry_run(tmp_path, capsys, "--dry-run", "--show-env")
    assert code == 0 and "WANDB_API_KEY=wandb-secret-456" in table and "***" not in table
    code, _, err = dry_run(tmp_path, capsys, "--show-env")
    assert code == 2 and "--show-env goes with --dry-run" in err


def test_json_without_dry_run_is_refused_before_anything_is_launched(
    refuse_network: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`orch up INV --json` was accepted and ignored: a launch printed its human output."""
    code, out, err = dry_run(tmp_path, capsys, "--json")
    assert code == 2 and out == "" and "--json goes with --dry-run" in err and "orch status RUN --json" in err


def test_a_per_rank_batch_below_4_without_sync_bn_is_warned_in_the_plan(
    refuse_network: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Field guide 004's `--batch-size 32` on 4 x 8 V100: the global batch, 1 image per GPU."""
    with pytest.raises(SystemExit):
        main(["up", str(V100), "--dry-run", "--", "--batch-size", "32"])
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "warning: global batch 32 on 32 ranks" in ln)
    assert "1 image(s) per rank without SyncBN" in line and "--batch-per-device 32" in line and "--sync-bn" in line
    with pytest.raises(SystemExit):
        main(["up", str(V100), "--dry-run", "--json", "--", "--batch-size", "32"])
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert len(warnings) == 1 and warnings[0].startswith("warning: global batch 32 on 32 ranks is 1 image(s)")
    for extra in ([], ["--batch-size", "32", "--sync-bn"], ["batch=128"]):  # 12 per rank; SyncBN; 4 per rank
        with pytest.raises(SystemExit):
            main(["up", str(V100), "--dry-run", "--json", *(["--", *extra] if extra else [])])
        assert json.loads(capsys.readouterr().out)["warnings"] == [], extra
    with pytest.raises(SystemExit):
        main(["up", str(V100), "--dry-run", "--json", "--", "--batch-per-device", "2"])
    assert "2 image(s) per rank" in json.loads(capsys.readouterr().out)["warnings"][0]
