"""`orch stacks` of a container run whose hosts have no py-spy (issue 54 item 4): the README says a
container job's nodes need only the runtime, the image and a `python3`, and the node agent looked
for py-spy next to the host's python or on PATH only. orch brings this controller's py-spy (one
static binary, for the node's architecture) into the node's run directory and takes every rank's
stack with it. Real sshd nodes, a podman store each, the node programs run by the system's
/usr/bin/python3 (no py-spy beside it or on the login's PATH), the job by the test image's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.cluster import TestCluster
from tests.containers import PodmanBed
from tests.integration.test_up_container import GONE_WITHIN_S, _running, ddp_inventory, run_label
from tests.up_helpers import Orch, run_root, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HOST_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(not Path(HOST_PYTHON).exists(), reason="needs the system's /usr/bin/python3")
def test_stacks_of_a_container_run_on_hosts_without_py_spy(
    podman_cluster: PodmanBed, cluster: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    assert shutil.which("py-spy", path="/usr/local/bin:/usr/bin:/bin") is None, "the login's PATH has a py-spy"
    assert not (Path(HOST_PYTHON).parent / "py-spy").exists()
    nodes = ["node1", "node2"]
    inv = ddp_inventory(cluster, tmp_path, nodes, steps=5000)
    doc = yaml.safe_load(inv.read_text())
    doc["job"]["python"] = HOST_PYTHON
    inv.write_text(yaml.safe_dump(doc))
    run = "ctr-stacks"
    res = orch.run("up", str(inv), "--run-id", run, "--skip-checks", "--detach", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    try:
        wait_for(lambda: _running(cluster, run, podman_cluster, nodes), 180, "both containers running")
        stacks = orch.run("stacks", run, "--json", timeout=240)
        assert stacks.returncode == 0, stacks.stdout[-3000:] + stacks.stderr[-3000:]
        report = json.loads(stacks.stdout)
        assert report["complete"] and report["problems"] == {}, report["problems"]
        assert sorted(r["rank"] for r in report["ranks"]) == [0, 1]
        assert all("ddp_job.py" in r["dump"] for r in report["ranks"]), report["ranks"]
        for node in nodes:  # brought once, into the run directory; the next call finds it there
            assert (run_root(cluster) / run / node / "py-spy").stat().st_mode & 0o777 == 0o700
        again = orch.run("stacks", run, "--json", timeout=240)
        assert again.returncode == 0 and json.loads(again.stdout)["complete"], again.stdout[-2000:]
    finally:
        down = orch.run("down", run, timeout=180)
        if down.returncode == 1:
            down = orch.run("down", run, timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    assert podman_cluster.wait_no_containers(run_label(run), within=GONE_WITHIN_S) == {}
