"""`transport: slurm`: nodes that are a Slurm allocation, each command an `srun` step on its node
(the lines, their environment and the allocation: `allocation.py`).

A step's command runs through `/bin/sh -c` with the warning signal ignored (`STEP_PREFIX`): Slurm
signals every process of a step, and orch's node programs (the probe, the log reader, the agent)
must outlive a `--signal=USR2@N` warning; torchrun inherits the ignored signal, and the trainer,
which installs its own handler, is the one that acts on it. A step that never ran (no such job,
no step could be made) is an unreached node, in srun's words (`srun_failure`).

The node agents of a run are held by one step on every node (`launch`): its task on each node
(`node/each.py`) runs that node's `node/boot.py`, and the agent stays in the foreground
(`Transport.agent_held`), so under `ProctrackType=proctrack/cgroup` (which kills whatever a
finished step leaves) the agent lives as long as the job, and `--kill-on-bad-exit=1` ends every
node's agent (which stops its job) as soon as one exits with a failure, whether or not the
controller is there to see it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config.inventory import Allocation, Inventory
from ..config.nodes import Node
from ..errors import TransportError
from ..node import script as node_script
from . import allocation
from .allocation import STEP_PREFIX, cpus_of, step_argv, step_env, version
from .base import GroupResult, Hold, Note, OnOutput, PopenProcess, Process, Result, Transport, command_line, log

SRUN_FAILED = re.compile(
    r"^srun: error: (?:Unable to (?:create step|confirm allocation|allocate)|Task launch for|Application launch "
    r"failed|.*(?:Invalid job id|has expired|are still not ready|Job/step already completing or completed))",
    re.M,
)
"""srun's own words when the step never ran (its exit code is then 1, which a command may also
return): the node was not reached."""
JOB_ENDED = re.compile(r"Invalid job id|has expired|Job/step already completing or completed|Job has already finished")
"""Among them, the words that say the allocation itself has ended: Slurm ended what ran in it."""


SRUN_SAID = re.compile(r"^srun: error: \S+: tasks? [\d,-]+: (?:Exited with exit code \d+|Killed|Terminated)\n?", re.M)
"""srun's own line about how its task ended: not the command's stderr."""


def srun_failure(node: str, code: int, stderr: str) -> TransportError | None:
    """The error that says srun never ran the step on `node` (its own words), else None."""
    m = SRUN_FAILED.search(stderr)
    if code == 0 or m is None:
        return None
    line = stderr[m.start() :].splitlines()[0].removeprefix("srun: error: ")
    if JOB_ENDED.search(line):
        return TransportError(node, "gone", f"the allocation has ended (srun: {line})")
    return TransportError(node, "unreachable", f"srun could not run a step there: {line}")


class _SrunProcess(PopenProcess):
    """A step's srun, its stdout and stderr one stream; ended as `end_srun` ends it (SIGTERM: the
    step's tasks are killed with it), SIGKILL if it lingers."""

    def end(self) -> None:
        end_srun(self.proc)


def end_srun(proc: subprocess.Popen[bytes], wait: float = 5.0) -> None:
    """End an srun and with it its step: SIGTERM (srun kills the tasks and tells slurmctld), SIGKILL
    after `wait` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()  # bounded: SIGKILLed just above


class SlurmTransport(Transport):
    """One node of a Slurm allocation: each command an srun step on it (`step_argv`)."""

    name = "slurm"
    same_host = False
    close_stops_commands = True
    allocates = True
    agent_held = True
    copy_tools = ("tar",)

    def __init__(self, node: Node, allocation: Allocation | None = None, gpus_per_node: int | None = None) -> None:
        super().__init__(node)
        self.allocation = allocation
        self.gpus_per_node = gpus_per_node

    @classmethod
    def open(cls, inv: Inventory, node: Node) -> SlurmTransport:
        return cls(node, inv.allocation, inv.slurm.gpus_per_node if inv.slurm else None)

    @classmethod
    def target(cls, node: Node) -> str:
        return f"Slurm node {node.name} (srun)"

    @classmethod
    def hold(cls, inv: Inventory, say: Note | None = None) -> Hold:
        return allocation.SlurmHold.acquire(inv, say)

    @classmethod
    def peek(cls, inv: Inventory) -> Inventory:
        return allocation.peek(inv)

    @classmethod
    def plan_lines(cls, inv: Inventory) -> list[list[str]]:
        return allocation.dry_run_lines(inv)

    @classmethod
    def release(cls, inv: Inventory) -> str | None:
        return allocation.release_recorded(inv)

    def _job(self) -> tuple[Allocation, int]:
        alloc = self.allocation
        if alloc is None:
            raise TransportError(self.node_name, "unreachable", "no Slurm allocation holds this node (yet)")
        return alloc, cpus_of(alloc, [self.node_name])

    def connect(self) -> float:
        self._job()
        return 0.0

    def step(self, label: bool = False) -> list[str]:
        """The srun line of a step on this node."""
        alloc, cpus = self._job()
        return step_argv(version(), alloc.job_id, [self.node_name], cpus, self.gpus_per_node, label=label)

    def reach(self, line: str) -> list[str]:
        return [*self.step(), "/bin/sh", "-c", STEP_PREFIX + line]

    def _reach_popen(self) -> dict[str, Any]:
        _alloc, cpus = self._job()
        return {"env": step_env(version(), cpus), "start_new_session": True, "cwd": "/"}

    def unreached(self, code: int, stderr: str) -> TransportError | None:
        return srun_failure(self.node_name, code, stderr)

    def said(self, stderr: str) -> str:
        return SRUN_SAID.sub("", stderr)

    def _exec(
        self,
        line: str,
        stdin: bytes | None,
        timeout: float | None,
        on_output: OnOutput | None = None,
        keep: bool = True,
    ) -> tuple[int, bytes, bytes]:
        from .local import _streamed

        argv = self.reach(line)
        proc = self.children.start(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **self._reach_popen()
        )
        try:
            if on_output is None:
                out, err = proc.communicate(stdin or b"", timeout=timeout)
            else:
                out, err = _streamed(proc, stdin or b"", timeout, on_output, keep)
        except subprocess.TimeoutExpired:
            end_srun(proc)
            if on_output is None:
                proc.communicate()
            raise TransportError(self.node_name, "timeout", f"command timed out after {timeout:.0f} s") from None
        finally:
            self.children.forget(proc)
        said = err.decode("utf-8", "replace")
        refused = srun_failure(self.node_name, proc.returncode, said)
        if refused is not None:
            raise refused
        return proc.returncode, out, self.said(said).encode() if keep else b""

    def popen(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        keep_stdin: bool = False,
    ) -> Process:
        line = command_line(argv, env, cwd)
        log.debug("%s$ %s", self.node_name, line)
        proc = subprocess.Popen(
            self.reach(line),
            stdin=subprocess.PIPE if keep_stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            **self._reach_popen(),
        )
        return _SrunProcess(proc)

    @classmethod
    def launch(
        cls,
        jobs: Mapping[str, tuple[Transport, list[str], bytes]],
        *,
        timeout: float,
        workers: int = 32,
        log_path: Path | None = None,
        detached: bool = False,
    ) -> GroupResult[Result]:
        """One step on every node (`--kill-on-bad-exit=1`, the node's memory) whose task runs that
        node's call (argv, stdin) and stays: each node's answer is its first lines up to a JSON object
        (the agent's, once its job runs). The step's srun writes to `log_path`; an attached run's is
        ended with the transports (`close`), a detached run's outlives this process, and when orch
        made the allocation, gives it back once the step ends."""
        calls = {name: (argv, stdin) for name, (_, argv, stdin) in jobs.items()}
        first = next(iter(jobs.values()))[0]
        assert isinstance(first, SlurmTransport)
        alloc, _ = first._job()  # the allocation, not the module
        names = list(jobs)
        order = [n for n in alloc.nodes if n in set(names)]  # task ids follow the allocation's order
        cpus = cpus_of(alloc, names)
        v = version()
        python = first.node.python
        argv = step_argv(v, alloc.job_id, order, cpus, first.gpus_per_node, label=True, whole=True)
        argv += ["/bin/sh", "-c", STEP_PREFIX + command_line([python, "-c", node_script("each"), "SLURMD_NODENAME"])]
        payload = json.dumps({n: {"argv": a, "stdin": s.decode("ascii")} for n, (a, s) in calls.items()})
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="orch-launch-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        env = step_env(v, cpus)
        if detached and alloc.created:  # the allocation ends with the step: nobody else is left to end it
            argv = ["/bin/sh", "-c", GIVE_BACK, "sh", alloc.job_id, *argv]
        log.debug("launch$ %s", " ".join(argv))
        with open(log_path, "ab") as out, tempfile.TemporaryFile() as feed:
            feed.write(payload.encode("ascii"))
            feed.seek(0)
            popen: dict[str, Any] = {"stdin": feed, "stdout": out, "stderr": out, "env": env, "cwd": "/"}
            if detached:
                proc = subprocess.Popen(argv, start_new_session=True, **popen)
            else:
                proc = first.children.start(argv, start_new_session=True, **popen)
        return _answers(log_path, proc, order, calls, timeout)


GIVE_BACK_AFTER_S = 5
"""How long a detached run's allocation outlives its launch step: the answers of the stops that
ended it (`orch down`, each its own step) come back before it is cancelled."""
GIVE_BACK = f'job=$1; shift; "$@"; sleep {GIVE_BACK_AFTER_S}; exec scancel "$job" >/dev/null 2>&1'
"""A detached run's launch on this machine, when orch made the allocation: the step's srun, then the
allocation given back (`scancel`) once the step has ended, whoever ended it."""


def _answers(
    log_path: Path,
    proc: subprocess.Popen[bytes],
    order: Sequence[str],
    calls: Mapping[str, tuple[list[str], bytes]],
    timeout: float,
) -> GroupResult[Result]:
    """Each node's answer in the launch step's labelled output: its lines up to its first JSON object,
    or, once the step has ended (or `timeout`), what it said until then."""
    start = time.monotonic()
    said: dict[str, list[str]] = {n: [] for n in order}
    srun: list[str] = []
    answered: dict[str, str] = {}
    offset = 0
    pending = b""
    while True:
        ended = proc.poll() is not None
        with open(log_path, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read()
        offset += len(chunk)
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            text = raw.decode("utf-8", "replace")
            m = re.match(r"^\s*(\d+): (.*)$", text)
            if m is None or int(m.group(1)) >= len(order):
                srun.append(text)
                continue
            node = order[int(m.group(1))]
            body = m.group(2)
            if node not in answered and body.startswith("{"):
                try:
                    if isinstance(json.loads(body), dict):
                        answered[node] = body
                        continue
                except ValueError:
                    pass
            said[node].append(body)
        if len(answered) == len(order) or ended or time.monotonic() - start > timeout:
            break
        time.sleep(0.02)
    code = proc.poll()
    elapsed = (time.monotonic() - start) * 1000
    results: dict[str, Result | Exception] = {}
    for node in order:
        argv = tuple(calls[node][0])
        if node in answered:
            results[node] = Result(node, argv, 0, answered[node] + "\n", "\n".join(said[node]), elapsed)
            continue
        why = srun_failure(node, 1, "\n".join(srun))
        if why is not None:
            results[node] = why
            continue
        tail = (said[node] + [s for s in srun if node in s])[-5:]
        results[node] = Result(
            node,
            argv,
            code if code is not None else 1,
            "",
            "\n".join(tail) or ("no answer" if code is None else f"the launch step ended ({code})"),
            elapsed,
        )
    return GroupResult(results)
