"""What `job.torchrun_args` may say: torchrun's flags that orch sets itself from the inventory are
refused (torchrun takes the last of a flag given twice, so one written there would silently win
over the inventory), and a `--role` must be a name the agent can read back from torchrun's `--tee`
prefix (`[<role><local rank>]:`, node/agent.py `ROLE`). Pure.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

OWN_FLAGS = {
    "nnodes": "the nodes: list says how many",
    "nproc-per-node": "set nproc_per_node (the inventory's, or a node's own)",
    "node-rank": "a node's rank is its place in nodes:, the master first",
    "master-addr": "set master: (the node, or master.addr)",
    "master-port": "set master.port",
    "rdzv-backend": "set job.rdzv",
    "rdzv-endpoint": "set master: and master.port",
    "rdzv-id": "orch names the rendezvous after the run and its launch",
    "standalone": "orch plans the rendezvous of every node",
    "max-restarts": "set job.max_restarts",
    "tee": "orch reads every worker's output through --tee 3",
    "log-dir": "orch keeps torchrun's logs in the node's run directory",
}
"""torchrun's flags (dashes; torchrun also takes each with underscores) that orch writes from the
inventory, and what says it instead. tests/unit/test_torchrun_args.py holds every flag
`plan.torchrun_args` writes to this table."""

ROLE_FIRST = string.ascii_letters + "_"
ROLE_REST = ROLE_FIRST + "-"
"""A role the agent reads back (node/agent.py `ROLE`: a letter or `_`, then letters, `_` or `-`);
a digit in it would run into the local rank torchrun writes after it (`[w20]:` for `w2`, rank 0)."""


def flag_name(word: str) -> str | None:
    """`--nproc_per_node=8` → `nproc-per-node`; None for a word that is not a long flag."""
    if not word.startswith("--") or len(word) < 3:
        return None
    return word[2:].partition("=")[0].replace("_", "-")


def problems(args: Sequence[str]) -> list[tuple[int, str]]:
    """(index, why) for each torchrun argument orch must refuse, with what to set instead."""
    out: list[tuple[int, str]] = []
    for i, word in enumerate(args):
        name = flag_name(word)
        if name is None:
            continue
        if name in OWN_FLAGS:
            out.append((i, f"--{name} is orch's to set ({OWN_FLAGS[name]}): leave it out of torchrun_args"))
        elif name == "role":
            given = word.partition("=")[2] if "=" in word else (args[i + 1] if i + 1 < len(args) else "")
            if not (given and given[0] in ROLE_FIRST and all(c in ROLE_REST for c in given)):
                out.append(
                    (
                        i,
                        f"--role {given!r}: a role is a letter or '_', then letters, '_' or '-' (no digit: torchrun "
                        "writes the local rank right after it, [<role><rank>]:, and orch could not tell them apart)",
                    )
                )
    return out
