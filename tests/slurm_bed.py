"""A real Slurm for the tests: Debian's slurm-wlm 22.05 (`slurmctld`, `slurmd`, the client commands)
and `munged`, every daemon started by pid from the tests, everything in a private directory.

Two modes (`SlurmBed(mode=...)`):

- ``loopback``: one slurmctld and N slurmd on this machine's network, the "multiple slurmd" way
  Debian builds Slurm (``scontrol show config``: ``MULTIPLE_SLURMD = Yes``): node *i* is ``sn<i>``,
  ``slurmd -N sn<i>`` on a port of its own at 127.0.0.1. Every node has this machine's hostname.
- ``netns`` (root, ``ip netns``): a `TestCluster` in netns mode, one slurmd in each node's network,
  UTS and mount namespaces, which finds its node by its hostname (``node<i>``, at ``198.18.<s>.<i>``
  on slurmd's default port); slurmctld runs in this machine's namespace on the bridge address, as
  on a login node. Each node has an /etc/hosts of its own (bind-mounted in its mount namespace):
  every node's name and address, and with ``self_loopback`` Debian's ``127.0.1.1 <hostname>`` line
  first, so a node's own name resolves to loopback as on a fresh Debian install.

Both: ``munged`` with its own key and socket (``AuthInfo=socket=`` in slurm.conf is how every daemon
and client command finds it: no system munge is involved), ``ProctrackType=proctrack/linuxproc``,
``TaskPlugin=task/none`` (or ``task/affinity``), ``SelectType=select/cons_tres``, no accounting (so no
`sacct`), and two partitions: ``bed``, the default, whose jobs may be preempted (requeued after
``GraceTime``), and ``urgent``, a higher tier that preempts them, with ``preempt_send_user_signal``
so that a preempted job's ``--signal`` arrives at preemption rather than at its time limit.

`env` is what a client command (sbatch, salloc, srun, squeue, scancel, scontrol, sinfo) needs:
``SLURM_CONF`` and the test session's tags, which a job's tasks inherit (``--export=ALL``), so the
session-finish leak check (`tests.cluster.leftovers`) finds a task left behind; `client_env` is the
whole environment (this process's, less any ``SLURM_*`` of an enclosing allocation), `run` runs one
command. `reset` cancels every job, waits for the queue to empty, resumes drained or down nodes and
waits until every node is idle; `stop` cancels every job and stops every daemon by pid.

What 22.05 does that a test must plan for: time limits are whole minutes, and slurmctld looks at
time limits (sends a ``--signal`` warning, ends a time limit or a preemption's ``GraceTime``) once
every 30 s, not when they fall due, so a time-limit test takes one to one and a half minutes; the
signal of a preemption is sent at once.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tests.cluster import (
    SESSION_TAG,
    ClusterError,
    KeyStore,
    TestCluster,
    TestNode,
    cluster_pids,
    is_root,
    kill_pids,
    netns_supported,
)
from tests.ports import job_port

SBIN = "/usr/sbin:/usr/bin:/sbin:/bin"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "salloc", "srun", "squeue", "scancel", "scontrol", "sinfo")
PARTITION = "bed"
"""The default partition: every node, jobs preemptable (requeued) by `URGENT`'s."""
URGENT = "urgent"
"""A partition of a higher tier over the same nodes: a job there preempts `PARTITION`'s."""
GRACE_TIME = 5
"""Seconds a preempted job keeps running after its warning signal (slurmctld ends it at its next
30 s time-limit pass after that)."""
SLURMD_PORT = 6818
"""slurmd's port in netns mode (each node has a network of its own): Slurm's default."""
CLIENT_PREFIXES = ("SLURM_", "SRUN_", "SALLOC_", "SBATCH_")
"""Environment variables a client command reads as options: an enclosing allocation's (a CI job
under Slurm) must not reach the bed's commands."""

Mode = Literal["loopback", "netns"]
TaskPlugin = Literal["task/none", "task/affinity"]
Proctrack = Literal["proctrack/linuxproc", "proctrack/cgroup"]
_bed_ids = itertools.count(1)


def why_no_slurm() -> str | None:
    """None when the bed can run here, else why not (a `missing` reason)."""
    if not is_root():
        return "the Slurm bed needs root (slurmd starts every task as its user)"
    for program in DAEMONS + CLIENTS:
        if shutil.which(program, path=SBIN) is None:
            return f"no `{program}` here: `make deps` installs Slurm and munge with the rest of .ci/packages"
    return None


def program(name: str) -> str:
    """A Slurm or munge program's path (the daemons live in /usr/sbin, which a user's PATH may lack)."""
    return shutil.which(name, path=SBIN) or name


@dataclass
class SlurmNode:
    """One slurmd: a node of the bed."""

    name: str
    addr: str
    port: int
    test_node: TestNode | None = None
    """Its `TestCluster` node in netns mode (namespaces, `cluster.exec`)."""
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)


def slurm_conf(
    *,
    cluster_name: str,
    root: Path,
    controller_addr: str,
    controller_port: int,
    munge_socket: Path,
    nodes: Sequence[SlurmNode],
    hostnames: Mapping[str, str],
    cpus: int,
    task_plugin: TaskPlugin,
    proctrack: Proctrack = "proctrack/linuxproc",
) -> str:
    """The bed's slurm.conf (every path under `root`; `hostnames`: each node's NodeHostname)."""
    lines = [
        f"# slurm.conf of a test bed ({cluster_name}): tests/slurm_bed.py",
        f"ClusterName={cluster_name}",
        # "localhost" is the name slurmctld accepts whatever this machine's hostname is; the address
        # in brackets is where the nodes and the client commands reach it
        f"SlurmctldHost=localhost({controller_addr})",
        f"SlurmctldPort={controller_port}",
        f"SlurmdPort={SLURMD_PORT}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool' / '%n'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd-%n.log'}",
        f"ProctrackType={proctrack}",
        f"TaskPlugin={task_plugin}",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "ReturnToService=2",
        # a node that stops answering is DOWN in 20 s, an RPC to a dead slurmd gives up in 5 s,
        # a task gets 2 s between SIGTERM and SIGKILL
        "SlurmdTimeout=20",
        "MessageTimeout=5",
        "KillWait=2",
        "InactiveLimit=0",
        # slurm.conf's CPUs, not what each slurmd counts (in loopback mode they all count this machine)
        "SlurmdParameters=config_overrides",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        "SlurmctldParameters=preempt_send_user_signal",
    ]
    for node in nodes:
        port = f" Port={node.port}" if node.port != SLURMD_PORT else ""
        lines.append(
            f"NodeName={node.name} NodeHostname={hostnames[node.name]} NodeAddr={node.addr}{port}"
            f" CPUs={cpus} RealMemory=1000 State=UNKNOWN"
        )
    names = ",".join(n.name for n in nodes)
    lines += [
        f"PartitionName={PARTITION} Nodes={names} Default=YES MaxTime=INFINITE State=UP"
        f" PriorityTier=1 PreemptMode=REQUEUE GraceTime={GRACE_TIME}",
        f"PartitionName={URGENT} Nodes={names} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF",
    ]
    return "\n".join(lines) + "\n"


CGROUP_CONF = """\
# cgroup.conf of a test bed: proctrack/cgroup tracks a step's processes in its cgroup (the freezer
# controller on cgroup v1), so whatever a finished step leaves, a daemon included, is killed with it
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
IgnoreSystemd=yes
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
"""


def hosts_file(nodes: Sequence[SlurmNode], me: str | None = None) -> str:
    """An /etc/hosts naming every node at its address; with `me`, Debian's ``127.0.1.1 <me>`` first
    (a node's own name resolves to loopback, as on a fresh Debian install)."""
    lines = ["127.0.0.1\tlocalhost"]
    if me is not None:
        lines.append(f"127.0.1.1\t{me}")
    lines += [f"{n.addr}\t{n.name}" for n in nodes]
    return "\n".join(lines) + "\n"


class SlurmBed:
    """munged, one slurmctld and `n` slurmd; see the module docstring."""

    def __init__(
        self,
        n: int = 4,
        mode: Mode = "loopback",
        keys: KeyStore | None = None,
        task_plugin: TaskPlugin = "task/none",
        self_loopback: bool = False,
        proctrack: Proctrack = "proctrack/linuxproc",
    ) -> None:
        if mode not in ("loopback", "netns"):
            raise ValueError(f"mode must be loopback or netns, not {mode!r}")
        if mode == "netns" and keys is None:
            raise ValueError("netns mode needs the session's KeyStore (its TestCluster's sshd keys)")
        if self_loopback and mode != "netns":
            raise ValueError("self_loopback needs netns mode (in loopback mode every node is this machine)")
        if not 1 <= n <= 64:
            raise ValueError(f"n must be 1..64, got {n}")
        self.n = n
        self.mode: Mode = mode
        self.keys = keys
        self.task_plugin: TaskPlugin = task_plugin
        self.self_loopback = self_loopback
        self.proctrack: Proctrack = proctrack
        self.id = f"{SESSION_TAG}s{next(_bed_ids)}"
        # munged wants every directory above its socket searchable by all: not under pytest's 0700 basetemp
        self.root = Path(tempfile.mkdtemp(prefix=f"{self.id}-", dir="/tmp"))
        self.root.chmod(0o755)
        self.conf = self.root / "slurm.conf"
        self.workdir = self.root / "work"
        """Where `run` and `popen` start the client commands: a job's working directory, where a
        batch job without `-o` writes its slurm-<id>.out (never the repository)."""
        self.munge_socket = self.root / "munge" / "munge.socket"
        # with task/affinity a task is bound to CPUs that must exist here
        cores = os.cpu_count() or 1
        self.cpus = cores if task_plugin == "task/affinity" else max(2, cores)
        self.cluster: TestCluster | None = None
        self.nodes: list[SlurmNode] = []
        self.munged: subprocess.Popen[bytes] | None = None
        self.slurmctld: subprocess.Popen[bytes] | None = None
        self.controller_addr = "127.0.0.1"
        self.up_seconds = 0.0
        """How long `start` took to bring every node up idle."""

    # -- lifecycle

    def start(self) -> SlurmBed:
        """Start munged, slurmctld and every slurmd; return once `sinfo` shows every node idle."""
        started = time.monotonic()
        try:
            for sub in ("munge", "state", "spool", "log", "work"):
                (self.root / sub).mkdir()
            if self.mode == "netns":
                reason = netns_supported()
                if reason:
                    raise ClusterError(reason)
                assert self.keys is not None
                # a root of its own: one under ours would name our tag in its sshd's command line,
                # and `reset` would take them for what a job left behind
                self.cluster = TestCluster(self.keys, n=self.n, mode="netns")
                self.cluster.start()
                self.controller_addr = f"198.18.{self.cluster.subnet}.254"
                self.nodes = [SlurmNode(t.name, t.addr, SLURMD_PORT, test_node=t) for t in self.cluster.nodes]
                hostnames = {n.name: n.name for n in self.nodes}
                for node in self.nodes:
                    self._mount_hosts(node)
            else:
                self.nodes = [SlurmNode(f"sn{i}", "127.0.0.1", job_port()) for i in range(1, self.n + 1)]
                hostnames = {n.name: "localhost" for n in self.nodes}
            self.conf.write_text(
                slurm_conf(
                    cluster_name="orchbed",
                    root=self.root,
                    controller_addr=self.controller_addr,
                    controller_port=job_port(),
                    munge_socket=self.munge_socket,
                    nodes=self.nodes,
                    hostnames=hostnames,
                    cpus=self.cpus,
                    task_plugin=self.task_plugin,
                    proctrack=self.proctrack,
                )
            )
            if self.proctrack == "proctrack/cgroup":  # read beside slurm.conf
                (self.root / "cgroup.conf").write_text(CGROUP_CONF)
            self._start_munged()
            self.slurmctld = self._spawn("slurmctld", [program("slurmctld"), "-D", "-f", str(self.conf)])
            for node in self.nodes:
                node.proc = self._spawn_slurmd(node)
            self.wait_idle(30)
        except BaseException:
            self.stop()
            raise
        self.up_seconds = time.monotonic() - started
        return self

    def stop(self) -> None:
        """Cancel every job, stop every slurmd, slurmctld and munged (by pid), then whatever of
        theirs is left (a step's slurmstepd, a task); in netns mode the cluster too."""
        with contextlib.suppress(ClusterError, subprocess.SubprocessError, OSError):
            if self._alive(self.slurmctld):
                self._cancel_all()
                self.wait_for(lambda: not self.jobs(), 15, "every job gone from squeue")
        kill_pids([n.proc.pid for n in self.nodes if self._alive(n.proc)])
        kill_pids([p.pid for p in (self.slurmctld, self.munged) if self._alive(p)])
        for proc in [n.proc for n in self.nodes] + [self.slurmctld, self.munged]:
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        kill_pids(cluster_pids(self.id))
        if self.cluster is not None:
            self.cluster.stop()
            shutil.rmtree(self.cluster.root, ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def reset(self) -> list[str]:
        """Make a started bed what `start` left, for the next test that shares it: no job in the
        queue, no process of a job left, every node idle (drained or down ones resumed), the
        nodes' /etc/hosts as written at start. Returns what it undid."""
        undone: list[str] = []
        live = self.jobs(completing=False)
        if live:
            self.run("scancel", *live, check=False)
            undone.append(f"cancelled jobs {' '.join(live)}")
        self.wait_for(lambda: not self.jobs(), 30, "every job gone from squeue")
        left = self.job_processes()
        if left:
            kill_pids(left)
            undone.append(f"killed {len(left)} processes of jobs")
        for name, state in self.states().items():
            if state.rstrip("*~#!%$@^-") not in ("idle", "allocated", "mixed", "completing"):
                self.run("scontrol", "update", f"NodeName={name}", "State=RESUME", check=False)
                undone.append(f"{name}: resumed from {state}")
        if self.mode == "netns":
            for node in self.nodes:
                if self._hosts_path(node).read_text() != self._default_hosts(node):
                    self.set_hosts(node.name, self._default_hosts(node))
                    undone.append(f"{node.name}: /etc/hosts as at start")
        self.wait_idle(30)
        return undone

    def job_processes(self, marker: str = "") -> list[int]:
        """The pids of what jobs and the client commands run (a step's slurmstepd and tasks, an
        srun: tasks and commands carry `env`'s tags, slurmstepd slurmd's), not the daemons or
        their helpers; with `marker`, those whose command line contains it."""
        daemons = set(self.daemons())
        pids = [p for p in cluster_pids(self.id) if p not in daemons and _ppid(p) not in daemons]
        return [p for p in pids if marker.encode() in _cmdline(p)] if marker else pids

    def left_behind(self, settle_s: float = 15) -> list[str]:
        """What jobs left: every task, srun and command of one still running now, and whatever is
        still there `settle_s` later (a step's slurmstepd, Slurm's own, may take a moment to go once
        its job has left the queue); [] when nothing is."""

        def shown(pid: int) -> str:
            return _cmdline(pid).decode(errors="replace").strip()[:200]

        now = [f"{p} {shown(p)}" for p in self.job_processes() if not _cmdline(p).startswith(b"slurmstepd")]
        deadline = time.monotonic() + settle_s
        while self.job_processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        return now + [f"{p} {shown(p)}" for p in self.job_processes()]

    def daemons(self) -> list[int]:
        """The pids of munged, slurmctld and every slurmd that are running (slurmctld's helper
        slurmscriptd is its child; a step's slurmstepd is no daemon's child: slurmd detaches it)."""
        procs = [self.munged, self.slurmctld] + [n.proc for n in self.nodes]
        return [p.pid for p in procs if p is not None and self._alive(p)]

    def __enter__(self) -> SlurmBed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the client commands

    @property
    def env(self) -> dict[str, str]:
        """What a client command needs on top of an ordinary environment (`client_env` has both)."""
        return {"SLURM_CONF": str(self.conf), "ORCH_TEST_SESSION": SESSION_TAG, "ORCH_TEST_CLUSTER": self.id}

    def client_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment without any Slurm client option variable, plus `env` and `extra`."""
        out = {k: v for k, v in os.environ.items() if not k.startswith(CLIENT_PREFIXES)}
        out.update(self.env)
        out.update(extra or {})
        return out

    def run(
        self,
        *argv: str,
        check: bool = True,
        timeout: float = 60,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a client command against the bed (`client_env` plus `env`) in `workdir`; `check`
        raises ClusterError with its output when it fails."""
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            env=self.client_env(env),
            cwd=self.workdir,
        )
        if check and proc.returncode != 0:
            raise ClusterError(
                f"`{' '.join(argv)}` exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
        return proc

    def popen(self, *argv: str, env: Mapping[str, str] | None = None, **kw: Any) -> subprocess.Popen[str]:
        """Start a client command against the bed (srun that streams, salloc that waits) and
        return at once; text mode, pipes for stdout and stderr unless `kw` says otherwise."""
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("cwd", self.workdir)
        return subprocess.Popen(list(argv), text=True, env=self.client_env(env), **kw)

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def node(self, name: str) -> SlurmNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no Slurm node {name!r} (have {', '.join(self.node_names)})")

    def states(self) -> dict[str, str]:
        """Each node's state as `sinfo` says it (``idle``, ``allocated``, ``drained``, ``idle*``: not
        responding)."""
        out = self.run("sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N %T").stdout
        return dict(line.split(None, 1) for line in out.splitlines() if line.strip())

    def jobs(self, completing: bool = True) -> list[str]:
        """The ids of the jobs in the queue (pending, running, and unless `completing` is False,
        those that have ended and whose nodes are still cleaning up)."""
        rows = [line.split() for line in self.run("squeue", "-h", "-o", "%i %t").stdout.splitlines() if line.strip()]
        return [job for job, state in rows if completing or state != "CG"]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Reason, NodeList, Restarts, ExitCode...); a
        finished job stays there for slurm.conf's MinJobAge (300 s)."""
        out = self.run("scontrol", "show", "-o", "job", job_id).stdout
        return dict(re.findall(r"(\S+?)=(\S*)", out))

    def run_requeued_now(self, job_id: str, timeout: float = 90, before: Callable[[], None] | None = None) -> None:
        """Once a requeued job is held back (22.05: PENDING, Reason BeginTime, two minutes on), let it
        run now (`scontrol update StartTime=now`), in a later second than the one its last run was
        killed in: slurmd compares a new credential's time with the revocation's in whole seconds,
        and one of the same second is "revoked" (`Killing non-startable batch JobId=N: Job credential
        revoked`: the job FAILED, not run). `before`, called once it is held back: what the test does
        between the two."""
        self.wait_for(lambda: self.job(job_id).get("Reason") == "BeginTime", timeout, f"job {job_id} requeued")
        held_at = time.time()
        if before is not None:
            before()
        self.wait_for(lambda: int(time.time()) > int(held_at), 2, "the next second")
        self.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")

    def wait_idle(self, timeout: float = 30) -> None:
        """Block until `sinfo` shows every node idle (and answering); a daemon that exits fails at once."""

        def idle() -> bool:
            states = self._states_or_none()
            return set(states) == set(self.node_names) and set(states.values()) == {"idle"}

        self.wait_for(idle, timeout, "every node idle")

    def wait_for(self, ready: Callable[[], object], timeout: float, what: str) -> None:
        """Poll `ready` until it is true; ClusterError naming `what`, the nodes' states and the
        daemons' log tails after `timeout` seconds or as soon as a daemon has exited."""
        deadline = time.monotonic() + timeout
        while True:
            if ready():
                return
            dead = self._dead_daemons()
            if dead or time.monotonic() > deadline:
                why = f"exited: {', '.join(dead)}" if dead else f"not within {timeout:g} s"
                states = self._states_or_none()
                raise ClusterError(f"Slurm bed {self.id}: {what}: {why}\nnodes: {states}\n{self.logs()}")
            time.sleep(0.05)

    def logs(self, tail: int = 1500) -> str:
        """The end of every daemon's log, for failure messages."""
        out = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(errors="replace")
            if text.strip():
                out.append(f"--- {path.name}\n{text[-tail:]}")
        return "\n".join(out)

    # -- changing a node

    def set_hosts(self, node: str, text: str) -> None:
        """Replace that node's /etc/hosts (netns mode; `reset` puts back the one `start` wrote)."""
        n = self.node(node)
        if n.test_node is None:
            raise ClusterError("a node's own /etc/hosts needs netns mode")
        # written in place: the bind mount holds this file's inode, a rename would leave it behind
        with open(self._hosts_path(n), "w") as fh:
            fh.write(text)

    def drain(self, node: str, reason: str = "drained by a test") -> None:
        """`scontrol update NodeName=<node> State=DRAIN Reason=...` (`reset` resumes it)."""
        self.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    # -- internals

    def _hosts_path(self, node: SlurmNode) -> Path:
        return self.root / f"hosts-{node.name}"

    def _default_hosts(self, node: SlurmNode) -> str:
        return hosts_file(self.nodes, node.name if self.self_loopback else None)

    def _mount_hosts(self, node: SlurmNode) -> None:
        assert self.cluster is not None
        path = self._hosts_path(node)
        path.write_text(self._default_hosts(node))
        proc = self.cluster.exec(node.name, ["mount", "--bind", str(path), "/etc/hosts"])
        if proc.returncode != 0:
            raise ClusterError(f"{node.name}: could not bind-mount its /etc/hosts: {proc.stderr.strip()}")

    def _daemon_env(self, node: SlurmNode | None = None) -> dict[str, str]:
        """The daemons' environment, tagged (the leak check, `stop`): slurmstepd inherits slurmd's."""
        env = self.client_env()
        if node is not None:
            env["ORCH_TEST_NODE"] = node.name
        return env

    def _spawn(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        with open(self.root / "log" / f"{name}.out", "ab") as log:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=dict(env or self._daemon_env()),
                start_new_session=True,
            )

    def _spawn_slurmd(self, node: SlurmNode) -> subprocess.Popen[bytes]:
        argv = [program("slurmd"), "-D", "-f", str(self.conf)]
        if node.test_node is None:
            argv[1:1] = ["-N", node.name]  # many slurmd on one host: each told its node
        else:  # in its node's namespaces it finds its node by its hostname, as on a real node
            assert self.cluster is not None
            argv = self.cluster._enter(node.test_node) + argv
        return self._spawn(f"slurmd-{node.name}", argv, self._daemon_env(node))

    def _start_munged(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        (self.root / "munge").chmod(0o711)  # the socket's directory: searchable by all, as munged insists
        self.munged = self._spawn(
            "munged",
            [
                program("munged"),
                "--foreground",
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                f"--seed-file={self.root / 'munge' / 'munged.seed'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
            ],
        )
        self.wait_for(self.munge_socket.exists, 10, "munged's socket")

    @staticmethod
    def _alive(proc: subprocess.Popen[bytes] | None) -> bool:
        return proc is not None and proc.poll() is None

    def _dead_daemons(self) -> list[str]:
        named = [("munged", self.munged), ("slurmctld", self.slurmctld)]
        named += [(f"slurmd {n.name}", n.proc) for n in self.nodes]
        return [name for name, proc in named if proc is not None and proc.poll() is not None]

    def _states_or_none(self) -> dict[str, str]:
        """`states`, or {} while slurmctld does not answer yet."""
        if not self._alive(self.slurmctld):
            return {}
        proc = self.run("sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N %T", check=False, timeout=15)
        if proc.returncode != 0:
            return {}
        return dict(line.split(None, 1) for line in proc.stdout.splitlines() if line.strip())

    def _cancel_all(self) -> None:
        jobs = self.jobs(completing=False)
        if jobs:
            self.run("scancel", *jobs, check=False)


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[-1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ")
    except OSError:
        return b""


MakeSlurmBed = Callable[..., SlurmBed]
"""The `make_slurm_bed` fixture: keyword arguments of `SlurmBed` → a started bed."""
