"""`orch down`'s container sweep on the real runtimes (issue 53 item 3): what a killed agent left is
listed and removed on the node by the agent's program, without a login shell, by whole IDs only,
so a login that prints other containers' IDs (a `.bashrc` running `RUNTIME ps -q`, a banner naming
an ID) makes orch remove nothing of anyone else's.

One node of the shared SSH cluster, its login's HOME a directory whose `.bashrc` prints another
user's container (its whole ID, its short ID in a banner, and `RUNTIME ps -q`), podman (the node's
own store) or the session's dockerd. Besides the run's own container (its stop hook removes it by
name), the node holds one more container of the launch under another name (a retry's container
whose stop hook was lost): the sweep's to find by label and remove."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cluster import TestCluster
from tests.containers import IMAGE, PodmanBed
from tests.integration.test_up_container import GONE_WITHIN_S, ddp_inventory, run_label
from tests.up_helpers import Orch, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RUN = "ctr-sweep"


@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_orch_down_removes_the_launchs_containers_and_nothing_a_login_shell_names(
    runtime: str,
    cluster: TestCluster,
    podman_bed: Callable[..., PodmanBed],
    request: pytest.FixtureRequest,
    orch: Orch,
    tmp_path: Path,
) -> None:
    node = "node1"
    if runtime == "podman":
        bed = podman_bed(cluster, [node])

        def rt(*args: str, check: bool = True) -> str:
            return bed.podman(node, *args, check=check).stdout

        login_env: dict[str, str] = {}
    else:
        dockerd = request.getfixturevalue("dockerd")

        def rt(*args: str, check: bool = True) -> str:
            return dockerd.docker(*args, check=check).stdout

        login_env = dict(dockerd.env)
    victim = rt("run", "-d", "--name", f"someone-else-{runtime}", "--network", "host", IMAGE, "sleep", "600").strip()
    assert len(victim) == 64, victim
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text(
        f'echo "{victim}"\necho "welcome: your container {victim[:12]} is up"\n{runtime} ps -q\n'
    )
    cluster.set_env(node, HOME=str(home), **login_env)
    inv = ddp_inventory(cluster, tmp_path, [node], steps=5000)
    text = inv.read_text().replace("runtime: podman", f"runtime: {runtime}")
    inv.write_text(text)
    try:
        res = orch.run("up", str(inv), "--run-id", RUN, "--skip-checks", "--detach", timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        listed = wait_for(
            lambda: rt("ps", "-a", "--filter", f"label={run_label(RUN)}", "--format", "{{json .Labels}}").strip(),
            60,
            "the run's container",
        )
        labels = json.loads(listed)  # podman: a map; docker: "k=v,k=v"
        labels = labels if isinstance(labels, dict) else dict(kv.split("=", 1) for kv in labels.split(","))
        nonce = labels["orch.nonce"]
        left = rt(
            "run",
            "-d",
            "--name",
            f"orch-{RUN}-{node}-{nonce}-a2",
            *(w for k in ("orch.run", "orch.node", "orch.nonce") for w in ("--label", f"{k}={labels[k]}")),
            "--network",
            "host",
            IMAGE,
            "sleep",
            "600",
        ).strip()
        said = orch.run("exec", str(inv), "--", "true")  # the login prints the other user's IDs
        assert victim in said.stdout and victim[:12] in said.stdout, said.stdout
        down = orch.run("down", RUN, timeout=180)
        if down.returncode == 1 and "still running" in down.stdout:
            down = orch.run("down", RUN, timeout=180)
        assert down.returncode == 0, down.stdout + down.stderr
        running = rt("ps", "-a", "--no-trunc", "--format", "{{.ID}}")
        assert victim in running, "orch down removed another user's container a login shell named"
        assert left not in running, "the launch's own leftover was not removed"
        wait_for(
            lambda: not rt("ps", "-aq", "--filter", f"label={run_label(RUN)}").strip(),
            GONE_WITHIN_S,
            "no run container",
        )
    finally:
        rt("rm", "-f", victim, check=False)
        for name in rt(
            "ps", "-a", "--filter", f"label={run_label(RUN)}", "--format", "{{.Names}}", check=False
        ).split():
            rt("rm", "-f", name, check=False)
