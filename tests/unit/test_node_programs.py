"""What runs on a node lives in `orchestrator/node/`, held to its rules (Python 3.8, stdlib only,
its ruff.toml; tests/unit/test_node.py): no module elsewhere keeps a program in a string and sends
it. And the fabric check's read-back removes a run directory only through the agent's own checks."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

import orchestrator
from orchestrator.node import agent

PACKAGE = Path(orchestrator.__file__).parent
LOADERS = {"node_script", "node_program", "script", "program", "packed", "unpacking"}
"""`node/__init__.py`'s loaders: a node program's text, made from its file in node/."""
FROM_STDIN = {"FROM_STDIN", "FROM_STDIN_OPEN"}
"""The `python -c` text that runs a node program sent on stdin."""


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _own(code: ast.AST) -> bool:
    """`-c` code that is a node program from node/ (or the stub that reads one from stdin)."""
    if isinstance(code, ast.IfExp):
        return _own(code.body) and _own(code.orelse)
    if isinstance(code, ast.Call):
        return _name(code.func) in LOADERS
    return isinstance(code, (ast.Name, ast.Attribute)) and _name(code) in FROM_STDIN


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        for st in body if isinstance(body, list) else []:
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str):
                out.add(id(st.value))
    return out


def programs_in_strings(source: str) -> list[str]:
    """A Python program kept in a string (several lines that parse and import something), and a
    command sent through a transport (`.run([...])`, `.popen([...])`) whose `-c` code is not a node
    program's: `python -c CODE` or `sh -c SCRIPT` written here."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    sent = {
        id(call.args[0])
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and call.args
        and _name(call.func) in ("run", "popen")
        and isinstance(call.args[0], (ast.List, ast.Tuple))
    }
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docs
            and "\n" in node.value.strip()
        ):
            try:
                parsed = ast.parse(node.value)
            except (SyntaxError, ValueError):
                continue
            if any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(parsed)):
                found.append(f"a Python program in a string at line {node.lineno}")
        elif isinstance(node, (ast.List, ast.Tuple)) and id(node) in sent:
            for flag, code in zip(node.elts, node.elts[1:]):
                if isinstance(flag, ast.Constant) and flag.value == "-c" and not _own(code):
                    found.append(f"`{ast.unparse(node)[:60]}` sent at line {node.lineno}")
    return found


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] != "node")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_outside_node_keeps_a_node_program_in_a_string(path: Path) -> None:
    assert programs_in_strings(path.read_text()) == []


def test_the_scan_sees_the_programs_that_were_kept_in_strings() -> None:
    """What preflight/jobcheck.py, preflight/fabric.py and transport/base.py held, and what passes."""
    assert programs_in_strings('IMPORT_CODE = r"""\nimport importlib.util, json, sys\nprint(1)\n"""')
    assert programs_in_strings('_COLLECT = (\n"import os,shutil,sys\\n"\n"d=os.getcwd()\\n"\n)')
    assert programs_in_strings("t.run([r['python'], '-c', _COLLECT, str(LOG_LIMIT), remove], cwd=d)")
    assert programs_in_strings("self.run(['sh', '-c', script, 'orch-put', path], stdin=data)")
    assert not programs_in_strings("t.run([python, '-c', node_script('boot'), rdir, 'start'])")
    assert not programs_in_strings("t.run([python, '-c', FROM_STDIN, 'stacks', rdir])")
    assert not programs_in_strings('def f():\n    """Run:\n\n    import x\n    x.go()\n    """')


# ----------------------------------------------------------------------------- agent.py collect


def collect(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    code = agent.main(["collect", *argv])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 or "untrusted" in out[-1], out
    return dict(json.loads(out[-1]))


def run_dir(root: Path, *parts: str, log: str = "line\n") -> Path:
    d = root.joinpath(*parts)
    d.mkdir(parents=True, mode=0o700)
    for p in [d, *d.parents]:
        if p == root.parent:
            break
        p.chmod(0o700)
    (d / "node.log").write_text(log)
    return d


@pytest.fixture
def here() -> object:
    cwd = os.getcwd()
    yield
    os.chdir(cwd)


def test_collect_reads_the_tail_and_removes_a_run_directory_of_the_run_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], here: object
) -> None:
    root = tmp_path / "runs"
    d = run_dir(root, "fabric-1", "n1", log="a" * 100 + "END\n")
    got = collect(capsys, str(d), "--root", str(root), "--limit", "4", "--remove")
    assert got == {"log": "END\n", "removed": True}
    assert not (root / "fabric-1").exists() and root.is_dir()  # the run id's directory too, once empty


@pytest.mark.parametrize("where", ["outside", "the root itself", "one level", "three levels"])
def test_collect_keeps_a_directory_outside_the_run_root(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], here: object
) -> None:
    """The old read-back (`python -c` from preflight/fabric.py) removed whatever directory it was
    started in; the agent removes only `<run_root>/<run-id>/<node>`."""
    root = tmp_path / "runs"
    root.mkdir(mode=0o700)
    d = {
        "outside": lambda: run_dir(tmp_path, "elsewhere", "n1"),
        "the root itself": lambda: (root / "node.log").write_text("x\n") and root,
        "one level": lambda: run_dir(root, "n1"),
        "three levels": lambda: run_dir(root, "a", "b", "n1"),
    }[where]()
    assert isinstance(d, Path)
    got = collect(capsys, str(d), "--root", str(root), "--remove")
    assert got["removed"] is False and "is not a run directory of the run root" in str(got["kept"])
    assert (d / "node.log").exists()


def test_collect_keeps_a_run_directory_through_a_link_out_of_the_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], here: object
) -> None:
    root = tmp_path / "runs"
    elsewhere = run_dir(tmp_path, "elsewhere", "n1")
    (root / "r1").mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    (root / "r1" / "n1").symlink_to(elsewhere)
    got = collect(capsys, str(root / "r1" / "n1"), "--root", str(root), "--remove")
    assert got.get("untrusted") or got.get("kept")
    assert (elsewhere / "node.log").exists()


def test_collect_keeps_another_launchs_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], here: object
) -> None:
    root = tmp_path / "runs"
    d = run_dir(root, "r1", "n1")
    (d / "launch.nonce").write_text("theirs\n")
    got = collect(capsys, str(d), "--root", str(root), "--remove", "--nonce", "ours")
    assert got["removed"] is False and got["kept"] and d.is_dir()
