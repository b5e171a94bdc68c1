"""The job inside a container image (`job.container`): its settings and their rules, and the
container's identity on a node (its name, its labels). Pure.

How a node runs the job in it (the runtime's argv, the stop hook, the sweep) is the job's
environment (`config/jobenv.py`); what each runtime can do is its entry in `config/runtimes.py`.
One container per node per launch, named `orch-<run>-<node>-<nonce>` (`container_name`) and
labelled with `LABELS` (`labels`; found again by `label_filter`), so that the stop hook removes it
by name and a later `orch down` finds what a killed agent left by label, never another run's or
another user's (the nonce).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .runtimes import TABLE, Option
from .schema import ContainerModel

USERS = ("host", "root")
PULLS = ("missing", "never")
NAME_PREFIX = "orch"
LABEL_PREFIX = NAME_PREFIX + "."
"""What every label of orch's begins with (`job.container.options` may not set one)."""
LABEL_RUN, LABEL_NODE, LABEL_NONCE, LABEL_CLUSTER = (LABEL_PREFIX + key for key in ("run", "node", "nonce", "cluster"))
LABELS = (LABEL_RUN, LABEL_NODE, LABEL_NONCE, LABEL_CLUSTER)
"""The labels every container orch starts carries, where its runtime keeps containers: the run, the
node, the launch's nonce, the inventory's name (`labels`; found by `label_filter`)."""
MEMLOCK = ("--ulimit", "memlock=-1", "--ulimit", "stack=67108864")
"""NVIDIA's recommended limits for NCCL over RDMA in a container (pinned memory; the stack): only
with `checks.rdma.devices` (past the node's own hard limits they need CAP_SYS_RESOURCE, and podman
adds nofile and nproc limits of its own once any `--ulimit` is given)."""
RDMA = ("--device", "/dev/infiniband", "--cap-add", "IPC_LOCK")
"""With `checks.rdma.devices`: the verbs devices and the right to pin memory for them."""
PASSWD = ("/etc/passwd", "/etc/group")
"""Mounted read-only for a user that is not root, so the uid has a name (and a home) inside."""
HOME_TMPFS = "/tmp/orch-home"
"""The writable HOME of a user other than root (a tmpfs: the host's home mounted over the image's
would hide what the image keeps there, and is not a `UID:GID` user's)."""
UID_GID = re.compile(r"^(\d+):(\d+)\Z")
NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class Mount:
    """One `job.container.mounts` entry: `HOST[:CONTAINER[:ro]]` (PATH alone: the same path)."""

    host: str
    container: str
    read_only: bool = False

    def spec(self) -> str:
        return f"{self.host}:{self.container}" + (":ro" if self.read_only else "")


@dataclass(frozen=True)
class Container:
    """`job.container`: the image the job runs in on every node, and how."""

    runtime: str
    """docker | podman | apptainer."""
    image: str
    """A name:tag or an image ID (apptainer: an absolute .sif path); the launch runs the ID the
    preflight resolved (`Pins.image_id`) where there is one."""
    python: str = ContainerModel.python
    """The job's interpreter inside the image."""
    workdir: str | None = None
    """The working directory inside the container (None: job.workdir)."""
    mounts: tuple[Mount, ...] = ()
    options: tuple[str, ...] = ()
    """Extra runtime flags, appended last (before the image)."""
    user: str = ContainerModel.user
    """host (the SSH user's uid:gid) | root | UID:GID."""
    pull: str = ContainerModel.pull
    """missing: the preflight may pull an image a node lacks | never."""


@dataclass(frozen=True)
class Pins:
    """What the preflight resolved that a container launch runs: the image ID every node runs
    (the tag is only what the inventory wrote), and each node's GPUs by UUID."""

    image_id: str | None = None
    gpus: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


# ----------------------------------------------------------------------------- rules


def parse_mount(text: str) -> tuple[Mount | None, str | None]:
    """`HOST[:CONTAINER[:ro|rw]]` → (Mount, None), or (None, why not)."""
    parts = text.split(":")
    if len(parts) > 3 or not all(parts[:2]):
        return None, f"mount {text!r} is not HOST[:CONTAINER[:ro]]"
    host = parts[0]
    inside = parts[1] if len(parts) > 1 else host
    mode = parts[2] if len(parts) > 2 else "rw"
    if mode not in ("ro", "rw"):
        return None, f"mount {text!r}: the mode must be ro or rw, not {mode!r}"
    for path in (host, inside):
        if not path.startswith("/"):
            return None, (
                f"mount {text!r}: {path!r} is not an absolute path (a mount is the same on every node: write it from /)"
            )
        if any(part in (".", "..") for part in path.split("/")):
            return None, f"mount {text!r}: {path!r} has '.' or '..' components"
    return Mount(host.rstrip("/") or "/", inside.rstrip("/") or "/", mode == "ro"), None


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def mount_problems(mounts: Sequence[Mount], run_root: str, workdir: str | None) -> list[tuple[int, str]]:
    """(index, why) for each mount that would collide with another or with what orch mounts:
    the run directory (under `job.run_root`) must stay what the node has, and a path is mounted once."""
    out: list[tuple[int, str]] = []
    seen: dict[str, int] = {}
    ours = {p: "the host's user database (mounted read-only)" for p in PASSWD}
    if workdir and workdir.startswith("/"):
        ours[workdir.rstrip("/") or "/"] = "job.workdir (mounted at the same path)"
    for i, m in enumerate(mounts):
        if m.container in seen:
            out.append((i, f"container path {m.container} is mounted twice: list it once"))
            continue
        seen[m.container] = i
        if run_root.startswith("/") and _under(m.container, run_root.rstrip("/") or "/"):
            out.append(
                (
                    i,
                    f"mount at {m.container} would hide the run directory under job.run_root {run_root} "
                    "(orch mounts each node's run directory at the same path): mount elsewhere",
                )
            )
        elif m.container in ours:
            out.append((i, f"mount at {m.container} would hide {ours[m.container]}: orch mounts it already"))
    return out


def read_options(runtime: str, options: Sequence[str]) -> tuple[list[Option], list[tuple[int, str]]]:
    """`options` as `runtime`'s run reads them (its grammar in `config/runtimes.py`): every flag by
    its long name, and (index, why) for each word that is none (`Grammar.read`)."""
    rt = TABLE.get(runtime)
    return rt.grammar.read(options) if rt is not None else ([], [])


def option_names(runtime: str, options: Sequence[str]) -> set[str]:
    """The long names of the flags `options` give (`-itd`: `--interactive`, `--tty`, `--detach`)."""
    return {o.name for o in read_options(runtime, options)[0]}


_ALIASES = {"--net": "--network"}
"""Long names a runtime reads as another (docker's and podman's hidden `--net`)."""


def option_problems(c: Container, gpus_selected: bool) -> list[tuple[int, str]]:
    """(index, why) for each `options` entry that contradicts what orch sets and relies on, judged
    by what the runtime reads it as (`read_options`: `-itd` detaches, `--rm=False` keeps the
    container, `-u0` sets the user), never by how it is spelt."""
    rt = TABLE.get(c.runtime)
    if rt is None:
        return []
    found, out = read_options(c.runtime, c.options)
    host_network = "network" in rt.parts
    workdir = rt.grammar.short.get(rt.workdir[1:], rt.workdir) if not rt.workdir.startswith("--") else rt.workdir
    for opt in found:
        name, value = _ALIASES.get(opt.name, opt.name), opt.value
        said = opt.name if opt.written.startswith(opt.name) else f"{opt.name} (in {opt.written!r})"
        why = None
        if name == "--detach" and value != "false":
            why = (
                "orch runs the container in the foreground: its output is the job's log and it ends with the job "
                "(--detach would leave it running unseen)"
            )
        elif name == "--rm" and value == "false":
            why = "the container must be removed when its job ends (orch sets --rm)"
        elif name == "--network" and host_network and value != "host":
            why = (
                f"{said} {value}: orch runs the job on the host's network (NCCL and the rendezvous use the "
                "node's addresses; a bridge network hangs NCCL at init): leave --network out"
            )
        elif name == "--name" and rt.keeps_containers:
            why = "orch names the container orch-<run>-<node>-<nonce> (what every stop removes): leave --name out"
        elif name == "--user" and "user" in rt.parts:
            why = f"{said}: set job.container.user instead (host | root | UID:GID)"
        elif gpus_selected and (
            name == "--gpus" or (name == "--device" and value and "nvidia.com/gpu" in value) or name == "--nv"
        ):
            why = (
                "orch passes each node's GPUs for its ranks (by UUID; CUDA_VISIBLE_DEVICES in env: selects "
                "them): leave " + name + " out"
            )
        elif name in ("--env", "--env-file"):
            why = f"{said}: environment values never go on a command line: put the variable in env: (passed by name)"
        elif name in ("--cleanenv", "--containall") and "env" not in rt.parts:
            why = f"{said}: the job's env: reaches the job through the runtime's environment, which it drops"
        elif name == "--label" and (value or "").startswith(LABEL_PREFIX) and rt.keeps_containers:
            why = f"{said} {value}: the orch.* labels are orch's (how it finds its containers)"
        elif name == "--label-file" and rt.keeps_containers:
            why = "give labels with --label (a file's cannot be checked, and the orch.* labels are orch's)"
        elif name == "--pull":
            why = "set job.container.pull instead (missing | never)"
        elif name == workdir:
            why = f"{said}: set job.container.workdir instead"
        if why:
            out.append((opt.at, why))
    return sorted(out, key=lambda item: item[0])


def leading_dash(key: str, value: str) -> str | None:
    """Why an image or a mount may not start with `-` (the runtime would read it as a flag: an image
    named `--privileged`), or None."""
    if value.startswith("-"):
        return f"{key} {value!r} starts with '-': the runtime would read it as a flag"
    return None


def suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


# ----------------------------------------------------------------------------- identity


def container_name(run_id: str, node: str, nonce: str = "") -> str:
    """`orch-<run>-<node>-<nonce>`, with what a runtime refuses in a name replaced by '-'."""
    return NOT_IN_NAME.sub("-", "-".join(p for p in (NAME_PREFIX, run_id, node, nonce) if p))


def labels(run_id: str, node: str, nonce: str, cluster: str) -> list[str]:
    """`KEY=VALUE` of each of `LABELS`."""
    return [f"{key}={value}" for key, value in zip(LABELS, (run_id, node, nonce, cluster))]


def label_filter(key: str, value: str) -> str:
    """A runtime's `--filter` value for the containers whose label `key` is `value`."""
    return f"label={key}={value}"


NO_CONTAINER_EXIT = 125
"""`orch exec --container`'s exit on a node where the run has no container (docker's and podman's
own code for a failed `exec`)."""
