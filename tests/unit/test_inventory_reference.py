"""Each inventory key is written once, in the schema (orchestrator/config/schema.py): its type, its
default and the docstring under it. docs/inventory.md's tables are generated from it and cannot
drift; no other module (the resolved dataclasses, the CLI's help, the detector) writes a default
of its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import reference
from orchestrator.config import schema as inv_mod
from orchestrator.contract import CHECK_NAMES

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "inventory.md"
SCHEMAS = [v for v in vars(inv_mod).values() if inv_mod._is_schema(v) and v is not inv_mod._Schema]


def test_every_key_has_its_meaning_under_it() -> None:
    missing = {s.__name__: sorted(set(inv_mod.fields_of(s)) - set(inv_mod.field_docs(s))) for s in SCHEMAS}
    assert {k: v for k, v in missing.items() if v} == {}


def test_the_page_is_generated_from_the_schema() -> None:
    """Regenerate with `python -m orchestrator.config.reference` when this fails."""
    assert reference.generated(PAGE.read_text()) == reference.tables()


def test_the_guard_sees_a_default_the_page_does_not_say(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inv_mod.JobModel, "stall_timeout_s", 900.0)
    assert reference.generated(PAGE.read_text()) != reference.tables()
    assert "| `job.stall_timeout_s` | number | `900` |" in reference.tables()


def schema_paths(schema: type = inv_mod.InventoryModel, prefix: str = "") -> set[str]:
    """Every key of the file as a dotted path (`job.straggler.share`, `nodes[].host`), walked
    independently of the generator."""
    out = set()
    for key, tp in inv_mod.fields_of(schema).items():
        path = f"{prefix}{key}"
        sub = reference._unwrap_schema(tp)
        if sub is None or (sub is inv_mod.SSHModel and schema is inv_mod.NodeModel):
            out.add(path)
            continue
        if key == "spare":
            out.add(path)
            continue
        if not inv_mod._is_schema(tp) or not prefix:  # `checks.fabric: true`, `job.container`, top level
            out.add(path)
        out |= schema_paths(sub, f"{path}[]." if key == "nodes" else f"{path}.")
    return out


def page_paths() -> set[str]:
    keys = set()
    for cell in re.findall(r"^\| `([^`]+)` \|", reference.generated(PAGE.read_text()), re.M):
        m = re.fullmatch(r"(.*)\{(.*)\}", cell)
        keys |= {m.group(1) + k for k in m.group(2).split(",")} if m else {cell}
    return keys


def test_every_key_is_on_the_page_and_every_key_there_is_real() -> None:
    assert page_paths() == schema_paths()
    assert {"job.stall_timeout_s", "nodes[].port", "checks.fabric.share", "job.container.pull"} <= page_paths()


def test_every_check_name_is_listed() -> None:
    row = next(line for line in PAGE.read_text().splitlines() if line.startswith("| `checks.skip`"))
    assert all(f"`{name}`" in row for name in CHECK_NAMES)


def test_the_cli_help_says_the_schemas_defaults() -> None:
    from orchestrator.cli.commands import cli

    up = cli.commands["up"]
    text = " ".join([up.help or ""] + [getattr(p, "help", None) or "" for p in up.params])
    for key in ("job.stall_timeout_s", "job.retries"):
        assert f"{key}, {inv_mod.yaml_text(inv_mod.default_of(key))})" in text


# ----------------------------------------------------------------------------- no second copy


def schema_defaults() -> dict[str, list[Any]]:
    """{key name: the defaults the schema gives keys of that name}: numbers and words, not the
    `None`/`false`/empty ones every option has."""
    out: dict[str, list[Any]] = {}
    for schema in SCHEMAS:
        for key in inv_mod.fields_of(schema):
            value = getattr(schema, key, None)
            if value is None and key in inv_mod.SSH_UNSET and issubclass(schema, inv_mod.SSHModel):
                value = inv_mod.SSH_UNSET[key]
            if isinstance(value, (int, float, str)) and not isinstance(value, bool):
                out.setdefault(key, []).append(value)
    return out


def _is_default(name: str | None, value: ast.AST | None, defaults: dict[str, list[Any]]) -> bool:
    """`value` is a literal equal to a default the schema gives a key called `name` (600 and 600.0
    alike; a word only as a word)."""
    if name not in defaults or not isinstance(value, ast.Constant) or isinstance(value.value, bool):
        return False
    number = isinstance(value.value, (int, float))
    return any(value.value == d and (number == isinstance(d, (int, float))) for d in defaults[name])


def _name(target: ast.AST) -> str | None:
    return target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else None


def written_defaults(tree: ast.AST) -> list[str]:
    """Where a module binds a schema default's literal value to a name of that key: a field
    (`stall_timeout_s: float = 600.0`), an assignment (`share, windows = 0.8, 3`), a parameter
    default or keyword argument (`share=0.8`), a `.get("share", 0.7)`, a dict entry."""
    defaults = schema_defaults()
    found = []

    def hit(name: str | None, value: ast.AST | None, where: ast.AST) -> None:
        if _is_default(name, value, defaults):
            assert isinstance(value, ast.Constant)
            found.append(f"line {getattr(where, 'lineno', '?')}: {name} = {value.value!r}")

    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign):
            hit(_name(node.target), node.value, node)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    for t, v in zip(target.elts, node.value.elts):
                        hit(_name(t), v, node)
                else:
                    hit(_name(target), node.value, node)
        elif isinstance(node, ast.keyword):
            hit(node.arg, node.value, node.value)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.posonlyargs + node.args.args
            for arg, default in zip(args[len(args) - len(node.args.defaults) :], node.args.defaults):
                hit(arg.arg, default, node)
            for arg, kw in zip(node.args.kwonlyargs, node.args.kw_defaults):
                hit(arg.arg, kw, node)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and len(node.args) == 2
            and isinstance(node.args[0], ast.Constant)
        ):
            hit(str(node.args[0].value), node.args[1], node)
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant):
                    hit(str(k.value), v, node)
    return sorted(found, key=lambda f: int(f.split()[1].rstrip(":")))


def said_defaults(tree: ast.AST) -> list[str]:
    """Text (help, docstrings) that states a key's default by value: `job.stall_timeout_s (600`."""
    defaults = schema_defaults()
    paths = {p.rsplit(".", 1)[-1]: p for p in schema_paths() if "." in p}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for m in re.finditer(
                r"\b((?:job|checks|ssh|master)\.[a-z_.]+)\W{1,3}(?:[a-z ]{0,12}\W{1,3})?"
                r"([0-9][0-9.]*)\b",
                node.value,
            ):
                key = m.group(1).rsplit(".", 1)[-1]
                if key in paths and any(inv_mod.yaml_text(d) == m.group(2) for d in defaults.get(key, [])):
                    found.append(f"line {node.lineno}: {m.group(0)!r}")
    return found


ALLOWED = {
    ("config/inventory.py", "transport"): "orch exec -w reaches its hosts over SSH, whatever the default",
    ("preflight/fabric/job.py", "max_restarts"): "the fabric job is never restarted: a value, not a default",
}
"""A schema default's value bound to its key's name on purpose, and why."""
OTHERS = sorted(
    p
    for p in (REPO / "orchestrator").rglob("*.py")
    if p.relative_to(REPO / "orchestrator").parts[0] != "node" and p.name not in ("schema.py", "reference.py")
)
"""Every module of orch but the schema (and the generator of the page, which reads it). The node
programs are left out: they import nothing of orch, and their settings arrive on their command
line."""


@pytest.mark.parametrize("path", OTHERS, ids=lambda p: str(p.relative_to(REPO / "orchestrator")))
def test_no_module_writes_a_default_of_the_schemas(path: Path) -> None:
    tree = ast.parse(path.read_text())
    module = str(path.relative_to(REPO / "orchestrator"))
    found = [
        f
        for f in written_defaults(tree) + said_defaults(tree)
        if (module, f.split(": ", 1)[1].split(" = ")[0]) not in ALLOWED
    ]
    assert found == []


def test_the_guard_sees_a_second_default() -> None:
    code = """
from dataclasses import dataclass
@dataclass(frozen=True)
class Job:
    stall_timeout_s: float = 600.0
    other: float = 600.0
share, windows = 0.8, 3
def detect(share: float = 0.8, *, fanout=32) -> None:
    fabric = {}
    fabric.get("share", 0.7)
    run(port=29500, retries=1)
HELP = "Call it hung after job.stall_timeout_s (600; --stall-timeout)"
"""
    tree = ast.parse(code)
    assert [f.split(":")[0] for f in written_defaults(tree)] == [
        "line 5",
        "line 7",
        "line 7",
        "line 8",
        "line 8",
        "line 10",
        "line 11",
    ]
    assert said_defaults(tree) == ["line 12: 'job.stall_timeout_s (600'"]
