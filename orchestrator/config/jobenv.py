"""The job's environment on one node: the bare host, or a container of one runtime (`JobEnv`),
built once per node from the inventory and the preflight's pins (`job_env`). Pure.

`plan.job_command`, the one builder of how a node runs anything of the job, asks it
(`JobEnv.command`); so do the launch's stop hook (`stop`), the sweep after a killed agent
(`sweep`), the runtime's own environment (`runtime_env`), torchrun's `--log-dir` (`log_dir`), the
preflight's container rows (`leftovers`, `inspect`) and plan.json (`record`: the runtime, the image
and the image ID it pinned, as data). What only the node knows (its run directory, the SSH user's
uid, gid and home) is written as `NODE_VALUES` names, filled in by the agent.

A container runs in the foreground (its output is torchrun's, it ends with the job), one per node
per launch, named `orch-<run>-<node>-<nonce>` and labelled (`container.LABELS`), so that the stop
hook removes it by name and a later `orch down` finds what a killed agent left by label, never
another run's or another user's (the nonce). What a runtime can do is its entry in
`config/runtimes.py`; nothing here names one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..node import unpacking
from .container import (
    HOME_TMPFS,
    LABEL_CLUSTER,
    LABEL_NODE,
    LABEL_NONCE,
    LABEL_RUN,
    MEMLOCK,
    PASSWD,
    RDMA,
    Container,
    Pins,
    container_name,
    label_filter,
    labels,
    option_names,
)
from .inventory import Inventory
from .nodes import Node
from .runtimes import Runtime, runtime
from .schema import ContainerModel

IPC_HOST = ("--ipc", "host")
"""Unless `job.container.options` size /dev/shm or set the IPC themselves."""
RUN_DIR = "{ORCH_RUN_DIR}"
"""In a launch's argv and stop hook: the node's run directory, absolute, as the agent finds it (the
plan cannot know it: `job.run_root` may start with `~/`). The agent substitutes it, and only the
names of `NODE_VALUES`, where they appear (`node/agent.py` `NODE_VALUES`, held equal by a test)."""
NODE_VALUES = ("{ORCH_RUN_DIR}", "{ORCH_UID}", "{ORCH_GID}", "{ORCH_HOME}")
"""What only the node knows, written into an argv by the plan and filled in by the agent: the run
directory, the uid and gid the agent runs as (the SSH user's), and its home."""
TORCHRUN_LOG_DIR = RUN_DIR + "/torchrun"
"""torchrun's `--log-dir`: in the node's run directory (made private by the agent)."""
WARNED = "warned"
"""The node program before the job's arguments in a container where a warning signal may come
(`python -c` of its `unpacking` text)."""
INSIDE_LOG_DIRS = {"root": "/tmp/orch-torchrun", "": HOME_TMPFS + "/torchrun"}
"""torchrun's `--log-dir` inside the container where its user is not the SSH user's (`root`; a
`UID:GID`, ""): what such a user makes in the run directory the SSH account could not remove (root's
0700 folders), and a `UID:GID` cannot enter it; gone with the container."""


FULL_IDS = "--no-trunc"
"""The listing's flag for whole 64-hex IDs (the only words the node's sweep removes)."""


@dataclass(frozen=True)
class Sweep:
    """What a launch may leave on a node beyond its processes: its containers, listed by label
    (`listing`, one whole ID a line: the launch's nonce and the node, never another launch's) and
    removed by ID (`remove -- ID...`), both run by the node's agent (`agent.py sweep`). run.json
    node `sweep` (the listing) and `sweep_remove`."""

    listing: tuple[str, ...]
    remove: tuple[str, ...]

    @property
    def recorded_before(self) -> tuple[str, ...]:
        """The listing as run.json recorded it before it asked for whole IDs (`FULL_IDS`): a record
        of an older launch says it; what runs is `listing`."""
        return tuple(w for w in self.listing if w != FULL_IDS)


@dataclass(frozen=True)
class JobEnv:
    """How one node runs the job: its interpreter on the host, or in a container of `runtime`.
    Whole once built: what it answers is read from its own fields, never from the inventory again."""

    node: str
    python: str
    """The job's interpreter: `job.container.python` inside the image, else the node's `python`."""
    log_dir: str
    """torchrun's `--log-dir`: `TORCHRUN_LOG_DIR`, or inside the container where its user is not the
    SSH user's (`INSIDE_LOG_DIRS`): orch's directories stay the SSH account's whatever that user."""
    run_id: str = ""
    nonce: str = ""
    cluster: str = ""
    runtime: Runtime | None = None
    """The container's runtime; None: the bare host."""
    image: str | None = None
    """`job.container.image` as the inventory names it."""
    image_id: str | None = None
    """The image ID the preflight pinned (`Pins.image_id`): what the launch runs instead of the name."""
    devices: tuple[str, ...] | None = None
    """The node's GPUs for its ranks (see `job_env`); None: the node declares none."""
    binds: tuple[str, ...] = ()
    """`HOST:CONTAINER[:ro]` mounts: the run directory and `job.workdir` at their own paths, then
    `job.container.mounts`."""
    workdir: str | None = None
    """The working directory inside the container."""
    options: tuple[str, ...] = ()
    """`job.container.options`, last before the image."""
    user: str = ""
    """`job.container.user`: host | root | UID:GID."""
    rdma: bool = False
    """`checks.rdma.devices` is set: the verbs devices, the right to pin memory, and memlock unlimited
    (only then: a `--ulimit` fails every start on a node that grants no CAP_SYS_RESOURCE)."""
    pull: str = ContainerModel.pull
    """`job.container.pull`: never (the runtime is told so, `Runtime.pull_never`) | missing."""
    warned: bool = False
    """A scheduler's warning signal may come (`transport: slurm`): the container runs the job's
    interpreter under `node/warned.py`, which keeps torchrun alive through it and passes
    it on to the ranks, as a Slurm step does on a host."""

    @property
    def apart(self) -> bool:
        """The job's interpreter runs apart from the host's (in a container): what it sees (its
        software, its GPUs, the output folders as its user) must be asked of it, through `command`."""
        return self.runtime is not None

    @property
    def needs_image(self) -> bool:
        """Nothing of the job can start where the node lacks the image: it will not be pulled
        (`pull: never`, or a runtime that runs an image file)."""
        return self.runtime is not None and (self.pull == "never" or not self.runtime.pulls)

    def name(self, role: str = "") -> str:
        """The container a launch (or a preflight's throw-away, `role`) runs in: the one spelling its
        start (`command`) and its stop hook (`stop`) share."""
        return container_name(self.run_id, self.node, "-".join(p for p in (self.nonce, role) if p))

    def command(self, inner: Sequence[str], role: str = "", env: Iterable[str] = ()) -> list[str]:
        """How the node runs `inner` (the arguments after the job's interpreter) in the job's
        environment: the interpreter itself, or the runtime's command around it (docs/CONTRACT.md's
        launch line), the container named for `role`, the job's `env` names passed by name (values
        in the runtime's own environment, never on argv)."""
        rt = self.runtime
        if rt is None:
            return [self.python, *inner]
        parts = {
            "gpus_first": lambda: rt.gpu_flags(self.devices or ()),
            "name": lambda: ["--name", self.name(role)],
            "labels": lambda: [
                w for v in labels(self.run_id, self.node, self.nonce, self.cluster) for w in ("--label", v)
            ],
            "network": lambda: ["--network", "host"],
            "ipc": lambda: [] if option_names(rt.name, self.options) & {"--shm-size", "--ipc"} else ["--ipc", "host"],
            "pull": lambda: list(rt.pull_never) if self.pull == "never" else [],
            "memlock": lambda: list(MEMLOCK) if self.rdma else [],
            "rdma": lambda: list(RDMA) if self.rdma else [],
            "user": lambda: self._user(rt),
            "mounts": lambda: [w for spec in self.binds for w in (rt.mount, spec)],
            "workdir": lambda: [rt.workdir, self.workdir] if self.workdir else [],
            "env": lambda: [w for n in env if n != "CUDA_VISIBLE_DEVICES" for w in ("-e", n)],
        }
        argv = list(rt.run)
        for part in rt.parts:
            argv += parts[part]()
        if "gpus_first" not in rt.parts:
            argv += rt.gpu_flags(self.devices or ())
        warned = ["-c", unpacking(WARNED)] if self.warned else []
        return [*argv, *self.options, self.image_id or self.image or "", self.python, *warned, *inner]

    def _user(self, rt: Runtime) -> list[str]:
        """Who the job runs as: root, or a uid:gid with the host's user database and a HOME of its
        own (the host's would hide what the image keeps there, like /root/yoloe)."""
        if self.user == "root":
            return ["--user", "0:0"]
        argv = ["--user", "{ORCH_UID}:{ORCH_GID}" if self.user == "host" else self.user]
        for p in PASSWD:
            argv += [rt.mount, f"{p}:{p}:ro"]
        return [*argv, "--tmpfs", f"{HOME_TMPFS}:rw,mode=1777", "-e", f"HOME={HOME_TMPFS}"]

    def mounts(self) -> list[tuple[str, str]]:
        """(path inside, path on the host) of every bind the plan can name (not the run directory
        nor a `~/` workdir, which only the node knows), the deepest inside path first."""
        out = []
        for spec in self.binds:
            host, inside = spec.split(":")[:2]
            if "{" not in host + inside:
                out.append((inside, host))
        return sorted(out, key=lambda m: -len(m[0]))

    def host_path(self, path: str) -> str | None:
        """Where the job's `path` is on the node's host: the same path on the bare host; in a
        container, through the mount it is under (`/ckpt/yoloe` with `/mnt/nfs/ckpt:/ckpt` is
        `/mnt/nfs/ckpt/yoloe`); None where it is under none, in the image's own files only (what
        the job writes there goes with the container)."""
        if self.runtime is None:
            return path
        for inside, host in self.mounts():
            if path == inside or path.startswith(inside.rstrip("/") + "/"):
                return host.rstrip("/") + path[len(inside.rstrip("/")) :] if path != inside else host
        return None

    def stop(self, role: str = "") -> list[str]:
        """The stop hook the agent runs on every stop path: the launch's container removed by name,
        running or not; empty where nothing outlives the job's process group."""
        rt = self.runtime
        return [*rt.rm, self.name(role)] if rt is not None and rt.rm else []

    def sweep(self) -> Sweep | None:
        """What lists (by label: this launch's nonce, this node) and removes the containers a
        killed agent left (`orch down`, a retry's teardown); None where nothing can be left (no
        container, a runtime that keeps none, a dry run without a nonce)."""
        rt = self.runtime
        if rt is None or not rt.ps or not self.nonce:
            return None
        listing = (*rt.ps, "-aq", FULL_IDS, "--filter", label_filter(LABEL_NONCE, self.nonce))
        return Sweep((*listing, "--filter", label_filter(LABEL_NODE, self.node)), tuple(rt.rm))

    def leftovers(self) -> list[str]:
        """What lists every container of this cluster's runs on the node, one a line: ID, name, its
        run, state (the `container` check's leftover rows); empty where none can be left. By the
        node's label too: two nodes that share a runtime each see only their own."""
        rt = self.runtime
        if rt is None or not rt.ps:
            return []
        fields = ("{{.ID}}", "{{.Names}}", rt.label_field(LABEL_RUN), "{{.State}}")  # the form each runtime knows
        by = (label_filter(LABEL_CLUSTER, self.cluster), label_filter(LABEL_NODE, self.node))  # a shared runtime's too
        return [*rt.ps, "-a", "--filter", by[0], "--filter", by[1], "--format", "\t".join(fields)]

    def inspect(self) -> list[str]:
        """What prints the image the node holds under `job.container.image` (`runtimes.held` reads it)."""
        return self.runtime.inspect_argv(self.image) if self.runtime is not None and self.image else []

    def runtime_env(self) -> dict[str, str]:
        """What the runtime's own environment needs beyond the job's (apptainer: which GPUs)."""
        return self.runtime.gpu_env(self.devices) if self.runtime is not None else {}

    def record(self) -> dict[str, Any]:
        """plan.json's `environment` of the node: the runtime (null: the bare host), the image as
        the inventory names it, the image ID the launch ran (null: the name ran), the job's python."""
        return {
            "runtime": self.runtime.name if self.runtime is not None else None,
            "image": self.image,
            "image_id": self.image_id,
            "python": self.python,
        }


def _home_path(path: str, home: str) -> str:
    """A `~/` path of the node (job.workdir) as the container sees it: under the SSH user's home."""
    return home + path[1:] if path == "~" or path.startswith("~/") else path


def job_env(inv: Inventory, node: Node, pins: Pins | None = None, run_id: str = "", nonce: str = "") -> JobEnv:
    """`node`'s environment for run `run_id` and launch `nonce`: where the inventory is read (the
    GPUs a container gets for the node's ranks: the preflight's UUIDs in `pins`, else what the
    node's CUDA_VISIBLE_DEVICES in env: selects, else the first `nproc_per_node` indices)."""
    c = inv.job.container
    if c is None:
        return JobEnv(node.name, node.python, TORCHRUN_LOG_DIR, run_id, nonce, inv.name)
    chosen = node.env.get("CUDA_VISIBLE_DEVICES")
    if not node.gpus:
        devices = None
    elif pins is not None and pins.gpus.get(node.name):
        devices = tuple(pins.gpus[node.name])
    elif chosen:
        devices = tuple(d.strip() for d in chosen.split(",") if d.strip())
    else:
        devices = tuple(str(i) for i in range(node.nproc_per_node))
    workdir = _home_path(inv.job.workdir, "{ORCH_HOME}") if inv.job.workdir else None
    binds = [f"{RUN_DIR}:{RUN_DIR}", *([f"{workdir}:{workdir}"] if workdir else []), *(m.spec() for m in c.mounts)]
    return JobEnv(
        node=node.name,
        python=c.python,
        log_dir=TORCHRUN_LOG_DIR if c.user == "host" else INSIDE_LOG_DIRS.get(c.user, INSIDE_LOG_DIRS[""]),
        run_id=run_id,
        nonce=nonce,
        cluster=inv.name,
        runtime=runtime(c.runtime),
        image=c.image,
        image_id=pins.image_id if pins is not None else None,
        devices=devices,
        binds=tuple(binds),
        workdir=c.workdir or workdir,
        options=tuple(c.options),
        user=c.user,
        rdma=bool(inv.checks.rdma_devices),
        pull=c.pull,
        warned=inv.slurm is not None,
    )


EXEC_GRACE_S = 5.0
"""`orch exec --container`: seconds between the SIGTERM to the command's processes in the container
and the SIGKILL to what is left of them (on a timeout, Ctrl-C or a lost session)."""


@dataclass(frozen=True)
class BoxExec:
    """`orch exec --container RUN`: how a node finds the run's container and runs a command in it
    (`node/execbox.py`'s arguments, all values: nothing here is parsed by a shell)."""

    ps: tuple[str, ...]
    """The runtime's program and its list word."""
    exec: str
    """The runtime's word that runs a command in a running container."""
    run_id: str
    nonce: str
    python: str
    """The job's python in the image: it stops the command's processes inside."""

    def args(self, node: str, command: Sequence[str], timeout: float | None) -> list[str]:
        """The node program's arguments for `node` (its container: the run's, the node's and the
        launch's labels); one word of `command` is a line for `sh -c` inside."""
        inner = ["sh", "-c", command[0]] if len(command) == 1 else list(command)
        filters = [
            label_filter(key, value)
            for key, value in ((LABEL_RUN, self.run_id), (LABEL_NODE, node), (LABEL_NONCE, self.nonce))
        ]
        limits = [f"{timeout or 0:g}", self.python, f"{EXEC_GRACE_S:g}"]
        return [*self.ps, self.exec, self.run_id, *limits, *filters, "--", *inner]


def box_exec(c: Container, run_id: str, nonce: str) -> BoxExec | None:
    """`orch exec --container`'s way into `c`'s containers of launch `nonce`; None: the runtime
    keeps no container to enter."""
    rt = runtime(c.runtime)
    if not rt.exec or not rt.ps:
        return None
    return BoxExec((rt.ps[0], rt.ps[1]), rt.exec[1], run_id, nonce, c.python)
