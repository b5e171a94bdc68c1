"""The controller's state directory, `$ORCH_HOME` (default `./.orch`), and where a run lives.

    latest                        the id of the latest run
    checks/<inventory name>.json  the last `orch check` of that inventory: results, clock offsets
    runs/<run-id>/                one run: `inventory.yaml` (the snapshot it was planned from),
                                  `plan.json`, `run.json` (run and per-node state, rewritten
                                  atomically), `check.json` (its preflight), `merged.log`,
                                  `nodes/<node>.log` (the copies of the node logs), `report/`

Files are created private (0600/0700): they can hold environment values. On each node the run
lives in `<job.run_root>/<run-id>/<node-name>/` (see `remote_dir`), so nodes that share one
filesystem never write the same file. Every package that reads or writes these (preflight
saves its reports, logs keeps its copies, run its records, the HTML report reads them) sits
above this module.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config.inventory import Inventory
from .config.nodes import Node, name_problem
from .contract import RunState
from .errors import UsageError


def orch_home() -> Path:
    """The controller's state directory: `$ORCH_HOME`, default `./.orch`."""
    return Path(os.environ.get("ORCH_HOME") or ".orch")


def remote_dir(inv: Inventory, node: Node, run_id: str) -> str:
    """Where a run lives on a node (may start with `~/`, meaning the login's home there)."""
    return f"{inv.job.run_root.rstrip('/')}/{run_id}/{node.name}"


def write_private(path: Path, data: str | bytes) -> None:
    """Write atomically (temp file + rename) with mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
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
    def check_path(self) -> Path:
        """check.json: the preflight this run was launched after (the last `orch check` of its
        inventory when the launch skipped its own), with the clock offsets `orch logs` orders by."""
        return self.path / CHECK

    def read(self, name: str = "run.json") -> dict[str, Any]:
        try:
            return dict(json.loads((self.path / name).read_text()))
        except FileNotFoundError:
            return {}

    def write(self, data: dict[str, Any], name: str = "run.json") -> None:
        write_private(self.path / name, json.dumps(data, indent=2, sort_keys=False) + "\n")

    def update(self, **fields: Any) -> dict[str, Any]:
        """Read run.json, set fields, write it back; returns the new content."""
        data = self.read()
        data.update(fields)
        self.write(data)
        return data

    def inventory(self, as_run: bool = True) -> Inventory:
        """The run's inventory snapshot; `as_run`: with the spares that replaced nodes on an
        automatic retry (run.json `replaced`) in those nodes' places, as the run last ran."""
        from .config.inventory import parse, with_replacements

        data = self.read()
        inv = parse(self.inventory_path.read_text(), str(data.get("inventory") or self.inventory_path))
        replaced = data.get("replaced") if as_run else None
        if not replaced:
            return inv
        try:
            return with_replacements(inv, replaced)
        except KeyError as exc:
            raise UsageError(f"run {self.run_id}: run.json `replaced` does not match its inventory: {exc.args[0]}",
                             f"the snapshot is {self.inventory_path}") from None


def checks_path(inventory_name: str) -> Path:
    """Where `orch check` saves its last report of an inventory."""
    return orch_home() / "checks" / f"{inventory_name}.json"


def clock_offsets(run: RunDir | None, inventory_name: str) -> tuple[dict[str, float], str | None]:
    """Clock offsets (ms, node minus reference) from the run's check.json, else from the last
    `orch check` of this inventory, with the file they came from; ({}, None) when neither has any.
    The one reader of the saved check reports' offsets (`orch logs`, `orch up`, `orch status`)."""
    paths = [run.check_path] if run is not None else []
    for path in [*paths, checks_path(inventory_name)]:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        offsets = data.get("offsets_ms") if isinstance(data, dict) else None
        if isinstance(offsets, dict) and offsets:
            return {str(k): float(v) for k, v in offsets.items() if isinstance(v, (int, float))}, str(path)
    return {}, None


def clock_reference(run: RunDir | None, inventory_name: str) -> tuple[str | None, float | None]:
    """What the saved offsets (`clock_offsets`, the same file) are against (`offset_reference`:
    an NTP server, or the controller) and how far the controller itself was off that server
    (`controller_clock.offset_ms`); (None, None) when the report does not say."""
    paths = [run.check_path] if run is not None else []
    for path in [*paths, checks_path(inventory_name)]:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or not data.get("offsets_ms"):
            continue
        ref = data.get("offset_reference")
        cc = data.get("controller_clock")
        off = cc.get("offset_ms") if isinstance(cc, dict) else None
        return (str(ref) if ref else None), (float(off) if isinstance(off, (int, float)) else None)
    return None, None


def check_run_id(run_id: str, where: str = "run id") -> str:
    """`run_id` when it can name a run (a directory here and on every node), else UsageError
    (exit 2): a name like a node's, so `../x` or `a/b` never becomes a path."""
    problem = name_problem(run_id)
    if problem:
        raise UsageError(f"{where} {run_id!r}: a run id {problem}", "run ids look like 20261130-093205-v100 or exp-42")
    return run_id


class RunStore:
    """All runs under `$ORCH_HOME/runs`."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home or orch_home()
        self.root = self.home / "runs"

    def new_run_id(self, inv: Inventory, now: float | None = None) -> str:
        """`20261130-093205-v100`, with `-2`, `-3`... if that second is already taken."""
        base = time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f"-{inv.name}"
        run_id, n = base, 1
        while (self.root / run_id).exists():
            n += 1
            run_id = f"{base}-{n}"
        return run_id

    def create(self, inv: Inventory, run_id: str | None = None) -> RunDir:
        """Make the run directory with the inventory snapshot; refuses to reuse an existing id."""
        run_id = check_run_id(run_id, "--run-id") if run_id else self.new_run_id(inv)
        path = self.root / run_id
        if path.exists():
            raise UsageError(f"run {run_id} already exists in {self.root}", "pick another --run-id")
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.mkdir(mode=0o700)
        run = RunDir(path)
        write_private(run.inventory_path, inv.source)
        run.write({"run": run_id, "inventory": inv.path, "name": inv.name, "created": time.time(),
                   "state": RunState.STARTING, "nodes": []})
        write_private(self.home / "latest", run_id + "\n")
        return run

    def runs(self) -> Iterator[RunDir]:
        """Every run, oldest first."""
        if not self.root.is_dir():
            return iter(())
        return iter(RunDir(p) for p in sorted(self.root.iterdir(), key=lambda p: p.stat().st_mtime) if p.is_dir())

    def get(self, run_id: str | None = None) -> RunDir:
        """The named run, else the latest. Raises UsageError (exit 2) when there is none."""
        if run_id is None:
            latest = self.home / "latest"
            if latest.exists():
                run_id = check_run_id(latest.read_text().strip(), f"{latest} names a run")
            else:
                raise UsageError(f"no runs yet in {self.root}", "start one with: orch up INVENTORY")
        else:
            check_run_id(run_id, "run")
        path = self.root / run_id
        if not (path / "run.json").exists():
            known = [r.run_id for r in self.runs()][-5:]
            raise UsageError(f"unknown run '{run_id}' in {self.root}",
                             "recent runs: " + (", ".join(known) if known else "none"))
        return RunDir(path)
