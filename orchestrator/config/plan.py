"""Plan: node ranks, world size and the exact torchrun argv and env of every node. Pure.

Node rank is the position in `Inventory.nodes` (the master first, then file order) — never
derived from an address (the field guide's `cut -d. -f4` turned 192.168.1.11 into rank 11).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from . import container
from .container import Pins
from .inventory import Inventory
from .nodes import Node
from .trainer import settings_of, small_batch_warning

TORCHRUN = ("-m", "torch.distributed.run")
RUN_DIR = "{ORCH_RUN_DIR}"
"""In a launch's argv and stop hook: the node's run directory, absolute, as the agent finds it (the
plan cannot know it: `job.run_root` may start with `~/`). The agent substitutes it, and only the
names of `NODE_VALUES`, where they appear (`node/agent.py` `NODE_VALUES`, held equal by a test)."""
NODE_VALUES = ("{ORCH_RUN_DIR}", "{ORCH_UID}", "{ORCH_GID}", "{ORCH_HOME}")
"""What only the node knows, written into an argv by the plan and filled in by the agent: the run
directory, the uid and gid the agent runs as (the SSH user's), and its home."""
TORCHRUN_LOG_DIR = RUN_DIR + "/torchrun"
"""torchrun's `--log-dir`: in the node's run directory (made private by the agent)."""
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

    def for_node(self, name: str) -> NodePlan:
        for np_ in self.nodes:
            if np_.node.name == name:
                return np_
        raise KeyError(name)

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
    c = inv.job.container
    return c.python if c is not None else node.python


def gpu_devices(inv: Inventory, node: Node, pins: Pins | None = None) -> tuple[str, ...] | None:
    """The GPUs a container on `node` gets for its ranks (None: the node declares none): the
    preflight's UUIDs (`pins`), else what the node's CUDA_VISIBLE_DEVICES (env:) selects, else the
    first `nproc_per_node` indices."""
    if not node.gpus:
        return None
    if pins is not None and pins.gpus.get(node.name):
        return tuple(pins.gpus[node.name])
    chosen = node.env.get("CUDA_VISIBLE_DEVICES")
    if chosen:
        return tuple(d.strip() for d in chosen.split(",") if d.strip())
    return tuple(str(i) for i in range(node.nproc_per_node))


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
    (`torchrun_argv`), the job's own check, the probe's software facts and the fabric job all
    come through here (tests/unit/test_layers.py holds every other module to it).

    With `job.container`: the runtime's command around it (config/container.py `run_argv`), the
    container named for `run_id`, the node, `nonce` and `role` (a preflight's throw-away
    containers), the `env` names passed by name, the GPUs and image ID of `pins`."""
    c = inv.job.container
    if c is None:
        return [job_python(inv, node), *inner]
    return container.run_argv(
        c,
        inner,
        name=launch_name(run_id, node, nonce, role),
        label_values=container.labels(run_id, node.name, nonce, inv.name),
        env=list(env),
        devices=gpu_devices(inv, node, pins),
        workdir=inv.job.workdir,
        run_dir=RUN_DIR,
        home="{ORCH_HOME}",
        uid_gid="{ORCH_UID}:{ORCH_GID}",
        rdma=bool(inv.checks.rdma_devices),
        image_id=pins.image_id if pins is not None else None,
    )


def launch_name(run_id: str, node: Node, nonce: str = "", role: str = "") -> str:
    """The container a launch (or a preflight's throw-away, `role`) runs in on `node`: the one
    spelling its start (`job_command`) and its stop hook (`job_stop`) share."""
    return container.container_name(run_id, node.name, "-".join(p for p in (nonce, role) if p))


def launch_role(attempt: int) -> str:
    """What a launch's container name adds for its attempt: nothing for the first (the contract's
    `orch-<run>-<node>-<nonce>`), `aN` for a retry's attempt N, whose containers must not share a
    name with an earlier attempt's, which a late stop hook of that attempt would remove."""
    return f"a{attempt}" if attempt > 1 else ""


def job_stop(inv: Inventory, node: Node, run_id: str, nonce: str = "", role: str = "") -> list[str]:
    """The stop hook of a launch on `node` (NodePlan.stop): an argv the agent runs on every stop
    path (empty: the process group is all there is to stop); a container launch's removes its
    container (`RUNTIME rm -f NAME`)."""
    c = inv.job.container
    if c is None:
        return []
    return container.stop_argv(c, launch_name(run_id, node, nonce, role))


def job_sweep(inv: Inventory, node: Node, nonce: str) -> list[str]:
    """What lists the containers a launch (`nonce`) left on `node`, one ID a line, for `orch down`
    and a retry's teardown to remove (`RUNTIME rm -f ID...`) after the agent's stop: what a killed
    agent could not. Empty: nothing outlives the job's processes (no container, apptainer, a dry run)."""
    c = inv.job.container
    return container.sweep_argv(c, nonce, node.name) if c is not None and nonce else []


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
    """The full command for one node: `job_command` of `-m torch.distributed.run <flags> <entry>
    <args>`, torchrun's `--log-dir` in the node's run directory (`TORCHRUN_LOG_DIR`)."""
    nnodes = len(inv.nodes)
    c = inv.job.container
    # a container user other than the SSH user's (UID:GID) cannot enter the private run directory
    log_dir = TORCHRUN_LOG_DIR if c is None or c.user in ("host", "root") else container.HOME_TMPFS + "/torchrun"
    argv = [*TORCHRUN, f"--log-dir={log_dir}", f"--nnodes={nnodes}", f"--nproc-per-node={node.nproc_per_node}"]
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
    argv += list(inv.job.args)
    return job_command(inv, node, argv, run_id=run_id, nonce=nonce, env=env, pins=pins, role=launch_role(attempt))


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
    for rank, node in enumerate(inv.nodes):
        first = firsts[node.name]
        env = {**node_env(inv, node, rank, run_id, attempt, nonce), **(extra_env or {})}
        argv = torchrun_argv(inv, node, rank, run_id, nonce, attempt, env=list(env), pins=pins)
        if inv.job.container is not None:
            env.update(container.runtime_env(inv.job.container, gpu_devices(inv, node, pins)))
        nodes.append(
            NodePlan(
                node=node,
                node_rank=rank,
                global_ranks=range(first, first + node.nproc_per_node),
                argv=tuple(argv),
                env=MappingProxyType(env),
                workdir=inv.job.workdir,
                stop=tuple(job_stop(inv, node, run_id, nonce, launch_role(attempt))),
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
