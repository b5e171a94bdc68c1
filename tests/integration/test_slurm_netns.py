"""The preflight on a Slurm allocation whose nodes are separate hosts (the netns bed: one slurmd per
network namespace, each node its own hostname, address and /etc/hosts): the master's address (its
NodeHostname) resolved on every node and reached from every node; with Debian's `127.0.1.1 node1`
line on node1 its own name is loopback there, and the `ports` check fails on node1 saying so (and on
node4, whose ring peer node1 listens on that loopback address)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from tests.ports import job_port
from tests.slurm_bed import SlurmBed, hosts_file
from tests.up_helpers import DDP_JOB, REPO, Orch

pytestmark = [pytest.mark.slurm, pytest.mark.netns, pytest.mark.timeout(240)]


def test_the_master_address_is_proven_on_every_node_and_loopback_on_its_own_host_is_refused(
    slurm_netns_bed: SlurmBed, tmp_path: Path
) -> None:
    bed = slurm_netns_bed
    inv = tmp_path / "lab.yaml"
    inv.write_text(
        yaml.safe_dump(
            {
                "name": "lab",
                "transport": "slurm",
                "slurm": {"nodes": 4},
                "master": {"port": job_port()},
                "job": {"script": DDP_JOB, "python": sys.executable, "workdir": str(REPO), "nproc_per_node": 1},
            }
        )
    )
    orch = Orch(tmp_path / "home", env=bed.env)
    good = orch.run("check", str(inv), "--only", "ports", "--json", timeout=180)
    assert good.returncode == 0, good.stdout[-3000:] + good.stderr[-3000:]
    rows = {r["node"]: r for r in json.loads(good.stdout)["results"]}
    assert sorted(rows) == ["node1", "node2", "node3", "node4"]
    addr1 = bed.nodes[0].addr
    assert all(f"the master's address node1 resolves to {addr1}" in r["detail"] for r in rows.values()), rows
    assert all("reaches the master at node1:" in rows[n]["detail"] for n in ("node2", "node3", "node4")), rows

    bed.set_hosts("node1", hosts_file(bed.nodes, me="node1"))  # Debian's own line for its hostname
    bad = orch.run("check", str(inv), "--only", "ports", "--json", timeout=180)
    assert bad.returncode == 1, bad.stdout[-3000:] + bad.stderr[-3000:]
    rows = {r["node"]: r for r in json.loads(bad.stdout)["results"]}
    assert rows["node1"]["status"] == "fail", rows["node1"]
    said = rows["node1"]["detail"]
    assert f"resolves to 127.0.1.1, {addr1} on this node: loopback (127.0.1.1), and the nodes are separate" in said
    assert {rows[n]["status"] for n in ("node2", "node3")} == {"ok"}, rows
    # node4's ring peer is node1, whose probe listened on its own name, loopback there: the same cause
    assert rows["node4"]["status"] == "fail" and "cannot reach node1 at node1:" in rows["node4"]["detail"]
    assert bed.jobs() == [] and bed.left_behind() == []
