"""Shared pytest fixtures: the real multi-node SSH test cluster (see tests/cluster.py).

- `make_cluster(n=4, mode="loopback"|"netns", node_env=None)`: factory, everything stopped at teardown;
- `cluster`: a 4-node loopback cluster; `netns_cluster`: a 4-node netns cluster (skipped unless root
  and `ip netns` works). Each is started once per session and shared: `TestCluster.reset` before
  and after every test that uses it kills what the test left on the nodes and undoes what it
  changed (a node's environment or clock, a stopped sshd, known_hosts, run and node directories,
  a pulled cable, a qdisc, an extra NIC), so a test sees a cluster as good as new;
- `cluster_keys`: the session's SSH keys (client key, host keys, extra keys for negative tests).

A session-finish hook fails the run if any sshd, chronyd, session process, namespace or link
started by the fixture is still there (under `pytest -n`, each worker's leftovers fail the run).

Under `pytest -n` (pytest-xdist; `make test` runs two workers) a test marked `alone` never runs
beside another test: it holds an exclusive lock that every other test takes shared. `alone` is for
a test whose proof is a duration or a count that load changes: a bound of a few seconds, a
watchdog or heartbeat of a few seconds, a relative speed (a straggler, a throttled link), an exact
number of status polls (a stream silent for 3 s is polled) or a follow's lag. Output compared byte
for byte over SSH needs no mark: a test node's login runs no dotfiles of this machine (its cluster
has a home of its own, tests/cluster.py), so no login shell's noise (a `pyenv rehash` racing
another test's logins) reaches it. Every other test, orch up scenarios under the default liveness
limits included, runs two at a time: their bounds leave a loaded machine room. The `alone` tests
are collected last, so the others run two at a time first. Without -n nothing changes but that
order.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import sys
import tempfile
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
    KeyStore,
    Mode,
    TestCluster,
    leftovers,
    missing,
    netns_supported,
    reap_stale_networks,
)
from tests.up_helpers import Orch  # noqa: E402

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

    def make(n: int = 4, mode: Mode = "loopback",
             node_env: Mapping[str, Mapping[str, str]] | None = None) -> TestCluster:
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


@pytest.fixture
def cluster_in(request: pytest.FixtureRequest) -> Callable[[Mode], TestCluster]:
    """`cluster_in(mode)`: the session's shared 4-node cluster of that mode (`cluster` or
    `netns_cluster`, reset around the test), for tests parametrized by mode."""
    return lambda mode: request.getfixturevalue("cluster" if mode == "loopback" else "netns_cluster")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


_GUARD_HOME = Path(tempfile.mkdtemp(prefix="orch-test-home-"))
"""Where $ORCH_HOME points for the whole session, before any fixture or subprocess: `orch` run by
a test that asks for no home of its own never writes to the real `~/.orch`."""


def pytest_configure(config: pytest.Config) -> None:
    """$ORCH_HOME defaults to `~/.orch`, the user's real runs: point it at the session's own
    directory (whatever the environment set), for session fixtures and every subprocess."""
    os.environ["ORCH_HOME"] = str(_GUARD_HOME / "session")


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


def runs_alone(item: pytest.Item) -> bool:
    """Whether a test must not share the machine with another test of this session: it is marked
    `alone` (its module's `pytestmark` or the test itself; setup.cfg says what the mark means)."""
    return item.get_closest_marker("alone") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests that may run alongside others first, the `slow` ones of them first (under xdist
    two long tests side by side, then the short ones fill in, rather than one long test left at
    the end with the other worker idle), then those that run alone; otherwise in collection order."""
    items.sort(key=lambda item: (runs_alone(item), item.get_closest_marker("slow") is None))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """Under xdist: a test that runs alone holds the session's lock exclusively, any other test
    holds it shared. Taken outside the test's timeout (waiting for the other worker is not the
    test's time)."""
    uid = getattr(item.config, "workerinput", {}).get("testrunuid")
    if uid is None:
        yield
        return
    path = Path(tempfile.gettempdir()) / f"orch-test-{uid}.lock"
    with open(path, "a") as fh, contextlib.ExitStack() as held:
        fcntl.flock(fh, fcntl.LOCK_EX if runs_alone(item) else fcntl.LOCK_SH)
        held.callback(fcntl.flock, fh, fcntl.LOCK_UN)
        yield



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
