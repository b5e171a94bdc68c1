"""Inventory: YAML → validated, frozen dataclasses. Pure: no connection is ever made here.

Two stages. The schema (`schema.py`) catches wrong types and unknown keys; the resolution here
expands host ranges (ClusterShell's NodeSet: `gpu[01-04]`, `10.0.0.[10-13]`) into nodes, merges
defaults into them, and checks what needs the whole cluster (duplicates, the master,
rendezvous). Every problem becomes an `InventoryIssue` with file, line and key; all are
reported at once.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from ..contract import CHECK_NAMES
from ..errors import InventoryError, InventoryIssue, OrchError
from . import container, runtimes, torchrun, yamlines
from .container import Container
from .nodes import (
    HOST,
    Node,
    NodeExpander,
    SSHOptions,
    name_problem,
)
from .schema import (
    ALLOCATED,
    SAME_HOST,
    FabricCheckModel,
    JobModel,
    SlurmModel,
    StragglerModel,
    suggest,
    validate,
)
from .trainer import OFF_WORD, setting_name

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# What would change meaning if a value ever met a shell. Values are quoted once in the transport
# anyway; refusing these in the inventory catches copy-paste accidents before anything runs.
SHELL_UNSAFE = ("\n", "\r", "\x00", "`", "$(", "${", ";", "&", "|", "<", ">")


SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]?)i?B?\s*$", re.I)


def parse_size(value: int | str) -> int:
    """Bytes from `268435456`, `"256M"`, `"1G"`, `"512K"` (powers of 1024, as nccl-tests' -b/-e);
    at least 4 bytes (one float). Raises ValueError with an example."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        m = SIZE.match(str(value))
        if not m or not math.isfinite(float(m.group(1))):
            raise ValueError(f"max_bytes {value!r} is not a size (examples: 268435456, 64M, 1G)")
        number = int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()])
    if number < 4:
        raise ValueError(f"max_bytes {value!r} is below 4 bytes (one float32 element)")
    return number


# ----------------------------------------------------------------------------- resolved (frozen)


class NoNodesYet(OrchError):
    """A Slurm inventory's nodes were asked for before its allocation was known."""


@dataclass(frozen=True)
class ClockCheck:
    ntp_server: str | None
    max_offset_ms: float


@dataclass(frozen=True)
class FabricCheck:
    """`checks.fabric`: the collective-path measurement (opt-in; `true` or a mapping)."""

    enabled: bool = False
    """Run it with every `orch check` / `orch up` of this inventory (else only when asked)."""
    max_bytes: int = parse_size(FabricCheckModel.max_bytes)
    """The largest all_reduce of the sweep (1 MiB, ×4, up to this), bytes."""
    min_busbw_gbps: float | None = None
    """`fail` when the sweep's busbw at its largest size is below this (GB/s); None: no floor."""
    share: float = FabricCheckModel.share
    """`warn` on a node (or link) below this share of the median node."""
    timeout_s: float = FabricCheckModel.timeout_s
    """The whole job must end within this; a collective gives up after it."""
    budget_s: float = FabricCheckModel.budget_s
    """Sweep sizes that would end the sweep after this many seconds are skipped (and reported)."""


@dataclass(frozen=True)
class Checks:
    clock: ClockCheck
    timezone: str | None
    rdma_devices: tuple[str, ...]
    ssh_warn_ms: float
    skip: tuple[str, ...]
    fabric: FabricCheck = FabricCheck()


@dataclass(frozen=True)
class Straggler:
    """`job.straggler`: when a rank is called slow, and what that does (`run/straggler.py`)."""

    share: float = StragglerModel.share
    """A rank whose step time outside collectives is above median / share is slow (0.8: 1.25x)."""
    windows: int = StragglerModel.windows
    """For this many consecutive timing windows before it is named."""
    action: str = StragglerModel.action
    """`warn`: one line, status, top, report · `stop`: also fail the run naming the node."""


@dataclass(frozen=True)
class Job:
    """What runs on every node: `python -m torch.distributed.run ... (-m module | script) args`."""

    workdir: str | None
    python: str
    rdzv: str
    max_restarts: int
    module: str | None
    script: str | None
    args: tuple[str, ...]
    """The job's argv after the module/script, rendered from the YAML mapping or list."""
    raw_args: Mapping[str, Any]
    """The YAML mapping as written (empty when `args` was a list), for checks on paths and batch."""
    torchrun_args: tuple[str, ...]
    run_root: str
    stop_grace_s: float
    stall_timeout_s: float = JobModel.stall_timeout_s
    """Seconds without a line from any rank before `orch up` calls the run hung; 0: never."""
    on_stall: str = JobModel.on_stall
    """What a hang does: `stop` (stacks, teardown, exit 1) or `warn` (stacks, keep running)."""
    retries: int = JobModel.retries
    """Relaunches of the same run after a failure that is not a preflight failure."""
    sync: tuple[str, ...] = ()
    """Controller paths `orch sync` (and `orch up` before its preflight) copies to the same absolute
    path on every node: absolute, normalised (no trailing slash), each listed once."""
    telemetry_s: float = JobModel.telemetry_s
    """Seconds between the node agent's telemetry samples; 0: none."""
    straggler: Straggler = Straggler()
    container: Container | None = None
    """`job.container`: the image the job runs in on every node (config/container.py); None: the
    job runs as `python` on the host."""


@dataclass(frozen=True)
class Slurm:
    """`slurm:` (with `transport: slurm`): the allocation the nodes come from."""

    nodes: int | None = None
    """`-N`: nodes to allocate; None inside an existing allocation (all of its nodes)."""
    partition: str | None = None
    time: str | None = None
    """The time limit as Slurm spells it (`90`, `4:00:00`, `2-00:00:00`)."""
    gpus_per_node: int | None = None
    options: tuple[str, ...] = ()
    """More allocation flags, as written (checked: `SLURM_REFUSED`)."""
    master: str | None = None
    """`master.node`: the allocation's node that becomes node rank 0; None: its first."""
    nproc_per_node: int | None = None
    """`job.nproc_per_node` (every node runs that many ranks); None: `gpus_per_node`, else 1."""


@dataclass(frozen=True)
class Allocation:
    """The nodes a Slurm allocation holds for a run: what `transport: slurm` plans and reaches with
    (run.json `slurm`, so every later command reads the run's nodes as it ran)."""

    job_id: str
    nodes: tuple[str, ...]
    """Node names in the allocation's order (node ranks follow it; the master moved first)."""
    addrs: Mapping[str, str] = field(default_factory=dict)
    """Each node's hostname as Slurm knows it (NodeHostname): the rendezvous address, proven by the
    preflight (resolved on every node, reached from every node); a node missing here: its name."""
    cpus: Mapping[str, int] = field(default_factory=dict)
    """The CPUs the allocation holds on each node (what every step asks for, `--cpus-per-task`)."""
    created: bool = False
    """orch asked for it (and gives it back); False: the user's own (`SLURM_JOB_ID`), never cancelled."""

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "nodes": list(self.nodes),
            "addrs": dict(self.addrs),
            "cpus": dict(self.cpus),
            "created": self.created,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Allocation:
        return cls(
            str(data["job_id"]),
            tuple(str(n) for n in data.get("nodes") or ()),
            MappingProxyType({str(k): str(v) for k, v in (data.get("addrs") or {}).items()}),
            MappingProxyType({str(k): int(v) for k, v in (data.get("cpus") or {}).items()}),
            data.get("created") is True,
        )


@dataclass(frozen=True)
class Inventory:
    """A validated cluster description. Build it with `load()` or `parse()`."""

    path: str
    name: str
    transport: str
    nodes: tuple[Node, ...]
    """In node-rank order: the master first, then the others in file order. Empty for a Slurm
    inventory until its allocation is known (`with_allocation`)."""
    master_port: int
    env: Mapping[str, str]
    checks: Checks
    job: Job
    fanout: int
    source: str = field(default="", repr=False)
    """The YAML text, kept for the run's snapshot."""
    spares: tuple[Node, ...] = ()
    """`spare:` nodes, in file order: never launched unless one replaces a node that fails the
    preflight of an automatic retry (`job.retries`)."""
    slurm: Slurm | None = None
    """`slurm:` (`transport: slurm`), else None."""
    allocation: Allocation | None = None
    """The Slurm allocation `nodes` come from, once known (`with_allocation`)."""

    @property
    def master(self) -> Node:
        """Node rank 0: the first of `nodes`."""
        if not self.nodes:
            raise NoNodesYet(
                f"{self.path}: the nodes come from a Slurm allocation, and none is known yet",
                "orch up and orch check ask for one (or run inside salloc); other commands take a run id",
            )
        return self.nodes[0]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if name in (n.name, n.host):
                return n
        raise KeyError(name)


# ----------------------------------------------------------------------------- loading


def load(path: str | os.PathLike[str]) -> Inventory:
    """Read and validate an inventory file. Raises InventoryError (exit 2) listing every problem."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise InventoryError([InventoryIssue(f"cannot read inventory: {exc.strerror}", path)]) from None
    return parse(text, path)


def parse(text: str, path: str = "<inventory>") -> Inventory:
    """Validate inventory YAML text; `path` is only used in messages and the snapshot."""
    try:
        data, lines = yamlines.load(text)
    except yamlines.YamlError as exc:
        raise InventoryError([InventoryIssue(exc.message, path, exc.line, exc.key)]) from None
    if not isinstance(data, dict):
        raise InventoryError([InventoryIssue("the inventory must be a YAML mapping with at least `nodes:`", path, 1)])
    allocated = isinstance(data.get("transport"), str) and ALLOCATED.get(data["transport"], False)
    if not data.get("nodes") and not allocated:
        line = lines.get(("nodes",), 1)
        msg = "`nodes` is missing" if "nodes" not in data else "`nodes` is empty"
        issues = [InventoryIssue(f"{msg}: list at least one node (- host: ...)", path, line, "nodes")]
        try:  # still report unknown keys: `nodez:` is the likely reason `nodes` is missing
            validate({**data, "nodes": [{"host": "placeholder"}]}, path, lines)
        except InventoryError as exc:
            issues = exc.issues + issues
        raise InventoryError(issues)
    return _Resolver(validate(data, path, lines), path, lines, text).resolve()


def _env_value(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return "" if v is None else str(v)


def render_args(args: Mapping[str, Any] | list[Any], off: Callable[[str], str | None] | None = None) -> tuple[str, ...]:
    """`{model: x, amp: true, lr: 0.01, skip: null}` → `--model x --amp --lr 0.01`. Lists pass as is.

    `false` is `--key WORD` with `off(key)`'s word (the job's own spelling of off: `--amp off`);
    without one, ValueError naming the key: a `false` is never dropped. `null` leaves the flag out."""
    if isinstance(args, list):
        return tuple(_env_value(a) for a in args)
    out: list[str] = []
    for key, value in args.items():
        if value is None:
            continue
        out.append(f"--{key}")
        if value is True:
            continue
        if value is False:
            word = off(key) if off is not None else None
            if word is None:
                raise ValueError(key)
            out.append(word)
        elif isinstance(value, list):
            out.extend(_env_value(v) for v in value)
        else:
            out.append(_env_value(value))
    return tuple(out)


def trainer_off(key: str) -> str | None:
    """This repository's trainer's word for off after `--key` (`trainer/interface.py` OFF_WORD)."""
    name = setting_name(f"--{key}")
    return OFF_WORD.get(name) if name is not None else None


class _Resolver:
    """Turns the schema model into an Inventory, collecting every cross-field problem."""

    def __init__(self, model: Any, path: str, lines: dict[yamlines.Path, int], text: str):
        self.m = model
        self.path = path
        self.lines = lines
        self.text = text
        self.issues: list[InventoryIssue] = []

    def issue(self, msg: str, *loc: str | int) -> None:
        self.issues.append(InventoryIssue(msg, self.path, yamlines.line_of(self.lines, loc), yamlines.dotted(loc)))

    def resolve(self) -> Inventory:
        m = self.m
        env = self.env_map(m.env, ("env",))
        expander = NodeExpander(self)
        nodes = expander.nodes(env)
        spares = expander.nodes(env, "spare")
        checks = self.checks()
        job = self.job()
        if not 1 <= m.master.port <= 65535:
            self.issue(f"port {m.master.port} is out of range 1-65535", "master", "port")
        if m.fanout < 1:
            self.issue(f"fanout must be at least 1, got {m.fanout}", "fanout")
        slurm = self.slurm_settings(nodes, spares)
        master = self.master(nodes)
        self.rendezvous(nodes + spares, job)
        if self.issues:
            raise InventoryError(self.issues)
        ordered = (master,) + tuple(n for n in nodes if n is not master) if master is not None else ()
        name = m.name or os.path.splitext(os.path.basename(self.path))[0] or "cluster"
        problem = name_problem(name)
        if problem:
            raise InventoryError(
                [InventoryIssue(f"cluster name {name!r} {problem}", self.path, self.lines.get(("name",)), "name")]
            )
        return Inventory(
            path=self.path,
            name=name,
            transport=m.transport,
            nodes=ordered,
            master_port=m.master.port,
            env=MappingProxyType(env),
            checks=checks,
            job=job,
            fanout=m.fanout,
            source=self.text,
            spares=tuple(spares),
            slurm=slurm,
        )

    # -- pieces

    def slurm_settings(self, nodes: list[Node], spares: list[Node]) -> Slurm | None:
        """`slurm:`, where the transport's nodes are an allocation (`schema.ALLOCATED`): no `nodes:`,
        `spare:` or `ssh:` then, and every allocation flag checked (`slurm_option_problem`)."""
        m = self.m
        if not ALLOCATED[m.transport]:
            if m.slurm is not None:
                self.issue(f"`slurm:` needs `transport: slurm` (this inventory's is {m.transport})", "slurm")
            return None
        for key, given in (("nodes", nodes), ("spare", spares)):
            if given:
                self.issue(
                    f"`{key}:` with transport: {m.transport}: the nodes are the allocation's "
                    "(slurm.nodes says how many); remove it",
                    key,
                )
        if ("ssh",) in self.lines:
            self.issue(f"`ssh:` with transport: {m.transport}: nodes are reached with srun steps; remove it", "ssh")
        s = m.slurm or _SLURM_UNSET
        where = ("slurm",)
        for key in ("nodes", "gpus_per_node"):
            value = getattr(s, key)
            if value is not None and value < (1 if key == "nodes" else 0):
                self.issue(f"{key} must be {'1' if key == 'nodes' else '0'} or more, got {value}", *where, key)
        if s.partition is not None and not SLURM_WORD.match(s.partition):
            self.issue(f"partition {s.partition!r} is not a partition name", *where, "partition")
        if s.time is not None and not SLURM_TIME.match(s.time):
            self.issue(
                f"time {s.time!r} is not a Slurm time limit (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
                "D-HH:MM:SS, or UNLIMITED)",
                *where,
                "time",
            )
        for i, opt in enumerate(s.options):
            self.safe(opt, "option", *where, "options", i)
            why = slurm_option_problem(opt)
            if why:
                self.issue(f"option {opt!r} refused: {why}", *where, "options", i)
        gpus = s.gpus_per_node
        nproc = m.job.nproc_per_node
        if gpus and nproc and nproc > gpus:
            self.issue(
                f"nproc_per_node {nproc} is larger than slurm.gpus_per_node {gpus}: a process needs its own GPU",
                "job",
                "nproc_per_node",
            )
        return Slurm(
            nodes=s.nodes,
            partition=s.partition,
            time=s.time,
            gpus_per_node=gpus,
            options=tuple(s.options),
            master=m.master.node,
            nproc_per_node=nproc,
        )

    def local_path(self, value: str) -> str:
        """Where the nodes are this machine (`transport: local`), a relative path
        (`../.venv/bin/python`, `..`) means relative to the inventory file, so a checked-in inventory
        works from any clone; a bare command name (`python3`) is left for PATH. Elsewhere paths are
        the node's and stay as written."""
        if (
            not SAME_HOST[self.m.transport]
            or os.path.isabs(value)
            or value.startswith("~")
            or ("/" not in value and value not in (".", ".."))
        ):
            return value
        return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(self.path)), value))

    def env_map(self, raw: Mapping[str, Any], loc: tuple[str | int, ...]) -> dict[str, str]:
        out = {}
        for key, value in raw.items():
            if not ENV_NAME.match(key):
                self.issue(f"'{key}' is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)", *loc, key)
                continue
            text = _env_value(value)
            self.safe(text, f"value of {key}", *loc, key)
            out[key] = text
        return out

    def safe(self, text: str | None, what: str, *loc: str | int) -> None:
        if text is None:
            return
        bad = [c for c in SHELL_UNSAFE if c in text]
        if bad:
            shown = ", ".join(repr(c) for c in bad)
            self.issue(f"{what} contains {shown}, which would need a shell to be safe: {text!r}", *loc)

    def master(self, nodes: list[Node]) -> Node | None:
        if not nodes or ALLOCATED[self.m.transport]:
            return None
        wanted = self.m.master.node
        if wanted is None:
            return nodes[0]
        for n in nodes:
            if wanted in (n.name, n.host):
                return n
        names = [n.name for n in nodes]
        self.issue(
            f"master '{wanted}' is not one of the nodes{suggest(wanted, names)}: "
            f"nodes are {', '.join(names[:8])}{'...' if len(names) > 8 else ''}",
            "master",
            "node",
        )
        return None

    def checks(self) -> Checks:
        c = self.m.checks
        if c.clock.max_offset_ms <= 0:
            self.issue("max_offset_ms must be positive", "checks", "clock", "max_offset_ms")
        server = c.clock.ntp_server
        if server is not None:
            host, _, port = server.rpartition(":") if server.count(":") == 1 else (server, "", "")
            if not HOST.match(host or server) or (port and not (port.isdigit() and 1 <= int(port) <= 65535)):
                self.issue(f"ntp_server {server!r} must be host or host:port", "checks", "clock", "ntp_server")
        for i, name in enumerate(c.skip):
            if name not in CHECK_NAMES:
                self.issue(
                    f"unknown check '{name}'{suggest(name, CHECK_NAMES)}; checks are {', '.join(CHECK_NAMES)}",
                    "checks",
                    "skip",
                    i,
                )
        for i, dev in enumerate(c.rdma.devices):
            if not re.match(r"^[A-Za-z0-9_.-]+\Z", dev):
                self.issue(f"bad RDMA device name {dev!r}", "checks", "rdma", "devices", i)
        self.safe(c.timezone, "timezone", "checks", "timezone")
        return Checks(
            clock=ClockCheck(server, c.clock.max_offset_ms),
            timezone=c.timezone,
            rdma_devices=tuple(c.rdma.devices),
            ssh_warn_ms=c.ssh.warn_ms,
            skip=tuple(c.skip),
            fabric=self.fabric(c.fabric),
        )

    def fabric(self, f: Any) -> FabricCheck:
        """`checks.fabric: true|false` or a mapping of settings (enabled unless it says otherwise)."""
        if isinstance(f, bool):
            return FabricCheck(enabled=f)
        where = ("checks", "fabric")
        try:
            max_bytes = parse_size(f.max_bytes)
        except ValueError as exc:
            self.issue(str(exc), *where, "max_bytes")
            max_bytes = FabricCheck.max_bytes
        if f.min_busbw_gbps is not None and f.min_busbw_gbps < 0:
            self.issue(f"min_busbw_gbps must be 0 or more, got {f.min_busbw_gbps:g}", *where, "min_busbw_gbps")
        if not 0 < f.share <= 1:
            self.issue(f"share must be in (0, 1] (a share of the median node), got {f.share:g}", *where, "share")
        for key in ("timeout_s", "budget_s"):
            if getattr(f, key) <= 0:
                self.issue(f"{key} must be positive, got {getattr(f, key):g}", *where, key)
        return FabricCheck(
            enabled=f.enabled,
            max_bytes=max_bytes,
            min_busbw_gbps=f.min_busbw_gbps,
            share=f.share,
            timeout_s=f.timeout_s,
            budget_s=f.budget_s,
        )

    def job(self) -> Job:
        j = self.m.job
        if j.module and j.script:
            self.issue("give either `module` or `script`, not both", "job", "script")
        if j.max_restarts < 0:
            self.issue("max_restarts must be 0 or more", "job", "max_restarts")
        if j.nproc_per_node is not None and j.nproc_per_node < 1:
            self.issue(f"nproc_per_node must be a positive integer, got {j.nproc_per_node}", "job", "nproc_per_node")
        if j.stop_grace_s <= 0:
            self.issue("stop_grace_s must be positive", "job", "stop_grace_s")
        if j.stall_timeout_s < 0:
            self.issue(f"stall_timeout_s must be 0 (off) or more, got {j.stall_timeout_s:g}", "job", "stall_timeout_s")
        if j.retries < 0:
            self.issue(f"retries must be 0 or more, got {j.retries}", "job", "retries")
        if j.telemetry_s < 0 or 0 < j.telemetry_s < 1:
            self.issue(f"telemetry_s must be 0 (off) or at least 1 second, got {j.telemetry_s:g}", "job", "telemetry_s")
        st = j.straggler
        if not 0 < st.share < 1:
            self.issue(
                f"share must be between 0 and 1 (0.8: a rank slower than 1/0.8 x the median), got {st.share:g}",
                "job",
                "straggler",
                "share",
            )
        if st.windows < 1:
            self.issue(f"windows must be 1 or more, got {st.windows}", "job", "straggler", "windows")
        for key in ("workdir", "python", "module", "script", "run_root"):
            self.safe(getattr(j, key), key, "job", key)
        if j.module and not re.match(r"^[A-Za-z_][A-Za-z0-9_.]*\Z", j.module):
            self.issue(f"module {j.module!r} is not a Python module name", "job", "module")
        trainer = not j.script and (j.module or "trainer") == "trainer"
        off = trainer_off if trainer else None
        if isinstance(j.args, dict):
            for key in [k for k, v in j.args.items() if v is False and (off is None or off(k) is None)]:
                self.issue(self.no_off(key, j, trainer), "job", "args", key)
        try:
            args = render_args(j.args, off)
        except ValueError:  # each said above, with its line
            args = ()
        if isinstance(j.args, dict):
            for key, value in j.args.items():
                if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z", key):
                    self.issue(f"argument name {key!r} is not a plain flag name", "job", "args", key)
                for v in value if isinstance(value, list) else [value]:
                    self.safe(_env_value(v), f"argument {key}", "job", "args", key)
        else:
            for i, v in enumerate(args):
                self.safe(v, "argument", "job", "args", i)
        for i, v in enumerate(j.torchrun_args):
            self.safe(v, "torchrun argument", "job", "torchrun_args", i)
        for i, why in torchrun.problems(j.torchrun_args):
            self.issue(why, "job", "torchrun_args", i)
        return Job(
            workdir=self.local_path(j.workdir) if j.workdir else None,
            python=self.local_path(j.python),
            rdzv=j.rdzv,
            max_restarts=j.max_restarts,
            module=j.module if (j.module or j.script) else "trainer",
            script=j.script,
            args=args,
            raw_args=MappingProxyType(dict(j.args) if isinstance(j.args, dict) else {}),
            torchrun_args=tuple(j.torchrun_args),
            run_root=j.run_root,
            stop_grace_s=j.stop_grace_s,
            stall_timeout_s=float(j.stall_timeout_s),
            on_stall=j.on_stall,
            retries=j.retries,
            sync=self.sync_paths(j.sync),
            telemetry_s=float(j.telemetry_s),
            straggler=Straggler(share=float(st.share), windows=st.windows, action=st.action),
            container=self.container_settings(j.container, j.run_root, j.workdir),
        )

    @staticmethod
    def no_off(key: str, j: Any, trainer: bool) -> str:
        """Why `KEY: false` cannot reach the job (see `render_args`), and the fix."""
        if trainer:
            return (
                f"{key}: false: the trainer's --{key} has no off (python -m trainer --help says what it "
                f"takes); write null to leave --{key} out, or the value you mean"
            )
        job = f"script {j.script}" if j.script else f"module {j.module}"
        return (
            f"{key}: false: orch cannot tell how {job} spells off for --{key}; write the word it takes "
            f"(e.g. {key}: 'false' or {key}: 0), or null to leave --{key} out"
        )

    def container_settings(self, c: Any, run_root: str, workdir: str | None) -> Container | None:
        """`job.container`, every rule of config/container.py applied with the key it breaks."""
        if c is None:
            return None
        where = ("job", "container")
        rt = runtimes.TABLE.get(c.runtime)
        if rt is None:
            self.issue(
                f"unknown runtime {c.runtime!r}{container.suggest(c.runtime, runtimes.RUNTIMES)}; runtimes are "
                f"{', '.join(runtimes.RUNTIMES)}",
                *where,
                "runtime",
            )
        for key in ("image", "python", "workdir"):
            value = getattr(c, key)
            if value is not None and not value.strip():
                self.issue(f"{key} is empty", *where, key)
            self.safe(value, key, *where, key)
        if c.workdir and not c.workdir.startswith("/"):
            self.issue(f"workdir {c.workdir!r} must be an absolute path inside the image", *where, "workdir")
        dash = container.leading_dash("image", c.image)
        if dash:
            self.issue(dash, *where, "image")
        elif rt is not None and rt.image_file and not c.image.startswith("/"):
            self.issue(
                f"image {c.image!r}: {rt.name} runs an image file: give its absolute path (a .sif)", *where, "image"
            )
        user = c.user
        if user not in container.USERS and not container.UID_GID.match(user):
            self.issue(
                f"user {user!r} is not host, root or UID:GID{container.suggest(user, container.USERS)}", *where, "user"
            )
        elif rt is not None and "user" not in rt.parts and user != "host":
            self.issue(f"user {user!r}: {rt.name} runs the job as the SSH user: leave user: host", *where, "user")
        mounts = []
        for i, raw in enumerate(c.mounts):
            self.safe(raw, "mount", *where, "mounts", i)
            mount, why = container.parse_mount(raw)
            why = container.leading_dash("mount", raw) or why
            if why:
                self.issue(why, *where, "mounts", i)
            elif mount is not None:
                mounts.append((i, mount))
        for k, why in container.mount_problems([m for _i, m in mounts], run_root, workdir):
            self.issue(why, *where, "mounts", mounts[k][0])
        for i, opt in enumerate(c.options):
            self.safe(opt, "option", *where, "options", i)
        resolved = Container(
            runtime=c.runtime,
            image=c.image,
            python=c.python,
            workdir=c.workdir,
            mounts=tuple(m for _i, m in mounts),
            options=tuple(c.options),
            user=user,
            pull=c.pull,
        )
        gpus = any(n.gpus for n in self.m.nodes) or bool(self.m.slurm and self.m.slurm.gpus_per_node)
        for i, why in container.option_problems(resolved, gpus):
            self.issue(f"option {c.options[i]!r} refused: {why}", *where, "options", i)
        return resolved

    def sync_paths(self, paths: list[str]) -> tuple[str, ...]:
        """`job.sync`: absolute paths, the same on the controller and on every node."""
        out: list[str] = []
        for i, raw in enumerate(paths):
            path = raw.rstrip("/")
            if not raw.startswith("/"):
                hint = (
                    "~ is the controller's home here and the node's there"
                    if raw.startswith("~")
                    else f"e.g. {os.path.join('/path/to', raw)}"
                )
                self.issue(
                    f"sync path {raw!r} is not absolute: it is copied to the same absolute path on every node ({hint})",
                    "job",
                    "sync",
                    i,
                )
            elif not path:
                self.issue(
                    "sync path '/' would copy the whole filesystem: list the directories to copy", "job", "sync", i
                )
            elif any(part in (".", "..") for part in path.split("/")):
                self.issue(
                    f"sync path {raw!r} has '.' or '..' components: write it as {os.path.normpath(raw)}",
                    "job",
                    "sync",
                    i,
                )
            elif path in out:
                self.issue(f"sync path {raw!r} is listed twice", "job", "sync", i)
            elif any(path.startswith(o + "/") or o.startswith(path + "/") for o in out):
                other = next(o for o in out if path.startswith(o + "/") or o.startswith(path + "/"))
                self.issue(f"sync paths {other} and {path} overlap: list only the outer one", "job", "sync", i)
            else:
                self.safe(path, "sync path", "job", "sync", i)
                out.append(path)
        return tuple(out)

    def rendezvous(self, nodes: list[Node], job: Job) -> None:
        nprocs = {n.nproc_per_node for n in nodes}
        if job.rdzv == "static" and len(nprocs) > 1:
            detail = ", ".join(f"{n.name}={n.nproc_per_node}" for n in nodes)
            self.issue(
                f"nodes run different numbers of processes ({detail}); static rendezvous needs the same "
                f"nproc_per_node everywhere: set job.rdzv: c10d",
                "job",
                "rdzv",
            )


_SLURM_UNSET = SlurmModel()
SLURM_WORD = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
SLURM_TIME = re.compile(r"^(?:\d+(?::\d{1,2}){0,2}|\d+-\d{1,2}(?::\d{1,2}){0,2}|UNLIMITED|INFINITE)\Z", re.I)
"""Slurm's time limit spellings: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, UNLIMITED."""
SLURM_REFUSED: Mapping[str, str] = MappingProxyType(
    {
        "-N": "the node count is slurm.nodes",
        "--nodes": "the node count is slurm.nodes",
        "-p": "the partition is slurm.partition",
        "--partition": "the partition is slurm.partition",
        "-t": "the time limit is slurm.time",
        "--time": "the time limit is slurm.time",
        "--gpus-per-node": "the GPUs per node are slurm.gpus_per_node",
        "-n": "orch starts one torchrun per node (--ntasks-per-node=1); job.nproc_per_node is its ranks",
        "--ntasks": "orch starts one torchrun per node (--ntasks-per-node=1); job.nproc_per_node is its ranks",
        "--ntasks-per-node": "orch starts one torchrun per node; a torchrun per task would collide on the master "
        "port and duplicate ranks: job.nproc_per_node is the ranks per node",
        "-G": "--gpus counts GPUs per job, not per node: use slurm.gpus_per_node",
        "--gpus": "--gpus counts GPUs per job, not per node: use slurm.gpus_per_node",
        "--gpus-per-task": "it gives each task its own GPUs (no peer-to-peer between a node's ranks): use "
        "slurm.gpus_per_node",
        "--export": "orch passes its environment and the inventory's env itself (--export=A,B would drop the rest)",
        "--wrap": "orch holds the allocation with its own batch script",
        "-o": "the holding batch script's output is orch's",
        "--output": "the holding batch script's output is orch's",
        "-e": "the holding batch script's output is orch's",
        "--error": "the holding batch script's output is orch's",
        "--parsable": "orch reads the job id itself",
        "-W": "orch waits for the allocation itself",
        "--wait": "orch waits for the allocation itself",
    }
)
"""`slurm.options` orch refuses, and why: it sets the value itself, or the flag breaks the run."""
SLURM_SIGNAL = re.compile(r"^(?:SIG)?USR2(?:@\d+)?\Z")


def slurm_option_problem(option: str) -> str | None:
    """Why an allocation flag of `slurm.options` is refused, or None."""
    if not option.startswith("-") or option in ("-", "--"):
        return "an sbatch flag starts with - (write --key=value as one item)"
    name, eq, value = option.partition("=")
    if not eq and not name.startswith("--") and len(name) > 2:  # -N4: a short flag with its value
        name, value = name[:2], name[2:]
    if name in SLURM_REFUSED:
        return SLURM_REFUSED[name]
    if name == "--signal" and not SLURM_SIGNAL.match(value.upper()):
        return (
            "the warning signal must be USR2 sent to the steps (--signal=USR2@SECONDS): the trainer "
            "checkpoints on USR2; B: would signal only the holding batch script"
        )
    return None


def with_allocation(inv: Inventory, alloc: Allocation) -> Inventory:
    """A Slurm inventory with the allocation's nodes: each node its Slurm name, its NodeHostname as
    the address, `slurm.gpus_per_node` GPUs, the job's python and env; node ranks in the allocation's
    order, `master.node` (else its first node) moved first. OrchError when `master.node` is not one
    of them, or `slurm.nodes` / `slurm.partition` disagree with an allocation orch did not make."""
    s = inv.slurm
    if s is None:
        raise ValueError(f"{inv.path}: not a Slurm inventory")
    if s.nodes is not None and s.nodes != len(alloc.nodes):
        raise OrchError(
            f"{inv.path}: slurm.nodes is {s.nodes}, but Slurm job {alloc.job_id} holds {len(alloc.nodes)} "
            f"node(s): {', '.join(alloc.nodes)}",
            "inside an allocation, leave slurm.nodes out (orch uses all of its nodes), or allocate as many",
        )
    gpus = s.gpus_per_node or None
    nproc = s.nproc_per_node or gpus or 1
    nodes = [
        Node(
            name=name,
            host=name,
            addr=alloc.addrs.get(name) or name,
            gpus=gpus,
            nproc_per_node=nproc,
            python=inv.job.python,
            env=inv.env,
            ssh=SSHOptions(),
            index=i,
        )
        for i, name in enumerate(alloc.nodes)
    ]
    if not nodes:
        raise OrchError(f"Slurm job {alloc.job_id} holds no node")
    master = nodes[0]
    if s.master is not None:
        found = next((n for n in nodes if n.name == s.master), None)
        if found is None:
            raise OrchError(
                f"{inv.path}: master.node {s.master} is not a node of Slurm job {alloc.job_id} "
                f"({', '.join(alloc.nodes)})",
                "leave master.node out (the allocation's first node is the master), or allocate that node",
            )
        master = found
    ordered = (master, *[n for n in nodes if n is not master])
    return replace(inv, nodes=ordered, allocation=alloc)


def with_replacements(inv: Inventory, replaced: Mapping[str, str]) -> Inventory:
    """The inventory as a run ran it once spares took the places of nodes that failed a retry's
    preflight (`{failed node: spare}`, in the order they were made, so a spare that failed in its
    turn is replaced too): each spare takes its node's place in the rank order (the master's
    too) and leaves `spares`. Raises KeyError naming a node or spare this inventory lacks."""
    nodes, spares = list(inv.nodes), {s.name: s for s in inv.spares}
    for old, new in replaced.items():
        at = next((i for i, n in enumerate(nodes) if n.name == old), None)
        if at is None:
            raise KeyError(f"node {old!r} is not a node of {inv.path}")
        if new not in spares:
            raise KeyError(f"spare {new!r} is not an unused spare of {inv.path}")
        nodes[at] = replace(spares.pop(new), index=nodes[at].index)
    if not replaced:
        return inv
    return replace(inv, nodes=tuple(nodes), spares=tuple(spares.values()))


def adhoc(spec: str, user: str | None = None) -> Inventory:
    """An inventory of the hosts `spec` names (pdsh/clush `-w`: `gpu[1-4],login`, `root@gpu[1-2]`)
    for `orch exec -w` without a file: `transport: ssh`, every default as in an inventory that
    gives no `ssh:` (user, keys and ProxyJump from ~/.ssh/config, host keys checked against
    ~/.ssh/known_hosts, strictly). Validated like a file (a host that would need a shell: exit 2)."""
    import json

    from .nodeset import expand

    nodes = []
    for word in expand(spec, "-w"):
        login, _, host = word.rpartition("@")
        node: dict[str, str] = {"host": host}
        if login or user:
            node["user"] = login or str(user)
        nodes.append(node)
    return parse(json.dumps({"name": "adhoc", "transport": "ssh", "nodes": nodes}), f"-w {spec}")
