"""Facts orch computes or declares in one place only (docs/ARCHITECTURE.md, habit 8), held by
reading the source like tests/unit/test_layers.py: the world size (config/plan.py), run.json's node
records (run/records.py `NodeRecord`), the progress callback's type (contract.py `Progress`), the
container labels' keys (config/container.py), which image a machine holds (config/runtimes.py
`held`), the CUDA an image requires (preflight/checks/container.py `required_cuda`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"
SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] != "node")
"""orch's modules on the controller (the node programs import nothing of orch)."""


def _rel(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


# ----------------------------------------------------------------------------- world size


def _mentions_procs(node: ast.AST) -> bool:
    """An expression that reads a node's process count: `.nproc_per_node`, `.nproc`, `["nproc"]`."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in ("nproc_per_node", "nproc"):
            return True
        if isinstance(sub, ast.Constant) and sub.value == "nproc":
            return True
    return False


def counted_ranks(tree: ast.AST) -> list[int]:
    """Lines that add up (or multiply) nodes' process counts: a world size computed by hand, also
    through a name (`per_node = [n["nproc"] ...]; sum(per_node)`)."""
    counts = {
        t.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _mentions_procs(node.value)
        for t in node.targets
        if isinstance(t, ast.Name)
    }

    def procs(node: ast.AST) -> bool:
        return _mentions_procs(node) or (isinstance(node, ast.Name) and node.id in counts)

    found = []
    for node in ast.walk(tree):
        summed = (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "sum"
            and any(procs(a) for a in node.args)
        )
        multiplied = (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Mult)
            and (_mentions_procs(node.left) or _mentions_procs(node.right))
        )
        added = isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) and _mentions_procs(node.value)
        if summed or multiplied or added:
            found.append(getattr(node, "lineno", 0))
    return sorted(found)


@pytest.mark.parametrize("path", [p for p in SOURCES if _rel(p) != "config/plan.py"], ids=_rel)
def test_only_the_plan_counts_the_ranks(path: Path) -> None:
    """`config.plan.world_size` (and `plan.first_ranks`) count a job's ranks; everyone asks them."""
    assert counted_ranks(ast.parse(path.read_text())) == [], f"{_rel(path)} counts ranks itself"


def test_the_guard_sees_ranks_counted_elsewhere() -> None:
    code = """
world = sum(n.nproc_per_node for n in inv.nodes)
total = sum(int(r.get("nproc") or 0) for r in records)
first = 0
for node in nodes:
    first += node.nproc_per_node
ranks = len(inv.nodes) * inv.nodes[0].nproc_per_node
fine = sum(sizes) + len(nodes) * 2
per_node = [int(n.get("nproc") or 0) for n in nodes]
procs = sum(per_node)
"""
    assert counted_ranks(ast.parse(code)) == [2, 3, 6, 7, 10]


def test_the_plan_counts_them() -> None:
    from orchestrator.config.inventory import parse
    from orchestrator.config.plan import first_ranks, make_plan, world_size

    inv = parse(
        "name: t\ntransport: local\njob: {rdzv: c10d}\nnodes:\n  - {host: localhost, name: a, nproc_per_node: 2}\n"
        "  - {host: localhost, name: b, nproc_per_node: 3}\n  - {host: localhost, name: c}\n"
    )
    assert world_size(inv.nodes) == 6 == make_plan(inv).world_size
    assert first_ranks(inv.nodes) == {"a": 0, "b": 2, "c": 5}
    assert [p.global_ranks for p in make_plan(inv).nodes] == [range(0, 2), range(2, 5), range(5, 6)]


# ----------------------------------------------------------------------------- run.json's node records

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
OLD_INVENTORY = """name: old
transport: ssh
ssh: {user: train}
nodes:
  - host: "10.0.0.[1-2]"
    name: "gpu[1-2]"
    gpus: 2
    python: /opt/venv/bin/python
job:
  container: {runtime: podman, image: "yoloe:latest"}
"""
"""The inventory the fixtures' run was planned from (run id 20261206-071800-old, nonce 0123456789ab)."""


def record_lookups(tree: ast.AST) -> list[int]:
    """Lines that read a node record's key from its JSON: `r["python"]`, `r.get("remote_dir")`
    (`.get("python")` is also the agent's answers' key: only the subscript is a record's)."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and node.slice.value in ("python", "remote_dir", "base_rank")
        ) or (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in ("remote_dir", "base_rank")
        ):
            found.append(node.lineno)
    return sorted(found)


@pytest.mark.parametrize("path", [p for p in SOURCES if _rel(p) != "store.py"], ids=_rel)
def test_node_records_are_read_through_their_type(path: Path) -> None:
    """run.json's node records are `store.NodeRecord`s everywhere but in the store that reads them."""
    assert record_lookups(ast.parse(path.read_text())) == [], f"{_rel(path)} reads a record's JSON itself"


def test_the_guard_sees_a_record_read_as_a_dict() -> None:
    code = (
        'a = r["python"]\nb = rec.get("remote_dir")\nc = r.get("base_rank", 0)\nd = r.python\n'
        'e = data.get("nodes")\nf = answer.get("python")\n'
    )
    assert record_lookups(ast.parse(code)) == [1, 2, 3]


def test_a_run_json_written_before_the_type_reads_and_keeps_every_key() -> None:
    import json

    from orchestrator.store import NodeRecord, recorded_nodes, recorded_world_size

    text = (FIXTURES / "run_json_before_noderecord.json").read_text()
    data = json.loads(text)
    records = recorded_nodes(data)
    first = records[0]
    assert (first.node, first.host, first.node_rank, first.base_rank, first.nproc) == ("gpu1", "10.0.0.1", 0, 0, 2)
    assert (first.python, first.remote_dir) == ("/opt/venv/bin/python", "~/.orch/nodes/20261206-071800-old/gpu1")
    assert (first.state, first.exit_code, first.pid, first.nonce) == ("failed", 1, 4242, "0123456789ab")
    assert first.sweep is not None and first.sweep[:2] == ("podman", "ps")
    assert first.more == {"agent_pid": 4240, "failed_at": 1765005489.75, "signal": "SIGKILL", "cleanup_left": [77]}
    assert records[1].more == {}  # what run.json keeps of a status (agents.RECORDED) and nothing else
    assert recorded_world_size(data) == 4
    for raw, rec in zip(data["nodes"], records):  # every key, in its place
        assert list(rec.to_json().items()) == list(raw.items())
    assert json.dumps({**data, "nodes": [r.to_json() for r in records]}, indent=2) + "\n" == text
    assert NodeRecord.from_json({"node": "n1"}).nproc is None  # a record from before nproc


def test_a_record_from_before_nonces_reads_as_not_said() -> None:
    from orchestrator.store import NodeRecord, recorded_nodes, recorded_world_size

    old = {
        "node": "n1",
        "host": "h",
        "addr": "h",
        "node_rank": 0,
        "remote_dir": "/r",
        "python": "py",
        "state": "running",
        "exit_code": None,
        "pid": "not a pid",
        "pgid": None,
        "started_at": None,
        "finished_at": None,
    }
    rec = NodeRecord.from_json(old)
    assert (rec.nonce, rec.sweep, rec.base_rank, rec.nproc, rec.pid) == (None, None, None, None, None)
    assert recorded_world_size({"nodes": [old]}) is None
    assert [r.node for r in recorded_nodes({"nodes": [old, {"host": "no node"}, "junk"]})] == ["n1"]
    with pytest.raises(ValueError):
        NodeRecord.from_json({"host": "h"})


def test_a_fresh_record_is_the_json_orch_always_wrote() -> None:
    import json

    from orchestrator.config.inventory import parse
    from orchestrator.config.plan import make_plan
    from orchestrator.run.records import node_records

    plan = make_plan(parse(OLD_INVENTORY, "/tmp/old.yaml"), "20261206-071800-old", nonce="0123456789ab")
    before = json.loads((FIXTURES / "node_records_before_noderecord.json").read_text())["nodes"]
    # every key as it was, in its place; what was added since (the sweep's removal) after them, and
    # the listing asks for whole IDs (the node's sweep removes nothing else)
    added = {"sweep_remove": ["podman", "rm", "-f"]}
    for r in before:
        r["sweep"] = [*r["sweep"][:3], "--no-trunc", *r["sweep"][3:]]
    assert [list(r.to_json().items()) for r in node_records(plan)] == [[*r.items(), *added.items()] for r in before]


def test_trusted_records_take_what_runs_from_the_snapshot(tmp_path: Path) -> None:
    import json

    from orchestrator.config.inventory import parse
    from orchestrator.errors import UsageError
    from orchestrator.run.records import trusted_records
    from orchestrator.store import RunDir, recorded_nodes

    inv = parse(OLD_INVENTORY, "/tmp/old.yaml")
    run = RunDir(tmp_path / "20261206-071800-old")
    data = json.loads((FIXTURES / "run_json_before_noderecord.json").read_text())
    assert [r.python for r in trusted_records(run, inv, recorded_nodes(data))] == ["/opt/venv/bin/python"] * 2
    data["nodes"][1]["python"] = "/tmp/evil"
    with pytest.raises(UsageError, match="gpu2: python '/tmp/evil'"):
        trusted_records(run, inv, recorded_nodes(data))


def test_trusted_records_take_the_container_sweep_from_the_snapshot(tmp_path: Path) -> None:
    """What `orch down` runs on a node to find and remove a killed agent's containers is the run's
    environment's (`JobEnv.sweep`), for the record's launch: a run.json written before the removal
    was recorded gets it, and a listing recorded before it asked for whole IDs is the launch's; a
    listing or removal run.json changed is refused, never run."""
    import json

    from orchestrator.config.inventory import parse
    from orchestrator.errors import UsageError
    from orchestrator.run.records import trusted_records
    from orchestrator.store import RunDir, recorded_nodes

    inv = parse(OLD_INVENTORY, "/tmp/old.yaml")
    run = RunDir(tmp_path / "20261206-071800-old")
    data = json.loads((FIXTURES / "run_json_before_noderecord.json").read_text())
    first = trusted_records(run, inv, recorded_nodes(data))[0]
    recorded = data["nodes"][0]["sweep"]
    assert "--no-trunc" not in recorded
    assert first.sweep == (*recorded[:3], "--no-trunc", *recorded[3:]) and first.sweep_remove == ("podman", "rm", "-f")
    for key, evil in (("sweep", ["sh", "-c", "rm -rf ~"]), ("sweep_remove", ["sh", "-c"])):
        changed = json.loads(json.dumps(data))
        changed["nodes"][0][key] = evil
        with pytest.raises(UsageError, match=f"gpu1: {key} "):
            trusted_records(run, inv, recorded_nodes(changed))


# ----------------------------------------------------------------------------- the progress callback

PROGRESS_HOME = "transport/base.py"
OLD_SIGNATURES = ("Callable[[str, int, int], None]", "Callable[[int, int], None]")


def progress_types(tree: ast.AST) -> list[str]:
    """Where a module defines a progress callback's type of its own: a `Progress = ...` alias or
    class, a `progress` parameter typed as a callable, a callable type of the shape progress
    callbacks have (`progress: Any`, the trainer's progress, and `UpProgress`, orch up's, are other
    things)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "Progress" for t in node.targets):
            found.append(f"line {node.lineno}: Progress = {ast.unparse(node.value)}")
        elif isinstance(node, ast.ClassDef) and node.name == "Progress":
            found.append(f"line {node.lineno}: class Progress")
        elif (
            isinstance(node, ast.arg)
            and node.arg in ("progress", "say")
            and node.annotation is not None
            and "Callable" in ast.unparse(node.annotation)
        ):
            found.append(f"line {node.lineno}: {node.arg}: {ast.unparse(node.annotation)}")
        elif isinstance(node, ast.expr) and ast.unparse(node) in OLD_SIGNATURES:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda f: int(f.split()[1].rstrip(":")))


@pytest.mark.parametrize("path", [p for p in SOURCES if _rel(p) != PROGRESS_HOME], ids=_rel)
def test_one_progress_type(path: Path) -> None:
    """`transport.base.Progress` is the one type of a progress callback: `progress(label, done, total)`."""
    assert progress_types(ast.parse(path.read_text())) == [], f"{_rel(path)} types progress itself"


def test_the_guard_sees_a_progress_type_of_its_own() -> None:
    code = """
Progress = Callable[[int, int], None]
def run(progress: Callable[[str, int, int], None] | None = None) -> None: ...
def fine(progress: Progress | None = None) -> Iterator[Progress | None]: ...
def drawn() -> Iterator[Callable[[int, int], None] | None]: ...
"""
    assert [f.split(":")[0] for f in progress_types(ast.parse(code))] == [
        "line 2",
        "line 2",
        "line 3",
        "line 3",
        "line 5",
    ]


def test_the_progress_type_is_a_protocol_the_callers_fit() -> None:
    from typing import Protocol

    from orchestrator.transport import Progress

    assert Protocol in Progress.__mro__
    seen: list[tuple[str, int, int]] = []

    def progress(label: str, done: int, total: int) -> None:
        seen.append((label, done, total))

    fits: Progress = progress
    fits("probing", 1, 2)
    assert seen == [("probing", 1, 2)]


def test_orch_exec_says_its_progress_through_it() -> None:
    """A caller of the old two-number signature, adapted: `progress("running", done, total)` as
    each node answers."""
    from orchestrator.config.inventory import parse
    from orchestrator.remote.exec import run_everywhere

    inv = parse('name: lx\ntransport: local\nnodes:\n  - {host: localhost, name: "n[0-1]"}\n')
    seen: list[tuple[str, int, int]] = []

    def progress(label: str, done: int, total: int) -> None:
        seen.append((label, done, total))

    assert run_everywhere(inv, list(inv.nodes), ["true"], timeout=30, progress=progress).exit_code == 0
    assert sorted(seen) == [("running", 1, 2), ("running", 2, 2)]


# ----------------------------------------------------------------------------- container facts


def code_strings(tree: ast.AST) -> list[tuple[str, int]]:
    """Every string of a module's code (an f-string's pieces too), not its docstrings: (text, line)."""
    docs = {
        id(body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and (body := node.body)
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
    }
    after = set()  # an attribute's docstring: the string statement right after its assignment
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        for a, b in zip(body or [], (body or [])[1:]) if isinstance(body, list) else ():
            if isinstance(a, (ast.Assign, ast.AnnAssign)) and isinstance(b, ast.Expr):
                after.add(id(b.value))
    return [
        (n.value, n.lineno)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs | after
    ]


def written(tree: ast.AST, words: tuple[str, ...]) -> list[str]:
    return [f"{text!r} at line {line}" for text, line in code_strings(tree) if any(w in text for w in words)]


ONCE = {
    "the container labels' keys": ("config/container.py", ("orch.run", "orch.node", "orch.nonce", "orch.cluster")),
    "which image a machine holds": ("config/runtimes.py", ("{{.Id}}", "sha256:")),
    "the CUDA an image requires": ("preflight/checks/container.py", ("NVIDIA_REQUIRE_CUDA", "cuda>=")),
}
"""Each fact, the one module that writes it, and the words a second copy would have to write."""


@pytest.mark.parametrize("fact", sorted(ONCE))
def test_each_container_fact_is_written_in_one_module(fact: str) -> None:
    home, words = ONCE[fact]
    copies = {_rel(p): found for p in SOURCES if (found := written(ast.parse(p.read_text()), words))}
    assert set(copies) <= {home}, f"{fact} is written outside {home}: {copies}"


def test_the_required_cuda_is_one_string_there_and_the_label_keys_are_built_from_one_prefix() -> None:
    from orchestrator.config.container import LABEL_PREFIX, LABELS, labels

    assert all(k.startswith(LABEL_PREFIX) for k in LABELS) and [v.split("=")[0] for v in labels(*"abcd")] == list(
        LABELS
    )
    tree = ast.parse((PACKAGE / "preflight" / "checks" / "container.py").read_text())
    assert [t for t, _ in code_strings(tree) if "NVIDIA_REQUIRE_CUDA" in t] == ["NVIDIA_REQUIRE_CUDA"]


def test_the_guard_sees_a_second_copy() -> None:
    code = 'f = ["--filter", f"label=orch.nonce={nonce}"]\nfmt = "{{.Id}}"\nreq = env.get("NVIDIA_REQUIRE_CUDA")\n'
    tree = ast.parse(code)
    assert written(tree, ONCE["the container labels' keys"][1]) == ["'label=orch.nonce=' at line 1"]
    assert written(tree, ONCE["which image a machine holds"][1]) == ["'{{.Id}}' at line 2"]
    assert written(tree, ONCE["the CUDA an image requires"][1]) == ["'NVIDIA_REQUIRE_CUDA' at line 3"]
    assert written(ast.parse('"""labelled orch.run and orch.node."""\nX = 1\n"""orch.nonce"""\n'), ("orch.",)) == []
