"""The job inside a container image (`job.container`): its settings, their rules, and the runtime
argv builders (docker, podman, apptainer). Pure.

`plan.job_command` is the one place that decides how a node runs the job; with `job.container`
it asks `run_argv` here to wrap the job's interpreter and arguments in a runtime command, and
`plan.job_stop` asks `stop_argv` for the stop hook the node agent runs on every stop path. What
only the node knows (its run directory, the SSH user's uid, gid and home) is written as
`plan.NODE_VALUES` names, filled in by the agent.

One container per node per launch, run in the foreground (its output is torchrun's, it ends with
the job), named `orch-<run>-<node>-<nonce>` and labelled `orch.run`, `orch.node`, `orch.nonce`,
`orch.cluster`, so that the stop hook removes it by name and a later `orch down` finds what a
killed agent left by label (`sweep_argv`), never another run's or another user's (the nonce).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .schema import ContainerModel

RUNTIMES = ("docker", "podman", "apptainer")
USERS = ("host", "root")
PULLS = ("missing", "never")
NAME_PREFIX = "orch"
LABELS = ("orch.run", "orch.node", "orch.nonce", "orch.cluster")
"""The labels every container orch starts carries (docker and podman)."""
MEMLOCK = ("--ulimit", "memlock=-1", "--ulimit", "stack=67108864")
"""NVIDIA's recommended limits for NCCL and RDMA in a container (pinned memory; the stack)."""
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


def _flag(option: str) -> tuple[str, str | None]:
    """`--network=bridge` → (`--network`, `bridge`); `-d` → (`-d`, None)."""
    if option.startswith("--") and "=" in option:
        name, _, value = option.partition("=")
        return name, value
    return option, None


def option_problems(c: Container, gpus_selected: bool) -> list[tuple[int, str]]:
    """(index, why) for each `options` entry that contradicts what orch sets and relies on."""
    out: list[tuple[int, str]] = []
    opts = list(c.options)
    for i, raw in enumerate(opts):
        name, value = _flag(raw)
        nxt = opts[i + 1] if value is None and i + 1 < len(opts) else None
        value = value if value is not None else nxt
        why = None
        if name in ("-d", "--detach"):
            why = (
                "orch runs the container in the foreground: its output is the job's log and it ends with the job "
                "(--detach would leave it running unseen)"
            )
        elif name == "--rm" and value in ("false", "0") and "=" in raw:
            why = "the container must be removed when its job ends (orch sets --rm)"
        elif name in ("--network", "--net") and c.runtime != "apptainer" and value != "host":
            why = (
                f"{name} {value}: orch runs the job on the host's network (NCCL and the rendezvous use the "
                "node's addresses; a bridge network hangs NCCL at init): leave --network out"
            )
        elif name == "--name":
            why = "orch names the container orch-<run>-<node>-<nonce> (what every stop removes): leave --name out"
        elif name in ("-u", "--user"):
            why = "set job.container.user instead (host | root | UID:GID)"
        elif gpus_selected and (
            name == "--gpus" or (name == "--device" and value and "nvidia.com/gpu" in value) or name == "--nv"
        ):
            why = (
                "orch passes each node's GPUs for its ranks (by UUID; CUDA_VISIBLE_DEVICES in env: selects "
                "them): leave " + name + " out"
            )
        elif name in ("-e", "--env", "--env-file") or name.startswith("-e") and len(name) > 2:
            why = "environment values never go on a command line: put the variable in env: (passed by name)"
        elif name == "--label" and value and value.startswith("orch."):
            why = "the orch.* labels are orch's (how it finds its containers)"
        elif name == "--pull":
            why = "set job.container.pull instead (missing | never)"
        elif name in ("-w", "--workdir", "--pwd"):
            why = "set job.container.workdir instead"
        if why:
            out.append((i, why))
    return out


def suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


# ----------------------------------------------------------------------------- argv builders


def container_name(run_id: str, node: str, nonce: str = "") -> str:
    """`orch-<run>-<node>-<nonce>`, with what a runtime refuses in a name replaced by '-'."""
    return NOT_IN_NAME.sub("-", "-".join(p for p in (NAME_PREFIX, run_id, node, nonce) if p))


def labels(run_id: str, node: str, nonce: str, cluster: str) -> list[str]:
    return [f"orch.run={run_id}", f"orch.node={node}", f"orch.nonce={nonce}", f"orch.cluster={cluster}"]


def _home_path(path: str, home: str) -> str:
    """A `~/` path of the node (job.workdir) as the container sees it: under the SSH user's home."""
    return home + path[1:] if path == "~" or path.startswith("~/") else path


def run_argv(
    c: Container,
    inner: Sequence[str],
    *,
    name: str,
    label_values: Sequence[str],
    env: Sequence[str],
    devices: Sequence[str] | None,
    workdir: str | None,
    run_dir: str,
    home: str,
    uid_gid: str,
    rdma: bool,
    image_id: str | None = None,
) -> list[str]:
    """The runtime command that runs `c.python INNER` in the image: see docs/CONTRACT.md.

    `env`: the names the job gets (values in the runtime's own environment, never on argv);
    `devices`: the node's GPUs for its ranks (UUIDs or indices; None: no GPUs); `workdir`: the
    job's workdir on the host, mounted at the same path; `run_dir`, `home`, `uid_gid`: the node's
    values (plan.NODE_VALUES names)."""
    image = image_id or c.image
    host_workdir = _home_path(workdir, home) if workdir else None
    inside = c.workdir or host_workdir
    if c.runtime == "apptainer":
        argv = ["apptainer", "exec", "--nv"] if devices else ["apptainer", "exec"]
        binds = [f"{run_dir}:{run_dir}"] + ([f"{host_workdir}:{host_workdir}"] if host_workdir else [])
        binds += [m.spec() for m in c.mounts]
        for b in binds:
            argv += ["--bind", b]
        if inside:
            argv += ["--pwd", inside]
        return [*argv, *c.options, image, c.python, *inner]
    argv = [c.runtime, "run", "--rm", "--init", "--name", name]
    for value in label_values:
        argv += ["--label", value]
    argv += ["--network", "host"]
    if not any(_flag(o)[0] in ("--shm-size", "--ipc") for o in c.options):
        argv += ["--ipc", "host"]
    argv += list(MEMLOCK)
    if rdma:
        argv += list(RDMA)
    if c.user == "root":
        argv += ["--user", "0:0"]
    else:
        argv += ["--user", uid_gid if c.user == "host" else c.user]
        for p in PASSWD:
            argv += ["-v", f"{p}:{p}:ro"]
        # a HOME of its own: the host's would hide what the image keeps there (/root/yoloe)
        argv += ["--tmpfs", f"{HOME_TMPFS}:rw,mode=1777", "-e", f"HOME={HOME_TMPFS}"]
    argv += ["-v", f"{run_dir}:{run_dir}"]
    if host_workdir:
        argv += ["-v", f"{host_workdir}:{host_workdir}"]
    for m in c.mounts:
        argv += ["-v", m.spec()]
    if inside:
        argv += ["-w", inside]
    for n in env:
        if n != "CUDA_VISIBLE_DEVICES":
            argv += ["-e", n]
    if devices:
        if c.runtime == "docker":
            argv += ["--gpus", '"device=' + ",".join(devices) + '"']
        else:
            for d in devices:
                argv += ["--device", f"nvidia.com/gpu={d}"]
    return [*argv, *c.options, image, c.python, *inner]


def runtime_env(c: Container, devices: Sequence[str] | None) -> dict[str, str]:
    """What the runtime's own environment needs beyond the job's (apptainer: which GPUs)."""
    if c.runtime == "apptainer" and devices:
        return {"APPTAINERENV_CUDA_VISIBLE_DEVICES": ",".join(devices)}
    return {}


def stop_argv(c: Container, name: str) -> list[str]:
    """The stop hook: remove the launch's container, running or not (apptainer: its processes are
    the agent's process group, nothing else to remove)."""
    return [] if c.runtime == "apptainer" else [c.runtime, "rm", "-f", name]


def sweep_argv(c: Container, nonce: str, node: str) -> list[str]:
    """The containers a launch's `nonce` left on `node` (`orch down` after a killed agent), one
    ID a line: by label, so never another run's or another user's."""
    if c.runtime == "apptainer":
        return []
    return [c.runtime, "ps", "-aq", "--filter", f"label=orch.nonce={nonce}", "--filter", f"label=orch.node={node}"]


def leftovers_argv(c: Container, cluster: str) -> list[str]:
    """Every orch container of this cluster's runs on a node, one a line: ID, name, its labels'
    run, state (the preflight's leftover row)."""
    if c.runtime == "apptainer":
        return []
    return [
        c.runtime,
        "ps",
        "-a",
        "--filter",
        f"label=orch.cluster={cluster}",
        "--format",
        '{{.ID}}\t{{.Names}}\t{{.Label "orch.run"}}\t{{.State}}',
    ]


IMAGE_FORMAT = "{{.Id}}\t{{json .Config.Env}}"
"""What `image_argv` prints for a held image: its ID, a tab, its configured environment (JSON)."""


def image_argv(c: Container) -> list[str]:
    """What the node holds under `job.container.image` (the preflight's image row): docker/podman
    print `IMAGE_FORMAT` (exit non-zero when the node lacks it); apptainer the .sif's sha256."""
    if c.runtime == "apptainer":
        return ["sha256sum", c.image]
    return [c.runtime, "image", "inspect", "--format", IMAGE_FORMAT, c.image]


NO_CONTAINER_EXIT = 125
"""`orch exec --container`'s exit on a node where the run has no container (docker's and podman's
own code for a failed `exec`)."""


def exec_argv(c: Container, run_id: str, nonce: str, command: Sequence[str]) -> list[str]:
    """`orch exec --container RUN`: run `command` inside the run's container on whichever node
    this runs on, found by its labels (the run and its launch nonce: one container per node), the
    same argv on every node; one word is a line for `sh -c` inside. docker and podman only."""
    inner = ["sh", "-c", command[0]] if len(command) == 1 else list(command)
    find = (
        f'id=$("$0" ps -q --filter label=orch.run={run_id} --filter label=orch.nonce={nonce}); '
        f'[ -n "$id" ] || {{ echo "orch: no running container of run {run_id} on this node" >&2; '
        f'exit {NO_CONTAINER_EXIT}; }}; exec "$0" exec "$id" "$@"'
    )
    return ["/bin/sh", "-c", find, c.runtime, *inner]


def launched_image(c: Container, argv: Sequence[str]) -> str | None:
    """The image a launch's runtime argv (`run_argv`) ran: the word before the job's python, which
    is the pinned image ID where the preflight resolved one; None when the argv is not one."""
    for i, word in enumerate(argv):
        if i > 0 and word == c.python:
            return str(argv[i - 1])
    return None
