"""Preflight (`orch check`): probe every node, run the checks, render one table or JSON.

`run_preflight` is the library entry (used by `orch up` too); `check_command` is the CLI's.
Every run's report is also saved, with the measured clock offsets, to
`$ORCH_HOME/checks/<inventory name>.json`, where `orch up` and `orch logs` find it.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config.inventory import Inventory
from .contract import CHECK_NAMES
from .errors import UsageError
from .facts import collect
from .store import checks_path, write_private
from .transport import Cluster

if TYPE_CHECKING:
    from rich.console import Console

    from .checks import CheckResult

Progress = Callable[[str, int, int], None]


@dataclass
class CheckReport:
    """Every (check, node) result of one preflight, plus the measured clock offsets."""

    results: list[CheckResult]
    offsets_ms: dict[str, float] = field(default_factory=dict)
    offset_reference: str = ""
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(r.status == "fail" for r in self.results)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "fail"]

    def to_json(self, inventory_path: str) -> dict[str, Any]:
        """The CONTRACT.md shape, plus offsets_ms (node clock minus reference) for log skew."""
        return {"inventory": inventory_path, "ok": self.ok,
                "results": [r.to_json() for r in self.results],
                "offsets_ms": {k: round(v, 3) for k, v in self.offsets_ms.items()},
                "offset_reference": self.offset_reference, "checked_at": time.time(),
                "elapsed_s": round(self.elapsed_s, 2)}


def select_checks(only: Iterable[str] | None, skip: Iterable[str] | None) -> list[str]:
    """The checks to run, in contract order. Raises UsageError (exit 2) for an unknown name."""
    only, skip = list(only or []), list(skip or [])
    for name in only + skip:
        if name not in CHECK_NAMES:
            raise UsageError(f"unknown check '{name}'", f"checks are: {', '.join(CHECK_NAMES)}")
    return [c for c in CHECK_NAMES if (not only or c in only) and c not in skip]


def run_preflight(inv: Inventory, cluster: Cluster | None = None, only: Iterable[str] | None = None,
                  skip: Iterable[str] | None = None, progress: Progress | None = None,
                  save: bool = True, render: bool = True) -> CheckReport:
    """Probe every node in parallel and judge; never raises for a node that is down.

    With `save` (the default) the report also goes to `$ORCH_HOME/checks/<inventory name>.json`,
    where `orch up` (copying it into the run) and `orch logs` (clock offsets) read it. `render`
    says the caller will print the table (rich is then imported while the nodes are probed)."""
    selected = select_checks(only, skip)
    start = time.monotonic()
    own = cluster is None
    cluster = cluster or Cluster(inv)
    # What judging and rendering need is imported while the nodes are probed, not before the
    # first connection (the controller mostly waits during the probe).
    warm = threading.Thread(target=_import_judging, args=(render,), daemon=True, name="orch-import")
    warm.start()
    try:
        facts = collect(inv, cluster, selected, progress)
    finally:
        if own:
            cluster.close()
    warm.join()
    from . import checks as checks_mod

    results = checks_mod.run_checks(inv, facts, selected)
    offsets, _, ref = checks_mod.clock_offsets(inv, facts)
    report = CheckReport(results, offsets, ref, time.monotonic() - start)
    if save:
        save_report(inv, report)
    return report


def _import_judging(render: bool) -> None:
    """Import the checks, and rich when a table will be printed, ahead of use."""
    from . import checks  # noqa: F401

    if render:
        import rich.table  # noqa: F401


def save_report(inv: Inventory, report: CheckReport, path: Path | None = None) -> Path:
    """Write the JSON report (0600) where `orch up` / `orch logs` look for offsets."""
    target = path or checks_path(inv.name)
    write_private(target, json.dumps(report.to_json(inv.path), indent=2) + "\n")
    return target


def render_report(report: CheckReport, console: Console) -> None:
    """One table grouped by check, a row per node: status, value, detail, hint."""
    from rich.table import Table

    from .cli.ui import styled

    table = Table(show_lines=False, pad_edge=False, expand=False)
    for col, kw in (("check", {"no_wrap": True}), ("node", {"no_wrap": True}), ("status", {"no_wrap": True}),
                    ("value", {"overflow": "fold", "max_width": 28}), ("detail", {"overflow": "fold"}),
                    ("hint", {"overflow": "fold"})):
        table.add_column(col, **kw)
    last = None
    for r in report.results:
        if last is not None and r.check != last:
            table.add_section()
        table.add_row(r.check if r.check != last else "", r.node, styled(r.status), r.value,
                      _escape(r.detail), _escape(r.hint))
        last = r.check
    console.print(table)
    counts = {s: sum(1 for r in report.results if r.status == s) for s in ("ok", "warn", "fail", "skip")}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    verdict = "[bold red]preflight failed[/]" if not report.ok else "[green]preflight passed[/]"
    console.print(f"{verdict}: {summary} ({report.elapsed_s:.1f} s)")


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def check_command(inv: Inventory, only: Sequence[str] | None, skip: Sequence[str] | None, as_json: bool) -> int:
    """`orch check`: progress on stderr (a terminal only), then the table or the JSON; 0 / 1."""
    from .cli.ui import console, may_be_terminal

    selected = select_checks(only, skip)
    err = console(stderr=True) if may_be_terminal(sys.stderr) else None
    if err is not None and err.is_terminal:
        with err.status(f"probing {len(inv.nodes)} nodes...") as status:
            def progress(label: str, done: int, total: int) -> None:
                status.update(f"{label} ({done}/{total})")
            report = run_preflight(inv, only=selected, progress=progress, render=not as_json)
    else:
        report = run_preflight(inv, only=selected, render=not as_json)
    if as_json:
        print(json.dumps(report.to_json(inv.path), indent=2))
    else:
        render_report(report, console(stderr=False))
    return report.exit_code
