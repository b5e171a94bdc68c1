"""The container runtimes a job can run in: one table entry each (`RUNTIMES`), what orch runs
them with and what they answer. Pure.

Nothing else in orch names a runtime: the inventory's rules, the job's environment
(`config/jobenv.py`: the launch line, the stop hook, the sweep), the preflight's facts and its
`container` check, `orch exec --container` and `orch image push` ask the entry what it can do
(tests/unit/test_runtimes.py fails on a runtime's name anywhere else). A new runtime is an entry
here, its tests and its docs.

Two kinds of runtime are in the table. docker and podman keep each container as an object of
their own, apart from the job's processes (`keeps_containers`): named and labelled, removed by
name, listed by label, entered with `exec`, with its own /dev/shm, devices, limits and user, the
image addressed by a name or an ID. apptainer runs the job's processes themselves in the image, on
the host's namespaces: nothing outlives them, and the image is a `.sif` file at the same absolute
path on every node, known by its sha256 (`image_file`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ..shell import Script

IMAGE_FORMAT = "{{.Id}}\t{{json .Config.Env}}"
"""What a daemon runtime's `inspect` prints for an image it holds: the ID, a tab, its environment."""
GRAPH_ROOT = Script(
    'r=$("$0" --log-level=debug image exists "$1" 2>&1 >/dev/null '
    "| sed -n 's/^.*Using graph root \\(\\/[^\"]*\\)\"\\{0,1\\}$/\\1/p' | tail -n 1); "
    'case $r in /*) echo "$r" ;; *) exec "$0" info --format "{{.Store.GraphRoot}}" ;; esac',
    guarded=True,
)
"""podman's store directory, as podman says it while it opens the store for a cheap question
(`image exists` of a name, `$1`, at `--log-level=debug`: its "Using graph root DIR" line); where it
says no such line (a podman that words it otherwise), `podman info` answers. `info` costs 0.2-0.3
CPU-s a call against 0.03 here (it asks the host, the OCI runtime, conmon and the network), which
every node of an image push paid before a byte was sent."""
GRAPH_ROOT_PROBE = "orch-store-probe:none"
"""The image name `GRAPH_ROOT` asks about (held or not, it does not matter: only the log is read)."""
IMAGE_ID = "[0-9a-f]{64}"
"""An image ID as docker and podman print it (after `sha256:`), and a .sif's sha256: 64 hex digits."""
RUN_PARTS = (
    "gpus_first",
    "pull",
    "name",
    "labels",
    "network",
    "ipc",
    "memlock",
    "rdma",
    "user",
    "mounts",
    "workdir",
    "env",
)
"""What a run argv may say between the runtime's `run` words and the image, each a capability of
the runtimes whose `parts` list it, in their order (the GPUs come last, before the options, unless
`gpus_first`): `config/jobenv.py` writes each."""


TRUE_WORDS = ("1", "t", "T", "TRUE", "true", "True")
FALSE_WORDS = ("0", "f", "F", "FALSE", "false", "False")
"""A boolean flag's `=VALUE` as Go's flag package (every runtime's CLI) reads it."""


class Option(NamedTuple):
    """One flag of `job.container.options` as the runtime reads it (`Grammar.read`)."""

    at: int
    """Where it starts in the list (a cluster's flags share their word's index)."""
    name: str
    """Its long name (`--detach` for `-d`); `--name` as written where the grammar knows no other."""
    value: str | None
    """Its value: a boolean's `true`/`false` (`--rm` alone is `true`), else what it takes (None: none given)."""
    written: str
    """The word it was written in (`-itd`)."""


@dataclass(frozen=True)
class Grammar:
    """How a runtime's `run` reads its flags (Go's pflag, as docker, podman and apptainer parse them):
    `--name=value` or `--name value`; a boolean takes no next word (`--rm`, `--rm=false`, `-d=true`);
    `-itd` is `-i -t -d`, and the first one-letter flag of a cluster that takes a value takes the rest
    of the word (`-u0`, `-eNAME=V`) or else the next word (`-ie NAME=V`). What is read is judged by
    meaning (`config/container.option_problems`), never by spelling."""

    short: Mapping[str, str]
    """One-letter flag → its long name (`d` → `--detach`)."""
    booleans: frozenset[str]
    """The long flags that take no next word."""

    def read(self, options: Sequence[str]) -> tuple[list[Option], list[tuple[int, str]]]:
        """(every flag, (index, why) for each word that is not one: a bare word (the image and its
        command come after the options, never in them), `--`, a one-letter flag the runtime does
        not have). A value that looks like a flag itself (`--x -d`) is read as one too: a flag the
        grammar does not know as a boolean cannot hide a refused one as its value."""
        out: list[Option] = []
        bad: list[tuple[int, str]] = []
        i = 0
        while i < len(options):
            word = options[i]
            if word == "--" or not looks_like_flag(word):
                bad.append((i, "is not a flag: the options are runtime flags (and their values), before the image"))
                i += 1
                continue
            if word.startswith("--"):
                name, eq, value = word.partition("=")
                if eq:
                    out.append(Option(i, name, self._bool(name, value), word))
                    i += 1
                    continue
                if name in self.booleans:
                    out.append(Option(i, name, "true", word))
                    i += 1
                    continue
            else:
                found = self._cluster(i, word, out, bad)
                if found is None:
                    i += 1
                    continue
                name = found
            nxt = options[i + 1] if i + 1 < len(options) else None
            out.append(Option(i, name, nxt, word))
            i += 1 if nxt is None or looks_like_flag(nxt) else 2
        return out, bad

    def _bool(self, name: str, value: str) -> str:
        """A boolean's `=VALUE` as `true`/`false` (as written where Go would refuse it)."""
        if name not in self.booleans:
            return value
        return "true" if value in TRUE_WORDS else "false" if value in FALSE_WORDS else value

    def _cluster(self, i: int, word: str, out: list[Option], bad: list[tuple[int, str]]) -> str | None:
        """`-itd`, `-u0`, `-d=true`, `-ie`: each letter's flag into `out`; the long name of the
        last one where it takes the next word as its value (the caller reads it), else None."""
        letters = word[1:]
        for j, letter in enumerate(letters):
            name = self.short.get(letter)
            if name is None:
                bad.append((i, f"-{letter} is no one-letter flag of this runtime's run"))
                return None
            rest = letters[j + 1 :]
            if rest.startswith("="):
                out.append(Option(i, name, self._bool(name, rest[1:]), word))
                return None
            if name in self.booleans:
                out.append(Option(i, name, "true", word))
                continue
            if rest:
                out.append(Option(i, name, rest, word))
                return None
            return name
        return None


def looks_like_flag(word: str) -> bool:
    """`--x`, `-x`: a flag's word, as opposed to a value (`-1`, `/path`, `name`)."""
    return word.startswith("--") and len(word) > 2 or word.startswith("-") and word[1:2].isalpha()


@dataclass(frozen=True)
class Runtime:
    """One container runtime: its argvs, flags and words. `{image}`, `{archive}`, `{devices}` (the
    GPUs, comma-separated) and `{device}` (one GPU) are filled in where they appear."""

    name: str
    run: tuple[str, ...]
    """The start of the job's command (then `parts`, the GPUs, `job.container.options`, the image,
    the job's python and its arguments)."""
    parts: tuple[str, ...]
    """What its run argv says, in order (`RUN_PARTS`)."""
    mount: str
    """The flag before each `HOST:CONTAINER[:ro]` mount."""
    workdir: str
    """The flag before the working directory inside the container."""
    inspect: tuple[str, ...]
    """What prints the ID of `{image}` on a machine that holds it (exit non-zero, saying one of
    `no_such_image`, where it does not): docker/podman `IMAGE_FORMAT`, apptainer `sha256sum`."""
    no_such_image: tuple[str, ...]
    """Words (lower case) of `inspect`'s error when the image is not there (any other error: the
    runtime could not be asked)."""
    gpus_once: tuple[str, ...] = ()
    """The GPUs as flags given once (`{devices}`)."""
    gpus_each: tuple[str, ...] = ()
    """The GPUs as flags given for each (`{device}`)."""
    gpus_env: Mapping[str, str] = field(default_factory=dict)
    """The GPUs chosen by the runtime's own environment (`{devices}`)."""
    keeps_containers: bool = False
    """A container outlives its client: named, labelled, its own namespaces (see the module)."""
    rm: tuple[str, ...] = ()
    """Removes containers by name or ID, running or not (empty: nothing outlives the job's processes)."""
    ps: tuple[str, ...] = ()
    """Lists containers (`ps` and its one word after the program; `--filter`, `-q`, `-a`, `--format` follow)."""
    exec: tuple[str, ...] = ()
    """Runs a command in a running container (the program and its one word; the ID and the command follow)."""
    save: tuple[str, ...] = ()
    """Exports `{image}` into the file `{archive}` (empty: the image is a file, copied as it is)."""
    load: tuple[str, ...] = ()
    """Imports an archive from stdin."""
    size: tuple[str, ...] = ()
    """Prints the size in bytes of `{image}` (what decides whether `orch image push` chains it)."""
    store: tuple[str, ...] = ()
    """Prints the directory its images are stored in (a load needs the archive's size free there)."""
    tmp_copies: int = 0
    """How many copies of the archive its `load` writes into `TMPDIR` (else /var/tmp) besides the
    one its store keeps, all there at once: podman's 2 (the archive staged, then each layer copied
    beside it: a 12 MB archive peaked at 36 MB on a filesystem holding both), docker's 0 (its
    daemon stores the stream as it reads it)."""
    image_file: bool = False
    """The image is an absolute `.sif` path, the same on every node, known by its sha256."""
    gpu_fix: str = ""
    """The fix where the runtime cannot give a container the node's GPUs."""
    id_shape: str = IMAGE_ID
    """What its image ID looks like (a regular expression, matched whole): `held` takes nothing
    else for one, as it becomes the launch's image word (`Pins.image_id`) and a line on a terminal."""
    grammar: Grammar = field(default_factory=lambda: Grammar({}, frozenset()))
    """How its `run` reads `job.container.options` (judged by meaning: `config/container.py`)."""
    label_format: str = ""
    """What `ps --format` prints for the value of the label `{key}` of each container (docker
    knows `.Label`, podman 4.3 only `index .Labels`)."""
    pull_never: tuple[str, ...] = ()
    """What keeps its `run` from pulling an image a node lacks (`job.container.pull: never`)."""
    limits_fix: str = ""
    """The fix where the node lets no container raise a limit past the node's own (no CAP_SYS_RESOURCE)."""
    init_fix: str = ""
    """The fix where its `--init` finds no init binary on the node."""

    @property
    def program(self) -> str:
        """What must be installed on a node: the first word of `inspect` (a daemon's CLI, or sha256sum)."""
        return self.inspect[0]

    @property
    def id_word(self) -> str:
        """What its image ID is called in a row: `image`, or `sha256` for an image file."""
        return "sha256" if self.image_file else "image"

    @property
    def id_what(self) -> str:
        """Its image ID in words, with its shape: `an image ID (64 hex digits)`."""
        return f"{'a sha256' if self.image_file else 'an image ID'} (64 hex digits)"

    def is_image_id(self, text: str) -> bool:
        return re.fullmatch(self.id_shape, text) is not None

    @property
    def pulls(self) -> bool:
        """Its launch can pull an image a node lacks (`job.container.pull: missing`)."""
        return not self.image_file

    @property
    def runs_by_id(self) -> bool:
        """Its launch can name the image by the ID the preflight found (`Pins.image_id`)."""
        return not self.image_file

    def label_field(self, key: str) -> str:
        """The `ps --format` field of label `key`'s value."""
        return self.label_format.replace("{key}", key)

    def inspect_argv(self, image: str) -> list[str]:
        return fill(self.inspect, image=image)

    def save_argv(self, image: str, archive: str) -> list[str]:
        return fill(self.save, image=image, archive=archive)

    def size_argv(self, image: str) -> list[str]:
        return fill(self.size, image=image)

    def gpu_flags(self, devices: Sequence[str]) -> list[str]:
        """The run argv's flags that give the container `devices` (none without devices)."""
        if not devices:
            return []
        out = fill(self.gpus_once, devices=",".join(devices))
        for d in devices:
            out += fill(self.gpus_each, device=d)
        return out

    def gpu_env(self, devices: Sequence[str] | None) -> dict[str, str]:
        """What the runtime's own environment needs to give the container `devices`."""
        if not devices:
            return {}
        return {k: v.format(devices=",".join(devices)) for k, v in self.gpus_env.items()}


def fill(words: Sequence[str], **values: str) -> list[str]:
    """`words` with each `{name}` replaced by its value (the rest left as written: `{{.Id}}` stays)."""
    out = []
    for w in words:
        for name, value in values.items():
            w = w.replace("{" + name + "}", value)
        out.append(w)
    return out


_DAEMON_GONE = ("no such image", "no such object", "image not known", "not found")
_DAEMON_SHORT = {
    "a": "--attach",
    "c": "--cpu-shares",
    "d": "--detach",
    "e": "--env",
    "h": "--hostname",
    "i": "--interactive",
    "l": "--label",
    "m": "--memory",
    "p": "--publish",
    "P": "--publish-all",
    "q": "--quiet",
    "t": "--tty",
    "u": "--user",
    "v": "--volume",
    "w": "--workdir",
}
"""`docker run --help`'s and `podman run --help`'s one-letter flags (the same in both)."""


def _longs(words: str) -> frozenset[str]:
    """`"rm tty"` → {`--rm`, `--tty`}."""
    return frozenset("--" + w for w in words.split())


_DAEMON_BOOLEANS = _longs(
    "detach disable-content-trust help init interactive no-healthcheck oom-kill-disable privileged publish-all "
    "quiet read-only rm sig-proxy tty"
)
"""The flags `docker run` reads as booleans (20.10 to 28)."""
_PODMAN_BOOLEANS = _DAEMON_BOOLEANS | _longs(
    "env-host http-proxy no-hosts passwd read-only-tmpfs replace rmi rootfs tls-verify unsetenv-all"
)
"""And those podman (4.3 on) adds."""
_LIMITS = (
    "the node lets no container raise a limit past its own (no CAP_SYS_RESOURCE: a node that is itself a "
    "container, or a hardened host): raise the node's hard limits (limits.conf, the service's LimitNOFILE/"
    "LimitMEMLOCK), or give job.container.options --ulimit values within them (e.g. --ulimit=nofile=N:N "
    "--ulimit=nproc=N:N), "
)


def _daemon(
    name: str,
    gpus_once: tuple[str, ...],
    gpus_each: tuple[str, ...],
    gpu_fix: str,
    booleans: frozenset[str],
    label_format: str,
    limits_fix: str,
    init_fix: str,
    store: tuple[str, ...],
    tmp_copies: int,
) -> Runtime:
    """docker and podman: the same CLI, but for how each is given GPUs, the flags it knows, how it
    prints a label, its configuration's fixes, and where its images and its load's input are stored."""
    return Runtime(
        name=name,
        run=(name, "run", "--rm", "--init"),
        parts=("pull", "name", "labels", "network", "ipc", "memlock", "rdma", "user", "mounts", "workdir", "env"),
        mount="-v",
        workdir="-w",
        inspect=(name, "image", "inspect", "--format", IMAGE_FORMAT, "{image}"),
        no_such_image=_DAEMON_GONE,
        gpus_once=gpus_once,
        gpus_each=gpus_each,
        keeps_containers=True,
        rm=(name, "rm", "-f"),
        ps=(name, "ps"),
        exec=(name, "exec"),
        save=(name, "save", "-o", "{archive}", "{image}"),
        load=(name, "load"),
        size=(name, "image", "inspect", "--format", "{{.Size}}", "{image}"),
        store=store,
        tmp_copies=tmp_copies,
        gpu_fix=gpu_fix,
        grammar=Grammar(_DAEMON_SHORT, booleans),
        label_format=label_format,
        pull_never=("--pull", "never"),
        limits_fix=_LIMITS + limits_fix,
        init_fix=init_fix,
    )


TABLE: dict[str, Runtime] = {
    r.name: r
    for r in (
        _daemon(
            "docker",
            gpus_once=("--gpus", '"device={devices}"'),
            gpus_each=(),
            gpu_fix="install nvidia-container-toolkit, then nvidia-ctk runtime configure --runtime=docker and restart "
            "docker",
            store=("docker", "info", "--format", "{{.DockerRootDir}}"),
            tmp_copies=0,
            booleans=_DAEMON_BOOLEANS,
            label_format='{{.Label "{key}"}}',
            limits_fix="or lower docker's own (default-ulimits in /etc/docker/daemon.json)",
            init_fix="docker-init (tini) comes with docker: reinstall docker, or set init-path in "
            "/etc/docker/daemon.json",
        ),
        _daemon(
            "podman",
            gpus_once=(),
            gpus_each=("--device", "nvidia.com/gpu={device}"),
            gpu_fix="generate the CDI spec podman reads: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml",
            store=tuple(GRAPH_ROOT.argv("podman", GRAPH_ROOT_PROBE)),
            tmp_copies=2,
            booleans=_PODMAN_BOOLEANS,
            label_format='{{index .Labels "{key}"}}',
            limits_fix="or empty podman's own (default_ulimits = [] under [containers] in containers.conf)",
            init_fix="install catatonit (Debian's podman only recommends it), or install tini and set "
            'init_path = "/usr/bin/tini" under [containers] in containers.conf',
        ),
        Runtime(
            name="apptainer",
            run=("apptainer", "exec"),
            parts=("gpus_first", "mounts", "workdir"),
            mount="--bind",
            workdir="--pwd",
            inspect=("sha256sum", "{image}"),
            no_such_image=("no such file",),
            gpus_once=("--nv",),
            gpus_env={"APPTAINERENV_CUDA_VISIBLE_DEVICES": "{devices}"},
            image_file=True,
            grammar=Grammar(
                {
                    "B": "--bind",
                    "c": "--contain",
                    "C": "--containall",
                    "e": "--cleanenv",
                    "f": "--fakeroot",
                    "H": "--home",
                    "i": "--ipc",
                    "n": "--net",
                    "o": "--overlay",
                    "p": "--pid",
                    "S": "--scratch",
                    "u": "--userns",
                    "W": "--workdir",
                    "w": "--writable",
                },
                _longs(
                    "allow-setuid cleanenv compat contain containall disable-cache fakeroot ipc keep-privs net "
                    "no-eval no-home no-https no-init no-privs no-umask nv nvccli pid rocm userns uts writable "
                    "writable-tmpfs"
                ),
            ),
        ),
    )
}
"""Every runtime orch runs a job in, by its name in `job.container.runtime`."""
RUNTIMES = tuple(TABLE)
"""Their names, in the table's order (the inventory's rule, `--runtime`'s choices)."""


def runtime(name: str) -> Runtime:
    """The entry of `name` (KeyError for a runtime orch does not know: the inventory refused it)."""
    return TABLE[name]


# ----------------------------------------------------------------------------- held images


@dataclass(frozen=True)
class HeldImage:
    """What a machine holds under an image name (its runtime's `inspect`, read by `held`)."""

    image_id: str | None
    """Its ID (without `sha256:`) or the .sif's sha256; None: not there."""
    env: Mapping[str, str]
    """The image's configured environment (NVIDIA_REQUIRE_CUDA, CUDA_VERSION...)."""
    error: str | None = None
    """Why the runtime could not be asked, or why its answer is no ID; None when it answered one."""
    fix: str | None = None
    """For an answer that is no ID: what to look at on that machine (else the caller's own fix)."""


def held(rt: Runtime, rc: int | None, out: str, err: str) -> HeldImage:
    """What `rt.inspect_argv` printed, read: the one reading of "which image does this machine
    hold" (the preflight's image rows and pins, `orch image push` on the nodes and here). An
    answer that is not of the ID's shape (`Runtime.id_shape`) is an error, never an ID."""
    out, err = (out or "").strip(), (err or "").strip()
    if rc != 0:
        said = err.splitlines()[-1] if err else f"exit {rc}"
        if rc is not None and any(k in err.lower() for k in rt.no_such_image):
            return HeldImage(None, {})
        return HeldImage(None, {}, said)
    ident, _, env_json = (out.splitlines()[0] if out else "").partition("\t")
    env: dict[str, str] = {}
    try:
        items = json.loads(env_json) if env_json.startswith("[") else []
    except ValueError:
        items = []
    for item in items or []:
        key, eq, value = str(item).partition("=")
        if eq:
            env[key] = value
    words = ident.split()
    found = (words[0] if words else "").removeprefix("sha256:")
    if found and not rt.is_image_id(found):
        return HeldImage(
            None,
            {},
            f"{rt.program} answered {found[:80]}, not {rt.id_what}",
            f"{rt.program} there must print the ID alone on its first line: is it a wrapper, or does a login "
            "script print there?",
        )
    return HeldImage(found or None, env)
