"""Slurm's side of `transport: slurm`: the lines orch runs here (every `srun` step, `step_argv`; the
`sbatch` that asks for the allocation, `sbatch_argv`), the environment they run in, and the
allocation a command runs in (`SlurmHold`): asked for, waited on, read, renewed, given back.

Every step: `srun --jobid J --overlap --nodes=N --ntasks-per-node=1 --cpus-per-task=C
--kill-on-bad-exit=1 --nodelist=...`, in the environment orch runs in less every `SLURM_*`,
`SRUN_*`, `SALLOC_*` and `SBATCH_*` variable of an enclosing allocation or step (SchedMD bug 14298:
a step's `SLURM_NTASKS=1` makes a nested `srun -N4` run on one node, silently), so the job id and
every count are said, never inherited. `--overlap` (20.11+) lets a step start beside the running
job; `--cpus-per-task` is the CPUs the allocation holds on the node, said because 22.05 to 23.02
srun no longer reads `SLURM_CPUS_PER_TASK` (those releases also get `SRUN_CPUS_PER_TASK`, for a job
that starts its own srun).

Outside an allocation, `orch up` and `orch check` ask for one with `sbatch`: a batch job whose
script only holds the nodes (`sleep infinity`), so that it can be requeued (`scontrol requeue`
refuses an `salloc` allocation), with the warning signal on the allocation (a step's own `--signal`
does nothing in an existing allocation on 22.05). They wait for it with its pending reason
(`squeue`), read its nodes, their hostnames and CPUs (`scontrol show -d job`, `sinfo`; never
`scontrol show hostnames` bare, which inside a step reads the step's nodes), and give it back
(`scancel`) however the command ends; a detached run's launch gives it back when its step ends.
Inside an allocation (`SLURM_JOB_ID` set: `salloc`, the user's own sbatch script) its nodes are used
and it is never cancelled.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..config.inventory import Allocation, Inventory, Slurm, with_allocation
from ..errors import OrchError
from .base import Hold, Note

SRUN = "srun"
CLIENT_PREFIXES = ("SLURM_", "SRUN_", "SALLOC_", "SBATCH_")
"""Environment variables Slurm's client commands read as options or as the context they run in."""
KEEP = ("SLURM_CONF",)
"""The one of them that says which cluster, not which job: kept."""
WARNING_SIGNAL = "USR2"
"""The signal Slurm sends the steps before a time limit or a preemption (`--signal`): SIGUSR1 is
NCCL's; torchrun dies of an unhandled USR2, so every step ignores it but the trainer."""
STEP_PREFIX = f"trap '' {WARNING_SIGNAL}; cd \"$HOME\" 2>/dev/null || cd /; "
"""What a step's shell does before the line: ignore the warning signal (inherited by what it
execs), start in the home directory as an SSH login does."""


@dataclass(frozen=True, order=True)
class Version:
    """A Slurm release (`srun --version`: `slurm 23.11.4`, Debian's `slurm-wlm 22.05.8`)."""

    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> Version:
        m = re.search(r"(\d+)\.(\d+)", text)
        if m is None:
            raise ValueError(f"no Slurm version in {text.strip()!r}")
        return cls(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}"

    @property
    def overlap(self) -> bool:
        """20.11 made steps exclusive: a second step waits for the CPUs the first holds, unless `--overlap`
        (which older releases do not know, and do not need)."""
        return self >= Version(20, 11)

    @property
    def reads_cpus_per_task(self) -> bool:
        """Whether srun takes `--cpus-per-task` from `SLURM_CPUS_PER_TASK`: not from 22.05 to 23.02
        (`SRUN_CPUS_PER_TASK` instead); 23.11 went back."""
        return not (Version(22, 5) <= self < Version(23, 11))


def client_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a Slurm client command: this one's, less every `SLURM_*`, `SRUN_*`,
    `SALLOC_*`, `SBATCH_*` of an enclosing allocation or step but `SLURM_CONF` (bug 14298)."""
    env = dict(os.environ if environ is None else environ)
    return {k: v for k, v in env.items() if k in KEEP or not k.startswith(CLIENT_PREFIXES)}


@functools.lru_cache(maxsize=1)
def version() -> Version:
    """This machine's Slurm client release (`srun --version`), asked once per process."""
    try:
        out = subprocess.run(
            [SRUN, "--version"], capture_output=True, text=True, timeout=30, env=client_env(), check=False
        )
    except FileNotFoundError:
        raise OrchError(
            "srun is not installed on this machine: transport: slurm runs every command on a node with it",
            "run orch on a login node of the cluster (apt-get install slurm-client, dnf install slurm)",
        ) from None
    return Version.parse(out.stdout or out.stderr)


def step_argv(
    v: Version,
    job_id: str,
    nodes: Sequence[str],
    cpus: int,
    gpus_per_node: int | None = None,
    *,
    label: bool = False,
    whole: bool = False,
) -> list[str]:
    """The srun line of one step of job `job_id` on `nodes`, one task per node: the job id, the node
    count and `--cpus-per-task` said (never inherited), `--kill-on-bad-exit=1`, `--overlap` where the
    release has it, the allocation's GPUs per node, output unbuffered and srun's own chatter off.
    `label`: each line prefixed with its task id; `whole`: the node's memory too (`--mem=0`: the
    launch step, which runs the job)."""
    argv = [SRUN, f"--jobid={job_id}"]
    if v.overlap:
        argv.append("--overlap")
    argv += [
        f"--nodes={len(nodes)}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={cpus}",
        "--kill-on-bad-exit=1",
        f"--nodelist={','.join(nodes)}",
    ]
    if gpus_per_node:
        argv.append(f"--gpus-per-node={gpus_per_node}")
    if whole:
        argv.append("--mem=0")
    argv += ["--unbuffered", "--quiet"]
    if label:
        argv.append("--label")
    return argv


def step_env(v: Version, cpus: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """srun's environment: `client_env`, and on releases that ignore `SLURM_CPUS_PER_TASK`, the
    step's CPUs as `SRUN_CPUS_PER_TASK` (what a job's own srun reads there)."""
    env = client_env(environ)
    if not v.reads_cpus_per_task:
        env["SRUN_CPUS_PER_TASK"] = str(cpus)
    return env


def cpus_of(alloc: Allocation, nodes: Sequence[str]) -> int:
    """`--cpus-per-task` for a step on `nodes`: the fewest CPUs the allocation holds on any of them
    (one count for every task of a step), 1 when it does not say."""
    counts = [alloc.cpus[n] for n in nodes if n in alloc.cpus]
    return max(1, min(counts)) if counts else 1


SBATCH, SQUEUE, SCONTROL, SCANCEL, SINFO = "sbatch", "squeue", "scontrol", "scancel", "sinfo"
WARNING_S = 120
"""Seconds before the time limit (or at a preemption) that the steps get `--signal=USR2@WARNING_S`
unless `slurm.options` says otherwise: slurmctld looks every 30 s and may send it up to 60 s early,
and the trainer needs time for one checkpoint."""
HOLD = "exec sleep infinity"
"""The holding batch script: the allocation is the steps', the script only keeps it."""
CPU_FLAGS = ("--exclusive", "-c", "--cpus-per-task", "--cpus-per-gpu", "--mincpus", "--cpus-per-node")
"""sbatch flags that say how many CPUs a node gets; without one, orch asks for whole nodes."""
POLL_S = 0.25
SAY_EVERY_S = 30.0
PREEMPT_WAIT_S = 60.0
"""How long a retry waits for a preempted allocation to be requeued or ended (slurmctld acts at its
next 30 s pass after the partition's GraceTime), or a completing one to settle."""
SETTLE_POLL_S = 0.5
GONE_WAIT_S = 30.0
"""How long `release` waits for a cancelled allocation to leave the queue's running states."""


def _flag(option: str) -> str:
    name = option.partition("=")[0]
    return name[:2] if not name.startswith("--") and len(name) > 2 else name


def sbatch_argv(slurm: Slurm, name: str) -> list[str]:
    """The sbatch line that asks for the allocation: `slurm:`'s keys, whole nodes unless the options
    say how many CPUs, the warning signal to the steps unless the options move it, requeue allowed,
    the user's options last, and the holding script."""
    if not slurm.nodes:
        raise OrchError(
            "slurm.nodes is not set and no allocation holds this process (SLURM_JOB_ID is unset)",
            "set slurm.nodes: N in the inventory, or run orch inside an allocation (salloc -N4 ...)",
        )
    given = {_flag(o) for o in slurm.options}
    argv = [SBATCH, "--parsable"]
    if not given & {"-J", "--job-name"}:
        argv.append(f"--job-name=orch-{name}")
    argv.append(f"--nodes={slurm.nodes}")
    if slurm.partition:
        argv.append(f"--partition={slurm.partition}")
    if slurm.time:
        argv.append(f"--time={slurm.time}")
    if slurm.gpus_per_node:
        argv.append(f"--gpus-per-node={slurm.gpus_per_node}")
    if not given & set(CPU_FLAGS):
        argv.append("--exclusive")
    if "--signal" not in given:
        argv.append(f"--signal={WARNING_SIGNAL}@{WARNING_S}")
    argv += ["--requeue", "--output=/dev/null", "--chdir=/", *slurm.options, "--wrap", HOLD]
    return argv


def scancel_argv(job_id: str) -> list[str]:
    return [SCANCEL, job_id]


def _run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=client_env(), stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        raise OrchError(
            f"{argv[0]} is not installed on this machine: transport: slurm needs Slurm's client commands",
            "run orch on a login node of the cluster (apt-get install slurm-client, dnf install slurm)",
        ) from None


def job_fields(job_id: str) -> dict[str, str] | None:
    """`scontrol show -d -o job J` as {key: value} (the `Nodes=`/`CPU_IDs=` pairs of `-d` as
    `Nodes.N`/`CPU_IDs.N`); None when Slurm no longer knows the job."""
    res = _run([SCONTROL, "show", "-d", "-o", "job", job_id])
    if res.returncode != 0:
        if "Invalid job id" in res.stderr:
            return None
        raise OrchError(f"scontrol show job {job_id} failed: {(res.stderr.strip() or res.stdout.strip())[-300:]}")
    out: dict[str, str] = {}
    counts: dict[str, int] = {}
    for key, value in re.findall(r"(?:^|\s)([A-Za-z_/:]+)=(\S*)", res.stdout):
        if key in ("Nodes", "CPU_IDs"):
            n = counts[key] = counts.get(key, -1) + 1
            key = f"{key}.{n}"
        out.setdefault(key, value)
    return out


def hostnames(nodelist: str) -> list[str]:
    """A Slurm node list (`sn[1-4]`) expanded in its order (`scontrol show hostnames LIST`: the list
    said, never read from a step's SLURM_JOB_NODELIST)."""
    if not nodelist or nodelist == "(null)":
        return []
    res = _run([SCONTROL, "show", "hostnames", nodelist])
    if res.returncode != 0:
        raise OrchError(f"scontrol show hostnames {nodelist} failed: {res.stderr.strip()[-300:]}")
    return [line.strip() for line in res.stdout.splitlines() if line.strip()]


def count_cpus(ids: str) -> int:
    """How many CPUs `CPU_IDs=0-1,4,6-7` names."""
    total = 0
    for part in ids.split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit():
            total += (int(hi) - int(lo) + 1) if hi.isdigit() else 1
    return total


def read_allocation(job_id: str, created: bool) -> Allocation:
    """A running allocation's nodes in its order, each node's hostname (NodeHostname, `sinfo`) and
    the CPUs it holds there (`scontrol show -d job`)."""
    fields = job_fields(job_id)
    if fields is None:
        raise OrchError(f"Slurm job {job_id} is not known to Slurm", "is SLURM_JOB_ID the job you are in?")
    nodes = hostnames(fields.get("NodeList", ""))
    cpus: dict[str, int] = {}
    for i in range(len(nodes)):
        group, ids = fields.get(f"Nodes.{i}"), fields.get(f"CPU_IDs.{i}")
        if group is None or ids is None:
            break
        for name in hostnames(group):
            cpus[name] = count_cpus(ids)
    if not cpus and nodes and fields.get("NumCPUs", "").isdigit():  # no -d detail: an even share
        cpus = dict.fromkeys(nodes, max(1, int(fields["NumCPUs"]) // len(nodes)))
    addrs: dict[str, str] = {}
    if nodes:
        res = _run([SINFO, "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%n"])
        for line in res.stdout.splitlines():
            name, _, host = line.strip().partition("|")
            if name in nodes and host:
                addrs.setdefault(name, host)
    return Allocation(job_id, tuple(nodes), addrs, cpus, created)


def queue_state(job_id: str) -> tuple[str, str] | None:
    """(state, reason) of a job in the queue (`squeue`), None when it has left the queue."""
    res = _run([SQUEUE, "-h", "-j", job_id, "-o", "%T|%r"])
    line = res.stdout.strip().splitlines()[0] if res.returncode == 0 and res.stdout.strip() else ""
    if not line:
        return None
    state, _, reason = line.partition("|")
    return state, reason


def wait_running(job_id: str, say: Note | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
    """Until the job runs, saying each state and pending reason as it changes (and every 30 s); an
    OrchError when it leaves the queue without running (cancelled, failed)."""
    start = time.monotonic()
    said, said_at = None, start
    while True:
        now = queue_state(job_id)
        if now is None:
            fields = job_fields(job_id) or {}
            raise OrchError(
                f"Slurm job {job_id} ended before it ran: {fields.get('JobState', 'gone')} "
                f"({fields.get('Reason', 'no reason given')})",
                "squeue/sacct say more; check slurm.partition, slurm.options and the cluster's limits",
            )
        state, reason = now
        if state == "RUNNING":
            if say is not None:
                say(f"Slurm job {job_id} is running (after {time.monotonic() - start:.1f} s)")
            return
        waited = time.monotonic() - start
        if say is not None and (now != said or time.monotonic() - said_at >= SAY_EVERY_S):
            say(f"Slurm job {job_id}: {state} ({reason}), waiting {waited:.0f} s")
            said, said_at = now, time.monotonic()
        sleep(POLL_S)


def submit(inv: Inventory) -> str:
    """sbatch the allocation; its job id."""
    assert inv.slurm is not None
    argv = sbatch_argv(inv.slurm, inv.name)
    res = _run(argv)
    job = res.stdout.strip().split(";")[0]
    if res.returncode != 0 or not job.isdigit():
        said = (res.stderr.strip() or res.stdout.strip() or f"exit {res.returncode}").splitlines()[-1]
        raise OrchError(f"sbatch refused the allocation: {said}", "check slurm.partition, slurm.time and slurm.options")
    return job


def cancel(job_id: str, wait: float = GONE_WAIT_S) -> None:
    """scancel the job and wait (bounded) until it has left the queue, its nodes' cleanup
    (COMPLETING) included: what orch asked for is gone when it says so."""
    _run(scancel_argv(job_id))
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and queue_state(job_id) is not None:
        time.sleep(POLL_S / 2)


def _epoch(stamp: str | None) -> float | None:
    if not stamp or stamp in ("Unknown", "None", "N/A"):
        return None
    try:
        return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _live(fields: Mapping[str, str]) -> str | None:
    """The job's state where it still holds or waits for nodes, else None."""
    state = fields.get("JobState", "")
    return state if state in ("PENDING", "RUNNING", "CONFIGURING", "REQUEUED", "SUSPENDED") else None


def _settling(fields: Mapping[str, str]) -> bool:
    """Whether a job is between two states a retry must tell apart: preempted and still running
    (slurmctld requeues or ends it at its next 30 s pass), or COMPLETING (its nodes cleaned up,
    after which a requeued job is PENDING again and an ended one is gone)."""
    state = fields.get("JobState", "")
    return state == "COMPLETING" or (state == "RUNNING" and _epoch(fields.get("PreemptTime")) is not None)


def ending(fields: Mapping[str, str], now: float | None = None) -> str | None:
    """Why a running allocation is about to end: preempted (PreemptTime set), or within the warning
    of its time limit (EndTime); None when it is not."""
    if _epoch(fields.get("PreemptTime")) is not None:
        return f"Slurm job {fields.get('JobId')} is being preempted"
    end = _epoch(fields.get("EndTime"))
    if end is not None and end - (now or time.time()) < WARNING_S + 60:
        return (
            f"Slurm job {fields.get('JobId')} reaches its time limit ({fields.get('TimeLimit')}) at {fields['EndTime']}"
        )
    return None


def ended_words(fields: Mapping[str, str] | None, job_id: str, restarts: int) -> str | None:
    """Why an allocation went away under a run, in words, from `scontrol show job`; None when it
    is still there and not ending."""
    if fields is None:
        return f"Slurm job {job_id} is gone"
    state = fields.get("JobState", "")
    if state == "TIMEOUT":
        return f"Slurm job {job_id} reached its time limit ({fields.get('TimeLimit')}): the job was ended by Slurm"
    if state == "PREEMPTED":
        return f"Slurm job {job_id} was preempted"
    if int(fields.get("Restarts", "0") or 0) > restarts or state in ("REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"):
        return f"Slurm job {job_id} was requeued (preempted or scontrol requeue): it runs again when scheduled"
    if state in ("CANCELLED", "NODE_FAIL", "FAILED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "COMPLETED"):
        return f"Slurm job {job_id} ended: {state} ({fields.get('Reason')})"
    if state == "RUNNING":
        return ending(fields)
    return None


class SlurmHold(Hold):
    """The allocation a command runs in: `acquire` asks for it (or finds the one this process is
    in), `release` gives back the one it asked for, `renew` gives the next attempt its nodes."""

    def __init__(self, base: Inventory, alloc: Allocation, say: Note | None = None) -> None:
        super().__init__(with_allocation(base, alloc))
        self.base = base
        self.alloc = alloc
        self.say = say
        self.kept = False
        self.restarts = self._restarts()

    @classmethod
    def acquire(cls, inv: Inventory, say: Note | None = None) -> SlurmHold:
        slurm = inv.slurm
        assert slurm is not None
        if inv.allocation is not None:  # read already (`peek`): the one this process is in
            return cls(inv, inv.allocation, say)
        inside = os.environ.get("SLURM_JOB_ID")
        if inside:
            alloc = read_allocation(inside, created=False)
            fields = job_fields(inside) or {}
            if slurm.partition and fields.get("Partition") not in (None, slurm.partition):
                raise OrchError(
                    f"{inv.path}: slurm.partition is {slurm.partition}, but this process is in Slurm job {inside} "
                    f"of partition {fields.get('Partition')}",
                    "leave slurm.partition out inside an allocation, or run orch outside it",
                )
            unused = [k for k in ("time", "options") if getattr(slurm, k)]
            if unused and say is not None:
                keys = " and ".join(f"slurm.{k}" for k in unused)
                say(f"inside Slurm job {inside} (SLURM_JOB_ID): its own limits hold; {keys} not applied")
            return cls(inv, alloc, say)
        version()  # srun is here, before anything is asked of Slurm
        job = submit(inv)
        if say is not None:
            say(f"Slurm job {job} submitted: {' '.join(sbatch_argv(slurm, inv.name))}")
        try:
            wait_running(job, say)
            return cls(inv, read_allocation(job, created=True), say)
        except BaseException:
            cancel(job)
            raise

    @property
    def record(self) -> dict[str, Any]:
        return self.alloc.to_json()

    def _restarts(self) -> int:
        fields = job_fields(self.alloc.job_id) or {}
        return int(fields.get("Restarts", "0") or 0)

    def ended(self) -> str | None:
        """`ended_words` of the state the job settles in: a step fails the moment Slurm ends the
        allocation, while the job is COMPLETING, which says nothing yet of why (0.1 to 3 s here,
        as long as the nodes' epilog on a real cluster)."""
        job = self.alloc.job_id
        fields = job_fields(job)
        deadline = time.monotonic() + PREEMPT_WAIT_S
        while fields is not None and fields.get("JobState") == "COMPLETING" and time.monotonic() < deadline:
            time.sleep(SETTLE_POLL_S)
            fields = job_fields(job)
        return ended_words(fields, job, self.restarts)

    def renew(self, say: Note | None = None) -> Inventory:
        say = say or self.say
        job = self.alloc.job_id
        fields = job_fields(job)
        deadline = time.monotonic() + PREEMPT_WAIT_S
        while fields is not None and _settling(fields):
            if time.monotonic() > deadline:  # a preemption that neither requeues nor ends it
                break
            time.sleep(SETTLE_POLL_S)
            fields = job_fields(job)
        state = _live(fields) if fields is not None else None
        if state == "RUNNING" and fields is not None and not ending(fields):
            pass  # the same allocation runs the next attempt
        elif state in ("PENDING", "CONFIGURING"):  # requeued: it runs again once scheduled
            wait_running(job, say)
        elif self.alloc.created:
            why = ended_words(fields, job, self.restarts) or f"Slurm job {job} is {state}"
            if fields is not None:  # whatever state it is in, it must not run again beside the new one
                cancel(job)
            if say is not None:
                say(f"{why}: asking for a new allocation")
            self.alloc = Allocation(submit(self.base), (), created=True)  # released if the wait is interrupted
            wait_running(self.alloc.job_id, say)
        else:
            raise OrchError(
                ended_words(fields, job, self.restarts) or f"Slurm job {job} cannot run another attempt ({state})",
                "resume in a new allocation: orch up again (the trainer continues with --resume auto)",
            )
        self.alloc = read_allocation(self.alloc.job_id, self.alloc.created)
        self.restarts = self._restarts()
        self.inventory = with_allocation(self.base, self.alloc)
        return self.inventory

    def keep(self) -> None:
        self.kept = True

    def release(self) -> None:
        if self.alloc.created and not self.kept:
            self.kept = True  # once
            cancel(self.alloc.job_id)


def release_recorded(inv: Inventory) -> str | None:
    """`orch down`: cancel the run's allocation if orch made it (run.json `slurm.created`)."""
    alloc = inv.allocation
    if alloc is None or not alloc.created:
        return None
    if queue_state(alloc.job_id) is None:
        return None
    cancel(alloc.job_id)
    return f"Slurm job {alloc.job_id} cancelled"


def peek(inv: Inventory) -> Inventory:
    """Inside an allocation (`SLURM_JOB_ID`), the inventory with its nodes; else as it is."""
    inside = os.environ.get("SLURM_JOB_ID")
    if inv.allocation is not None or not inside:
        return inv
    return with_allocation(inv, read_allocation(inside, created=False))


def dry_run_lines(inv: Inventory) -> list[list[str]]:
    """What `orch up` would run here for the allocation and the launch step (the node list and CPUs
    as placeholders where no allocation holds this process yet)."""
    assert inv.slurm is not None
    v = version()
    lines = []
    alloc = inv.allocation
    if alloc is None:
        lines.append(sbatch_argv(inv.slurm, inv.name))
        n = inv.slurm.nodes or 1
        step = step_argv(
            v, "<JOBID>", [f"<node{i}>" for i in range(n)], 1, inv.slurm.gpus_per_node, label=True, whole=True
        )
        shown = {
            "--nodelist=": f"--nodelist=<the {n} allocated nodes>",
            "--cpus-per-task=": "--cpus-per-task=<CPUs per node>",
        }
        step = [next((shown[k] for k in shown if a.startswith(k)), a) for a in step]
    else:
        step = step_argv(
            v, alloc.job_id, alloc.nodes, cpus_of(alloc, alloc.nodes), inv.slurm.gpus_per_node, label=True, whole=True
        )
    lines.append([*step, "<each node: python -c boot.py RUN_DIR start . --foreground>"])
    if alloc is None:
        lines.append([SCANCEL, "<JOBID>"])
    assert step[0] == SRUN
    return lines
