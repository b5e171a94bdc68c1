"""Plan: node ranks, world size and the exact torchrun argv and env of every node. Pure.

Node rank is the position in `Inventory.nodes` (the master first, then file order) — never
derived from an address (the field guide's `cut -d. -f4` turned 192.168.1.11 into rank 11).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from .container import Pins
from .inventory import Inventory
from .jobenv import NODE_VALUES, RUN_DIR, TORCHRUN_LOG_DIR, JobEnv, job_env
from .nodes import Node
from .trainer import settings_of, small_batch_warning

__all__ = ["NODE_VALUES", "RUN_DIR", "TORCHRUN_LOG_DIR"]  # the job's environment's, asked here too

TORCHRUN = ("-m", "torch.distributed.run")
HIDDEN = "***"
"""What an env value the inventory gave is shown as, unless asked for (`orch up --dry-run --show-env`)."""


class Procs(Protocol):
    """Anything that says how many processes (ranks) a node runs: a `Node`, a run.json record."""

    @property
    def nproc_per_node(self) -> int: ...


def world_size(nodes: Iterable[Procs]) -> int:
    """How many ranks a job over `nodes` has: their processes added up. The one count of it: the
    plan, the preflight, the job's check, the log views, top and the report ask here."""
    return sum(n.nproc_per_node for n in nodes)


def first_ranks(nodes: Iterable[Node]) -> dict[str, int]:
    """{node name: the global rank of its first process} under static rendezvous, `nodes` in rank
    order: the ranks of the nodes before it."""
    out, first = {}, 0
    for node in nodes:
        out[node.name] = first
        first += node.nproc_per_node
    return out


@dataclass(frozen=True)
class NodePlan:
    """What one node runs: its ranks, the command and its environment."""

    node: Node
    node_rank: int
    global_ranks: range
    """Global ranks of this node's workers (static rendezvous; c10d may permute node order)."""
    argv: tuple[str, ...]
    env: Mapping[str, str]
    workdir: str | None
    stop: tuple[str, ...] = ()
    """The stop hook (`job_stop`): what the agent runs on every stop path once the job is being
    stopped or has ended (state.json `stop_hook`); empty: nothing beyond the process group."""
    environment: JobEnv | None = None
    """How the node runs the job (`jobenv.job_env`): what built `argv` and `stop`, its `sweep`,
    and plan.json's `environment`."""

    def shown_env(self, values: bool = False) -> dict[str, str]:
        """The job's environment for a person or a script: every name, and the values orch sets
        itself (`ORCH_*`, `PYTHONUNBUFFERED` when the inventory does not); the inventory's values
        (tokens, keys, passwords as often as interface names) are HIDDEN unless `values`."""
        if values:
            return dict(self.env)
        return {k: HIDDEN if k in self.node.env else v for k, v in self.env.items()}


@dataclass(frozen=True)
class Plan:
    """The whole cluster's launch plan."""

    inventory: Inventory
    run_id: str
    nodes: tuple[NodePlan, ...]
    world_size: int
    master_addr: str
    master_port: int
    nonce: str = ""
    """The launch's nonce (run.json `nonce`; empty for a dry run): it claims the nodes' run
    directories, tags the job's processes (`ORCH_LAUNCH`) and names its rendezvous."""
    warnings: tuple[str, ...] = ()
    """What the plan shows under its table (and `warnings` in its JSON): the job's settings that
    would train badly on this cluster (`job_warnings`)."""

    by_name: Mapping[str, NodePlan] = field(init=False, repr=False, compare=False)
    """`nodes` by node name (what the launch looks each node's plan up by)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", MappingProxyType({p.node.name: p for p in self.nodes}))

    def for_node(self, name: str) -> NodePlan:
        return self.by_name[name]

    def to_json(self, env_values: bool = False) -> dict[str, object]:
        """The plan JSON (docs/CONTRACT.md). The inventory's env values are HIDDEN unless
        `env_values` (`--show-env`; plan.json in the private run directory keeps them)."""
        return {
            "run": self.run_id,
            "inventory": self.inventory.path,
            "world_size": self.world_size,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "nodes": [
                {
                    "node": p.node.name,
                    "host": p.node.host,
                    "addr": p.node.addr,
                    "node_rank": p.node_rank,
                    "nproc_per_node": p.node.nproc_per_node,
                    "global_ranks": [p.global_ranks.start, p.global_ranks.stop - 1],
                    "argv": list(p.argv),
                    "env": p.shown_env(env_values),
                    "workdir": p.workdir,
                    **({"stop_hook": list(p.stop)} if p.stop else {}),
                    **({"environment": p.environment.record()} if p.environment is not None else {}),
                }
                for p in self.nodes
            ],
            "env_values": "shown" if env_values else "hidden",
            "warnings": list(self.warnings),
        }


def trainer_settings(inv: Inventory) -> dict[str, str | bool]:
    """The trainer's settings in the job's argv, by name (`--batch-size 32`, `batch=32` -> `batch`:
    "32"; a bare flag -> True); empty for any other job."""
    if inv.job.script is not None or inv.job.module != "trainer":
        return {}
    out: dict[str, str | bool] = {}
    for name, words in settings_of(list(inv.job.args)):
        if name is not None:
            out[name] = words[0].split("=", 1)[1] if "=" in words[0] else (words[1] if len(words) > 1 else True)
    return out


def job_warnings(inv: Inventory, world_size: int) -> tuple[str, ...]:
    """The trainer's start-up warnings that the plan can tell already: fewer than 4 images per rank
    without `--sync-bn` (trainer/interface.py's rule, the trainer's own start-up line)."""
    given = trainer_settings(inv)
    sync_bn = str(given.get("sync_bn", False)).lower() not in ("false", "0", "no")
    try:
        per_device = int(given["batch_per_device"]) if "batch_per_device" in given else None
        batch = per_device * world_size if per_device is not None else int(given["batch"]) if "batch" in given else None
    except ValueError:
        return ()  # the trainer refuses it, with its reason
    if batch is None:
        return ()
    warning = small_batch_warning(batch, world_size, sync_bn, per_device=per_device is not None)
    return (warning,) if warning else ()


def rdzv_id(run_id: str, nonce: str = "", attempt: int = 1) -> str:
    """torchrun's `--rdzv-id`: the run id, and with a launch nonce `RUN-NONCE-aATTEMPT`.

    torchrun's static rendezvous keeps every key of its agents under this prefix in the master's
    TCPStore (`PrefixStore(run_id, store)` in `static_tcp_rendezvous.py`; c10d's rendezvous is
    named by it): a node of another run, or of this run's earlier attempt, that reaches the same
    address and port waits under its own prefix for a rank assignment that never comes, and
    never spawns a worker in this run's world (torch's default id, `none`, is everyone's)."""
    return f"{run_id}-{nonce}-a{attempt}" if nonce else run_id


def job_python(inv: Inventory, node: Node) -> str:
    """The job's interpreter on `node`: `job.container.python` inside the image, else the node's
    `python:` or `job.python`. `node.python` itself is what runs orch's own node programs (agent,
    probe, log reader) on the host."""
    return job_env(inv, node).python


def job_command(
    inv: Inventory,
    node: Node,
    inner: Sequence[str],
    *,
    run_id: str = "",
    nonce: str = "",
    env: Iterable[str] = (),
    pins: Pins | None = None,
    role: str = "",
) -> list[str]:
    """How `node` runs anything of the job: `inner` (the arguments after the job's interpreter:
    `-m torch.distributed.run ...`, `-m trainer --check ...`, `-c CODE`) run by the job's
    interpreter in the job's environment. The one place that knows it: the launch
    (`torchrun_argv`), the job's own check, the probe's in-image facts and the fabric job all
    come through here (tests/unit/test_layers.py holds every other module to it), asking the
    node's environment (`jobenv.JobEnv.command`): with `job.container`, the runtime's command
    around it, the container named for `run_id`, the node, `nonce` and `role` (a preflight's
    throw-away container), the `env` names passed by name, the GPUs and image ID of `pins`."""
    return job_env(inv, node, pins, run_id, nonce).command(inner, role, env)


def launch_role(attempt: int) -> str:
    """What a launch's container name adds for its attempt: nothing for the first (the contract's
    `orch-<run>-<node>-<nonce>`), `aN` for a retry's attempt N, whose containers must not share a
    name with an earlier attempt's, which a late stop hook of that attempt would remove."""
    return f"a{attempt}" if attempt > 1 else ""


def job_stop(inv: Inventory, node: Node, run_id: str, nonce: str = "", role: str = "") -> list[str]:
    """The stop hook of a launch on `node` (NodePlan.stop): an argv the agent runs on every stop
    path (empty: the process group is all there is to stop); a container launch's removes its
    container (`RUNTIME rm -f NAME`)."""
    return job_env(inv, node, run_id=run_id, nonce=nonce).stop(role)


def torchrun_args(
    inv: Inventory, node: Node, node_rank: int, run_id: str, nonce: str = "", attempt: int = 1, log_dir: str = ""
) -> list[str]:
    """What the job's interpreter runs on one node: `-m torch.distributed.run <flags> <entry>
    <args>`, torchrun's `--log-dir` where the node's environment keeps it (`JobEnv.log_dir`)."""
    nnodes = len(inv.nodes)
    argv = [
        *TORCHRUN,
        f"--log-dir={log_dir or TORCHRUN_LOG_DIR}",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={node.nproc_per_node}",
    ]
    if inv.job.rdzv == "static":
        argv += [
            f"--node-rank={node_rank}",
            f"--master-addr={inv.master.addr}",
            f"--master-port={inv.master_port}",
        ]
        if nonce:
            argv.append(f"--rdzv-id={rdzv_id(run_id, nonce, attempt)}")
    else:
        argv += [
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={inv.master.addr}:{inv.master_port}",
            f"--rdzv-id={rdzv_id(run_id, nonce, attempt)}",
        ]
    argv += [f"--max-restarts={inv.job.max_restarts}", "--tee=3", *inv.job.torchrun_args]
    if inv.job.script:
        argv.append(inv.job.script)
    else:
        argv += ["-m", inv.job.module or "trainer"]
    return argv + list(inv.job.args)


def torchrun_argv(
    inv: Inventory,
    node: Node,
    node_rank: int,
    run_id: str,
    nonce: str = "",
    attempt: int = 1,
    env: Iterable[str] = (),
    pins: Pins | None = None,
) -> list[str]:
    """The full command for one node: `torchrun_args` run in the node's environment (`job_command`)."""
    jenv = job_env(inv, node, pins, run_id, nonce)
    inner = torchrun_args(inv, node, node_rank, run_id, nonce, attempt, jenv.log_dir)
    return jenv.command(inner, launch_role(attempt), env)


def node_env(
    inv: Inventory, node: Node, node_rank: int, run_id: str, attempt: int = 1, nonce: str = ""
) -> dict[str, str]:
    """The job's environment: inventory `env`, then the node's `env`, then what orch itself sets
    (`ORCH_ATTEMPT`: 1, then 2, 3... when `orch up` relaunches the run after a failure;
    `ORCH_LAUNCH`: the launch nonce, part of the tag the agent knows the job's processes by)."""
    env = dict(node.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(
        {
            "ORCH_RUN_ID": run_id,
            "ORCH_NODE": node.name,
            "ORCH_NODE_RANK": str(node_rank),
            "ORCH_NNODES": str(len(inv.nodes)),
            "ORCH_ATTEMPT": str(attempt),
        }
    )
    if nonce:
        env["ORCH_LAUNCH"] = nonce
    return env


def make_plan(
    inv: Inventory,
    run_id: str = "dry-run",
    attempt: int = 1,
    nonce: str = "",
    extra_env: Mapping[str, str] | None = None,
    pins: Pins | None = None,
) -> Plan:
    """Assign node ranks in inventory order (master = 0) and build every node's command
    (`nonce`: the launch's, see `Plan.nonce`; `extra_env`: more of the job's environment, set by
    orch (the fabric check's NCCL_DEBUG); `pins`: a container launch's image ID and GPUs)."""
    nodes = []
    firsts = first_ranks(inv.nodes)
    role = launch_role(attempt)
    for rank, node in enumerate(inv.nodes):
        first = firsts[node.name]
        jenv = job_env(inv, node, pins, run_id, nonce)  # the node's environment, built once
        env = {**node_env(inv, node, rank, run_id, attempt, nonce), **(extra_env or {})}
        argv = jenv.command(torchrun_args(inv, node, rank, run_id, nonce, attempt, jenv.log_dir), role, env)
        nodes.append(
            NodePlan(
                node=node,
                node_rank=rank,
                global_ranks=range(first, first + node.nproc_per_node),
                argv=tuple(argv),
                env=MappingProxyType({**env, **jenv.runtime_env()}),
                workdir=inv.job.workdir,
                stop=tuple(jenv.stop(role)),
                environment=jenv,
            )
        )
    world = world_size(inv.nodes)
    return Plan(
        inventory=inv,
        run_id=run_id,
        nodes=tuple(nodes),
        world_size=world,
        master_addr=inv.master.addr,
        master_port=inv.master_port,
        nonce=nonce,
        warnings=job_warnings(inv, world),
    )
