"""The controller's state directory, `$ORCH_HOME` (default `~/.orch`, as SkyPilot keeps `~/.sky`:
the same runs from any shell and any directory), and where a run lives.

    latest                        the id of the latest run
    checks/<inventory name>.json  the last `orch check` of that inventory: results, clock offsets
    runs/<run-id>/                one run: `inventory.yaml` (the snapshot it was planned from),
                                  `plan.json`, `run.json` (run and per-node state, rewritten
                                  atomically), `check.json` (its preflight), `merged.log`,
                                  `nodes/<node>.log` (the copies of the node logs), `report/`

Files and directories are created private (0600/0700) whatever the umask: they can hold
environment values, and run.json says what runs on the nodes. A directory here that someone
else owns or can write (`$ORCH_HOME` made by an older orch under umask 002) is refused with the
fix (`state_dir`), and so are a way to `$ORCH_HOME` through a link someone else owns and a run's
run.json or inventory snapshot that is not this user's alone. `$ORCH_HOME` is resolved once per
process (`home_way`) and every path is built from where it led: what was judged is what is read.
On each node the run
lives in `<job.run_root>/<run-id>/<node-name>/` (see `remote_dir`), so nodes that share one
filesystem never write the same file. Every package that reads or writes these (preflight
saves its reports, logs keeps its copies, run its records, the HTML report reads them) sits
above this module.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .config.inventory import Inventory
from .config.nodes import Node, name_problem
from .config.plan import world_size
from .contract import NodeState, RunState
from .errors import UsageError
from .node.trust import above_problem, own_problem, walk

HOME_VARIABLE = "ORCH_HOME"
DEFAULT_HOME = "~/.orch"


def orch_home() -> Path:
    """The controller's state directory: `$ORCH_HOME`, default `~/.orch` (one place per user,
    whatever the current directory, so `orch logs -f` finds the run from any shell). A leading
    `~` in the variable is the user's home too. Resolved once per process (`home_way`): the
    directory every link on the way leads to, and every path of orch's state is built from it, so
    a link turned elsewhere after that changes nothing of what this process reads or writes."""
    return home_way()[0]


_HOMES: dict[str, tuple[Path, Path, str | None]] = {}


def home_way() -> tuple[Path, Path, str | None]:
    """`$ORCH_HOME` as (where its links lead, as given, why someone else could change the way
    there or None), each walked once per process and value (`node/trust.py` `walk`: every link on
    the way this user's or root's, every directory passed through, up to the home's own, this
    user's or root's and not writable by others unless sticky). `state_dir` refuses the why."""
    given = Path(os.path.abspath(Path(os.environ.get(HOME_VARIABLE) or DEFAULT_HOME).expanduser()))
    found = _HOMES.get(str(given))
    if found is None:
        real, problem = walk(str(given), str(given), last=False)
        # refused (`state_dir`): it stays the path as given, so what is looked up finds what is refused
        found = _HOMES[str(given)] = (given if problem else Path(real), given, problem)
    return found


def remote_dir(inv: Inventory, node: Node, run_id: str) -> str:
    """Where a run lives on a node (may start with `~/`, meaning the login's home there)."""
    return f"{inv.job.run_root.rstrip('/')}/{run_id}/{node.name}"


def _refuse(path: Path, problem: str, own: bool = True) -> UsageError:
    """`problem` (`node/trust.py`'s words) as orch's refusal, with the fix: `chmod 700` of orch's
    own directory, `chmod go-w` of one above `$ORCH_HOME`."""
    text, _, fix = problem.partition("; ")
    hint = f"chmod 700 {path} (and make it yours)" if own else fix.replace(" or set job.run_root elsewhere", "")
    return UsageError(f"orch's state: {text}", f"{hint}, or set ${HOME_VARIABLE} to a directory of your own")


def state_dir(path: Path, create: bool = True) -> Path:
    """`path`, a directory of orch's state (`$ORCH_HOME` or one below it), made mode 0700 with
    every missing directory above it up to `$ORCH_HOME` whatever the umask (`create`); each that
    exists, from `$ORCH_HOME` down, must be this user's (not a link) and writable by no one else,
    and the way to `$ORCH_HOME` (`home_way`: its links and every directory they lead through) this
    user's or root's and not writable by others unless sticky (the node agent's rule for a run
    directory, `node/trust.py`). Otherwise UsageError (exit 2) with the fix: someone else could
    plant a run whose run.json says what orch runs. Returns `path` on the way `home_way` resolved
    (a path given under `$ORCH_HOME` as written is the same path under where it leads): what was
    judged is what is then read."""
    home, given, problem = home_way()
    path = in_home(path)
    if not _under(path, home):  # a file the user asked for elsewhere (`orch report -o`): made private, not judged
        if create:
            for d in reversed([path, *path.parents]):
                _make_private(d)
        return path
    if not create and not os.path.lexists(home):
        return path
    if problem:
        raise _refuse(given, problem, own=False)
    if create and not os.path.lexists(home):
        for d in reversed(home.parents):
            _make_private(d)
    problem = above_problem(str(home.parent), str(given))  # again: what was not there may be now
    if problem:
        raise _refuse(home, problem, own=False)
    rel = path.relative_to(home).parts
    for d in (home.joinpath(*rel[:i]) for i in range(len(rel) + 1)):
        if not os.path.lexists(d):
            if not create:
                return path
            _make_private(d)
        problem = own_problem(str(d))
        if problem:
            raise _refuse(d, problem)
    return path


def in_home(path: Path) -> Path:
    """`path` absolute, and when it is under `$ORCH_HOME` as given, under where `$ORCH_HOME`
    leads (`home_way`), never resolved again: a path outside it is resolved (made private where
    it leads, `state_dir`)."""
    home, given, _problem = home_way()
    path = Path(os.path.abspath(path))
    if _under(path, given) and given != home:
        return home / path.relative_to(given)
    if _under(path, home):
        return path
    return path.resolve()


def _under(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


def _make_private(d: Path) -> None:
    """`d` made mode 0700 where it is missing (the umask cannot widen it); one that is there is left as it is."""
    try:
        d.mkdir(mode=0o700)
    except FileExistsError:
        return
    os.chmod(d, 0o700)


def check_private(path: Path) -> Path:
    """`path`, a file orch reads its state from: this user's and writable by no one else, else
    UsageError (a planted run.json would say what orch runs)."""
    st = os.lstat(path)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022 or not (st.st_mode & 0o170000 == 0o100000):
        raise UsageError(
            f"{path} is not this user's alone (uid {st.st_uid}, mode {st.st_mode & 0o7777:04o}): refusing to read it",
            f"remove it, or chmod 600 {path} if you wrote it",
        )
    return path


def write_private(path: Path, data: str | bytes) -> None:
    """Write atomically (temp file + rename) with mode 0600, in the directory `state_dir` judged."""
    path = state_dir(path.parent) / path.name
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


FULL = (errno.ENOSPC, errno.EDQUOT)
"""A write refused because the controller's disk (or quota) is full."""
RESERVE = 4096
"""run.json is padded (JSON allows trailing whitespace) to hold this much more in the blocks it
already has, so that on a full disk it can still be rewritten in place (`RunDir.write`)."""
ID_ALPHABET = "0123456789abcdefghijkmnpqrstuvwxyz"
"""The random suffix of a run id: lower case and digits, without `l` and `o` (read as 1 and 0)."""


def warn(message: str) -> None:
    """A warning through logging (`orch.store`): a record that could not be written, the run goes
    on. `orch up` passes its own (`UpProgress.warning`) where it has one."""
    logging.getLogger("orch.store").warning("orch: warning: %s", message)


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def _float(value: Any) -> float | None:
    return float(value) if type(value) in (int, float) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class NodeRecord:
    """One node of run.json `nodes`: where its share of the run lives on the node, how to reach its
    agent later, and what the agent last said (docs/CONTRACT.md lists the keys). Written by
    `run.records.node_records` when a run is launched; the agent's answers are merged into it
    (`run.records.merge_status`); read back with `from_json`, which takes every record orch has
    written, keeps the keys it does not name in `more`, and reads a value of the wrong type as not
    said. What runs on a node (`python`, `remote_dir`) is the inventory snapshot's, never run.json's
    alone: `run.records.trusted_records`."""

    node: str
    host: str | None = None
    addr: str | None = None
    node_rank: int = 0
    base_rank: int | None = None
    """The node's first global rank (static rendezvous); None in a record without it."""
    nproc: int | None = None
    """The processes torchrun starts on the node; None in a record without it."""
    remote_dir: str = ""
    python: str = ""
    state: str = NodeState.PENDING
    exit_code: int | None = None
    pid: int | None = None
    pgid: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    nonce: str | None = None
    """The launch's nonce, which guards the agent's stop and status (a record before nonces: None)."""
    sweep: tuple[str, ...] | None = None
    """The argv listing the launch's containers left on the node (`config.jobenv.Sweep.listing`), if any."""
    sweep_remove: tuple[str, ...] | None = None
    """The argv that removes them, the IDs appended (`Sweep.remove`); None in a record before it was
    written (the runtime's own `rm -f` then: `run.agents.sweep_node`)."""
    more: Mapping[str, Any] = field(default_factory=dict)
    """The other keys, as written (the agent's `failed_at`, `signal`, `agent_pid`, `cleanup_left`...)."""

    ORDER: ClassVar[tuple[str, ...]] = (
        "node",
        "host",
        "addr",
        "node_rank",
        "base_rank",
        "nproc",
        "remote_dir",
        "python",
        "state",
        "exit_code",
        "pid",
        "pgid",
        "started_at",
        "finished_at",
    )
    """The keys every record has, in run.json's order; `nonce`, `sweep` and `sweep_remove` follow where set."""

    @property
    def nproc_per_node(self) -> int:
        """The node's processes (0 when the record does not say): what `config.plan.world_size` adds."""
        return self.nproc or 0

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeRecord:
        """A record of run.json. ValueError when it is not a mapping naming its node."""
        if not isinstance(data, Mapping) or not isinstance(data.get("node"), str):
            raise ValueError(f"a run.json node record without its node: {data!r:.80}")
        sweep, remove = data.get("sweep"), data.get("sweep_remove")
        known = {*cls.ORDER, "nonce", "sweep", "sweep_remove"}
        return cls(
            node=data["node"],
            host=_str(data.get("host")),
            addr=_str(data.get("addr")),
            node_rank=_int(data.get("node_rank")) or 0,
            base_rank=_int(data.get("base_rank")),
            nproc=_int(data.get("nproc")),
            remote_dir=_str(data.get("remote_dir")) or "",
            python=_str(data.get("python")) or "",
            state=_str(data.get("state")) or NodeState.PENDING,
            exit_code=_int(data.get("exit_code")),
            pid=_int(data.get("pid")),
            pgid=_int(data.get("pgid")),
            started_at=_float(data.get("started_at")),
            finished_at=_float(data.get("finished_at")),
            nonce=_str(data.get("nonce")) or None,
            sweep=tuple(str(w) for w in sweep) if isinstance(sweep, list) and sweep else None,
            sweep_remove=tuple(str(w) for w in remove) if isinstance(remove, list) and remove else None,
            more={k: v for k, v in data.items() if k not in known},
        )

    def to_json(self) -> dict[str, Any]:
        """The record as run.json holds it (a fresh record's JSON is what orch always wrote)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in self.ORDER}
        out["state"] = str(self.state)
        if self.nonce:
            out["nonce"] = self.nonce
        if self.sweep:
            out["sweep"] = list(self.sweep)
        if self.sweep_remove:
            out["sweep_remove"] = list(self.sweep_remove)
        return {**out, **self.more}


def recorded_nodes(info: Mapping[str, Any]) -> list[NodeRecord]:
    """run.json's node records (`info`: run.json), typed; an entry that names no node is left out."""
    out = []
    for raw in info.get("nodes") or []:
        with contextlib.suppress(ValueError):
            out.append(NodeRecord.from_json(raw))
    return out


def recorded_world_size(info: Mapping[str, Any]) -> int | None:
    """A run's number of ranks as run.json's node records say it (`info`: run.json); None when it
    has no records, or one of them lacks its process count."""
    records = recorded_nodes(info)
    if not records or any(r.nproc is None for r in records):
        return None
    return world_size(records)


def recorded_wall_s(info: Mapping[str, Any]) -> float | None:
    """A finished run's wall time (`info`: run.json): `wall_s` as `orch up` recorded it, else from
    its creation to its last node's end (a run whose controller was killed records none: `orch
    status` brings the nodes' ends into run.json); None when neither is known. The one rule of
    `orch runs` and the report."""
    wall = _float(info.get("wall_s"))
    if wall is not None:
        return wall
    created = _float(info.get("created"))
    ends = [n.finished_at for n in recorded_nodes(info) if n.finished_at is not None]
    return max(ends) - created if ends and created is not None else None


CHECK = "check.json"
"""A run's copy of its preflight report (the check JSON of docs/CONTRACT.md), in its directory."""


@dataclass
class RunDir:
    """One run's directory on the controller."""

    path: Path

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def inventory_path(self) -> Path:
        return self.path / "inventory.yaml"

    @property
    def merged_log(self) -> Path:
        return self.path / "merged.log"

    @property
    def controller_log(self) -> Path:
        """controller.log: the lines the controller itself adds to the merged log (a straggler
        named), in node.log's format, merged with the nodes' copies as a node of its own."""
        return self.path / "controller.log"

    def node_log(self, node: str) -> Path:
        """`nodes/<node>.log`: the controller's copy of a node's log (`logs/fetch.py` keeps it)."""
        return self.path / "nodes" / f"{node}.log"

    def node_logs(self) -> list[Path]:
        """Every node log copy the run has, by file name."""
        return sorted((self.path / "nodes").glob("*.log"))

    @property
    def check_path(self) -> Path:
        """check.json: the preflight this run was launched after (the last `orch check` of its
        inventory when the launch skipped its own), with the clock offsets `orch logs` orders by."""
        return self.path / CHECK

    @property
    def nonce(self) -> str | None:
        """The run's launch nonce (run.json `nonce`): what its node run directories are claimed
        with, so another controller's run of the same id is never started over, stopped or read."""
        value = self.read().get("nonce")
        return check_nonce(str(value), f"{self.path / 'run.json'}") if value else None

    def read(self, name: str = "run.json") -> dict[str, Any]:
        try:
            return dict(json.loads((self.path / name).read_text()))
        except FileNotFoundError:
            return {}

    def write(self, data: dict[str, Any], name: str = "run.json") -> None:
        """Rewrite atomically. run.json is padded to keep `RESERVE` bytes in hand: when the disk is
        full, it is rewritten in place in the blocks it has (OSError if even that cannot be done)."""
        text = json.dumps(data, indent=2, sort_keys=False) + "\n"
        if name != "run.json":
            write_private(self.path / name, text)
            return
        raw = text.encode()
        padded = raw + b" " * (-(len(raw) + RESERVE) % RESERVE + RESERVE - 1) + b"\n"
        try:
            write_private(self.path / name, padded)
        except OSError as exc:
            if exc.errno not in FULL:
                raise
            self._rewrite_in_place(raw, exc)

    def _rewrite_in_place(self, raw: bytes, exc: OSError) -> None:
        """run.json over its own blocks (no new block needed while it fits the old size)."""
        path = self.path / "run.json"
        try:
            size = path.stat().st_size
        except OSError:
            raise exc from None
        if len(raw) + 1 > size:
            raise exc
        fd = os.open(path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            os.pwrite(fd, raw + b" " * (size - len(raw) - 1) + b"\n", 0)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold run.json's lock (flock on `run.lock`): every read-modify-write of run.json, by any
        process (`orch up`, `orch status`, `orch down` beside it), is done under it."""
        fd = os.open(self.path / "run.lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def modify(self, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Read run.json, `change` it, write it back, all under the lock; returns the new content."""
        with self.locked():
            data = self.read()
            change(data)
            self.write(data)
            return data

    def update(self, **fields: Any) -> dict[str, Any]:
        """Read run.json, set fields, write it back (under the lock); returns the new content."""
        return self.modify(lambda data: data.update(fields))

    def inventory(self, as_run: bool = True) -> Inventory:
        """The run's inventory snapshot; `as_run`: with the command line's overrides of its launch
        (run.json `overrides`: nodes chosen, `--env`, args after `--`) and the spares that replaced
        nodes on an automatic retry (run.json `replaced`) in those nodes' places, as the run last ran.
        A Slurm run's nodes are its allocation's either way (run.json `slurm`: its inventory lists none)."""
        from .config.inventory import parse, with_replacements

        data = self.read()
        inv = parse(self.inventory_path.read_text(), str(data.get("inventory") or self.inventory_path))
        if as_run and isinstance(data.get("overrides"), dict):
            from .config.overrides import Overrides, apply

            inv = apply(inv, Overrides.from_json(data["overrides"]))
        if isinstance(data.get("slurm"), dict):  # the allocation's nodes (the file lists none), as the run last ran
            from .config.inventory import Allocation, with_allocation

            inv = with_allocation(inv, Allocation.from_json(data["slurm"]))
        replaced = data.get("replaced") if as_run else None
        if not replaced:
            return inv
        try:
            return with_replacements(inv, replaced)
        except KeyError as exc:
            raise UsageError(
                f"run {self.run_id}: run.json `replaced` does not match its inventory: {exc.args[0]}",
                f"the snapshot is {self.inventory_path}",
            ) from None


def checks_path(inventory_name: str) -> Path:
    """Where `orch check` saves its last report of an inventory."""
    return orch_home() / "checks" / f"{inventory_name}.json"


def _offsets_report(run: RunDir | None, inventory_name: str) -> tuple[dict[str, Any], Path] | None:
    """The saved check report the clock offsets come from, with its path: the run's check.json,
    else the inventory's last `orch check`; the first with a non-empty mapping of offsets."""
    paths = [run.check_path] if run is not None else []
    for path in [*paths, checks_path(inventory_name)]:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        offsets = data.get("offsets_ms") if isinstance(data, dict) else None
        if isinstance(offsets, dict) and offsets:
            return data, path
    return None


def clock_offsets(run: RunDir | None, inventory_name: str) -> tuple[dict[str, float], str | None]:
    """Clock offsets (ms, node minus reference) from the run's check.json, else from the last
    `orch check` of this inventory, with the file they came from; ({}, None) when neither has any.
    The one reader of the saved check reports' offsets (`orch logs`, `orch up`, `orch status`)."""
    found = _offsets_report(run, inventory_name)
    if found is None:
        return {}, None
    data, path = found
    return {str(k): float(v) for k, v in data["offsets_ms"].items() if isinstance(v, (int, float))}, str(path)


def clock_reference(run: RunDir | None, inventory_name: str) -> tuple[str | None, float | None]:
    """What the saved offsets (`clock_offsets`, the same file) are against (`offset_reference`:
    an NTP server, or the controller) and how far the controller itself was off that server
    (`controller_clock.offset_ms`); (None, None) when the report does not say."""
    found = _offsets_report(run, inventory_name)
    if found is None:
        return None, None
    data, _path = found
    ref = data.get("offset_reference")
    cc = data.get("controller_clock")
    off = cc.get("offset_ms") if isinstance(cc, dict) else None
    return (str(ref) if ref else None), (float(off) if isinstance(off, (int, float)) else None)


NONCE_BYTES = 6
"""A launch's nonce: `secrets.token_hex(NONCE_BYTES)`, lowercase hex (`NONCE`)."""
NONCE = re.compile(rf"^[0-9a-f]{{{2 * NONCE_BYTES}}}\Z")


def check_nonce(nonce: str | None, where: str) -> str | None:
    """A nonce read back from run.json (`where`: the file and key), when it is of the form orch
    writes (`NONCE`: it names containers and labels and guards every agent call, so nothing else
    may reach a node), else UsageError (exit 2) naming it; None stays None (a run before nonces)."""
    if nonce is None or NONCE.match(nonce):
        return nonce
    raise UsageError(
        f"{where}: nonce {nonce[:40]!r} is not one orch writes ({2 * NONCE_BYTES} lowercase hex digits): "
        "refusing to use it",
        "run.json was changed after the launch; stop the run's processes by hand",
    )


def check_run_id(run_id: str, where: str = "run id") -> str:
    """`run_id` when it can name a run (a directory here and on every node), else UsageError
    (exit 2): a name like a node's, so `../x` or `a/b` never becomes a path."""
    problem = name_problem(run_id)
    if problem:
        raise UsageError(
            f"{where} {run_id!r}: a run id {problem}", "run ids look like 20261130-093205-v100-k3f9 or exp-42"
        )
    return run_id


class RunStore:
    """All runs under `$ORCH_HOME/runs`."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or orch_home()
        self.root = self.home / "runs"

    def new_run_id(self, inv: Inventory, now: float | None = None) -> str:
        """`20261130-093205-v100-k3f9`: local time, the inventory's name and 4 random characters,
        so two controllers (two users, two `$ORCH_HOME`s) starting runs of one inventory in the
        same second never pick the same id (1 in 34^4 = 1.3 million; drawn again if taken here)."""
        base = time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f"-{inv.name}"
        while True:
            run_id = f"{base}-{''.join(secrets.choice(ID_ALPHABET) for _ in range(4))}"
            if not (self.root / run_id).exists():
                return run_id

    def create(self, inv: Inventory, run_id: str | None = None) -> RunDir:
        """Make the run directory with the inventory snapshot; refuses to reuse an existing id."""
        run_id = check_run_id(run_id, "--run-id") if run_id else self.new_run_id(inv)
        if run_id == LATEST:
            raise UsageError(
                "--run-id latest: `latest` names the latest run wherever a RUN is taken", "pick another --run-id"
            )
        path = self.root / run_id
        state_dir(self.root)
        try:
            path.mkdir(mode=0o700)  # exclusive: of two `orch up --run-id X` here, one gets it
        except FileExistsError:
            raise UsageError(f"run {run_id} already exists in {self.root}", "pick another --run-id") from None
        run = RunDir(path)
        write_private(run.inventory_path, inv.source)
        run.write(
            {
                "run": run_id,
                "inventory": inv.path,
                "name": inv.name,
                "created": time.time(),
                "nonce": secrets.token_hex(NONCE_BYTES),
                "state": RunState.STARTING,
                "nodes": [],
            }
        )
        write_private(self.home / "latest", run_id + "\n")
        return run

    def runs(self) -> Iterator[RunDir]:
        """Every run, oldest first (by run.json `created`, else the directory's time)."""
        if not self.root.is_dir():
            return iter(())
        state_dir(self.root, create=False)
        return iter(sorted((RunDir(p) for p in self.root.iterdir() if p.is_dir()), key=_started))

    def latest_id(self) -> str:
        """The id `latest` names, else UsageError (exit 2): no run yet."""
        latest = self.home / "latest"
        if not latest.exists():
            raise UsageError(f"no runs yet in {self.root}", "start one with: orch up INVENTORY")
        state_dir(self.home, create=False)
        check_private(latest)
        return check_run_id(latest.read_text().strip(), f"{latest} names a run")

    def get(self, run_id: str | None = None) -> RunDir:
        """The named run, else the latest. RUN may be `latest`, a whole id, or any unique prefix
        of one (`20261201-1933`), also with the date left out (`1933`: the run started 19:33).
        Raises UsageError (exit 2) when there is none, or when a prefix fits several (listed)."""
        if run_id is None or run_id == LATEST:
            run_id = self.latest_id()
        else:
            check_run_id(run_id, "run")
        path = self.root / run_id
        if (path / "run.json").exists():
            return trusted(RunDir(path))
        matches = self.matching(run_id)
        if len(matches) == 1:
            return trusted(matches[0])
        if matches:
            ids = [r.run_id for r in reversed(matches)]
            shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
            raise UsageError(
                f"run '{run_id}' is ambiguous: {len(ids)} runs start so: {shown}",
                "give more of the id (orch runs lists them)",
            )
        known = [r.run_id for r in self.runs()][-5:]
        raise UsageError(
            f"unknown run '{run_id}' in {self.root}",
            "recent runs: " + (", ".join(known) if known else "none") + " (orch runs --all lists every one)",
        )

    def matching(self, prefix: str) -> list[RunDir]:
        """The runs whose id starts with `prefix`, oldest first; when none does, those whose id
        after its date (`YYYYMMDD-`) does."""
        runs = [r for r in self.runs() if (r.path / "run.json").exists()]
        whole = [r for r in runs if r.run_id.startswith(prefix)]
        return whole or [r for r in runs if _DATED.match(r.run_id) and r.run_id[9:].startswith(prefix)]


def trusted(run: RunDir) -> RunDir:
    """`run` once its directory (and every one above it up to `$ORCH_HOME`), its run.json and its
    inventory snapshot are this user's alone (`state_dir`, `check_private`): what a run's record
    says is run on the nodes only when no one else could have written it."""
    run = RunDir(state_dir(run.path, create=False))
    for name in ("run.json", "inventory.yaml"):
        if os.path.lexists(run.path / name):
            check_private(run.path / name)
    return run


LATEST = "latest"
"""The RUN that names the latest run (`orch logs latest`), like leaving RUN out."""

_DATED = re.compile(r"\d{8}-")


def _started(run: RunDir) -> tuple[float, str]:
    try:
        created = run.read().get("created")
    except (OSError, ValueError):
        created = None
    if not isinstance(created, (int, float)):
        try:
            created = run.path.stat().st_mtime
        except OSError:
            created = 0.0
    return float(created), run.run_id
