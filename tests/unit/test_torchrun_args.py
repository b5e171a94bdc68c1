"""`job.torchrun_args` cannot silently override what orch plans (config/torchrun.py): every flag
the plan writes for torchrun is in `OWN_FLAGS` and refused there in either spelling, and a
`--role` is refused exactly where the agent could not read it back from torchrun's prefix."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.config import inventory, plan, torchrun
from orchestrator.node import agent
from tests.hypothesis_support import examples

NODES = "nodes:\n  - host: a\n    nproc_per_node: 2\n  - host: b\n    nproc_per_node: 2\n"


@pytest.mark.parametrize("rdzv", ["static", "c10d"])
def test_every_flag_the_plan_writes_is_orchs_own(rdzv: str) -> None:
    inv = inventory.parse(NODES + f"job: {{rdzv: {rdzv}}}\n", "t.yaml")
    argv = plan.torchrun_args(inv, inv.nodes[0], 0, "r", nonce="n")
    written = {torchrun.flag_name(w) for w in argv[: argv.index("-m", 2)] if torchrun.flag_name(w)}
    assert written and written <= set(torchrun.OWN_FLAGS), written - set(torchrun.OWN_FLAGS)


@pytest.mark.parametrize("flag", sorted(torchrun.OWN_FLAGS))
def test_an_own_flag_is_refused_in_either_spelling(flag: str) -> None:
    for word in (f"--{flag}=1", f"--{flag.replace('-', '_')}=1", f"--{flag}"):
        with pytest.raises(Exception, match=re.escape(f"--{flag} is orch's to set")):
            inventory.parse(NODES + f"job:\n  torchrun_args: ['{word}']\n", "t.yaml")


def test_what_torchrun_args_may_still_say() -> None:
    args = ["--role", "trainer", "--rdzv-conf", "join_timeout=900", "--monitor-interval=1", "--local-addr=x"]
    assert torchrun.problems(args) == []
    inv = inventory.parse(NODES + f"job:\n  torchrun_args: {args}\n", "t.yaml")
    assert inv.job.torchrun_args == tuple(args)


@settings(max_examples=examples(300), deadline=None)
@given(st.text(alphabet="ab_-Z9 .:", min_size=0, max_size=6))
def test_a_role_is_refused_exactly_where_the_agent_could_not_read_it(role: str) -> None:
    readable = bool(role) and re.fullmatch(agent.worker_pattern(), f"[{role}0]:") is not None
    readable = readable and re.fullmatch(agent.ROLE, role) is not None
    refused = torchrun.problems(["--role", role]) != [] and torchrun.problems([f"--role={role}"]) != []
    assert refused == (not readable)
