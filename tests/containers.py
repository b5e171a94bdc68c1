"""A real container runtime for the tests: podman (with runc) and dockerd, a real image, no registry.

- The image: a Debian base system built offline once with ``debootstrap --variant=minbase`` from
  the machine's Debian mirror (`rootfs_tarball`: about 45 s and 330 MB here), cached under
  ``$ORCH_TEST_CACHE`` (default ``/var/cache/orch-tests``), keyed by the suite, the package list and
  the mirror, so a CI run builds it at most once and later runs not at all. `seed_store` imports
  it once into a podman image store beside the tarball; every test node's store reads it from there
  (``additionalimagestores``), so a node holding the image costs nothing per test.
- `PodmanStore`: one podman image and container store (its own ``containers.conf`` and
  ``storage.conf``, passed with ``CONTAINERS_CONF`` / ``CONTAINERS_STORAGE_CONF``). Here crun fails on
  the cgroup v1/v2 hybrid mounts and the sandbox lacks CAP_SYS_RESOURCE, so the configuration says
  ``runtime = "runc"`` and ``default_ulimits = []``; file locks and a private tmp_dir keep stores
  from sharing podman's shared-memory lock table. A node's store with ``image=False`` lacks the
  image ("image missing on one node"), and `PodmanStore.move_tag` imports a different image under
  the same name into one node's own store ("a tag that moved on one node").
- `PodmanBed` (the ``podman_cluster`` fixture): a store per node of a test cluster, set in the
  nodes' login environment, every container removed at teardown (one left behind fails the test).
  With ``on_node=True`` each store keeps its graph, run root and temporary files (``TMPDIR``:
  where `podman load` stages an archive) in the node's own ``NODE_LOCAL`` (its private tmpfs on a
  cluster with ``tmpfs``): eight nodes' images are eight copies, and a full node fails its load.
- `Dockerd`: ``dockerd`` from docker.io on its own socket, data root and exec root, host networking
  only (``--iptables=false --bridge=none``), cgroupfs.
- `python_mounts`: what must be bind-mounted into the image for the job's Python environment (the
  interpreter's prefix, the venv, the ``.pth`` paths: this repository and the packages) to run
  ``python -m trainer`` and torchrun inside, as users mount their code and data.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUITE = "bookworm"
PACKAGES = ("python3", "libxcb1", "libgl1", "libglib2.0-0")
"""The image's packages beyond minbase: python3 (a system Python, as official images have one) and
the shared libraries OpenCV (ultralytics) loads."""
PRUNE = ("usr/share/doc", "usr/share/man", "usr/share/locale", "var/lib/apt/lists", "var/cache/apt/archives")
"""What the image need not carry (100 MB of 430: documentation, translations, debootstrap's .debs)."""
IMAGE = "localhost/orch-test:bookworm"
"""The test image's name in every store."""
LABEL = "orch.run"
"""The label orch puts on every container it starts (the run id)."""


def cache_dir() -> Path:
    return Path(os.environ.get("ORCH_TEST_CACHE", "/var/cache/orch-tests"))


def debian_mirror() -> str | None:
    """The Debian mirror apt on this machine uses ($ORCH_TEST_DEBIAN_MIRROR first); None where apt
    names none: debootstrap then picks its own default."""
    if os.environ.get("ORCH_TEST_DEBIAN_MIRROR"):
        return os.environ["ORCH_TEST_DEBIAN_MIRROR"].rstrip("/")
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                m = re.match(r"^\s*URIs:\s*(\S+)", line) or re.match(r"^\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s", line)
                if m and "security" not in m.group(1):
                    return m.group(1).rstrip("/")
    return None


def image_key() -> str:
    """What names the cached image: a different package list or mirror builds another."""
    text = json.dumps([SUITE, PACKAGES, PRUNE, debian_mirror() or ""])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def why_no_podman() -> str | None:
    """None when podman can run the test image here, else why not (a `missing` reason)."""
    if os.geteuid() != 0:
        return "the container tests need root (podman with runc, per-node image stores)"
    for tool in ("podman", "runc", "tini"):
        if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            return f"the container tests need {tool} (.ci/packages)"
    if (
        not (cache_dir() / f"rootfs-{image_key()}.tar").exists()
        and shutil.which("debootstrap", path="/usr/sbin:/usr/bin:/sbin:/bin") is None
    ):
        return "the container tests build their image with debootstrap (.ci/packages)"
    return None


def why_no_docker() -> str | None:
    if os.geteuid() != 0:
        return "the docker tests need root (their own dockerd)"
    for tool in ("dockerd", "containerd", "runc"):
        if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            return f"the docker tests need {tool} (docker.io in .ci/packages)"
    return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on path: one builder per machine (xdist workers, concurrent sessions)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def rootfs_tarball(log: Any = None) -> Path:
    """The image's root file system as a tar (built once per key with debootstrap, then cached)."""
    cache = cache_dir()
    target = cache / f"rootfs-{image_key()}.tar"
    with _locked(cache / f"rootfs-{image_key()}.lock"):
        if target.exists():
            return target
        work = Path(tempfile.mkdtemp(prefix="rootfs-", dir=cache))
        try:
            root = work / "root"
            argv = [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(root),
            ]
            mirror = debian_mirror()
            if mirror is not None:
                argv.append(mirror)
            started = time.monotonic()
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                raise RuntimeError(
                    f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
                )
            for rel in PRUNE:
                shutil.rmtree(root / rel, ignore_errors=True)
            partial = work / "rootfs.tar"
            subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], check=True, timeout=300)
            partial.replace(target)
            if log is not None:
                log(f"built {target} in {time.monotonic() - started:.0f} s")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


# ----------------------------------------------------------------------------- podman


PODMAN = "/usr/bin/podman"


@dataclass
class PodmanStore:
    """One podman store: its configuration files, graph root and run root, under `root` (keep it
    short: conmon's sockets live below the run root)."""

    root: Path
    images_from: Sequence[Path] = ()
    """Read-only image stores (graph roots) this one also sees: the seed store's image."""
    read_only: bool = False
    data: Path | None = None
    """Where the graph, run root and temporary files are, as the process that runs podman sees the
    path (a test node's `NODE_LOCAL`, made by `start_podman_bed`); None: under `root`, beside the
    configuration, which always stays on this machine's disk where every node reads it."""

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.write()

    @property
    def graph(self) -> Path:
        return (self.data or self.root) / "graph"

    @property
    def tmp(self) -> Path:
        """podman's `tmp_dir`; with `data`, also the logins' TMPDIR (where `podman load` stages stdin)."""
        return (self.data or self.root) / "tmp"

    @property
    def conf(self) -> Path:
        return self.root / "containers.conf"

    @property
    def storage_conf(self) -> Path:
        return self.root / "storage.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment that makes `podman` use this store."""
        env = {"CONTAINERS_CONF": str(self.conf), "CONTAINERS_STORAGE_CONF": str(self.storage_conf)}
        if self.data is not None:
            env["TMPDIR"] = str(self.tmp)
        return env

    def write(self) -> None:
        # with `data`, `podman load` stages what it reads there too (not in the machine's /var/tmp)
        staging = f'image_copy_tmp_dir = "{self.tmp}"\n' if self.data is not None else ""
        self.conf.write_text(
            "[containers]\n"
            "default_ulimits = []\n"  # the runtime's default ulimits exceed this sandbox's hard limits
            'init_path = "/usr/bin/tini"\n'  # --init: Debian's podman has no catatonit; tini is the same idea
            "[engine]\n"
            'runtime = "runc"\n'  # crun fails on the cgroup v1/v2 hybrid mounts here
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            'lock_type = "file"\n'  # not the shared-memory lock table every store would share
            f'tmp_dir = "{self.tmp}"\n'
            f"{staging}"
        )
        extra = ", ".join(json.dumps(str(p)) for p in self.images_from)
        self.storage_conf.write_text(
            "[storage]\n"
            'driver = "overlay"\n'
            f'graphroot = "{self.graph}"\n'
            f'runroot = "{(self.data or self.root) / "run"}"\n'
            "[storage.options]\n"
            f"additionalimagestores = [{extra}]\n"
        )

    def see_images_of(self, *stores: Path) -> None:
        """Change which read-only stores this one sees (none: the seed's image is missing here)."""
        self.images_from = tuple(stores)
        self.write()

    def podman(
        self, *args: str, check: bool = True, timeout: float = 300, enter: Sequence[str] = (), **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run podman on this store (`enter`: an argv prefix, e.g. a test node's nsenter)."""
        env = {**os.environ, **self.env}
        argv = [*enter, PODMAN, *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, **kw)
        if check and proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def image_id(self, ref: str = IMAGE, enter: Sequence[str] = ()) -> str | None:
        """The full image ID `ref` resolves to in this store (None: not here)."""
        proc = self.podman("image", "inspect", "--format", "{{.Id}}", ref, check=False, enter=enter)
        return proc.stdout.strip() or None if proc.returncode == 0 else None

    def import_rootfs(
        self, tarball: Path, ref: str = IMAGE, changes: Sequence[str] = (), enter: Sequence[str] = ()
    ) -> str:
        """`podman import` the tarball as `ref` (each import is a new image ID); its ID."""
        flags = [f"--change={c}" for c in changes]
        out = self.podman("import", *flags, str(tarball), ref, enter=enter).stdout.strip().splitlines()
        return out[-1].removeprefix("sha256:")

    def move_tag(self, tarball: Path, ref: str = IMAGE, enter: Sequence[str] = ()) -> str:
        """Give `ref` in this store another image (same files, another config): a tag that moved."""
        return self.import_rootfs(tarball, ref, changes=("ENV ORCH_TEST_MOVED_TAG=1",), enter=enter)

    def containers(self, label: str | None = None, enter: Sequence[str] = ()) -> list[str]:
        """The names of every container of this store, running or not (`label`: `key=value`)."""
        flags = ["--filter", f"label={label}"] if label else []
        out = self.podman("ps", "-a", *flags, "--format", "{{.Names}}", check=False, enter=enter).stdout
        return [line for line in out.split() if line]

    def remove_all(self, enter: Sequence[str] = ()) -> list[str]:
        """Remove every container of this store; the names it removed."""
        names = self.containers(enter=enter)
        if names:
            self.podman("rm", "-f", "-t", "0", *names, check=False, enter=enter)
        return names


def seed_store(log: Any = None) -> tuple[PodmanStore, str]:
    """The machine's read-only store holding the test image (imported once per image key, beside
    the cached tarball) and the image's ID there."""
    cache = cache_dir()
    tarball = rootfs_tarball(log)
    store = PodmanStore(cache / f"store-{image_key()}")
    ready = store.root / "image-id"
    with _locked(cache / f"store-{image_key()}.lock"):
        image_id = ready.read_text().strip() if ready.exists() else ""
        if not image_id or store.image_id(IMAGE) != image_id:
            image_id = store.import_rootfs(tarball, IMAGE)
            ready.write_text(image_id + "\n")
    return store, image_id


@dataclass
class TestImage:
    """The session's test image: its tarball, the seed store that holds it, its ID there."""

    __test__ = False

    tarball: Path
    store: PodmanStore
    id: str
    ref: str = IMAGE


def python_mounts(python: str) -> list[str]:
    """The directories to bind-mount (same path inside) for `python` and every package it imports
    to run inside the image: its prefix and base prefix and every `sys.path` entry outside the
    system's directories, and the checkout the trainer is imported from, innermost folded into
    outermost. Raises when the interpreter itself is the system's (under /usr): the image's own
    Python would shadow it."""
    code = (
        "import json, os, sys, trainer; print(json.dumps([sys.prefix, sys.base_prefix, "
        "os.path.dirname(os.path.dirname(os.path.abspath(trainer.__file__))), *sys.path]))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    prefix, base, *path = json.loads(out)  # the checkout the trainer is imported from: an editable install
    # reaches it through a finder, not sys.path, and the tests' job scripts live there too
    if os.path.realpath(base).startswith(("/usr/", "/bin/", "/lib")):
        raise RuntimeError(f"{python}: a system interpreter ({base}) cannot be mounted into the image")
    dirs = set()
    for entry in [prefix, base, *path]:
        real = os.path.realpath(entry) if entry else ""
        if not real or not os.path.isdir(real) or real.startswith(("/usr/", "/etc/", "/bin/", "/lib")):
            continue
        dirs.add(real)
        if os.path.abspath(entry) != real and os.path.isdir(entry):
            dirs.add(os.path.abspath(entry))
    # a venv's bin/python is a symlink to the base interpreter: both folders travel
    ordered = sorted(dirs)
    return [d for i, d in enumerate(ordered) if not any(d.startswith(o + "/") for o in ordered[:i])]


@dataclass
class PodmanBed:
    """A podman store per node of a test cluster (`stores`), each node's logins pointed at it."""

    cluster: Any
    image: TestImage | None
    """The seed's image every store sees (None: stores that start empty)."""
    stores: dict[str, PodmanStore] = field(default_factory=dict)

    def enter(self, node: str) -> list[str]:
        return self.cluster._enter(self.cluster.node(node))

    def podman(self, node: str, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        """podman on that node (its namespaces and store), as its logins run it."""
        return self.stores[node].podman(*args, enter=self.enter(node), **kw)

    def image_id(self, node: str, ref: str = IMAGE) -> str | None:
        return self.stores[node].image_id(ref, enter=self.enter(node))

    def drop_image(self, node: str) -> None:
        """That node no longer sees the seed's image (nor anything else)."""
        self.stores[node].see_images_of()

    def move_tag(self, node: str, ref: str = IMAGE) -> str:
        """That node's `ref` becomes another image; its new ID."""
        if self.image is None:
            raise RuntimeError("move_tag needs a bed started with the seed's image")
        return self.stores[node].move_tag(self.image.tarball, ref, enter=self.enter(node))

    def containers(self, node: str, label: str | None = None) -> list[str]:
        return self.stores[node].containers(label, enter=self.enter(node))

    def all_containers(self, label: str | None = None) -> dict[str, list[str]]:
        """Every node's containers (those with a `label`, `key=value`), nodes without any left out."""
        found = {node: self.containers(node, label) for node in self.stores}
        return {node: names for node, names in found.items() if names}

    def wait_no_containers(self, label: str, within: float) -> dict[str, list[str]]:
        """Poll until no node has a container with that label or `within` seconds passed; what is left."""
        deadline = time.monotonic() + within
        while True:
            left = self.all_containers(label)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)

    def remove_all(self) -> dict[str, list[str]]:
        """Remove every node's containers; what was there."""
        removed = {node: store.remove_all(enter=self.enter(node)) for node, store in self.stores.items()}
        return {node: names for node, names in removed.items() if names}


NODE_STORE = "podman"
"""The folder under a node's `NODE_LOCAL` that holds its store's data with ``on_node=True``."""


def start_podman_bed(
    cluster: Any, image: TestImage | None, base: Path, nodes: Sequence[str] | None = None, on_node: bool = False
) -> PodmanBed:
    """A store per node (its configuration under `base`) that sees the seed's image (`image` None:
    no image at all), set in each node's logins. `on_node`: the store's data in the node's own
    `NODE_LOCAL` (see the module docstring); the cluster's `reset` empties it with the rest."""
    bed = PodmanBed(cluster, image)
    for node in nodes or [n.name for n in cluster.nodes]:
        data = None
        if on_node:
            data = Path(cluster.NODE_LOCAL) / NODE_STORE
            cluster.node_path(node, data / "tmp").mkdir(parents=True, exist_ok=True)  # TMPDIR must exist
        store = PodmanStore(base / node, images_from=(image.store.graph,) if image else (), data=data)
        bed.stores[node] = store
        cluster.set_env(node, **store.env)
    return bed


def short_dir(tag: str) -> Path:
    """A short private directory under /tmp (conmon's socket paths are limited to 108 bytes)."""
    return Path(tempfile.mkdtemp(prefix=f"orchctr{os.getpid()}{tag}-", dir="/tmp"))


# ----------------------------------------------------------------------------- docker


@dataclass
class Dockerd:
    """A dockerd of its own: socket, data root, exec root and pid file under `root`; host
    networking only. `env` points a docker client at it (DOCKER_HOST)."""

    root: Path
    tag_env: Mapping[str, str] = field(default_factory=dict)
    """Added to the daemon's environment (the test session's tag, so the leak check finds it)."""
    proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def env(self) -> dict[str, str]:
        return {"DOCKER_HOST": f"unix://{self.socket}"}

    def start(self, timeout: float = 60) -> Dockerd:
        self.root.mkdir(parents=True, exist_ok=True)
        argv = [
            "dockerd",
            f"--host=unix://{self.socket}",
            f"--data-root={self.root / 'data'}",
            f"--exec-root={self.root / 'exec'}",
            f"--pidfile={self.root / 'docker.pid'}",
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
            "--ip-masq=false",
            "--exec-opt",
            "native.cgroupdriver=cgroupfs",
            "--storage-driver=overlay2",
        ]
        log = open(self.root / "dockerd.log", "ab")  # noqa: SIM115 (the daemon's, closed below)
        with log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, **self.tag_env},
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while self.docker("info", "--format", "{{.ServerVersion}}", check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.root / "dockerd.log").read_text(errors="replace")[-3000:]
                self.stop()
                raise RuntimeError(f"dockerd did not answer within {timeout:g} s: {tail}")
            time.sleep(0.2)
        return self

    def docker(
        self, *args: str, check: bool = True, timeout: float = 300, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        argv = ["/usr/bin/docker", *args]  # Debian's client, whatever else is on PATH
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **self.env}, **kw
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def containers(self, label: str | None = None) -> list[str]:
        flags = ["--filter", f"label={label}"] if label else []
        out = self.docker("ps", "-a", *flags, "--format", "{{.Names}}", check=False).stdout
        return [line for line in out.split() if line]

    def stop(self, grace: float = 20) -> None:
        """Remove every container, stop the daemon (and the containerd it started)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            names = self.containers()
            if names:
                self.docker("rm", "-f", *names, check=False)
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        # what dockerd leaves mounted under its roots (its exec root's netns/default, an nsfs): the
        # directory cannot be removed while it is
        prefix = str(self.root) + "/"
        with open("/proc/self/mounts") as fh:
            points = [line.split()[1] for line in fh if line.split()[1].startswith(prefix)]
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=30, check=False)
