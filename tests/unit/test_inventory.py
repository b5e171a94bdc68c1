"""Inventory validation: every bad file is refused with file, line and key, before any connection."""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.cli import main
from orchestrator.config import inventory, nodes, schema
from orchestrator.config.inventory import load
from orchestrator.errors import InventoryError
from tests.hypothesis_support import examples

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
def test_cli_refuses_before_connecting(
    command: str, path: Path, no_network: list[object], capsys: pytest.CaptureFixture[str]
) -> None:
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
""",
        "t.yaml",
    )
    a, _, c = inv.nodes
    assert (a.ssh.user, a.ssh.port, a.ssh.host_key_policy) == ("train", 2222, "accept-new")
    assert (c.ssh.user, c.ssh.port) == ("admin", 22)
    assert a.python == "/usr/bin/python3" and c.python == "/opt/py/bin/python"
    assert a.env == {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "0", "DEBUG": "1"}
    assert c.env["NCCL_SOCKET_IFNAME"] == "eth9"
    assert a.nproc_per_node == 4


def test_job_sync_paths_are_normalised_and_default_to_none() -> None:
    inv = inventory.parse("nodes:\n  - host: a\njob:\n  sync: [/srv/yolo/, /data/coco.yaml, /srv/yolo2]\n", "t.yaml")
    assert inv.job.sync == ("/srv/yolo", "/data/coco.yaml", "/srv/yolo2")  # /srv/yolo2 is not inside /srv/yolo
    assert inventory.parse("nodes:\n  - host: a\n", "t.yaml").job.sync == ()


def test_master_moves_to_rank_zero_others_keep_file_order() -> None:
    inv = inventory.parse("nodes:\n  - host: n[1-4]\nmaster:\n  node: n3\n", "t.yaml")
    assert [n.name for n in inv.nodes] == ["n3", "n1", "n2", "n4"]


def test_cpu_nodes_without_gpus_run_one_process() -> None:
    inv = inventory.parse("transport: local\nnodes:\n  - host: localhost\n    name: node[0-1]\n", "t.yaml")
    assert [n.name for n in inv.nodes] == ["node0", "node1"]
    assert all(n.gpus is None and n.nproc_per_node == 1 for n in inv.nodes)


def test_job_args_render_as_flags() -> None:
    args = {"model": "yolo12n.yaml", "amp": True, "sync-bn": False, "lr": 0.01, "skip": None, "imgsz": [640, 480]}
    assert inventory.render_args(args, inventory.trainer_off) == (
        "--model",
        "yolo12n.yaml",
        "--amp",
        "--sync-bn",
        "false",
        "--lr",
        "0.01",
        "--imgsz",
        "640",
        "480",
    )
    with pytest.raises(ValueError, match="sync-bn"):  # false is never dropped: the job's word, or refused
        inventory.render_args(args)
    assert inventory.render_args(["train.py", 3, True]) == ("train.py", "3", "1")


# ----------------------------------------------------------------------------- one schema, two validators

SCHEMAS = [
    schema.SSHModel,
    schema.NodeModel,
    schema.MasterModel,
    schema.SlurmModel,
    schema.ClockModel,
    schema.RdmaModel,
    schema.SSHCheckModel,
    schema.FabricCheckModel,
    schema.ChecksModel,
    schema.StragglerModel,
    schema.ContainerModel,
    schema.JobModel,
    schema.InventoryModel,
]


def as_data(value: object) -> object:
    """A validated model (the plain schema object or pydantic's) as nested plain data."""
    if isinstance(value, schema._Schema) or hasattr(type(value), "model_fields"):
        klass = next(s for s in SCHEMAS if s.__name__ == type(value).__name__)
        return {"__model__": klass.__name__, **{k: as_data(getattr(value, k)) for k in schema.fields_of(klass)}}
    if isinstance(value, dict):
        return {k: as_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_data(v) for v in value]
    return (type(value).__name__, value)


@pytest.mark.parametrize("klass", SCHEMAS, ids=[s.__name__ for s in SCHEMAS])
def test_the_pydantic_model_is_the_schema(klass: type) -> None:
    """Same keys in the same order, same required keys, same defaults."""
    model = schema.pydantic_model(klass)
    assert list(model.model_fields) == list(schema.fields_of(klass))
    for name, info in model.model_fields.items():
        assert info.is_required() == (not hasattr(klass, name)), name
        if not info.is_required():
            assert as_data(info.default) == as_data(getattr(klass, name)), name


def _pydantic_only(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(tp: object, value: object) -> object:
        raise schema._NotPlain

    monkeypatch.setattr(schema, "_plain", refuse)


@pytest.mark.parametrize("path", sorted((REPO / "inventory").glob("*.yaml")), ids=lambda p: p.stem)
def test_plain_yaml_resolves_without_pydantic_and_as_pydantic_would(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, _ = schema.yamlines.load(path.read_text())
    plain = schema.validate(data)
    assert isinstance(plain, schema.InventoryModel)  # no coercion needed: the plain validator took it
    fast = inventory.load(path)
    _pydantic_only(monkeypatch)
    assert as_data(schema.validate(data)) == as_data(plain)
    assert inventory.load(path) == fast


def test_a_value_to_coerce_goes_to_pydantic() -> None:
    """`port: "2222"` and `gpus: 4.0` are not plain; pydantic coerces them exactly as before."""
    inv = inventory.parse('nodes:\n  - host: a\n    port: "2222"\n    gpus: 4.0\n    connect_timeout: 3\n', "t.yaml")
    node = inv.nodes[0]
    assert (node.ssh.port, node.gpus, node.ssh.connect_timeout) == (2222, 4, 3.0)
    assert type(node.ssh.port) is int and type(node.ssh.connect_timeout) is float


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70000),
    st.floats(allow_nan=False, width=32),
    st.text(max_size=6),
    st.sampled_from(["22", "1.5", "true", "ssh", "local", "c10d", "strict"]),
    st.lists(st.one_of(st.integers(0, 9), st.text(max_size=3), st.none()), max_size=3),
    st.dictionaries(
        st.sampled_from(["A", "port", "x", "devices", "ntp_server"]),
        st.one_of(st.none(), st.integers(0, 9), st.text(max_size=3)),
        max_size=2,
    ),
)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(0, 9), st.floats(0, 9), st.text(max_size=3))
TYPED = {  # mostly the declared type, sometimes not: both validators see both
    "host": st.text(max_size=4),
    "name": st.text(max_size=4),
    "user": st.text(max_size=4),
    "port": st.integers(0, 70000),
    "gpus": st.one_of(st.integers(-1, 8), st.floats(0, 8)),
    "connect_timeout": st.one_of(st.integers(0, 9), st.floats(0, 9)),
    "python": st.text(max_size=4),
    "host_key_policy": st.sampled_from(["strict", "accept-new", "yes"]),
    "env": st.dictionaries(st.text(max_size=3), SCALARS, max_size=3),
    "ssh": st.fixed_dictionaries(
        {}, optional={"port": st.integers(0, 9), "user": st.text(max_size=2), "identity": SCALARS}
    ),
    "transport": st.sampled_from(["ssh", "local", "rsh"]),
    "fanout": st.integers(-1, 64),
    "master": st.fixed_dictionaries({}, optional={"node": st.text(max_size=2), "port": st.integers(0, 9)}),
    "checks": st.fixed_dictionaries(
        {},
        optional={
            "clock": st.fixed_dictionaries({}, optional={"ntp_server": SCALARS, "max_offset_ms": SCALARS}),
            "skip": st.lists(st.text(max_size=3), max_size=2),
            "rdma": st.just({"devices": ["mlx5_0"]}),
            "fabric": st.one_of(
                SCALARS,
                st.fixed_dictionaries(
                    {},
                    optional={
                        "enabled": SCALARS,
                        "max_bytes": st.one_of(SCALARS, st.sampled_from(["256M", "1G", "x"])),
                        "min_busbw_gbps": SCALARS,
                        "share": SCALARS,
                        "timeout_s": SCALARS,
                    },
                ),
            ),
        },
    ),
    "job": st.fixed_dictionaries(
        {},
        optional={
            "args": st.one_of(
                st.dictionaries(st.text(max_size=3), st.one_of(SCALARS, st.lists(SCALARS)), max_size=2),
                st.lists(SCALARS, max_size=3),
            ),
            "rdzv": st.sampled_from(["static", "c10d", "x"]),
            "max_restarts": SCALARS,
            "torchrun_args": st.lists(st.text(max_size=3), max_size=2),
            "stop_grace_s": SCALARS,
            "stall_timeout_s": SCALARS,
            "on_stall": st.sampled_from(["warn", "stop", "kill"]),
            "retries": SCALARS,
            "sync": st.one_of(st.lists(st.one_of(st.text(max_size=3), SCALARS), max_size=2), SCALARS),
        },
    ),
    "spare": st.lists(
        st.fixed_dictionaries({"host": st.text(max_size=3)}, optional={"port": SCALARS, "gpus": SCALARS}), max_size=2
    ),
}


def keyed(keys: list[str]) -> st.SearchStrategy[dict[str, object]]:
    return st.dictionaries(st.sampled_from(keys), VALUES, max_size=1).flatmap(
        lambda wrong: st.fixed_dictionaries({}, optional={k: TYPED[k] for k in keys if k in TYPED}).map(
            lambda right: {**right, **wrong}
        )
    )


NODE_KEYS = [
    "host",
    "name",
    "port",
    "gpus",
    "env",
    "ssh",
    "user",
    "connect_timeout",
    "host_key_policy",
    "python",
    "bogus",
]
TOP_KEYS = ["name", "transport", "ssh", "master", "env", "checks", "job", "fanout", "spare", "nodez"]


@settings(max_examples=examples(300), deadline=None)
@given(node=keyed(NODE_KEYS), top=keyed(TOP_KEYS))
def test_the_plain_validator_agrees_with_pydantic(node: dict[str, object], top: dict[str, object]) -> None:
    """Whatever the plain validator takes, pydantic takes too and makes the same values of."""
    data = {**top, "nodes": [{"host": "h1", **node}]}
    try:
        plain = schema._plain(schema.InventoryModel, data)
    except schema._NotPlain:
        return
    assert as_data(schema.pydantic_model(schema.InventoryModel).model_validate(data)) == as_data(plain)


@settings(max_examples=examples(500), deadline=None)
@given(st.from_regex(nodes.PLAIN_HOST.pattern.replace("^", r"\A").replace("$", r"\Z")))
def test_a_plain_host_is_what_nodeset_makes_of_it(host: str) -> None:
    """Hosts without ranges, lists or colons skip ClusterShell: NodeSet gives them back unchanged."""
    from ClusterShell.NodeSet import NodeSet

    assert list(NodeSet(host)) == [host]
    inv = inventory.parse(f"nodes:\n  - host: '{host}'\n    name: n1\n", "t.yaml")
    assert inv.nodes[0].host == host


@pytest.mark.parametrize(
    ("job", "key", "words"),
    [
        ({"telemetry_s": -1}, "job.telemetry_s", "0 (off) or at least 1"),
        ({"telemetry_s": 0.5}, "job.telemetry_s", "at least 1 second"),
        ({"straggler": {"share": 1.25}}, "job.straggler.share", "between 0 and 1"),
        ({"straggler": {"windows": 0}}, "job.straggler.windows", "1 or more"),
        ({"straggler": {"action": "kill"}}, "job.straggler.action", "warn"),
        ({"straggler": {"window": 3}}, "job.straggler.window", "windows"),
    ],
)
def test_telemetry_and_straggler_keys_are_checked_with_their_line(
    tmp_path: Path, job: dict[str, Any], key: str, words: str
) -> None:
    """A bad `job.telemetry_s` or `job.straggler.*` is refused naming file, line and key."""
    import yaml

    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"host": "a"}], "job": job}, sort_keys=False))
    with pytest.raises(InventoryError) as exc:
        load(path)
    text = str(exc.value)
    assert f"{path}:" in text and key in text and words in text, text


def test_telemetry_and_straggler_defaults_and_values(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"host": "a"}]}))
    job = load(path).job
    assert (job.telemetry_s, job.straggler.share, job.straggler.windows, job.straggler.action) == (10.0, 0.8, 3, "warn")
    path.write_text(
        yaml.safe_dump(
            {
                "nodes": [{"host": "a"}],
                "job": {"telemetry_s": 0, "straggler": {"share": 0.5, "windows": 2, "action": "stop"}},
            }
        )
    )
    job = load(path).job
    assert (job.telemetry_s, job.straggler.share, job.straggler.windows, job.straggler.action) == (0.0, 0.5, 2, "stop")
