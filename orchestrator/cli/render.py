"""Everything orch shows people: tables and progress on the terminal, `--json` alone on stdout.

The library never prints: commands return outcome objects (a CheckReport, an up outcome, a status
report...) or yield what to show, and the functions here render them. rich is imported inside
them, so a command that draws nothing (`orch check --json` in a pipe) never loads it.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from .ui import console

if TYPE_CHECKING:
    from ..config.plan import Plan


def plan_table(plan: Plan) -> None:
    """The dry-run table: node, address, node rank, global ranks, the exact remote command."""
    from rich.table import Table

    out = console(stderr=False)
    table = Table(title=f"plan for {plan.inventory.path}: {len(plan.nodes)} nodes, world size "
                        f"{plan.world_size}, master {plan.master_addr}:{plan.master_port}",
                  show_lines=True)
    for col in ("node", "address", "node rank", "global ranks", "command"):
        table.add_column(col, overflow="fold")
    for p in plan.nodes:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in p.env.items() if not k.startswith("ORCH_"))
        cmd = (f"cd {p.workdir} && " if p.workdir else "") + (env + " " if env else "") + shlex.join(p.argv)
        ranks = f"{p.global_ranks.start}-{p.global_ranks.stop - 1}" if len(p.global_ranks) > 1 else str(p.global_ranks.start)
        table.add_row(p.node.name, f"{p.node.host}" + (f" ({p.node.addr})" if p.node.addr != p.node.host else ""),
                      str(p.node_rank), ranks, cmd)
    out.print(table)
