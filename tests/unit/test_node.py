"""The programs that run on the nodes: stdlib only, Python 3.8, nothing of orch; shipped whole."""

from __future__ import annotations

import ast
import functools
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator import node
from orchestrator.logs.fetch import read_frames, reader_argv

NODE_FILES = sorted(Path(node.__file__).parent.glob("*.py"))
PYTHONS = ["this", "3.8"]


@functools.cache
def python38() -> str | None:
    """The oldest Python the README promises on a node, where this machine has one (CI may not):
    $ORCH_TEST_PYTHON38, `python3.8` on PATH, or a pyenv 3.8 ($PYENV_ROOT, default ~/.pyenv);
    each candidate must run and say it is 3.8 (a pyenv shim without that version selected does not)."""
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates = [
        os.environ.get("ORCH_TEST_PYTHON38"),
        shutil.which("python3.8"),
        *sorted(str(p) for p in pyenv.glob("versions/3.8*/bin/python3.8")),
    ]
    for exe in filter(None, candidates):
        try:
            out = subprocess.run(
                [exe, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == "(3, 8)":
            return exe
    return None


def python(which: str) -> str:
    if which == "this":
        return sys.executable
    exe = python38()
    if exe is None:
        pytest.skip("no Python 3.8 here (set ORCH_TEST_PYTHON38, or put python3.8 on PATH or in pyenv)")
    return exe


def imports(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(absolute top-level modules, sibling modules imported relatively) of a module."""
    absolute = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    absolute |= {
        n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module
    }
    relative = {
        n.module or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level for a in n.names
    }
    return absolute, relative


JOB_FILES = sorted((Path(node.__file__).parent / "jobs").glob("*.py"))
"""Jobs orch runs under torchrun (node/jobs/): like the programs, but they may import torch."""


def test_the_package_holds_the_node_programs_and_the_agents_modules() -> None:
    assert {p.stem for p in NODE_FILES} == {
        "__init__",
        "agent",
        "boot",
        "each",
        "execbox",
        "findmodule",
        "probe",
        "reader",
        "relay",
        "tether",
        "warned",
        *node.AGENT_MODULES,
    }


def test_the_agent_ships_every_module_it_imports() -> None:
    """agent.py imports its modules relatively (as a package: the reader, the tests) or by name (run
    from its run directory); either way each must be one that every run directory receives."""
    tree = ast.parse((Path(node.__file__).parent / "agent.py").read_text())
    absolute, relative = imports(tree)
    siblings = {p.stem for p in NODE_FILES} - {"__init__"}
    assert relative == set(node.AGENT_MODULES) == absolute & siblings
    assert set(node.agent_files()) == {f"{m}.py" for m in (*node.AGENT_MODULES, "agent")}


@pytest.mark.parametrize("path", NODE_FILES, ids=lambda p: p.name)
def test_python38_syntax_stdlib_only_and_nothing_of_orch(path: Path) -> None:
    tree = ast.parse(path.read_text(), feature_version=(3, 8))
    absolute, relative = imports(tree)
    siblings = {p.stem for p in NODE_FILES if p.stem != "__init__"}
    # a sibling may also be imported by its bare name: the fallback of a program run from its directory;
    # the one optional module: NVML for the telemetry, used where installed (nvidia-smi otherwise)
    optional = {"pynvml"} if path.name == "telemetry.py" else set()
    assert absolute <= set(sys.stdlib_module_names) | {"__future__"} | siblings | optional, absolute
    assert "orchestrator" not in absolute
    assert relative <= siblings, relative


@pytest.mark.parametrize("path", NODE_FILES, ids=lambda p: p.name)
def test_compiles_under_python38(path: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [python("3.8"), "-m", "py_compile", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPYCACHEPREFIX": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("which", PYTHONS)
def test_a_program_runs_with_the_siblings_it_imports(which: str, tmp_path: Path) -> None:
    """The log reader as the controller ships it (with the agent it imports): bytecode on this
    Python, source on 3.8. A finished run: its log, its final status, the end."""
    (tmp_path / "node.log").write_bytes(b"2026-11-30T09:32:05.000001Z out hello\n")
    (tmp_path / "state.json").write_text(json.dumps({"state": "succeeded", "exit_code": 0, "pid": 1}))
    proc = subprocess.run(
        reader_argv(python(which), str(tmp_path), 0, 0.05, False, True, "n0nce"),
        input=node.program("reader", (*node.AGENT_MODULES, "agent")).encode(),
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.startswith(b"ORCH-LOG-READER n0nce\n")
    frames = list(read_frames(io.BytesIO(proc.stdout), "n0nce"))
    assert [k for k, _ in frames] == ["D", "S", "E"]
    assert frames[0][1] == b"2026-11-30T09:32:05.000001Z out hello\n"
    status = json.loads(frames[1][1])
    assert status["state"] == "succeeded" and status["exit_code"] == 0 and "agent_alive" not in status
    assert frames[2][1].startswith(b"succeeded ")


def test_a_short_program_is_sent_without_its_docstring() -> None:
    """boot.py's text stays the command line of the agent it turns into: its code only."""
    text = node.script("boot")
    assert not text.lstrip().startswith('"""') and "def main(" in text
    ast.parse(text, feature_version=(3, 8))
    assert node.source("boot").endswith(text)


def test_threads_asking_at_once_build_a_program_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """One thread per node asks for the reader when a follow starts: compiling it once each would
    cost every thread the compile and the controller its memory (8 MB more following 8 nodes)."""
    import time

    built: list[str] = []
    real = node._build

    def slow_build(main: str, deps: tuple[str, ...]) -> str:
        built.append(main)
        time.sleep(0.2)  # every other thread asks while this one builds
        return real(main, deps)

    monkeypatch.setattr(node, "_build", slow_build)
    monkeypatch.setattr(node, "_PROGRAMS", {})
    texts = at_once(lambda: node.program("reader", (*node.AGENT_MODULES, "agent")))
    assert built == ["reader"] and len(texts) == 8 and len(set(texts)) == 1


def at_once(ask: Callable[[], str], n: int = 8) -> list[str]:
    """What `ask` returns in each of `n` threads let go together (one per node starting)."""
    import threading

    start = threading.Barrier(n)
    texts: list[str] = []

    def one() -> None:
        start.wait()
        texts.append(ask())

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return texts


def test_threads_starting_nodes_at_once_parse_a_script_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node's start asks for boot.py's text from its own thread: `ast.parse` in several
    threads at once fails now and then on CPython 3.11 ("SystemError: AST constructor recursion
    depth mismatch": a node that could not start), so it runs once, in one thread. The fake parse
    waits up to 1 s for a second thread to come in beside it; none may."""
    import threading

    lock, second = threading.Lock(), threading.Event()
    inside: list[int] = []
    calls: list[str] = []
    real = ast.parse

    def parse(text: str, *args: object, **kwargs: object) -> ast.Module:
        with lock:
            calls.append(text)
            inside.append(1)
            if len(inside) > 1:
                second.set()
        second.wait(1.0)
        with lock:
            inside.pop()
        return real(text)

    monkeypatch.setattr(node.ast, "parse", parse)
    monkeypatch.setattr(node, "_SCRIPTS", {})
    texts = at_once(lambda: node.script("boot"))
    assert not second.is_set(), "two threads parsed at once"
    assert len(calls) == 1 and len(texts) == 8 and len(set(texts)) == 1


def test_the_jobs_folder_holds_the_fabric_checks_allreduce_job() -> None:
    assert {p.stem for p in JOB_FILES} == {"__init__", "allreduce"}


@pytest.mark.parametrize("path", JOB_FILES, ids=lambda p: p.name)
def test_a_job_is_python38_stdlib_and_torch_and_nothing_of_orch(path: Path, tmp_path: Path) -> None:
    """A job runs in the training's environment (torch is there) on any Python the nodes have; the
    controller imports it for its constants and helpers, so torch is imported inside functions."""
    tree = ast.parse(path.read_text(), feature_version=(3, 8))
    absolute, relative = imports(tree)
    assert absolute <= set(sys.stdlib_module_names) | {"__future__", "torch"}, absolute
    assert not relative
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
    assert "torch" not in top
    out = subprocess.run(
        [python("3.8"), "-m", "py_compile", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPYCACHEPREFIX": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
