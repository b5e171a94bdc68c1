"""A script of timed steps: each under its own budget and the whole run's, each a row of a table.

The plumbing of ``bench/gpu_smoke.py``, kept apart from its steps so that it is tested on its own
(``tests/unit/test_steps.py``): a step is a function of a ``StepContext``; it runs commands through
``StepContext.run`` (each in its own process group, its output in a log file, stopped with SIGTERM
then SIGKILL when the step's deadline passes: ``StepTimeout``), records figures, goals and the
parts it skipped, and ends by returning (``pass``) or raising ``StepFailed``, ``StepSkipped`` or
``StepTimeout``. ``run_steps`` is the state machine: dependencies, budgets, the whole run's
deadline, teardown of whatever a step started in ``finally``, Ctrl-C; ``table`` and
``write_outputs`` are the report.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
STATUSES = ("pass", "fail", "timeout", "skip")
LOG_TAIL = 1 << 20
"""Each log in the tarball keeps its last MiB (a tarball must stay far below what comes back)."""


@dataclass
class Goal:
    what: str
    value: Any
    goal: str
    met: bool | None
    """None: reported only, no goal."""


@dataclass
class StepResult:
    name: str
    title: str
    status: str = "skip"
    seconds: float = 0.0
    budget_s: float = 0.0
    error: str | None = None
    reason: str | None = None
    """Why the step was skipped."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Parts of the step that did not run here, with why (the GPU-only parts in the dry run)."""
    figures: dict[str, Any] = field(default_factory=dict)
    goals: list[Goal] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """The table's short result column."""
        if self.status == "skip":
            return self.reason or ""
        if self.error:
            return self.error.splitlines()[0]
        return str(self.figures.get("summary", ""))


class StepFailed(Exception):
    """The step ran and something it checks is wrong."""


class StepSkipped(Exception):
    """The step cannot run here; the message says why."""


class StepTimeout(Exception):
    """A command of the step was still running at the step's deadline and was stopped."""


@dataclass
class Ran:
    """A finished command: its exit code and its output (stdout and stderr in one log, or stdout
    in a file of its own for a command whose stdout is a JSON document)."""

    argv: list[str]
    code: int
    seconds: float
    log: Path
    out: Path | None = None

    @property
    def text(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def stdout(self) -> str:
        return (self.out or self.log).read_text(errors="replace")

    def tail(self, n: int = 25) -> str:
        return "\n".join(self.text.splitlines()[-n:])


# ----------------------------------------------------------------------------- processes


class Procs:
    """Every command the script starts: its own process group and session, its output to a log
    file, stopped (SIGTERM to the group, then SIGKILL) when its deadline passes or the script ends."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, grace_s: float = 10.0) -> None:
        self.clock = clock
        self.grace_s = grace_s
        self.live: list[subprocess.Popen[bytes]] = []

    def start(
        self, argv: Sequence[str], log: Path, env: Mapping[str, str], cwd: Path, out: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv``: its stderr (and its stdout unless ``out`` is given) to ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as fh, open(out or os.devnull, "wb") as fo:
            fh.write(("$ " + " ".join(argv) + "\n").encode())
            fh.flush()
            p = subprocess.Popen(
                list(argv),
                stdout=fo if out else fh,
                stderr=fh if out else subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
            )
        self.live.append(p)
        return p

    def wait(self, p: subprocess.Popen[bytes], deadline: float) -> int | None:
        """The exit code, or None when the deadline came first (the process still runs)."""
        try:
            return p.wait(max(0.0, deadline - self.clock()))
        except subprocess.TimeoutExpired:
            return None

    def stop(self, p: subprocess.Popen[bytes]) -> None:
        """SIGTERM to the process group (orch up tears its run down on it), SIGKILL after the grace."""
        for sig, wait in ((signal.SIGTERM, self.grace_s), (signal.SIGKILL, 10.0)):
            if p.poll() is not None:
                break
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        # what the group left behind (a child that outlived its parent) goes too
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if p in self.live:
            self.live.remove(p)

    def stop_all(self) -> None:
        for p in list(self.live):
            self.stop(p)


def strays(marker: str) -> list[int]:
    """Processes of this machine, other than this one, whose environment mentions ``marker`` (a
    session's own scratch directory): what the commands started and left running in sessions of
    their own (a node agent's children), beyond the reach of their process groups."""
    want, found = marker.encode(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if want in fh.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


def stop_strays(marker: str, grace_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> list[str]:
    """Stop the ``strays`` of ``marker`` (SIGTERM, then SIGKILL after ``grace_s``) and return their
    command lines, so that nothing a script started outlives it and what had to be stopped is said."""
    said = []
    pids = strays(marker)
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                said.append(fh.read().replace(b"\0", b" ").decode(errors="replace").strip()[:300])
            os.kill(pid, signal.SIGTERM)
        except OSError:
            continue
    deadline = clock() + grace_s
    while pids and clock() < deadline:
        pids = [p for p in pids if os.path.exists(f"/proc/{p}") and not _zombie(p)]
        if pids:
            time.sleep(0.1)  # the processes' own exit is what is awaited, under the deadline
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return said


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# ----------------------------------------------------------------------------- the session and a step's context


@dataclass
class Session:
    """What every step shares: mode, settings, where things are, what earlier steps found."""

    dry: bool
    settings: Any
    """What the steps run with (bench/gpu_smoke.py: its Sizes)."""
    work: Path
    env: dict[str, str]
    procs: Procs
    clock: Callable[[], float] = time.monotonic
    python: str = sys.executable
    cwd: Path = field(default_factory=Path.cwd)
    """Where commands start unless a step says otherwise."""
    facts: dict[str, Any] = field(default_factory=dict)
    """Found by a step for later ones: data paths, the GPU count, the inventories."""

    @property
    def logs(self) -> Path:
        return self.work / "logs"


class StepContext:
    """One step's view: its deadline, its figures, goals and skipped parts, its commands."""

    def __init__(self, session: Session, result: StepResult, deadline: float, limit: str = "") -> None:
        self.s = session
        self.result = result
        self.deadline = deadline
        self.limit = limit or f"the step's budget ({result.budget_s:.0f} s)"
        """What the deadline is, for messages."""
        self.figures = result.figures
        self._n = 0

    @property
    def dry(self) -> bool:
        return self.s.dry

    @property
    def settings(self) -> Any:
        return self.s.settings

    def left(self) -> float:
        return self.deadline - self.s.clock()

    def log_path(self, name: str) -> Path:
        self._n += 1
        path = self.s.logs / self.result.name / f"{self._n:02d}-{name}.log"
        self.result.logs.append(str(path.relative_to(self.s.logs)))
        return path

    def start(
        self, argv: Sequence[str], name: str, env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.log_path(name)
        return self.s.procs.start(argv, log, {**self.s.env, **(env or {})}, cwd or self.s.cwd), log

    def run(
        self,
        argv: Sequence[str],
        name: str,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        limit_s: float | None = None,
        json_stdout: bool = False,
        cleanup: bool = False,
    ) -> Ran:
        """Run a command to its end, or stop it at the step's deadline, or after ``limit_s``
        (then StepTimeout). ``json_stdout``: its stdout goes to a file of its own (``Ran.stdout``).
        ``cleanup``: a teardown command (``orch down``) that runs ``limit_s`` even past the deadline."""
        if cleanup and limit_s is None:
            raise ValueError("a cleanup command needs its own limit_s")
        t0 = self.s.clock()
        log = self.log_path(name)
        out = log.with_suffix(".json") if json_stdout else None
        p = self.s.procs.start(argv, log, {**self.s.env, **(env or {})}, cwd or self.s.cwd, out=out)
        deadline = (
            (t0 + limit_s if cleanup else min(self.deadline, t0 + limit_s)) if limit_s is not None else self.deadline
        )
        code = self.s.procs.wait(p, deadline)
        if code is None:
            self.s.procs.stop(p)
            why = (
                f"after {limit_s:.0f} s"
                if limit_s is not None and (cleanup or deadline < self.deadline)
                else f"at {self.limit}"
            )
            raise StepTimeout(f"{name} still running {why}: stopped")
        self.s.procs.live.remove(p)
        return Ran(list(argv), code, self.s.clock() - t0, log, out)

    def require(self, cond: Any, message: str) -> None:
        if not cond:
            raise StepFailed(message)

    def need(self, value: T | None, message: str) -> T:
        """``value``, which must be there (not None, not empty), else the step fails with ``message``."""
        if not value:
            raise StepFailed(message)
        return value

    def ok(self, ran: Ran, what: str, codes: Sequence[int] = (0,)) -> Ran:
        """The command exited with one of ``codes``, else the step fails with its last lines."""
        if ran.code not in codes:
            raise StepFailed(f"{what} exited {ran.code} (log {ran.log.name}):\n{ran.tail()}")
        return ran

    def goal(self, what: str, value: Any, goal: str, met: bool | None) -> None:
        self.result.goals.append(Goal(what, value, goal, met))

    def skip_part(self, part: str, reason: str) -> None:
        self.result.skipped[part] = reason


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    budget_s: float
    dry_budget_s: float
    fn: Callable[[StepContext], None]
    requires: tuple[str, ...] = ()


def run_steps(
    steps: Sequence[Step],
    session: Session,
    total_s: float,
    budgets: Mapping[str, float] | None = None,
    on_result: Callable[[list[StepResult]], None] | None = None,
) -> list[StepResult]:
    """Run each step in order under its budget and the whole run's; every step becomes a result.

    A step whose required steps did not pass, or that would start after the whole budget is
    spent, is skipped with the reason. Whatever a step started is stopped when it ends, however
    it ends (``finally``); Ctrl-C or SIGTERM stops the current step and skips the rest."""
    clock = session.clock
    end = clock() + total_s
    results: list[StepResult] = []
    by_name: dict[str, StepResult] = {}
    interrupted = False
    for step in steps:
        budget = (budgets or {}).get(step.name, step.dry_budget_s if session.dry else step.budget_s)
        r = StepResult(step.name, step.title, budget_s=budget)
        results.append(r)
        by_name[step.name] = r
        failed = [n for n in step.requires if n in by_name and by_name[n].status != "pass"]
        if interrupted:
            r.reason = "interrupted before this step"
        elif failed:
            r.reason = f"needs {', '.join(failed)}, which did not pass"
        elif clock() >= end:
            r.reason = f"the whole budget ({total_s:.0f} s) was spent before this step"
        else:
            print(f"== {step.name}: {step.title} (budget {budget:.0f} s)", flush=True)
            t0 = clock()
            limit = "" if t0 + budget <= end else f"the end of the whole run's budget ({total_s:.0f} s)"
            ctx = StepContext(session, r, min(t0 + budget, end), limit)
            try:
                step.fn(ctx)
                r.status = "pass"
            except StepSkipped as e:
                r.status, r.reason = "skip", str(e)
            except StepTimeout as e:
                r.status, r.error = "timeout", str(e)
            except StepFailed as e:
                r.status, r.error = "fail", str(e)
            except KeyboardInterrupt:
                r.status, r.error = "fail", "interrupted"
                interrupted = True
            except Exception as e:  # a bug of the script or an unexpected output: recorded, the rest still run
                r.status, r.error = "fail", f"{type(e).__name__}: {e}"
            finally:
                session.procs.stop_all()
                r.seconds = round(clock() - t0, 2)
            print(f"   {r.status} in {r.seconds:.1f} s: {r.summary()}", flush=True)
        if on_result is not None:
            on_result(results)
    return results


# ----------------------------------------------------------------------------- the report


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if v is None:
        return "-"
    return str(v)


def counts(results: Sequence[StepResult]) -> dict[str, int]:
    return {st: sum(1 for r in results if r.status == st) for st in STATUSES}


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def table(results: Sequence[StepResult], doc: Mapping[str, Any], width: int = 100) -> str:
    """The short table printed last: one row per step (its result cut to ``width``, the parts it
    skipped here named after it, within a third of it), then the goals."""
    c = doc["counts"]
    head = (
        f"{doc['benchmark']} ({doc['mode']}): {len(results)} steps, {c['pass']} pass, {c['fail']} fail, "
        f"{c['timeout']} timeout, {c['skip']} skip; {doc['wall_s']:.0f} s of {doc['budget_s']:.0f} s"
    )
    lines = [head, f"{'step':<12} {'status':<8} {'time':>7} {'budget':>7}  result"]
    for r in results:
        note = f" [skipped here: {', '.join(r.skipped)}]" if r.skipped and r.status != "skip" else ""
        text = cut(r.summary(), width - min(len(note), width // 3)) + cut(note, width // 3)
        lines.append(f"{r.name:<12} {r.status:<8} {r.seconds:>6.1f}s {r.budget_s:>6.0f}s  {text}")
    goals = [(r.name, g) for r in results for g in r.goals]
    if goals:
        lines.append("")
        lines.append(f"{'goal':<76} {'value':>9} {'goal':>14} met")
        for _, g in goals:
            met = {True: "yes", False: "NO", None: ""}[g.met]
            value = fmt(g.value)
            value = value if len(value) <= 9 else value[:8] + "…"
            lines.append(f"{cut(g.what, 76):<76} {value:>9} {g.goal:>14} {met}")
    return "\n".join(lines)


def output_names(name: str) -> tuple[str, str, str]:
    """The three files ``write_outputs`` writes: NAME.json, NAME.txt, NAME_logs.tar.gz."""
    return f"{name}.json", f"{name}.txt", f"{name}_logs.tar.gz"


def write_outputs(out: Path, name: str, doc: Mapping[str, Any], text: str, logs: Path) -> None:
    """NAME.json and NAME.txt (each written whole, then renamed into place), and NAME_logs.tar.gz:
    every command's output under ``logs`` (``*.log``, and ``*.json`` stdout), each its last MiB."""
    out.mkdir(parents=True, exist_ok=True)
    js, txt, tgz = output_names(name)
    for file, body in ((js, json.dumps(doc, indent=1, default=str) + "\n"), (txt, text + "\n")):
        tmp = out / f".{file}.tmp"
        tmp.write_text(body)
        os.replace(tmp, out / file)
    tmp = out / f".{tgz}.tmp"
    files = sorted(p for p in logs.rglob("*") if p.is_file() and p.suffix in (".log", ".json")) if logs.is_dir() else []
    with tarfile.open(tmp, "w:gz") as tar:
        for path in files:
            data = path.read_bytes()
            if len(data) > LOG_TAIL:
                data = b"[... cut: the last MiB follows]\n" + data[-LOG_TAIL:]
            info = tarfile.TarInfo(str(Path("logs") / path.relative_to(logs)))
            info.size, info.mtime = len(data), int(path.stat().st_mtime)
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, out / tgz)
