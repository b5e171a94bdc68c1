"""Shell completion of values, not only of commands and flags: run ids (newest first, and
`latest`), node names of the inventory given (or `$ORCH_INVENTORY`, or the latest run's), check
names (each item of a comma list), and inventory files (`*.yaml`/`*.yml`, then any path).

Each function is a click `shell_complete` callback: it never raises (a broken inventory or store
completes nothing) and reads only the controller's files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
from click.shell_completion import CompletionItem


def run_ids(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Run ids that start with what was typed, newest first; `latest` too."""
    try:
        from ..store import LATEST, RunStore

        ids = [r.run_id for r in reversed(list(RunStore().runs()))]
    except Exception:
        return []
    ids = [LATEST, *ids]
    return [CompletionItem(i) for i in ids if i.startswith(incomplete)]


class Remembering(click.Command):
    """A command that keeps the words it was given (`ctx.meta["orch.words"]`): while a shell
    completes an option's value, click parses the line without it and fills no parameter, so a
    completion that needs the inventory or run named earlier finds it there."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["orch.words"] = list(args)
        return super().parse_args(ctx, args)


def _inventory_of(ctx: click.Context) -> Any:
    """The inventory the command line names (a `*.yaml`/`*.yml` word that is a file), else
    `$ORCH_INVENTORY`, else the latest run's; with a RUN argument (orch logs), that run's."""
    from ..store import RunStore

    words = [w for w in ctx.meta.get("orch.words", []) if not w.startswith("-")]
    if "run" in ctx.params:
        for word in words:
            try:
                return RunStore().get(word).inventory()
            except Exception:
                continue
        return RunStore().get().inventory()
    if "-w" in ctx.meta.get("orch.words", []):
        return None
    path = (
        ctx.params.get("inventory")
        or next((w for w in words if w.endswith((".yaml", ".yml")) and os.path.isfile(w)), None)
        or os.environ.get("ORCH_INVENTORY")
    )
    if path:
        from ..config.inventory import load

        return load(path)
    return RunStore().get().inventory(as_run=False)


def _last_item(incomplete: str) -> tuple[str, str]:
    """`a,b,c` -> (`a,b,`, `c`): comma lists complete their last item."""
    head, _, last = incomplete.rpartition(",")
    return (head + "," if head else ""), last


def node_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The nodes of the command's inventory (each item of a comma list)."""
    try:
        inv = _inventory_of(ctx)
    except Exception:
        return []
    if inv is None:
        return []
    head, last = _last_item(incomplete)
    return [CompletionItem(head + n.name) for n in sorted(inv.nodes, key=lambda n: n.index) if n.name.startswith(last)]


def check_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The check names (each item of a comma list)."""
    from ..contract import CHECK_NAMES

    head, last = _last_item(incomplete)
    return [CompletionItem(head + c) for c in CHECK_NAMES if c.startswith(last)]


def inventory_files(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """YAML files under what was typed (a directory's `*.yaml`/`*.yml`, `inventory/` first from
    the current directory); where none fits, the shell's own path completion."""
    base = Path(incomplete).parent if incomplete and not incomplete.endswith("/") else Path(incomplete or ".")
    prefix = "" if incomplete.endswith("/") or not incomplete else Path(incomplete).name
    found: list[str] = []
    try:
        for entry in sorted(base.iterdir()):
            if not entry.name.startswith(prefix) or entry.name.startswith("."):
                continue
            shown = str(entry) if incomplete else entry.name
            if entry.is_dir():
                if any(entry.glob("*.y*ml")):
                    found.append(shown + "/")
            elif entry.suffix in (".yaml", ".yml"):
                found.append(shown)
    except OSError:
        pass
    if not found:
        return [CompletionItem(incomplete, type="file")]
    return [CompletionItem(f, type="plain") for f in found]
