"""A node.log line's grammar and markers, each written once by its writer, held by reading the
source like tests/unit/test_one_definition.py: the worker field `[<role><local rank>]:`
(`node/agent.py`, which writes it), the timing line's mark (`trainer/logs.py`, which writes the line;
orch takes it through `logs/trainer.py`) and the telemetry line's (`node/telemetry.py`). A reader
that spells one again (a regular expression, an f-string, a bytes filter) fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from orchestrator.logs.trainer import TIMING_MARK, parse_timing
from orchestrator.node.agent import WORKER_FIELD, Rejoin, worker_field
from orchestrator.node.telemetry import PREFIX
from trainer.logs import TIMING_LINE, timing_line

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"
SOURCES = sorted(PACKAGE.rglob("*.py"))


def _rel(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


def constants(tree: ast.AST) -> list[tuple[int, str]]:
    """Every str and bytes constant of a module (f-strings' literal parts too), but what only
    documents: a string standing alone as a statement (a docstring, an attribute's docstring)."""
    notes = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and id(n) not in notes and isinstance(n.value, (str, bytes)):
            value = n.value.decode("latin-1") if isinstance(n.value, bytes) else n.value
            out.append((n.lineno, value))
    return out


def worker_copies(tree: ast.AST) -> list[int]:
    """Lines that spell the worker field: a role's character class or group before the local
    rank's digits and `]:`, or the default role's prefix (torchrun's summary entry, `[0]:`, has no role)."""
    return [
        line
        for line, v in constants(tree)
        if re.search(r"A-Z.*\\\]:", v) or "[default" in v or re.search(r"(?<!\\\[)(?<!\\\[\()\\d\+\)?\\\]:", v)
    ]


def timing_copies(tree: ast.AST) -> list[int]:
    """Lines that spell the timing line's mark (`timing epoch`)."""
    return [line for line, v in constants(tree) if "timing epoch" in v or "timing\\ epoch" in v]


def telemetry_copies(tree: ast.AST) -> list[int]:
    """Lines that spell the telemetry line's mark: as a line's head, or with the agent's stream
    before it or the sample's JSON after it."""
    return [
        line for line, v in constants(tree) if v == PREFIX or PREFIX + "{" in v or re.search(r"orch\\? telemetry", v)
    ]


@pytest.mark.parametrize("path", [p for p in SOURCES if _rel(p) != "node/agent.py"], ids=_rel)
def test_only_the_agent_spells_the_worker_field(path: Path) -> None:
    """`node/agent.py` `WORKER_FIELD` (and `worker_pattern`, `worker_field`): everyone reads it from there."""
    assert worker_copies(ast.parse(path.read_text())) == [], f"{_rel(path)} spells the worker field again"


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_only_the_trainer_spells_the_timing_mark(path: Path) -> None:
    """`trainer/logs.py` `timing_line` writes it; orch reads `logs/trainer.py` `TIMING_MARK`."""
    assert timing_copies(ast.parse(path.read_text())) == [], f"{_rel(path)} spells the timing mark again"


@pytest.mark.parametrize("path", [p for p in SOURCES if _rel(p) != "node/telemetry.py"], ids=_rel)
def test_only_the_telemetry_writer_spells_its_mark(path: Path) -> None:
    """`node/telemetry.py` `PREFIX`: the agent's sampler writes it, every reader imports it."""
    assert telemetry_copies(ast.parse(path.read_text())) == [], f"{_rel(path)} spells the telemetry mark again"


def test_the_guards_see_a_second_copy() -> None:
    code = '''
"""A docstring that says `[default0]:`, `timing epoch` and `orch telemetry {...}` documents them."""
TEE = re.compile(r"^\\[[A-Za-z_-]+(\\d+)\\]:")
prefix = f"[default{local}]:"
HEAD = re.compile(rb"\\[([a-z]+)\\d+\\]:")
RECORD = re.compile(rb"timing epoch| orch telemetry ")
HEAD2 = re.compile(r"(?:^|\\] )timing\\ epoch ")
is_sample = text.startswith("telemetry ")
js = line.partition("telemetry {")
ENTRY = re.compile(r"\\[\\d+\\]:")  # torchrun's failure summary's entry number: not a worker field
said = f"telemetry sample failed: {exc}"
'''
    tree = ast.parse(code)
    assert worker_copies(tree) == [3, 4, 5]
    assert timing_copies(tree) == [6, 7]
    assert telemetry_copies(tree) == [6, 8, 9]
    assert worker_copies(ast.parse(Path(PACKAGE / "node" / "agent.py").read_text()))  # the one copy is seen


def test_the_agent_writes_the_field_its_readers_read() -> None:
    """What `Rejoin` writes for a worker's line, whatever the role, is a worker field with its
    local rank; the field is torchrun's own prefix, so an older node.log reads the same."""
    head = re.compile(WORKER_FIELD)
    for role in (b"default", b"trainer", b"my_role-x"):
        raw = worker_field(role, b"3") + b"hello\n"
        assert Rejoin().feed(raw) == [raw]
        m = head.match(raw.decode())
        assert m is not None and m.group(1) == "3" and raw.startswith(b"[" + role + b"3]:")
    huge = b"[default" + b"9" * 5000 + b"]:x\n"  # more digits than Python's int() takes: passed on as read
    assert Rejoin().feed(huge) == [huge]


def test_the_timing_mark_is_what_the_trainer_writes() -> None:
    line = timing_line(3, 40, 10, 80, 0.0123, 1.52, 3.1)
    assert TIMING_MARK.strip() and TIMING_MARK.endswith(" ") and line.startswith(TIMING_MARK)
    assert line[len(TIMING_MARK) :].startswith("3 batch 40 ")
    assert TIMING_MARK in TIMING_LINE.pattern and parse_timing(line) is not None
    assert parse_timing(line.replace(TIMING_MARK, "timing  epoch ", 1)) is None
