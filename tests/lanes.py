"""CPU lanes for the test session under pytest -n: a test whose proof is a short duration runs in
the foreground lane, every other test in the background lane, so the others can go on beside it
without stealing the CPU it needs.

A lane is a cgroup of the v1 ``cpu`` controller (``/sys/fs/cgroup/cpu``): ``fg`` with
``FG_SHARES``, ``bg`` with ``BG_SHARES``. When both want a core the foreground gets
FG_SHARES / (FG_SHARES + BG_SHARES) of it (94 %), and it is scheduled first when it wakes; when it
waits (on a watchdog, a heartbeat, a lag) the background takes the whole machine. Tasks in a
cgroup other than the root are outside the kernel's autogroups, so every SSH login a test node
starts (a session, an autogroup of its own in the root cgroup) is weighed by its lane, not as one
more equal claimant.

What is in a lane is decided per test by `tests/conftest.py`: the worker process and the daemons
of the clusters it has started (sshd, namespace holders, chronyd; `tests.cluster.daemon_pids`) are
moved there before the test, so whatever they start during it (orch, a login, torchrun, the ranks)
is born in that lane. The session's controller creates the lanes and removes them at the end;
lanes a killed session left behind are removed by the next (`reap_stale`).

Root only, and only where the v1 ``cpu`` controller is mounted; elsewhere `create` says why not
and the session runs as it did before lanes: a foreground test then runs with no other test
beside it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
PREFIX = "orchlanes-"
FG_SHARES = 16384
BG_SHARES = 1024
LANES = ("fg", "bg")


def unusable(root: Path = CPU_ROOT) -> str | None:
    """Why lanes cannot be made here, or None."""
    if os.geteuid() != 0:
        return "not root"
    if not (root / "cpu.shares").exists():
        return f"no cgroup v1 cpu controller at {root}"
    if not os.access(root, os.W_OK):
        return f"{root} is not writable"
    return None


def pid_alive(pid: int) -> bool:
    """Whether a process of that pid exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _move(group: Path, pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            (group / "cgroup.procs").write_text(f"{pid}\n")
        except OSError as exc:  # gone meanwhile
            if exc.errno != errno.ESRCH:
                raise


def _tasks(group: Path) -> list[int]:
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _remove_tree(group: Path) -> None:
    """Move every task of ``group`` and its sub-groups to the cgroup above it, then remove them."""
    subs = sorted((p for p in group.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
    for each in [*subs, group]:  # the deepest first: a cgroup with a sub-group cannot be removed
        for _ in range(50):  # tasks may fork while they are moved: until the group is empty
            pids = _tasks(each)
            if not pids:
                break
            _move(group.parent, pids)
        with contextlib.suppress(OSError):
            each.rmdir()


class Lanes:
    """The session's two lanes under ``path`` (``<CPU_ROOT>/orchlanes-<controller pid>``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, owner: int, root: Path = CPU_ROOT) -> Lanes:
        """Make the lanes of the session whose controller is ``owner``.

        Raises:
            OSError: the cgroup cannot be made (`unusable` says why before).
        """
        lanes = cls(root / f"{PREFIX}{owner}")
        lanes.path.mkdir(exist_ok=True)
        for name, shares in (("fg", FG_SHARES), ("bg", BG_SHARES)):
            (lanes.path / name).mkdir(exist_ok=True)
            (lanes.path / name / "cpu.shares").write_text(f"{shares}\n")
        return lanes

    def kinds_list(self) -> Path:
        """Where the workers list the session's foreground and alone tests (``KIND NODEID`` a line)
        for the controller's scheduler: a file in the temporary directory, named after the lanes."""
        return Path(tempfile.gettempdir()) / f"{self.path.name}.kinds"

    def enter(self, lane: str, pids: Iterable[int]) -> None:
        """Move ``pids`` (each with all its threads) into ``lane``; a pid already gone is skipped."""
        if lane not in LANES:
            raise ValueError(f"lane must be one of {LANES}, not {lane!r}")
        _move(self.path / lane, pids)

    def remove(self) -> None:
        """Move whatever is still in the lanes back to the root cgroup and remove them (and the
        list of the foreground and alone tests)."""
        _remove_tree(self.path)
        self.kinds_list().unlink(missing_ok=True)


def lane_of(pid: int) -> Path | None:
    """The cgroup of the v1 cpu controller that ``pid`` is in (a directory under CPU_ROOT), or None."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _num, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return CPU_ROOT / path.lstrip("/")
    return None


@contextlib.contextmanager
def reaping() -> Iterator[None]:
    """The lock every reap holds: two sessions starting at once (a test may start one) never
    remove the same group, and a test can make a stale group and reap it before anyone else."""
    with open(Path(tempfile.gettempdir()) / f"{PREFIX}reap.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def reap_stale(root: Path = CPU_ROOT, *, locked: bool = False) -> list[str]:
    """Remove the lanes of earlier sessions whose controller is gone (killed before teardown).
    ``locked``: the caller holds `reaping` already."""
    if unusable(root):
        return []
    removed = []
    with contextlib.nullcontext() if locked else reaping():
        for group in root.glob(f"{PREFIX}*"):
            owner = group.name[len(PREFIX) :]
            if group.is_dir() and owner.isdigit() and not pid_alive(int(owner)):
                _remove_tree(group)
                removed.append(f"cgroup {group}")
    return removed
