"""`orch stacks`: the Python stack of every rank of a running run, merged into one grouped view.

Each node's agent program (`agent.py stacks`, shipped on stdin so a run launched by any orch
version can be asked) finds the job's rank processes (torchrun's workers: RANK in their
environment) and runs `py-spy dump` on each; here the dumps are parsed into frames, ranks whose
main threads stand on identical frames are grouped, their rank sets folded like dshbak folds
hosts (`ranks 0-6,8-31`), and each group is summarised by where it is and the innermost frame of
the job's own code:

    ranks 0-1,3  all_reduce (torch/distributed/distributed_c10d.py:3913) in main (ddp_job.py:72)
    rank 2       sleep_forever (ddp_job.py:50) in main (ddp_job.py:70)

A node without py-spy (next to the node's python, or on PATH: a container job's host needs only
the runtime) gets this controller's: py-spy is one static binary, sent once into the node's run
directory when its architecture is the node's (`bring`), else the node's row says why not.

A hang shows as one small group apart from the rest: `odd_ranks` names it. The pure parts
(`parse_dump`, `group_stacks`, `fold`, `summary`, `grouped_text`) are tested on dumps recorded
from real py-spy runs (tests/fixtures/pyspy/).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import OrchError
from ..node import AGENT_MODULES, FROM_STDIN, FROM_STDIN_OPEN
from ..node import program as node_program
from ..store import NodeRecord, RunDir, RunStore, recorded_nodes, write_private
from ..transport import Cluster, Transport
from .agents import parse_agent
from .records import trusted_records

DUMP_TIMEOUT_S = 20.0
STUCK = ("T", "t", "D")
"""Process states of a rank that cannot move on its own (stopped, traced, in uninterruptible sleep):
its stack cannot be taken, and it is the prime suspect of a hang (`run/watchdog.hang_failure`)."""
THREAD = re.compile(r'^Thread (\S+) \(([^)]*)\)(?:: "(.*)")?\s*$')
FRAME = re.compile(r"^ {4}(\S.*?) \((.*):(\d+)\)\s*$")
LIBRARY = re.compile(r"/(?:site|dist)-packages/|/lib/python\d+(?:\.\d+)?/|^<frozen ")
SHORT = re.compile(r"^.*/(?:site|dist)-packages/|^.*/lib/python\d+(?:\.\d+)?/")


@dataclass(frozen=True)
class Frame:
    """One frame of a stack, innermost first as py-spy prints them."""

    function: str
    file: str
    """The full path py-spy reports (`--full-filenames`)."""
    line: int

    @property
    def library(self) -> bool:
        """In the standard library or an installed package, not the job's own code."""
        return bool(LIBRARY.search(self.file))

    @property
    def short_file(self) -> str:
        """The path from the package on for installed code (`torch/distributed/...py`), the
        file's name for the job's own code: what py-spy shows without `--full-filenames`."""
        short = SHORT.sub("", self.file)
        return short if short != self.file else self.file.rsplit("/", 1)[-1]

    def text(self) -> str:
        return f"{self.function} ({self.short_file}:{self.line})"

    def to_json(self) -> dict[str, Any]:
        return {"function": self.function, "file": self.file, "line": self.line}


@dataclass(frozen=True)
class Thread:
    """One thread of a dump: py-spy's id, status (`idle`, `active`, `active+gil`...) and name."""

    ident: str
    status: str
    name: str
    frames: tuple[Frame, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.ident,
            "status": self.status,
            "name": self.name,
            "frames": [f.to_json() for f in self.frames],
        }


@dataclass(frozen=True)
class RankStack:
    """One rank's dump, or why there is none."""

    node: str
    node_rank: int
    rank: int | None
    local_rank: int | None
    pid: int | None
    threads: tuple[Thread, ...] = ()
    error: str | None = None
    raw: str = ""
    state: str | None = None
    """Its process's state when its stack was asked for (`R`, `S`, `D`, `T`...; None: not said)."""

    @property
    def main(self) -> tuple[Frame, ...]:
        """The frames of the main thread (else of the first thread): what ranks are grouped by."""
        for t in self.threads:
            if t.name == "MainThread":
                return t.frames
        return self.threads[0].frames if self.threads else ()

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "node_rank": self.node_rank,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "pid": self.pid,
            "error": self.error,
            "state": self.state,
            "threads": [t.to_json() for t in self.threads],
            "dump": self.raw,
        }


@dataclass(frozen=True)
class StackGroup:
    """Ranks whose main threads stand on the same frames."""

    ranks: tuple[int, ...]
    frames: tuple[Frame, ...]
    nodes: tuple[str, ...]

    @property
    def label(self) -> str:
        return ("rank " if len(self.ranks) == 1 else "ranks ") + fold(self.ranks)

    @property
    def summary(self) -> str:
        return summary(self.frames)

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks": list(self.ranks),
            "ranks_text": fold(self.ranks),
            "nodes": list(self.nodes),
            "summary": self.summary,
            "frames": [f.to_json() for f in self.frames],
        }


@dataclass
class StacksReport:
    """`orch stacks`: every rank's stack, the groups, and every node or rank that could not say."""

    run: str
    taken_at: float
    ranks: list[RankStack]
    problems: dict[str, str] = field(default_factory=dict)
    """Per node (`node2`, or `node2 rank 5`): why no stack came from there."""
    saved: list[Path] = field(default_factory=list)
    """Where the report was written (stacks/<time>.json and .txt in the run directory)."""

    @property
    def groups(self) -> list[StackGroup]:
        return group_stacks(self.ranks)

    @property
    def complete(self) -> bool:
        """A stack from every rank of every node asked, and at least one rank."""
        return bool(self.ranks) and not self.problems and all(r.error is None for r in self.ranks)

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "taken_at": self.taken_at,
            "complete": self.complete,
            "groups": [g.to_json() for g in self.groups],
            "odd_ranks": list(odd_ranks(self.groups)),
            "problems": dict(self.problems),
            "ranks": [r.to_json() for r in self.ranks],
        }


# ----------------------------------------------------------------------------- pure


def parse_dump(text: str) -> tuple[Thread, ...]:
    """py-spy dump's text (`Thread ID (STATUS): "NAME"`, then `    function (file:line)` lines,
    innermost first) as threads; `--locals` lines and anything else are skipped."""
    threads: list[Thread] = []
    head: tuple[str, str, str] | None = None
    frames: list[Frame] = []
    for line in text.splitlines():
        m = THREAD.match(line)
        if m:
            if head is not None:
                threads.append(Thread(*head, tuple(frames)))
            head, frames = (m.group(1), m.group(2), m.group(3) or ""), []
            continue
        f = FRAME.match(line)
        if f and head is not None:
            frames.append(Frame(f.group(1), f.group(2), int(f.group(3))))
    if head is not None:
        threads.append(Thread(*head, tuple(frames)))
    return tuple(threads)


def fold(ranks: Iterable[int]) -> str:
    """`[0, 1, 2, 3, 5, 8, 9]` → `0-3,5,8-9` (dshbak's folding, for ranks)."""
    out: list[str] = []
    values = sorted(set(ranks))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(out)


def summary(frames: Sequence[Frame]) -> str:
    """Where a stack stands: its innermost frame, and the innermost frame of the job's own code
    when that is another one (`all_reduce (torch/.../distributed_c10d.py:3913) in main (train.py:72)`)."""
    if not frames:
        return "(no Python frames)"
    inner = frames[0]
    own = next((f for f in frames if not f.library), None)
    if own is None or own is inner:
        return inner.text()
    return f"{inner.text()} in {own.text()}"


def group_stacks(ranks: Sequence[RankStack]) -> list[StackGroup]:
    """Ranks with a stack, grouped by their main thread's frames (function, file, line); the
    largest group first, then by lowest rank."""
    by_key: dict[tuple[Frame, ...], list[RankStack]] = {}
    for r in ranks:
        if r.error is None and r.rank is not None and r.threads:
            by_key.setdefault(r.main, []).append(r)
    groups = [
        StackGroup(
            tuple(sorted(x.rank for x in members if x.rank is not None)),
            key,
            tuple(dict.fromkeys(x.node for x in sorted(members, key=lambda m: m.rank or 0))),
        )
        for key, members in by_key.items()
    ]
    return sorted(groups, key=lambda g: (-len(g.ranks), g.ranks))


def waiting(frames: Sequence[Frame]) -> bool:
    """Does this stack stand inside torch.distributed (a collective, a barrier, the store), below
    the job's own innermost frame: waiting for the others rather than holding them up?"""
    for f in frames:
        if not f.library:
            return False
        if f.short_file.startswith("torch/distributed/"):
            return True
    return False


def odd_ranks(groups: Sequence[StackGroup]) -> tuple[int, ...]:
    """The ranks whose stack differs from the majority's: of the groups other than the largest
    (all of them when no group is largest), the one not waiting in torch.distributed, else the
    smallest, else the one with the lowest rank; () when every rank stands in one place. Two
    ranks in two places: the one that is not in the collective."""
    if len(groups) < 2:
        return ()
    top = max(len(g.ranks) for g in groups)
    others = [g for g in groups if len(g.ranks) < top]
    tied = [g for g in groups if len(g.ranks) == top]
    pool = others if len(tied) == 1 else groups
    return min(pool, key=lambda g: (waiting(g.frames), len(g.ranks), g.ranks)).ranks


def grouped_text(report: StacksReport, detail: bool = False) -> list[str]:
    """The grouped view as lines (`orch stacks`, and stacks/<time>.txt with `detail`: each
    group's whole main-thread stack, then every rank's raw dump)."""
    groups = report.groups
    width = max((len(g.label) for g in groups), default=0)
    lines = [f"{g.label:<{width}}  {g.summary}" for g in groups]
    lines += [f"{where}: {why}" for where, why in report.problems.items()]
    lines += [f"rank {r.rank} on {r.node}: {r.error}" for r in report.ranks if r.error is not None]
    if not detail:
        return lines
    for g in groups:
        lines += ["", f"== {g.label} (on {', '.join(g.nodes)})"] + [f"    {f.text()}" for f in g.frames]
    for r in report.ranks:
        lines += ["", f"== rank {r.rank} on {r.node} (pid {r.pid})"] + (r.raw.rstrip().splitlines() or [str(r.error)])
    return lines


def dump_problem(answer: Mapping[str, Any], rank: Mapping[str, Any]) -> str:
    """Why a rank's dump failed, with the fix (a ptrace restriction, a missing process...)."""
    error = str(rank.get("error") or "")
    if re.search(r"permission denied|operation not permitted|EPERM", error, re.I):
        scope = answer.get("ptrace_scope")
        if isinstance(scope, int) and scope > 0 and answer.get("euid") != 0:
            return (
                f"py-spy may not read the process: /proc/sys/kernel/yama/ptrace_scope is {scope}; "
                "fix: `sudo sysctl kernel.yama.ptrace_scope=0`, or give py-spy the capability: "
                f"`sudo setcap cap_sys_ptrace+ep {answer.get('py_spy')}` ({error.splitlines()[0]})"
            )
        return (
            f"py-spy may not read the process (ptrace refused: {error.splitlines()[0]}); run orch as the "
            "job's user, or allow ptrace (a container needs --cap-add SYS_PTRACE)"
        )
    return error.strip().splitlines()[0] if error.strip() else "py-spy failed without a message"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def node_stacks(node: str, node_rank: int, answer: Mapping[str, Any]) -> tuple[list[RankStack], str | None]:
    """One node's answer as rank stacks, and the node's problem (py-spy missing, nothing running).
    A rank entry that is not an object is left out; a number that is not an integer reads as none."""
    ranks = answer.get("ranks")
    procs = [p for p in ranks if isinstance(p, dict)] if isinstance(ranks, list) else []
    if answer.get("error"):
        return [], str(answer["error"])
    if not procs:
        state = answer.get("state")
        return [], (
            f"no rank process is running here (the node's job is {state})"
            if state
            else "no rank process is running here"
        )
    if not answer.get("py_spy"):
        why = f"; {answer['ship_error']}" if answer.get("ship_error") else ""
        return [], (
            f"py-spy is not installed next to {answer.get('python')} nor on PATH{why}: "
            f"`{answer.get('python')} -m pip install py-spy` on this node ({len(procs)} ranks not dumped)"
        )
    out = []
    for p in procs:
        error = None if p.get("code") == 0 and p.get("dump") else dump_problem(answer, p)
        out.append(
            RankStack(
                node,
                node_rank,
                _int(p.get("rank")),
                _int(p.get("local_rank")),
                _int(p.get("pid")),
                parse_dump(str(p.get("dump") or "")) if error is None else (),
                error,
                str(p.get("dump") or ""),
                p.get("state") if isinstance(p.get("state"), str) else None,
            )
        )
    return out, None


ELF_MACHINES = {3: "i686", 21: "ppc64le", 22: "s390x", 40: "armv7l", 62: "x86_64", 183: "aarch64", 243: "riscv64"}
"""An ELF header's `e_machine` → what `uname -m` says on a machine that runs it."""


def elf_machine(head: bytes) -> str | None:
    """The architecture an executable is for (its first 20 bytes), None when it is not an ELF file."""
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    number = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
    return ELF_MACHINES.get(number, f"ELF machine {number}")


def controller_py_spy() -> Path | None:
    """The py-spy of this controller's environment (next to its python, else on PATH)."""
    import shutil
    import sys

    here = Path(sys.executable).parent / "py-spy"
    found = here if here.is_file() else (Path(w) if (w := shutil.which("py-spy")) else None)
    return found


def bring(answer: Mapping[str, Any], ours: Path | None) -> tuple[bool, str | None]:
    """Whether to send this controller's py-spy (`ours`) to a node whose stacks answer said it has
    none (and ranks to dump): (send it, why not). Only an executable for the node's architecture."""
    if answer.get("py_spy") or answer.get("error") or not answer.get("ranks") or answer.get("ship_error"):
        return False, None
    if ours is None:
        return False, "and this controller has no py-spy to bring (`pip install py-spy` here or on the node)"
    try:
        with open(ours, "rb") as fh:
            made_for = elf_machine(fh.read(20))
    except OSError as exc:
        return False, f"and this controller's {ours} cannot be read: {exc.strerror or exc}"
    machine = answer.get("machine")
    if made_for is None or made_for != machine:
        return False, f"and this controller's {ours} is for {made_for or 'another system'}, not this node's {machine}"
    return True, None


# ----------------------------------------------------------------------------- side effects


SEND_S = 120.0
"""What sending py-spy (8 MB) to a node may add to its stacks call."""


def ask_node(
    t: Transport, python: str, rdir: str, timeout: float = DUMP_TIMEOUT_S, py_spy: bytes | None = None
) -> dict[str, Any]:
    """`agent.py stacks` on one node: the current agent's code on stdin, run against the run
    directory; with `py_spy`, this controller's py-spy after it, kept in the run directory."""
    program = node_program("agent", AGENT_MODULES).encode("ascii")
    if py_spy is None:
        argv = [python, "-c", FROM_STDIN, "stacks", rdir, "--timeout", f"{timeout:g}"]
        res = t.run(argv, stdin=program, timeout=timeout + 20)
    else:
        argv = [python, "-c", FROM_STDIN_OPEN, "stacks", rdir, "--timeout", f"{timeout:g}"]
        stdin = f"{len(program)}\n".encode() + program + py_spy
        res = t.run([*argv, "--py-spy-bytes", str(len(py_spy))], stdin=stdin, timeout=timeout + 20 + SEND_S)
    return parse_agent(res, python)


def take_stacks(
    cluster: Cluster, run_id: str, records: Sequence[NodeRecord], timeout: float = DUMP_TIMEOUT_S
) -> StacksReport:
    """Every rank's stack on every node of the run whose job is not over, in parallel."""
    by_name = {r.node: r for r in records}
    nodes = [n for n in cluster.inv.nodes if n.name in by_name]
    taken = time.time()
    answers: dict[str, Any] = dict(
        cluster.fan_out(
            lambda t: ask_node(t, by_name[t.node.name].python, by_name[t.node.name].remote_dir, timeout), nodes
        )
    )
    ours, refused = controller_py_spy(), {}
    wanting = []
    for name, answer in answers.items():
        if not isinstance(answer, Exception):
            send, why = bring(answer, ours)
            if send:
                wanting.append(name)
            elif why:
                refused[name] = why
    if wanting and ours is not None:
        binary = ours.read_bytes()
        again = cluster.fan_out(
            lambda t: ask_node(t, by_name[t.node.name].python, by_name[t.node.name].remote_dir, timeout, py_spy=binary),
            [n for n in nodes if n.name in wanting],
        )
        answers.update(again)
    ranks: list[RankStack] = []
    problems: dict[str, str] = {}
    for name, answer in answers.items():
        if name in refused and not isinstance(answer, Exception):
            answer = {**answer, "ship_error": refused[name]}
        if isinstance(answer, Exception):
            problems[name] = str(answer.message if isinstance(answer, OrchError) else answer)
            continue
        got, problem = node_stacks(name, by_name[name].node_rank, answer)
        ranks += got
        if problem:
            problems[name] = problem
    ranks.sort(key=lambda r: (r.rank is None, r.rank or 0))
    return StacksReport(run_id, taken, ranks, problems)


def save(run: RunDir, report: StacksReport, tag: str = "") -> list[Path]:
    """stacks/<UTC time>[-tag].json (the `--json` document) and .txt (groups, stacks, raw dumps)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(report.taken_at)) + (f"-{tag}" if tag else "")
    base = Path("stacks") / stamp
    run.write(report.to_json(), str(base.with_suffix(".json")))
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(report.taken_at))
    text = "\n".join([f"run {report.run}: stacks taken {when}", *grouped_text(report, detail=True)]) + "\n"
    write_private(run.path / base.with_suffix(".txt"), text)
    report.saved = [run.path / base.with_suffix(".json"), run.path / base.with_suffix(".txt")]
    return report.saved


def stacks(run_id: str | None, timeout: float = DUMP_TIMEOUT_S) -> StacksReport:
    """`orch stacks RUN`: take every rank's stack now, save it in the run directory, return it.

    Raises:
        UsageError: unknown run.
    """
    run = RunStore().get(run_id)
    inv = run.inventory()
    records = trusted_records(run, inv, recorded_nodes(run.read()))
    with Cluster(inv) as cluster:
        report = take_stacks(cluster, run.run_id, records, timeout)
    if report.ranks:
        save(run, report)
    return report
