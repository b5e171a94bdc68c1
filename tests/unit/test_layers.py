"""The architecture holds (docs/ARCHITECTURE.md): imports go down the layers, only the CLI prints
or exits, and the node programs import nothing of orch (tests/unit/test_node.py)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"
LAYERS = {
    "contract": 0,
    "errors": 1,
    "waits": 1,
    "shell": 1,
    "node": 1,
    "config": 2,
    "store": 3,
    "transport": 3,
    "run": 4,
    "preflight": 5,
    "logs": 5,
    "remote": 5,
    "report": 6,
    "up": 6,
    "top": 6,
    "cli": 7,
    "__main__": 8,
    "__init__": 0,
}
"""Each part of the package and its layer, as docs/ARCHITECTURE.md draws them: a module may import
from its own part and from lower layers only."""
SOURCES = sorted(PACKAGE.rglob("*.py"))


def part(path: Path) -> str:
    """The top-level part of the package a file belongs to (`logs` for logs/merge.py)."""
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported_parts(path: Path) -> set[str]:
    """The parts of the package a module imports, at module level or inside functions."""
    tree = ast.parse(path.read_text())
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]  # ("orchestrator", "logs")
    out = set()
    for node in ast.walk(tree):
        names: list[tuple[str, ...]] = []
        if isinstance(node, ast.Import):
            names = [tuple(a.name.split(".")) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = tuple(node.module.split(".")) if node.module else ()
            full = base + module
            names = [full + (a.name,) for a in node.names] if full == ("orchestrator",) else [full]
        for name in names:
            if name[:1] == ("orchestrator",) and len(name) > 1:
                submodule = (PACKAGE / name[1]).is_dir() or (PACKAGE / f"{name[1]}.py").exists()
                out.add(name[1] if submodule else "__init__")  # `from .. import __version__`
    return out


def test_every_part_has_a_layer() -> None:
    assert {part(p) for p in SOURCES} <= set(LAYERS), {part(p) for p in SOURCES} - set(LAYERS)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_down_the_layers(path: Path) -> None:
    mine = part(path)
    upward = {p for p in imported_parts(path) if p != mine and LAYERS[p] >= LAYERS[mine]}
    assert not upward, f"{path.relative_to(PACKAGE)} ({mine}, layer {LAYERS[mine]}) imports {upward}"


def test_the_fabric_check_is_a_package_of_preflight() -> None:
    """The one check that runs a job across the nodes, through run/: its job, verdict and parsers
    are `preflight/fabric/`, and no other module of preflight/ imports run/."""
    launching = sorted(
        str(p.relative_to(PACKAGE)) for p in SOURCES if part(p) == "preflight" and "run" in imported_parts(p)
    )
    assert launching and all(p.startswith("preflight/fabric/") for p in launching), launching
    beside = sorted(
        p.name
        for p in (PACKAGE / "preflight").glob("*.py")
        if p.stem.startswith("fabric") or p.stem in ("nccl_log", "busbw")
    )
    assert beside == [], f"the fabric check's modules belong in preflight/fabric/: {beside}"


def test_the_cli_renders_each_command_in_a_module_of_its_own() -> None:
    """`cli/render/` is a package, a module per command beside `common.py`, not one module of
    every renderer; `commands.py` reaches them all through the package."""
    modules = {p.stem: len(p.read_text().splitlines()) for p in (PACKAGE / "cli" / "render").glob("*.py")}
    assert {"__init__", "common", "check", "up", "top"} <= set(modules), modules
    assert max(modules.values()) <= 500, modules  # render.py was 1099 lines (1290 in ruff format)


def printing(path: Path) -> list[str]:
    """What in a module writes to the terminal or ends the process."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            found.append(f"print() at line {node.lineno}")
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
            and node.attr in ("exit", "stdout", "stderr")
        ):
            found.append(f"sys.{node.attr} at line {node.lineno}")
        elif isinstance(node, ast.Name) and node.id == "SystemExit":
            found.append(f"SystemExit at line {node.lineno}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"import {m} at line {node.lineno}" for m in mods if m.split(".")[0] in ("click", "rich")]
    return found


@pytest.mark.parametrize(
    "path", [p for p in SOURCES if part(p) not in ("cli", "node")], ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_only_the_cli_prints_or_exits(path: Path) -> None:
    """The library returns outcomes or raises OrchError; cli/ shows them and picks the exit code.
    (The node programs print their protocol on the node's stdout: that is their job.)"""
    assert printing(path) == []


def test_the_guard_sees_printing() -> None:
    cli = PACKAGE / "cli" / "render" / "up.py"
    assert any(f.startswith("import rich") for f in printing(cli)) and any("sys.stdout" in f for f in printing(cli))


def trainer_imports(path: Path) -> set[str]:
    """The modules of the `trainer` package a module imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "trainer"}
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "trainer":
            found.add(node.module or "")
    return found


def test_orch_reaches_the_trainer_only_through_its_two_torch_free_modules() -> None:
    """trainer/logs.py defines the lines orch reads, trainer/interface.py the flags, layout and rules
    orch relies on (both stdlib only); logs/trainer.py and config/trainer.py are the doors to them."""
    importers = {str(p.relative_to(PACKAGE)): trainer_imports(p) for p in SOURCES if trainer_imports(p)}
    assert importers == {"logs/trainer.py": {"trainer.logs"}, "config/trainer.py": {"trainer.interface"}}, importers


@pytest.mark.parametrize("module", ["logs", "interface"])
def test_the_trainers_doors_import_only_the_standard_library(module: str) -> None:
    """At module level: what the controller loads by importing them (trainer/logs.py imports
    ultralytics inside the function only the trainer calls)."""
    body = ast.parse((PACKAGE.parent / "trainer" / f"{module}.py").read_text()).body
    found = {a.name.split(".")[0] for n in body if isinstance(n, ast.Import) for a in n.names}
    found |= {(n.module or "").split(".")[0] for n in body if isinstance(n, ast.ImportFrom) and not n.level}
    assert found <= set(sys.stdlib_module_names) | {"__future__"}, found


OWN_PROGRAMS = {"node_script", "node_program", "script", "program", "FROM_STDIN", "FROM_STDIN_OPEN"}
"""What orch's own node programs are spelled as after `python -c` (the agent's boot, the probe, the
log reader): run by the host's python, not the job's."""
JOB_BUILDER = "config/plan.py"


def _names(node: ast.AST) -> set[str]:
    return {
        n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))
    }


def job_argv_builders(source: str) -> list[str]:
    """Where a module builds a command that runs the job's interpreter itself: an argv whose head
    is a python followed by `-m`, or by `-c` and code that is not orch's own node program; or
    torchrun named. Only `plan.job_command` may (the launch, the job's check, the probe's software
    facts and the fabric job go through it)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.List, ast.Tuple)) and len(node.elts) >= 2:
            head, flag = node.elts[0], node.elts[1]
            pythonish = any("python" in n.lower() for n in _names(head)) or (
                isinstance(head, ast.Constant) and "python" in str(head.value)
            )
            if pythonish and isinstance(flag, ast.Constant) and flag.value in ("-m", "-c"):
                code = node.elts[2] if len(node.elts) > 2 else None
                if flag.value == "-m" or code is None or not _names(code) & OWN_PROGRAMS:
                    found.append(f"argv {ast.unparse(node)[:60]} at line {node.lineno}")
        elif isinstance(node, ast.Name) and node.id == "TORCHRUN":
            found.append(f"TORCHRUN at line {node.lineno}")
        elif isinstance(node, ast.Constant) and node.value == "torch.distributed.run":
            found.append(f"torch.distributed.run at line {node.lineno}")
    return found


@pytest.mark.parametrize(
    "path",
    [p for p in SOURCES if part(p) != "node" and str(p.relative_to(PACKAGE)) != JOB_BUILDER],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_only_the_plan_builds_the_jobs_command(path: Path) -> None:
    """How a node runs the job (its interpreter, or later a container around it) is known in one
    place, `config/plan.job_command`; everything that runs the job's python asks it."""
    assert job_argv_builders(path.read_text()) == []


def test_the_guard_sees_a_job_command_built_elsewhere() -> None:
    """What preflight/jobcheck.py did before the seam, and the orch programs it must let pass."""
    assert job_argv_builders("argv = [node.python, '-m', TRAINER, '--check', *inv.job.args]")
    assert job_argv_builders("argv = [node.python, '-c', IMPORT_CODE, str(inv.job.module)]")
    assert job_argv_builders("argv = [python, *TORCHRUN, '--nnodes=2']")
    assert not job_argv_builders("t.run([python, '-c', node_script('boot'), rdir, 'start'])")
    assert not job_argv_builders("[python, '-c', FROM_STDIN_OPEN if lease else FROM_STDIN, d]")
    assert job_argv_builders((PACKAGE / JOB_BUILDER).read_text())


def module_name(path: Path) -> str:
    """`orchestrator.logs.lines` for logs/lines.py, `orchestrator.logs` for logs/__init__.py."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of the package a module imports, at module level or inside functions: for
    `from .x import y`, module `x.y` when y is one, else `x` itself."""
    package = module_name(path).split(".") if path.name == "__init__.py" else module_name(path).split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            full = ".".join(base + (node.module.split(".") if node.module else []))
            out |= {f"{full}.{a.name}" if f"{full}.{a.name}" in known else full for a in node.names}
    return out & known


def cycles_of(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle of a graph of imports (Tarjan's strongly connected components with more than
    one module, or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def import_cycles() -> list[list[str]]:
    known = {module_name(p) for p in SOURCES}
    return cycles_of({module_name(p): imported_modules(p, known) for p in SOURCES})


def test_no_module_imports_itself_in_a_circle() -> None:
    """An import circle (a imports b, b imports a, even inside a function) makes the two one module
    in two files: the layers above cannot see it, so this holds every module of orchestrator/ to none."""
    assert import_cycles() == []


def test_the_guard_sees_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"d"}}
    assert cycles_of(graph) == [["a", "b", "c"], ["e"]]
    lines = PACKAGE / "logs" / "lines.py"
    known = {module_name(p) for p in SOURCES}
    assert imported_modules(lines, known) == {  # `from .trainer import RANK_PREFIX`, `from ..node.agent import ...`
        "orchestrator.logs.trainer",
        "orchestrator.node.agent",
    }
    assert "orchestrator.cli.render" in imported_modules(
        PACKAGE / "cli" / "commands.py", known
    )  # `from . import render`
