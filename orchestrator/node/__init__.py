"""The programs that run ON the nodes, and how the controller ships them.

Every other module of this package is a node-side program: stdlib only, Python >= 3.8, and it
imports nothing from orch (a test holds them to that; `ruff.toml` here lints them as py38).
A node may run another orch version, or none: what a program needs travels with it.

- `agent.py`  the node agent of a run: starts torchrun detached, records its state, stops it.
              Copied into the node's run directory (by `boot.py`) with its own modules
              (`AGENT_MODULES`) and run from there:
- `procs.py`  process identity: which processes are the run's (pid and start time, boot id),
              signalled only while they still are; liveness of the agent and the job.
- `trust.py`  which directories may be trusted (the run directory, all above it): the agent's
              rule, which the probe applies to `job.run_root` too.
- `stacks.py` `agent.py stacks`: every rank's Python stack (py-spy dump).
- `telemetry.py` the agent's samples of GPUs, CPU, memory and ranks (`telemetry ...` lines).
- `boot.py`   writes the files it reads on stdin into a run directory, then runs the agent.
- `each.py`   the task of a step on every node at once (a Slurm launch): it execs its own node's
              call (boot.py) with that call's stdin.
- `probe.py`  `orch check`'s probe: gathers a node's facts, answers pings and connect tests.
- `reader.py` streams a node's log from a byte offset as frames, with the node's status;
              it judges liveness with the agent's own functions (shipped along with it).
- `findmodule.py` the `job` check of a module job: whether the job's python finds the module
              (`python -c` of its text, run by the job's python where the job runs).
- `warned.py` a container's job under a scheduler's warning signal (`transport: slurm`): runs the
              job with the warning ignored and passes the warning on to every process below it
              (`python -c` of its `unpacking` text, first in the container's command).
- `tether.py` a watcher the login shell starts beside `orch exec`'s command: it stops the
              shell's process group when the SSH session that started it goes away
              (`python -c` of its `packed` text, in the background).
- `relay.py`  one link of the copy chain of `orch sync` and `orch image push`: verifies what
              its predecessor (or the controller) sends, writes it (files renamed into place
              once their sha256 holds; an image into `RUNTIME load`), forwards it over TCP
              (`program("relay")` sent on the stdin of `python -c FROM_STDIN_OPEN`, which then
              carries the controller's commands).
- `execbox.py` `orch exec --container`'s command in the run's container on this node, stopped
              inside the container on a timeout, a signal or a lost session (`python -c` of
              its `packed` text).
- `jobs/`     what orch itself runs under torchrun (the fabric check's job): stdlib and torch.

This file is the controller's side: `source(name)` is a program's text, and `program(main,
deps)` the text that runs it with the sibling modules it imports (`from . import agent`)
registered as a package around it: as `python -c TEXT` (the probe), or sent on the stdin of
`python -c FROM_STDIN` (the log reader).
"""

from __future__ import annotations

import ast
import base64
import functools
import importlib.util
import marshal
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
_BUILD = threading.Lock()
_PROGRAMS: dict[tuple[str, tuple[str, ...]], str] = {}
_SCRIPTS: dict[str, str] = {}
FROM_STDIN = "import sys;exec(sys.stdin.buffer.read())"
"""`python -c` text that runs the program sent on its stdin. A long-lived program (the log reader)
then shows a command line of a few words in `ps` for its whole life, not its 40 KB of code."""
FROM_STDIN_OPEN = "import sys;b=sys.stdin.buffer;exec(b.read(int(b.readline())))"
"""Like FROM_STDIN, but the program comes after a line with its length, and stdin stays open
for the program to read (the log reader's lease renewals, `reader.py`)."""
AGENT_MODULES = ("procs", "stacks", "telemetry", "trust")
"""The agent's own modules (`agent.py` imports them): shipped beside it into every run directory
(`agent_files`), bundled before it into every program that runs or imports it."""
PACKAGE = "orch_node"
"""The package name the node programs run under on a node (`from . import agent` resolves there)."""


def source(name: str) -> str:
    """The text of the node program `name` (`agent`, `boot`, `probe`, `reader`)."""
    return (HERE / f"{name}.py").read_text(encoding="utf-8")


def agent_files() -> dict[str, str]:
    """`agent.py` and its modules, as every run directory holds them ({file name: text})."""
    return {f"{name}.py": source(name) for name in (*AGENT_MODULES, "agent")}


def script(name: str) -> str:
    """The source of node program `name` without its module docstring: the `python -c` text of a
    short program (boot), which stays on the command line of the agent it turns into. Made once
    per process, under the lock: the threads that start the nodes ask at once, and CPython 3.11
    fails `ast.parse` run in several threads at once now and then ("SystemError: AST constructor
    recursion depth mismatch", seen on 3.11.7 as a node that could not start)."""
    return _once(_SCRIPTS, name, lambda: _without_docstring(source(name)))


def _once(cache: dict[Any, str], key: Any, make: Callable[[], str]) -> str:
    """``cache[key]``, made by ``make`` the first time: under the build lock, so of the threads
    that ask at once (one per node) the first makes it and the others wait for it."""
    with _BUILD:
        text = cache.get(key)
        if text is None:
            text = cache[key] = make()
    return text


def _without_docstring(text: str) -> str:
    tree = ast.parse(text)
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        text = "\n".join(text.splitlines()[first.end_lineno :]).lstrip("\n") + "\n"
    return text


def _blob(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data, 9)).decode("ascii")


@functools.lru_cache(maxsize=None)
def packed(name: str) -> str:
    """`script(name)` compressed and base64-encoded: one line without quotes, newlines or `!`,
    which any login shell passes through inside quotes (`orch exec`'s tether). Made once per process."""
    return _blob(script(name).encode("utf-8"))


def unpacking(name: str) -> str:
    """The `python -c` text that runs node program `name` from its `packed` form: one line of a
    few hundred characters, the same on every node (an argv word that plan JSON shows as it is)."""
    return f'import base64,zlib;exec(zlib.decompress(base64.b64decode("{packed(name)}")))'


def program(main: str, deps: tuple[str, ...] = ()) -> str:
    """The text that runs node program `main` as `__main__`, its sibling modules `deps`
    importable by `from . import NAME`. It carries the bytecode for a node whose Python has this
    Python's bytecode magic number (compiling is a fifth of the probe's CPU on a node), and the
    compressed source for any other. Built once per process, by the first of the threads that
    ask at once (one per node); the others wait for it rather than compile it again each."""
    return _once(_PROGRAMS, (main, tuple(deps)), lambda: _build(main, tuple(deps)))


def _build(main: str, deps: tuple[str, ...]) -> str:
    names = (*deps, main)
    texts = [source(n) for n in names]
    code = _blob(marshal.dumps(tuple(compile(t, f"orch-{n}", "exec") for n, t in zip(names, texts))))
    srcs = ",".join(f"'{_blob(t.encode('utf-8'))}'" for t in texts)
    return (
        "import sys,types,zlib,base64 as b\n"
        f"N={names!r}\n"
        f"if getattr(sys.modules.get('_frozen_importlib_external'),'MAGIC_NUMBER',None)"
        f"=={importlib.util.MAGIC_NUMBER!r}:\n"
        f" import marshal;C=marshal.loads(zlib.decompress(b.b64decode('{code}')))\n"
        f"else:C=[compile(zlib.decompress(b.b64decode(s)),'orch-'+n,'exec') for n,s in zip(N,({srcs},))]\n"
        f"p=types.ModuleType('{PACKAGE}');p.__path__=[];sys.modules['{PACKAGE}']=p\n"
        "for n,c in zip(N[:-1],C):\n"
        f" m=types.ModuleType('{PACKAGE}.'+n);m.__package__='{PACKAGE}';"
        f"sys.modules[m.__name__]=m;setattr(p,n,m);exec(c,m.__dict__)\n"
        f"exec(C[-1],{{'__name__':'__main__','__package__':'{PACKAGE}'}})"
    )
