"""Every shell program orch hands a node parses (`sh -n`), the day it is written.

Two kinds, both data here: every module-level `shell.Script` of the package (found by reading
the modules, so a new one is checked without being listed), and the lines orch builds for a node's
login shell around them (`LINES`: built from hostile values, which must stay words). A module
that still writes shell some other way adds its builder to `LINES`."""

from __future__ import annotations

import ast
import importlib
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.shell import Script

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"
HOSTILE = ("$(touch /tmp/orch-pwned)", "a b'c\"d", "`id`;|&>x", "~/x y", "-n", "", "*")
"""Values a node's shell must see as plain words: a run id, a nonce, an image, a path may hold any of it."""


def scripts() -> dict[str, Script]:
    """`module.NAME` → every module-level `NAME = Script(...)` of the package."""
    found: dict[str, Script] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        names = [
            t.id
            for node in tree.body
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "Script"
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Name)
        ]
        if names:
            module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
            for name in names:
                found[f"{module}.{name}"] = getattr(importlib.import_module(module), name)
    return found


SCRIPTS = scripts()
EXPECTED = {
    "orchestrator.transport.copy.RSYNC_SERVER",
    "orchestrator.transport.copy.UNTAR",
    "orchestrator.remote.image.RUN",
    "orchestrator.remote.exec.TETHER",
    "orchestrator.remote.exec.TIMED_LINE",
    "orchestrator.remote.exec.TIMED_ARGV",
}
"""Scripts known to exist: the scan must find at least these (it cannot pass by finding none)."""


def _command_line() -> str:
    from orchestrator.transport import command_line

    return command_line(["echo", *HOSTILE], {"K": HOSTILE[0], "L": HOSTILE[1]}, "~/run dir")


def _exec_line() -> str:
    from orchestrator.remote.exec import command_line

    return command_line(list(HOSTILE[:3]), False, "/opt/py thon$x/bin/python")


def _timed_argv() -> str:
    from orchestrator.remote.exec import timed_line

    return timed_line(list(HOSTILE), False, 2.5, "/opt/py'thon")


def _timed_shell() -> str:
    from orchestrator.remote.exec import timed_line

    return timed_line(["df -h | grep '/data' && echo \"$HOME\""], True, 30)


def _rsync_path() -> str:
    from orchestrator.transport.copy import REMOTE_RSYNC

    return REMOTE_RSYNC + " --server -logDtpre.iLsfxCIvu . /"


def _exec_container() -> str:
    from orchestrator.config.container import Container
    from orchestrator.config.inventory import parse
    from orchestrator.config.jobenv import box_exec
    from orchestrator.remote.exec import box_line

    box = box_exec(Container("podman", "img", python=HOSTILE[3]), HOSTILE[0], HOSTILE[2])
    node = parse("nodes:\n  - host: h\n    python: /opt/py'thon\n", "t.yaml").nodes[0]
    assert box is not None
    line = box_line(box, node, [HOSTILE[1]], 2.5, tethered=True)
    words = shlex.split(line.rpartition("; exec ")[2])
    assert {HOSTILE[0], f"label=orch.nonce={HOSTILE[2]}", HOSTILE[3], HOSTILE[1]} <= set(words), words  # as they are
    return line


def _image_push() -> str:
    from orchestrator.remote.image import inspect_argv, load_argv

    argvs = [inspect_argv("docker", HOSTILE[0]), inspect_argv("apptainer", HOSTILE[1]), load_argv("podman")]
    assert not any(v in argv[2] for argv in argvs for v in HOSTILE if v)
    return "; ".join(shlex.join(a) for a in argvs)


def _each_script() -> str:
    return "; ".join(shlex.join(s.argv("tool", *HOSTILE)) for s in SCRIPTS.values())


LINES: dict[str, Callable[[], str]] = {
    "transport.command_line": _command_line,
    "exec.command_line": _exec_line,
    "exec.timed_line (argv)": _timed_argv,
    "exec.timed_line (a line)": _timed_shell,
    "rsync's --rsync-path": _rsync_path,
    "orch exec --container (remote/exec.box_line)": _exec_container,
    "image push's inspect and load (remote/image)": _image_push,
    "every Script as a login shell is handed it": _each_script,
}
"""Lines orch sends a node's login shell, each from its builder."""


def sh_n(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-n", "-c", text], capture_output=True, text=True, timeout=30)


def test_the_scan_finds_the_scripts_orch_builds() -> None:
    assert set(SCRIPTS) >= EXPECTED, sorted(EXPECTED - set(SCRIPTS))


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_script_parses(name: str) -> None:
    checked = sh_n(SCRIPTS[name].text)
    assert checked.returncode == 0, f"{name}: {checked.stderr}"


@pytest.mark.parametrize("name", sorted(LINES))
def test_every_line_parses(name: str) -> None:
    checked = sh_n(LINES[name]())
    assert checked.returncode == 0, f"{name}: {checked.stderr}"


def test_sh_n_catches_a_broken_script() -> None:
    assert sh_n('if true; then echo "$1"').returncode != 0
    assert sh_n(Script('{ echo "$0"', guarded=True).text).returncode != 0


def test_values_reach_a_script_as_they_are(tmp_path: Path) -> None:
    """Positional parameters, never text: a hostile value is a word, whatever it holds."""
    echo = Script('printf "%s|" "$@"')
    got = subprocess.run(echo.argv("sh", *HOSTILE), capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert got.stdout == "".join(f"{v}|" for v in HOSTILE) and not (tmp_path / "x").exists()
    assert not Path("/tmp/orch-pwned").exists()
