"""A container launch through the real node agent, with a fake runtime (tests/fake_runtime.py)
standing in for podman: every stop removes the launch's container, and what a killed agent left
is removed by `orch down`'s stop by label, never another run's."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.inventory import parse
from orchestrator.config.plan import make_plan
from orchestrator.run.agents import start_all, status_all, stop_all
from orchestrator.run.records import node_records
from orchestrator.transport import Cluster
from tests import fake_runtime


def wait_for(pred: Callable[[], Any], what: str, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := pred()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.05)
    return got


MINE = "e1" * 32
"""A container of the launch a killed agent left: a whole ID, as the node's sweep lists it."""


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "containers.json"
    fake_runtime.install(tmp_path / "bin", state)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return state


def launch(tmp_path: Path, nonce: str) -> tuple[Cluster, list[dict[str, Any]]]:
    inv = parse(
        f"name: lab\ntransport: local\nnodes:\n  - host: localhost\n    name: n1\n"
        f"job:\n  python: {sys.executable}\n  run_root: {tmp_path / 'nodes'}\n  stop_grace_s: 2\n"
        "  container: {runtime: podman, image: img:1, python: /py}\n",
        str(tmp_path / "lab.yaml"),
    )
    plan = make_plan(inv, "r1", nonce=nonce)
    cluster = Cluster(inv)
    started = start_all(cluster, plan)
    assert not started.failed, started.failed
    return cluster, node_records(plan)


@pytest.mark.parametrize("how", ["orch down", "agent killed -9, then orch down"])
def test_every_stop_leaves_no_container_of_the_launch_and_no_other_is_touched(
    tmp_path: Path, runtime: Path, how: str
) -> None:
    others = [
        {
            "id": "0ther",
            "name": "orch-r1-n1-othernonce",
            "labels": {"orch.run": "r1", "orch.node": "n1", "orch.nonce": "othernonce"},
            "state": "running",
        },
        {
            "id": "mine2",
            "name": "orch-r1-n2-abcd",
            "labels": {"orch.run": "r1", "orch.node": "n2", "orch.nonce": "abcd"},
            "state": "running",
        },
    ]
    runtime.write_text(json.dumps(others))
    cluster, records = launch(tmp_path, "abcd")
    try:
        box = wait_for(
            lambda: [c for c in fake_runtime.containers(runtime) if c["name"] == "orch-r1-n1-abcd"],
            "the launch's container",
        )[0]
        assert box["labels"] == {"orch.run": "r1", "orch.node": "n1", "orch.nonce": "abcd", "orch.cluster": "lab"}
        at = box["argv"].index("img:1")
        assert box["argv"][at : at + 4] == ["img:1", "/py", "-m", "torch.distributed.run"]  # the job's python inside
        assert f"--log-dir={records[0].remote_dir}/torchrun" in box["argv"]  # the node's values filled in
        if how != "orch down":
            st = json.loads(Path(records[0].remote_dir, "state.json").read_text())
            assert st["stop_hook"] == ["podman", "rm", "-f", "orch-r1-n1-abcd"]
            os.kill(st["agent_pid"], signal.SIGKILL)
            os.killpg(st["pgid"], signal.SIGKILL)  # the client too: its container stays, as a real one does
            leftover = {
                "id": MINE,
                "name": "orch-r1-n1-abcd-check",
                "state": "exited",
                "labels": {"orch.run": "r1", "orch.node": "n1", "orch.nonce": "abcd"},
            }
            fake_runtime._edit(runtime, lambda data: data.append(leftover))
            wait_for(lambda: not status_all(cluster, records).succeeded["n1"].agent_alive, "the agent gone")
            assert {c["name"] for c in fake_runtime.containers(runtime)} >= {"orch-r1-n1-abcd", "orch-r1-n1-abcd-check"}
        stops = stop_all(cluster, records, 2)
        assert not stops.failed, stops.failed
        left = {c["name"] for c in fake_runtime.containers(runtime)}
        assert left == {"orch-r1-n1-othernonce", "orch-r1-n2-abcd"}, left  # another run's, another node's: untouched
        if how != "orch down":
            assert stops.succeeded["n1"].containers == (MINE,)  # by label; the hook removed its own by name
    finally:
        cluster.close()


def test_the_fake_runtimes_rm_kills_only_a_process_that_is_still_the_containers(runtime: Path) -> None:
    """A container whose process ended long ago (its killed client never removed it) keeps that
    pid, which a busy machine soon gives to another process, even to the `rm` itself: the fake's
    `rm -f` once SIGKILLed its own process so (the stop hook said `exit -9`). It kills a process
    group only while the pid still names the process the container started."""
    import subprocess

    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        runtime.write_text(
            json.dumps(
                [
                    {"id": "old1", "name": "stale", "labels": {}, "state": "running", "pgid": other.pid},
                    {
                        "id": "old2",
                        "name": "reused",
                        "labels": {},
                        "state": "running",
                        "pgid": other.pid,
                        "started": "1",
                    },
                ]
            )
        )
        assert fake_runtime.main([str(runtime), "podman", "rm", "-f", "stale", "reused"]) == 0
        assert other.poll() is None, "rm -f killed a process that was not the container's"
        assert fake_runtime.containers(runtime) == []
    finally:
        other.kill()
        other.wait()
