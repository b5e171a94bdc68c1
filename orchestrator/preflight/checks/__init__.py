"""The checks: pure functions of (inventory, facts of every node) → one result per (check, node),
a module each, each with the shape of the probe's facts it reads (`FACTS`).

Every pitfall of the field guides becomes a finding with the measured value and a hint that
fixes it. A node that could not be probed fails `ssh` and is `skip` everywhere else, with the
reason. Checks that compare nodes (versions, env, file contents) report on each node that differs
from the majority and name the majority value. What a check returns and the helpers it judges
with are `preflight/results.py`; the fabric check's verdict is `fabric/judge.py`.

- `common.py`    what several checks judge with (a value shown, names folded, the ring's reach)
- `ssh.py`, `clock.py`, `timezone.py`, `nccl_env.py`, `rdma.py`, `gpus.py`, `software.py`, `job.py`,
  `ports.py`, `container.py`: one check each (`check_NAME`), and the facts it reads (`FACTS`)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ...config.inventory import Inventory
from ...contract import CHECK_NAMES
from ..fabric.judge import check_fabric
from ..results import CheckResult, Facts, Findings, majority, odd_one_out, probed
from ..shapes import PROBE_SHAPE, assemble
from . import clock, container, gpus, job, nccl_env, ports, rdma, software, timezone
from .clock import CONTROLLER_REFERENCE, check_clock, clock_offsets
from .container import check_container, image_findings
from .gpus import check_gpus
from .job import check_job, cluster_job_findings, relative_args
from .nccl_env import IfSpec, check_nccl_env
from .ports import check_ports
from .rdma import check_rdma
from .software import check_software
from .ssh import check_ssh
from .timezone import check_timezone

__all__ = [
    "CHECKS",
    "CONTROLLER_REFERENCE",
    "FACTS_SHAPE",
    "CheckResult",
    "Findings",
    "IfSpec",
    "check_clock",
    "check_container",
    "check_gpus",
    "check_job",
    "check_nccl_env",
    "check_ports",
    "check_rdma",
    "check_software",
    "check_ssh",
    "check_timezone",
    "clock_offsets",
    "cluster_job_findings",
    "image_findings",
    "majority",
    "odd_one_out",
    "probed",
    "relative_args",
    "run_checks",
]

FACTS_SHAPE = assemble(
    PROBE_SHAPE,
    clock.FACTS,
    timezone.FACTS,
    nccl_env.FACTS,
    rdma.FACTS,
    gpus.FACTS,
    software.FACTS,
    job.FACTS,
    ports.FACTS,
    container.FACTS,
)
"""What the probe (node/probe.py) answers, key by key: its frame (`shapes.PROBE_SHAPE`) and the facts
each check reads, declared beside the check. What the checks may rely on."""


CHECKS: dict[str, Callable[[Inventory, Facts], list[CheckResult]]] = {
    "ssh": check_ssh,
    "clock": check_clock,
    "timezone": check_timezone,
    "nccl_env": check_nccl_env,
    "rdma": check_rdma,
    "gpus": check_gpus,
    "software": check_software,
    "job": check_job,
    "ports": check_ports,
    "container": check_container,
    "fabric": check_fabric,
}
assert tuple(CHECKS) == CHECK_NAMES


def run_checks(inv: Inventory, facts: Facts, selected: Iterable[str]) -> list[CheckResult]:
    """Every selected check in contract order; unprobed nodes `skip` (except on `ssh`);
    checks listed in the inventory's checks.skip become `skip` rows."""
    results = []
    for name in [c for c in CHECK_NAMES if c in set(selected)]:
        if name in inv.checks.skip:
            results += [
                CheckResult(name, n.name, "skip", "", "skipped by checks.skip in the inventory") for n in inv.nodes
            ]
            continue
        try:
            got = {r.node: r for r in CHECKS[name](inv, facts)}
        except Exception as exc:  # the last line of defence: a check that cannot judge fails, loudly
            got = {
                n.name: CheckResult(
                    name, n.name, "fail", "", f"could not judge the facts the nodes sent: {type(exc).__name__}: {exc}"
                )
                for n in inv.nodes
                if facts[n.name].ok
            }
        for node in inv.nodes:
            nf = facts[node.name]
            if node.name in got:
                results.append(got[node.name])
            elif not nf.ok:
                reason = (nf.error or "").removeprefix(f"{node.name}: ")
                results.append(CheckResult(name, node.name, "skip", "", f"node not probed: {reason}"))
    return results
