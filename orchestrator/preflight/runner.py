"""A preflight: probe every node, run the checks, and the report they make (`orch check`, and
the gate of `orch up`).

`run_preflight` returns a `CheckReport`; the CLI renders it (a table, or the contract's JSON).
Every report is also saved, with the measured clock offsets, to
`$ORCH_HOME/checks/<inventory name>.json`, where `orch up` (copying it into the run as
check.json) and `orch logs` (ordering lines across nodes) find it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .. import waits
from ..config.container import Pins
from ..config.inventory import Inventory
from ..config.jobenv import job_env
from ..config.runtimes import runtime
from ..contract import CHECK_NAMES
from ..errors import PreflightUnavailable, UsageError
from ..store import CHECK, checks_path, write_private
from ..transport import Cluster
from ..transport.base import Progress
from .controller_clock import ControllerClock
from .controller_clock import measure as measure_controller
from .facts import collect

if TYPE_CHECKING:
    from ..store import RunDir
    from .checks import CheckResult
    from .fabric.job import FabricFacts
    from .facts import NodeFacts


@dataclass
class CheckReport:
    """Every (check, node) result of one preflight, plus the measured clock offsets."""

    results: list[CheckResult]
    offsets_ms: dict[str, float] = field(default_factory=dict)
    offset_reference: str = ""
    elapsed_s: float = 0.0
    fabric: dict[str, Any] | None = None
    """What the fabric job measured (`fabric.judge.fabric_summary`), when it ran."""
    not_probed: dict[str, str] = field(default_factory=dict)
    """Nodes that could not be probed, with why (their `ssh` row fails, every other row skips)."""
    controller_clock: ControllerClock | None = None
    """The controller's own offset to `checks.clock.ntp_server`, when the clock check ran."""
    pins: Pins | None = None
    """What a container launch runs as the preflight found it (`container_pins`: each node's
    GPUs by UUID; the image ID the image rows resolve); None without `job.container`."""
    inventory: str = ""
    """The inventory file it judged (the check JSON's `inventory`; empty: the caller names it)."""

    @property
    def ok(self) -> bool:
        return not any(r.status == "fail" for r in self.results)

    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "fail"]

    def to_json(self, inventory_path: str | None = None) -> dict[str, Any]:
        """docs/CONTRACT.md's check JSON, plus offsets_ms (node clock minus reference) for log skew."""
        out = {
            "inventory": self.inventory if inventory_path is None else inventory_path,
            "ok": self.ok,
            "results": [r.to_json() for r in self.results],
            "offsets_ms": {k: round(v, 3) for k, v in self.offsets_ms.items()},
            "offset_reference": self.offset_reference,
            "checked_at": time.time(),
            "elapsed_s": round(self.elapsed_s, 2),
            "not_probed": dict(self.not_probed),
        }
        if self.controller_clock is not None:
            out["controller_clock"] = self.controller_clock.to_json()
        if self.fabric is not None:
            out["fabric"] = self.fabric
        return out


def select_checks(only: Iterable[str] | None, skip: Iterable[str] | None) -> list[str]:
    """The checks to run, in contract order. Raises UsageError (exit 2) for an unknown name."""
    only, skip = list(only or []), list(skip or [])
    for name in only + skip:
        if name not in CHECK_NAMES:
            raise UsageError(f"unknown check '{name}'", f"checks are: {', '.join(CHECK_NAMES)}")
    return [c for c in CHECK_NAMES if (not only or c in only) and c not in skip]


def run_preflight(
    inv: Inventory,
    cluster: Cluster | None = None,
    only: Iterable[str] | None = None,
    skip: Iterable[str] | None = None,
    progress: Progress | None = None,
    save: bool = True,
    warm_up: Callable[[], None] | None = None,
    fabric: bool = False,
    run_id: str | None = None,
) -> CheckReport:
    """Probe every node in parallel and judge; never raises for a node that is down.

    With `save` (the default) the report also goes to `$ORCH_HOME/checks/<inventory name>.json`,
    where `orch up` (copying it into the run) and `orch logs` (clock offsets) read it. `warm_up`
    runs beside the probe, with the import of the checks: what the caller needs afterwards (the
    CLI's table) is imported while the controller mostly waits, not before the first connection.

    The opt-in checks (`contract.OPT_IN_CHECKS`: the fabric job) run when named in `only`, turned
    on in the inventory (`checks.fabric`), or asked for with `fabric` (`orch up --fabric`);
    otherwise every node gets a `skip` row saying so. The fabric job runs after the probe, and only
    when every node was probed (it needs them all).

    `run_id`: the run the preflight is for, when there is one already (a retry of `orch up`, or
    `--run-id`): the job's own check (`python -m trainer --check`) then sees its run directory."""
    selected = select_checks(only, skip)
    start = time.monotonic()
    own = cluster is None
    cluster = cluster or Cluster(inv)
    warm = threading.Thread(target=_import_judging, args=(warm_up,), daemon=True, name="orch-import")
    warm.start()
    ff = None
    clock: list[ControllerClock] = []
    timing = None
    if "clock" in selected and "clock" not in inv.checks.skip:  # the controller's own clock, beside the probe
        timing = threading.Thread(
            target=lambda: clock.append(measure_controller(inv.checks.clock.ntp_server)), daemon=True, name="orch-ntp"
        )
        timing.start()
    try:
        facts = collect(inv, cluster, selected, progress, run_id)
        if "fabric" in selected and "fabric" not in inv.checks.skip:
            ff = _fabric_facts(inv, cluster, facts, fabric or "fabric" in (only or ()), progress)
            for nf in facts.values():
                nf.fabric = ff
    finally:
        if own:
            cluster.close()
    waits.join(warm)
    if timing is not None:
        waits.join(timing)
        for nf in facts.values():
            nf.controller_clock = clock[0] if clock else None
    checks_mod = _checks()
    results = checks_mod.run_checks(inv, facts, selected)
    offsets, _, ref = checks_mod.clock_offsets(inv, facts)
    report = CheckReport(
        results,
        offsets,
        ref,
        time.monotonic() - start,
        not_probed={n: (nf.error or "").removeprefix(f"{n}: ") for n, nf in facts.items() if not nf.ok},
        controller_clock=clock[0] if clock else None,
        pins=container_pins(inv, facts),
        inventory=inv.path,
    )
    if ff is not None and ff.not_run is None:
        from .fabric.judge import fabric_summary

        report.fabric = fabric_summary(inv, ff)
    if save:
        save_report(inv, report)
    return report


def _fabric_facts(
    inv: Inventory, cluster: Cluster, facts: Mapping[str, NodeFacts], asked: bool, progress: Progress | None
) -> FabricFacts:
    """Run the fabric job, or say why not (opt-in and not asked; a node that was not probed)."""
    from .fabric import job as fabric_mod

    if not (asked or inv.checks.fabric.enabled):
        return fabric_mod.FabricFacts.skipped(inv, fabric_mod.FABRIC_OPT_IN)
    down = [name for name, nf in facts.items() if not nf.ok]
    if down:
        return fabric_mod.FabricFacts.skipped(
            inv, f"not run: the job needs every node, and {', '.join(down)} could not be probed (see ssh)"
        )
    return fabric_mod.measure(inv, cluster, progress)


def container_pins(inv: Inventory, facts: dict[str, NodeFacts]) -> Pins | None:
    """What a container launch pins from the probe's facts: each node's GPUs for its ranks by UUID
    (the node's environment's choice, `JobEnv.devices`: an index turned into its GPU's UUID as nvidia-smi reports it),
    and the image ID every node holds under `job.container.image`, which the launch then runs
    instead of the name (a tag moved after the preflight cannot change what runs; none when a node
    lacks it, disagrees, or was not asked, or the runtime runs an image file). A node whose GPU
    choice cannot be told by UUID keeps it as it is. None without `job.container`."""
    c = inv.job.container
    if c is None:
        return None
    rt = runtime(c.runtime)
    gpus: dict[str, tuple[str, ...]] = {}
    ids: set[str | None] = set()
    for node in inv.nodes:
        nf = facts.get(node.name)
        held = nf.image(rt) if nf is not None and nf.ok else None
        ids.add(held.image_id if held is not None else None)
        chosen = job_env(inv, node).devices
        if not chosen or nf is None or not nf.ok:
            continue
        by_index = {str(g.index): g.uuid for g in nf.gpus.gpus if g.uuid}
        uuids = [d if d.startswith(("GPU-", "MIG-")) else by_index.get(d) for d in chosen]
        if all(uuids):
            gpus[node.name] = tuple(u for u in uuids if u)
    pinned = ids.pop() if len(ids) == 1 and rt.runs_by_id else None
    return Pins(image_id=pinned, gpus=gpus)


def _import_judging(warm_up: Callable[[], None] | None) -> None:
    """Import the checks, and what the caller asked for, ahead of use. A failure here is only
    a missed head start: `_checks` imports again and says why."""
    try:
        from . import checks  # noqa: F401

        if warm_up is not None:
            warm_up()
    except Exception:  # noqa: S110 - reported by _checks on the main thread
        pass


def _checks() -> ModuleType:
    """The checks module, or PreflightUnavailable (exit 3): a preflight that cannot judge must
    stop the launch, never let it go ahead unchecked."""
    try:
        from . import checks
    except Exception as exc:
        raise PreflightUnavailable(
            f"the preflight cannot run: importing its checks failed: {type(exc).__name__}: {exc}",
            "nothing was launched; repair the installation (make install, or pip install -e .), or launch "
            "unchecked on purpose with --skip-checks",
        ) from exc
    return checks


def save_report(inv: Inventory, report: CheckReport, path: Path | None = None) -> Path:
    """Write the JSON report (0600) where `orch up` / `orch logs` look for offsets."""
    target = path or checks_path(inv.name)
    write_private(target, json.dumps(report.to_json(inv.path), indent=2) + "\n")
    return target


def save_to_run(run: RunDir, inv: Inventory, report: CheckReport | None) -> None:
    """check.json in a run's directory (log skew correction reads its offsets): this launch's
    preflight, or with --skip-checks the last `orch check` of this inventory, if there was one."""
    if report is not None:
        run.write(report.to_json(report.inventory or inv.path), CHECK)
        return
    saved = checks_path(inv.name)
    if saved.exists():
        write_private(run.check_path, saved.read_bytes())
