"""Inventory validation: every bad file is refused with file, line and key, before any connection."""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import pytest

from orchestrator import inventory
from orchestrator.cli import main
from orchestrator.errors import InventoryError

BAD = sorted((Path(__file__).parent / "bad_inventories").glob("*.yaml"))
REPO = Path(__file__).resolve().parents[2]


def expectation(path: Path) -> tuple[int | None, str]:
    first = path.read_text().splitlines()[0]
    m = re.match(r"# expect: (?:line (\d+): )?(.*)$", first)
    assert m, f"{path.name} must start with '# expect: [line N: ]text'"
    return (int(m.group(1)) if m.group(1) else None), m.group(2)


def test_corpus_is_large_enough() -> None:
    assert len(BAD) >= 25


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_inventory_names_file_line_and_key(path: Path) -> None:
    line, text = expectation(path)
    with pytest.raises(InventoryError) as info:
        inventory.load(path)
    message = str(info.value)
    assert info.value.exit_code == 2
    assert text in message, message
    where = f"{path}:{line}:" if line else f"{path}:"
    assert where in message, message


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Record (and refuse) any attempt to connect or to start a process."""
    attempts: list[object] = []

    def refuse(*args: object, **kwargs: object) -> None:
        attempts.append(args)
        raise AssertionError(f"connection attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    import paramiko

    monkeypatch.setattr(paramiko.SSHClient, "connect", refuse)
    return attempts


@pytest.mark.parametrize("command", ["check", "up"])
@pytest.mark.parametrize("path", BAD[:: max(1, len(BAD) // 8)], ids=lambda p: p.stem)
def test_cli_refuses_before_connecting(command: str, path: Path, no_network: list[object],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, str(path)])
    assert info.value.code == 2
    assert no_network == []
    err = capsys.readouterr().err
    assert str(path) in err


def test_every_bad_inventory_reports_all_problems_at_once(tmp_path: Path) -> None:
    f = tmp_path / "two.yaml"
    f.write_text("nodes:\n  - host: a\n    gpus: 0\nmaster:\n  port: 0\n")
    with pytest.raises(InventoryError) as info:
        inventory.load(f)
    assert len(info.value.issues) == 2
    assert {i.line for i in info.value.issues} == {3, 5}


def test_missing_file_is_a_clean_error(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="cannot read inventory"):
        inventory.load(tmp_path / "nope.yaml")


def test_v100_inventory_resolves_like_the_field_guide() -> None:
    inv = inventory.load(REPO / "inventory" / "v100.yaml")
    assert [n.name for n in inv.nodes] == ["v100-1", "v100-2", "v100-3", "v100-4"]
    assert [n.host for n in inv.nodes] == [f"192.168.1.{i}" for i in range(10, 14)]
    assert inv.master.name == "v100-1" and inv.master_port == 29500
    assert all(n.gpus == 8 and n.nproc_per_node == 8 for n in inv.nodes)
    assert inv.env["NCCL_IB_HCA"] == "mlx5_0" and inv.env["NCCL_IB_DISABLE"] == "0"
    assert inv.checks.clock.ntp_server == "192.168.1.10"
    assert inv.checks.timezone == "Asia/Shanghai"
    assert inv.checks.rdma_devices == ("mlx5_0",)
    assert inv.nodes[1].ssh.user == "root" and inv.nodes[1].ssh.host_key_policy == "strict"


def test_defaults_and_per_node_overrides() -> None:
    inv = inventory.parse(
        """
ssh: {user: train, port: 2222, host_key_policy: accept-new}
nodes:
  - host: gpu[01-02]
    gpus: 4
  - host: gpu03
    gpus: 4
    user: admin
    ssh: {port: 22}
    python: /opt/py/bin/python
    env: {NCCL_SOCKET_IFNAME: eth9}
env: {NCCL_SOCKET_IFNAME: eth0, NCCL_IB_DISABLE: 0, DEBUG: true}
job: {python: /usr/bin/python3}
""", "t.yaml")
    a, _, c = inv.nodes
    assert (a.ssh.user, a.ssh.port, a.ssh.host_key_policy) == ("train", 2222, "accept-new")
    assert (c.ssh.user, c.ssh.port) == ("admin", 22)
    assert a.python == "/usr/bin/python3" and c.python == "/opt/py/bin/python"
    assert a.env == {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "0", "DEBUG": "1"}
    assert c.env["NCCL_SOCKET_IFNAME"] == "eth9"
    assert a.nproc_per_node == 4


def test_master_moves_to_rank_zero_others_keep_file_order() -> None:
    inv = inventory.parse("nodes:\n  - host: n[1-4]\nmaster:\n  node: n3\n", "t.yaml")
    assert [n.name for n in inv.nodes] == ["n3", "n1", "n2", "n4"]


def test_cpu_nodes_without_gpus_run_one_process() -> None:
    inv = inventory.parse("transport: local\nnodes:\n  - host: localhost\n    name: node[0-1]\n", "t.yaml")
    assert [n.name for n in inv.nodes] == ["node0", "node1"]
    assert all(n.gpus is None and n.nproc_per_node == 1 for n in inv.nodes)


def test_job_args_render_as_flags() -> None:
    assert inventory.render_args({"model": "yolo12n.yaml", "amp": True, "sync-bn": False, "lr": 0.01,
                                  "skip": None, "imgsz": [640, 480]}) == (
        "--model", "yolo12n.yaml", "--amp", "--lr", "0.01", "--imgsz", "640", "480")
    assert inventory.render_args(["train.py", 3, True]) == ("train.py", "3", "1")
