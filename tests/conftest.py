"""Shared pytest fixtures: the real multi-node SSH test cluster (see tests/cluster.py).

- `make_cluster(n=4, mode="loopback"|"netns", node_env=None)`: factory, everything stopped at teardown;
- `cluster`: a 4-node loopback cluster; `netns_cluster`: a 4-node netns cluster (skipped unless root
  and `ip netns` works). Each is started once per session and shared: `TestCluster.reset` before
  and after every test that uses it kills what the test left on the nodes and undoes what it
  changed (a node's environment or clock, a stopped sshd, known_hosts, run and node directories,
  a pulled cable, a qdisc, an extra NIC), so a test sees a cluster as good as new;
- `cluster_keys`: the session's SSH keys (client key, host keys, extra keys for negative tests);
- `slurm_bed` / `slurm_netns_bed`: a real Slurm of four nodes (tests/slurm_bed.py), on loopback or
  one slurmd per network namespace, the session's, reset around each test; `make_slurm_bed`: one
  of the test's own (another task plugin, a node's own name resolving to loopback).

A session-finish hook fails the run if any sshd, chronyd, session process, namespace or link
started by the fixture is still there (under `pytest -n`, each worker's leftovers fail the run).

Under `pytest -n` (pytest-xdist; `make test` runs four workers on this 2-core machine) a test
shares the machine by its mark (setup.cfg says what each mark means; `lane_kind`):

- `alone`: no other test beside it. It holds an exclusive lock that every other test takes shared.
  For a proof that even the background lane's load would change (no test needs it now: the
  relative speeds moved to the foreground lane). Collected last.
- `foreground`: a short duration or a count on processes that mostly wait (a watchdog or heartbeat
  of a few seconds, a follow's lag, a connect bound, an exact number of status polls), or a
  relative speed between nodes (a straggler, a throttled link), which other load would skew. Where this
  session has CPU lanes (root and the cgroup v1 cpu controller, tests/lanes.py) it runs in the
  foreground lane, first in line for the CPU, while the other tests go on beside it in the
  background lane; the foreground tests are one xdist group, so one worker runs them one after the
  other from the start while the others work through the rest. Without lanes it runs alone.
- everything else, orch up scenarios under the default liveness limits included, runs in the
  background lane where there are lanes, the `slow` ones at most one per core (a slot each,
  `_take_a_slot`): their bounds leave a machine loaded that much room. A shared test marked
  `waits` (it mostly waits: a timeout, a reconnect, a child's exit) is handed to the foreground
  tests' worker, after them, so its waiting overlaps the slow tests rather than the run's tail.

Output compared byte for byte over SSH needs no mark: a test node's login runs no dotfiles of this
machine (its cluster has a home of its own, tests/cluster.py), so no login shell's noise (a `pyenv
rehash` racing another test's logins) reaches it. Without -n nothing changes but the order.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

# One intra-op thread per process of the session unless the caller says otherwise: set before
# anything imports torch (OpenMP reads it once, when its library loads), here in the controller, so
# every xdist worker and every child inherits it. Two workers on two cores that each start an
# OpenMP team of two spin-wait on each other: tests/local/test_trainer_models.py took 113 core-s
# (57 s) that way and 16 core-s (9 s) with one thread each. What the trainer itself decides is
# unchanged: it picks min(8, CPUs / local ranks - 1) threads, 1 on this machine, and keeps a count
# OMP_NUM_THREADS gives (tests/unit/test_trainer_data.py covers both). A test node's SSH login
# gets only the environment its sshd config sets, so jobs orch launches over SSH see no change; a
# `transport: local` node inherits it with the rest of the caller's environment.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# `tests.cluster` must import however pytest was started (python -m pytest, .venv/bin/pytest, an IDE)
_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from tests.cluster import (  # noqa: E402
    ACCOUNT,
    SESSION_TAG,
    KeyStore,
    Mode,
    TestCluster,
    daemon_pids,
    is_root,
    leftovers,
    missing,
    netns_supported,
    reap_stale_networks,
)
from tests.containers import (  # noqa: E402
    Dockerd,
    PodmanBed,
    TestImage,
    rootfs_tarball,
    seed_store,
    short_dir,
    start_podman_bed,
    why_no_docker,
    why_no_podman,
)
from tests.lanes import Lanes, reap_stale, unusable  # noqa: E402
from tests.procs_support import take_sigint  # noqa: E402
from tests.slurm_bed import MakeSlurmBed, SlurmBed, why_no_slurm  # noqa: E402
from tests.up_helpers import Orch  # noqa: E402

take_sigint()  # in the controller and every xdist worker: a suite started in the background still tests Ctrl-C

MakeCluster = Callable[..., TestCluster]


@pytest.fixture(scope="session")
def cluster_keys(tmp_path_factory: pytest.TempPathFactory) -> KeyStore:
    """SSH keys generated once per session (ssh-keygen ed25519)."""
    return KeyStore(tmp_path_factory.mktemp("cluster-keys"))


def _skip_unless_netns(mode: str) -> None:
    if mode == "netns":
        reason = netns_supported()
        if reason:
            missing(reason)


@pytest.fixture
def make_cluster(cluster_keys: KeyStore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MakeCluster]:
    """Factory: `make_cluster(n=4, mode="loopback", node_env={"node2": {"TZ": "UTC"}})` → a started cluster."""
    started: list[TestCluster] = []

    def make(
        n: int = 4, mode: Mode = "loopback", node_env: Mapping[str, Mapping[str, str]] | None = None
    ) -> TestCluster:
        _skip_unless_netns(mode)
        root = tmp_path_factory.mktemp(f"cluster-{mode}")
        c = TestCluster(cluster_keys, n=n, mode=mode, node_env=node_env, root=root)
        started.append(c)
        return c.start()

    try:
        yield make
    finally:
        for c in reversed(started):
            c.stop()


def _shared(mode: Mode, keys: KeyStore, factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    _skip_unless_netns(mode)
    c = TestCluster(keys, n=4, mode=mode, root=factory.mktemp(f"cluster-shared-{mode}"))
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture(scope="session")
def _shared_loopback(cluster_keys: KeyStore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    yield from _shared("loopback", cluster_keys, tmp_path_factory)


@pytest.fixture(scope="session")
def _shared_netns(cluster_keys: KeyStore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    yield from _shared("netns", cluster_keys, tmp_path_factory)


def _reset_around(c: TestCluster) -> Iterator[TestCluster]:
    c.reset()
    try:
        yield c
    finally:
        c.reset()


@pytest.fixture
def cluster(_shared_loopback: TestCluster) -> Iterator[TestCluster]:
    """Four real sshd nodes on 127.0.1.1-4 with a chronyd on 127.0.0.1 (the session's, reset)."""
    yield from _reset_around(_shared_loopback)


@pytest.fixture
def netns_cluster(_shared_netns: TestCluster) -> Iterator[TestCluster]:
    """Four nodes, each in its own network/UTS/mount namespace on a bridge (root only; the
    session's, reset)."""
    yield from _reset_around(_shared_netns)


@pytest.fixture(scope="session")
def _shared_account(cluster_keys: KeyStore) -> Iterator[TestCluster]:
    if not is_root():
        missing("a non-root SSH account is made by sshd dropping to it (ForceCommand, setpriv): needs root")
    c = TestCluster(cluster_keys, n=2, mode="loopback", account=ACCOUNT)
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture
def account_cluster(_shared_account: TestCluster) -> Iterator[TestCluster]:
    """Two real sshd nodes whose every login runs as uid:gid `ACCOUNT`, not root (a team's `train`
    account): its own HOME and run root, `job.python` the system's python3 (the session's, reset)."""
    yield from _reset_around(_shared_account)


@pytest.fixture
def cluster_in(request: pytest.FixtureRequest) -> Callable[[Mode], TestCluster]:
    """`cluster_in(mode)`: the session's shared 4-node cluster of that mode (`cluster` or
    `netns_cluster`, reset around the test), for tests parametrized by mode."""
    return lambda mode: request.getfixturevalue("cluster" if mode == "loopback" else "netns_cluster")


# ----------------------------------------------------------------------------- containers


@pytest.fixture(scope="session")
def container_image() -> TestImage:
    """The test image (tests/containers.py): built with debootstrap once per machine and package
    list, cached under $ORCH_TEST_CACHE, imported once into the read-only seed store every node's
    store reads. Needs root, podman, runc, tini and debootstrap (.ci/packages): `missing` otherwise."""
    why = why_no_podman()
    if why:
        missing(why)
    store, image_id = seed_store(log=lambda line: sys.stderr.write(f"\ncontainer image: {line}\n"))
    return TestImage(rootfs_tarball(), store, image_id)


MakePodmanBed = Callable[..., PodmanBed]


@pytest.fixture
def podman_bed(container_image: TestImage) -> Iterator[MakePodmanBed]:
    """Factory: `podman_bed(cluster, nodes=None)` gives every node (or those named) a podman store
    of its own that sees the test image, in its logins' environment (CONTAINERS_CONF,
    CONTAINERS_STORAGE_CONF; the cluster's reset restores it). At teardown every container is
    removed, and one a test left behind fails it: orch must leave none."""
    beds: list[tuple[PodmanBed, Path]] = []

    def make(c: TestCluster, nodes: list[str] | None = None) -> PodmanBed:
        base = short_dir("p")
        bed = start_podman_bed(c, container_image, base, nodes)
        beds.append((bed, base))
        return bed

    try:
        yield make
    finally:
        left: dict[str, list[str]] = {}
        for bed, base in beds:
            left.update(bed.remove_all())
            shutil.rmtree(base, ignore_errors=True)
        if left:
            pytest.fail(f"containers left behind (removed now): {left}", pytrace=False)


@pytest.fixture
def podman_cluster(cluster: TestCluster, podman_bed: MakePodmanBed) -> PodmanBed:
    """The shared 4-node loopback cluster, every node with a podman store of its own holding the
    test image (`PodmanBed`: drop_image, move_tag, containers, wait_no_containers)."""
    return podman_bed(cluster)


@pytest.fixture(scope="session")
def dockerd(container_image: TestImage) -> Iterator[Dockerd]:
    """A dockerd of the session's own (own socket, data root; host networking only) holding the
    test image; `Dockerd.env` (DOCKER_HOST) points a client at it."""
    why = why_no_docker()
    if why:
        missing(why)
    daemon = Dockerd(short_dir("d"), tag_env={"ORCH_TEST_SESSION": SESSION_TAG})
    try:
        daemon.start()
        daemon.docker("import", str(container_image.tarball), container_image.ref)
        yield daemon
    finally:
        daemon.stop()
        shutil.rmtree(daemon.root, ignore_errors=True)


@pytest.fixture
def account_docker(account_cluster: TestCluster, dockerd: Dockerd) -> Iterator[Dockerd]:
    """The session's dockerd reachable from the account bed's logins, as by an account in the
    `docker` group (its socket the account's group's, 0660, for the test); every container a test
    leaves fails it."""
    assert account_cluster.account is not None
    gid = account_cluster.account[1]
    dockerd.root.chmod(0o711)
    os.chown(dockerd.socket, 0, gid)
    dockerd.socket.chmod(0o660)
    for node in account_cluster.nodes:
        account_cluster.set_env(node.name, **dockerd.env)
    before = set(dockerd.containers())
    try:
        yield dockerd
    finally:
        os.chown(dockerd.socket, 0, 0)
        dockerd.root.chmod(0o700)
        left = sorted(set(dockerd.containers()) - before)
        if left:
            dockerd.docker("rm", "-f", *left, check=False)
        assert left == [], f"containers left behind: {left}"


# ----------------------------------------------------------------------------- Slurm


def _slurm_bed(**kw: Any) -> SlurmBed:
    why = why_no_slurm() or (netns_supported() if kw.get("mode") == "netns" else None)
    if why:
        missing(why)
    return SlurmBed(**kw)


def _shared_slurm(bed: SlurmBed) -> Iterator[SlurmBed]:
    try:
        yield bed.start()
    finally:
        bed.stop()


@pytest.fixture(scope="session")
def _shared_slurm_loopback() -> Iterator[SlurmBed]:
    yield from _shared_slurm(_slurm_bed(n=4, mode="loopback"))


@pytest.fixture(scope="session")
def _shared_slurm_netns(cluster_keys: KeyStore) -> Iterator[SlurmBed]:
    yield from _shared_slurm(_slurm_bed(n=4, mode="netns", keys=cluster_keys))


def _reset_slurm_around(bed: SlurmBed) -> Iterator[SlurmBed]:
    bed.reset()
    try:
        yield bed
    finally:
        bed.reset()


@pytest.fixture
def slurm_bed(_shared_slurm_loopback: SlurmBed) -> Iterator[SlurmBed]:
    """A real Slurm (tests/slurm_bed.py): munged, slurmctld and four slurmd `sn1`..`sn4` on
    loopback, the session's, reset around the test (no job, every node idle). Needs root and
    Debian's slurm-wlm and munge (.ci/packages): `missing` otherwise."""
    yield from _reset_slurm_around(_shared_slurm_loopback)


@pytest.fixture
def slurm_netns_bed(_shared_slurm_netns: SlurmBed) -> Iterator[SlurmBed]:
    """The same with one slurmd per network namespace (`node1`..`node4`, each its own hostname,
    address and /etc/hosts; `.cluster` is their TestCluster), the session's, reset around the test."""
    yield from _reset_slurm_around(_shared_slurm_netns)


@pytest.fixture
def make_slurm_bed(cluster_keys: KeyStore) -> Iterator[MakeSlurmBed]:
    """Factory: `make_slurm_bed(n=2, mode="netns", task_plugin="task/affinity", self_loopback=True)`
    → a started bed of the test's own, stopped at teardown."""
    started: list[SlurmBed] = []

    def make(**kw: Any) -> SlurmBed:
        if kw.get("mode") == "netns":
            kw.setdefault("keys", cluster_keys)
        bed = _slurm_bed(**kw)
        started.append(bed)
        return bed.start()

    try:
        yield make
    finally:
        for bed in reversed(started):
            bed.stop()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


_GUARD_HOME = Path(tempfile.mkdtemp(prefix="orch-test-home-"))
"""Where $ORCH_HOME points for the whole session, before any fixture or subprocess: `orch` run by
a test that asks for no home of its own never writes to the real `~/.orch`."""


def pytest_configure(config: pytest.Config) -> None:
    """$ORCH_HOME defaults to `~/.orch`, the user's real runs: point it at the session's own
    directory (whatever the environment set), for session fixtures and every subprocess. The xdist
    controller makes the session's CPU lanes where it can (tests/lanes.py)."""
    os.environ["ORCH_HOME"] = str(_GUARD_HOME / "session")
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    for stale in reap_stale():
        sys.stderr.write(f"removed stale {stale} of an earlier test session\n")
    why = "ORCH_TEST_LANES=0" if os.environ.get("ORCH_TEST_LANES", "1") == "0" else unusable()
    config.stash[_LANES] = None if why else Lanes.create(os.getpid())
    if why:
        sys.stderr.write(f"no CPU lanes ({why}): tests marked foreground run alone\n")


@pytest.fixture(autouse=True)
def _private_orch_home(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees a $ORCH_HOME of its own (created only when something writes there), so a
    test that forgets the `orch_home` fixture shares no runs with another and never touches
    `~/.orch`; `orch_home` and the tests that set the variable themselves override it."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in request.node.nodeid)[-120:]
    monkeypatch.setenv("ORCH_HOME", str(_GUARD_HOME / safe))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Remove namespaces/links that a killed earlier session could not tear down; turn SIGTERM
    (CI or `timeout` stopping the run) into an interrupt, so fixtures still stop their daemons."""
    signal.signal(signal.SIGTERM, _interrupt)
    for item in reap_stale_networks():
        sys.stderr.write(f"removed stale {item} of an earlier test session\n")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when the cluster fixture left anything behind (processes, namespaces, links).
    An xdist worker hands its leftovers to the controller, which fails the run."""
    shutil.rmtree(_GUARD_HOME, ignore_errors=True)
    left = leftovers()
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:
        worker_output["orch_leftovers"] = left
        return
    left += session.config.stash.get(_WORKER_LEFTOVERS, [])
    lanes = session.config.stash.get(_LANES, None)
    if lanes is not None:
        lanes.remove()
        if lanes.path.exists():
            left.append(f"cgroup {lanes.path}")
    if left:
        sys.stderr.write("\norch test cluster left behind:\n" + "".join(f"  {x}\n" for x in left))
        session.exitstatus = 1


_WORKER_LEFTOVERS = pytest.StashKey[list[str]]()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """(xdist controller) Collect what a worker's session left behind."""
    left = list(getattr(node, "workeroutput", {}).get("orch_leftovers") or [])
    node.config.stash.setdefault(_WORKER_LEFTOVERS, []).extend(f"{node.gateway.id}: {x}" for x in left)


# ----------------------------------------------------------------------------- pytest -n


def lane_kind(item: pytest.Item) -> str:
    """How a test shares the machine under pytest -n (setup.cfg says what the marks mean):
    `alone` (marked alone: no other test beside it), `foreground` (marked foreground: first in line
    for the CPU, the others beside it in the background lane) or `shared` (everything else). The
    mark may be the test's own or its module's `pytestmark`."""
    if item.get_closest_marker("alone") is not None:
        return "alone"
    if item.get_closest_marker("foreground") is not None:
        return "foreground"
    return "shared"


def _lanes(config: pytest.Config) -> Lanes | None:
    """The session's CPU lanes (tests/lanes.py), as the controller handed them to this worker."""
    path = getattr(config, "workerinput", {}).get("orch_lanes")
    return Lanes(Path(path)) if path else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order tests are handed out in. With CPU lanes (root, under pytest -n): the foreground
    tests first, as one unit of work (`_foreground_first`: one worker runs them one after the other
    while the others work through the rest beside them in the background lane), the `waits` tests
    after them on that worker (shared tests otherwise); then the shared tests, the `slow` ones
    first (two long tests side by side, then the short ones fill in, rather than one long test
    left at the end with the other workers idle), the longest first by
    tests/durations.json (the tail of the run is then short tests); the `alone` ones last, as one
    unit of work too.
    Without lanes a foreground test runs alone, so it goes last with those."""
    lanes = _lanes(config)
    rank = {"foreground": 0, "shared": 1, "alone": 2} if lanes else {"foreground": 1, "shared": 0, "alone": 1}
    took = _durations()
    items.sort(
        key=lambda item: (
            rank[lane_kind(item)],
            not _waits(item),
            item.get_closest_marker("slow") is None,
            -took.get(item.nodeid, 0.0),
        )
    )
    if lanes is not None:  # for the controller's scheduler, before this worker reports its collection
        listed = lanes.kinds_list()
        tmp = listed.with_name(f"{listed.name}.{os.getpid()}")
        kinds = ((_scope_kind(item), item.nodeid) for item in items)
        tmp.write_text("".join(f"{kind} {nodeid}\n" for kind, nodeid in kinds if kind != "shared"))
        tmp.replace(listed)


def _waits(item: pytest.Item) -> bool:
    """Marked `waits` (and shared): a test that mostly waits, a few % of a core over seconds."""
    return lane_kind(item) == "shared" and item.get_closest_marker("waits") is not None


def _scope_kind(item: pytest.Item) -> str:
    """What the scheduler reads from the kinds list: `lane_kind`, or `waits` for a shared test
    marked so (it goes to the foreground tests' worker, after them, and runs as a shared test)."""
    return "waits" if _waits(item) else lane_kind(item)


def _durations() -> dict[str, float]:
    """Seconds each test of 2 s or more took in a full run (tests/durations.json, node id to
    seconds; refresh it from a JUnit file when tests change much): only the order tests are handed
    out in depends on it, so a stale or missing entry costs time, never a result."""
    path = Path(__file__).with_name("durations.json")
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own, which always answers
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """(xdist controller) With CPU lanes: `_ForegroundFirst`; otherwise xdist's own for --dist."""
    lanes = config.stash.get(_LANES, None)
    return None if lanes is None else _foreground_first(config, log, lanes)


def _foreground_first(config: pytest.Config, log: Any, lanes: Lanes) -> Any:
    """xdist's load-by-scope scheduler, in the order `pytest_collection_modifyitems` left the tests
    (no reordering by scope size), where the foreground tests are one scope, the alone tests
    another and every other test a scope of its own (as the workers listed them,
    `Lanes.kinds_list`): the foreground scope goes out first, so one worker takes the foreground
    tests from the start, and after them the `waits` tests (shared tests that mostly wait: they
    wait while the other workers keep the CPU busy with slow tests, not in the run's tail, where
    they left a core idle); the alone scope goes out last, to one worker, which holds the machine
    from the first of them to the last (`_EXCLUSIVE`); a worker is given one more test whenever it
    has two or fewer left. (xdist's --dist loadgroup would group with xdist_group marks, but xdist
    3.8 renames an item through `item._nodeid`, which pytest 9 no longer reads, so its groups never
    form.)"""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ForegroundFirst(LoadScopeScheduling):  # type: ignore[misc]
        kinds: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.kinds is None:  # read once every worker has collected
                lines = lanes.kinds_list().read_text().splitlines()
                self.kinds = {nid: kind for kind, nid in (ln.split(" ", 1) for ln in lines)}
            kind = self.kinds.get(nodeid, nodeid)
            return "foreground" if kind == "waits" else kind

    return ForegroundFirst(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """(xdist controller) Hand every worker the session's CPU lanes."""
    lanes = node.config.stash.get(_LANES, None)
    if lanes is not None:
        node.workerinput["orch_lanes"] = str(lanes.path)


_LANES = pytest.StashKey["Lanes | None"]()


def _lock(fh: Any, how: int, held: contextlib.ExitStack) -> None:
    fcntl.flock(fh, how)
    held.callback(fcntl.flock, fh, fcntl.LOCK_UN)


_EXCLUSIVE: list[contextlib.ExitStack] = []
"""The exclusive lock this worker still holds from its last test: an `alone` test followed by
another on the same worker keeps it, so no shared test slips in between and the next one need not
wait for the machine to drain again."""


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """Under xdist, by `lane_kind`: an `alone` test holds the session's lock exclusively, every
    other test holds it shared; whoever wants it exclusively first closes a gate the shared takers
    pass through, so a stream of shared tests on the other workers cannot keep it out, and keeps
    it while its worker's next test is alone too. A `foreground` test also holds the foreground
    lock (one at a time) and runs in the foreground lane, the others in the background lane: the
    worker and its clusters' daemons are moved there first. Without lanes a foreground test is an
    alone test. The locks are taken outside the test's timeout (waiting for another worker is not
    the test's time)."""
    uid = getattr(item.config, "workerinput", {}).get("testrunuid")
    if uid is None:
        yield
        return
    lanes = _lanes(item.config)
    kind = _effective_kind(item, lanes)
    base = Path(tempfile.gettempdir()) / f"orch-test-{uid}"
    with contextlib.ExitStack() as held:
        if _EXCLUSIVE:  # the alone test before this one on this worker kept the lock for it
            held.enter_context(_EXCLUSIVE.pop())
        else:
            if kind == "foreground":
                _lock(held.enter_context(open(f"{base}.fg", "a")), fcntl.LOCK_EX, held)  # noqa: SIM115
            elif kind == "shared" and item.get_closest_marker("slow") is not None and not _waits(item):
                _take_a_slot(base, held)
            how = fcntl.LOCK_EX if kind == "alone" else fcntl.LOCK_SH
            main = held.enter_context(open(f"{base}.lock", "a"))  # noqa: SIM115 (closed with the test)
            with open(f"{base}.gate", "a") as gate, contextlib.ExitStack() as passing:
                _lock(gate, how, passing)
                _lock(main, how, held)
        if lanes is not None:
            lanes.enter("bg" if kind == "shared" else "fg", [os.getpid(), *daemon_pids()])
        started = time.time()
        yield
        _timeline(item, kind, started)
        if kind == "alone" and nextitem is not None and _effective_kind(nextitem, lanes) == "alone":
            _EXCLUSIVE.append(held.pop_all())


def _timeline(item: pytest.Item, kind: str, started: float) -> None:
    """With $ORCH_TEST_TIMELINE (a file): one JSON line per test, when it ran on which worker and
    how it shared the machine, to see where a run's time goes (the locks' waits are outside)."""
    path = os.environ.get("ORCH_TEST_TIMELINE")
    if path:
        worker = getattr(item.config, "workerinput", {}).get("workerid", "")
        line = {"test": item.nodeid, "worker": worker, "kind": kind, "start": started, "end": time.time()}
        with open(path, "a") as fh:
            fh.write(json.dumps(line) + "\n")


def _effective_kind(item: pytest.Item, lanes: Lanes | None) -> str:
    """`lane_kind`, where a foreground test without lanes is an alone test."""
    kind = lane_kind(item)
    return "alone" if kind == "foreground" and lanes is None else kind


def _take_a_slot(base: Path, held: contextlib.ExitStack) -> None:
    """Hold one of the session's slots for slow shared tests (trainer runs, orch up scenarios: the
    ones that keep a core busy), one per core: more workers than cores (`make test` runs four on
    two cores, so that one can run the foreground tests while two work through the rest, and the
    short tests of the run's tail run four at a time) never run more of them at once than there
    are cores. The short shared tests take no slot: they mostly
    wait (an SSH round trip, a timeout, a child's exit), and a third beside two slow ones fills the
    CPU they leave (with a slot each, 120 s of the last full run ran at 40 to 75 % CPU). A free slot
    is taken at once; when none is, wait for this worker's own."""
    count = max(1, os.cpu_count() or 1)
    for i in range(count):
        fh = held.enter_context(open(f"{base}.slot{i}", "a"))  # noqa: SIM115 (closed with the test)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        held.callback(fcntl.flock, fh, fcntl.LOCK_UN)
        return
    fh = held.enter_context(open(f"{base}.slot{os.getpid() % count}", "a"))  # noqa: SIM115
    _lock(fh, fcntl.LOCK_EX, held)


@pytest.fixture
def orch_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private $ORCH_HOME (runs, check reports) and plain, uncoloured output for the test."""
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NO_COLOR", "1")
    return tmp_path / "home"


@pytest.fixture
def orch(tmp_path: Path) -> Orch:
    """`python -m orchestrator` with a private $ORCH_HOME (tests/up_helpers.py)."""
    return Orch(tmp_path / "home")
