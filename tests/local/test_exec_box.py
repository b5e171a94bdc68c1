"""`orch exec --container`'s node program (orchestrator/node/execbox.py) against the fake runtime
(tests/fake_runtime.py, whose `exec` runs the command on this host and whose killed client leaves
it running, as a real runtime's does): the command is stopped where it runs, not only its client,
on a timeout, a SIGTERM (the tether's) and a SIGKILL of the login shell's whole process group (a
local transport's close), and a stop is said only once nothing of the command is left. The real
runtimes: tests/integration/test_exec_in_container.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.config.container import Container
from orchestrator.config.jobenv import box_exec
from orchestrator.node import HERE
from tests import fake_runtime
from tests.procs_support import own_sleeps, running

ID = "ab" * 32
NONCE = "0123456789ab"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    state = tmp_path / "containers.json"
    fake_runtime.install(tmp_path / "bin", state)
    box = {"id": ID, "name": "orch-r1-n1-" + NONCE, "state": "running"}
    box["labels"] = {"orch.run": "r1", "orch.node": "n1", "orch.nonce": NONCE}
    other = {"id": "cd" * 32, "name": "orch-r1-n2-" + NONCE, "state": "running"}
    other["labels"] = {"orch.run": "r1", "orch.node": "n2", "orch.nonce": NONCE}
    state.write_text(json.dumps([box, other]))
    return {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}


def argv(command: list[str], timeout: float | None = None, node: str = "n1") -> list[str]:
    box = box_exec(Container("podman", "img", python=sys.executable), "r1", NONCE)
    assert box is not None
    return [sys.executable, "-I", "-S", str(HERE / "execbox.py"), *box.args(node, command, timeout)]


def wait_for(pred, what: str, timeout: float = 30):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (got := pred()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.05)
    return got


def test_the_command_runs_in_its_nodes_container_with_its_own_exit_code(env: dict[str, str]) -> None:
    ran = subprocess.run(argv(["echo said; exit 3"], node="n2"), env=env, capture_output=True, text=True)
    assert (ran.returncode, ran.stdout) == (3, "said\n"), ran.stderr
    log = Path(env["PATH"].split(os.pathsep)[0]).parent / "containers.calls"
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls[0][:4] == ["podman", "ps", "-q", "--no-trunc"] and "label=orch.node=n2" in calls[0]
    assert calls[1][:3] == ["podman", "exec", "-e"] and calls[1][4] == "cd" * 32  # its own container, by its whole ID
    missing = subprocess.run(argv(["true"], node="n3"), env=env, capture_output=True, text=True)
    assert missing.returncode == 125 and "no running container of run r1 on this node" in missing.stderr


def test_a_timeout_stops_the_command_in_the_container_before_it_says_so(env: dict[str, str]) -> None:
    first, second = own_sleeps(97, 96)
    ran = subprocess.run(argv([f"{first} & {second}"], timeout=1), env=env, capture_output=True, text=True)
    assert ran.returncode == 124, ran.stderr
    assert "timed out after 1 s: 3 processes of the command in container abababababab were stopped" in ran.stderr
    assert running(first) == running(second) == []  # gone when it said so


def test_a_command_still_starting_when_the_timeout_comes_is_stopped_too(env: dict[str, str]) -> None:
    """The runtime's exec started the command only after the stop's first sweep had looked (slow
    under load: a full test run saw it with podman): its client still runs after that sweep, so
    the container is swept again, and the stop is said only once the command is gone."""
    state = Path(env["PATH"].split(os.pathsep)[0]).parent / "containers.json"
    Path(f"{state}.exec-late").write_text("2")
    said = state.with_name("said")
    first, second = own_sleeps(93, 92)
    try:
        with said.open("w") as out:  # not a pipe: what is left of the command would hold it open
            code = subprocess.run(argv([f"{first} & {second}"], timeout=1), env=env, stdout=out, stderr=out)
        err = said.read_text()
        assert code.returncode == 124, err
        assert running(first) == running(second) == [], err  # gone when it said so
        assert "processes of the command in container abababababab were stopped" in err
    finally:
        for pid in running(first) + running(second):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("how", ["SIGTERM to it (the tether)", "SIGKILL to its process group (a closed local session)"])
def test_a_signal_or_a_lost_session_stops_the_command_in_the_container(env: dict[str, str], how: str) -> None:
    first, second = own_sleeps(95, 94)
    proc = subprocess.Popen(
        argv([f"{first} & {second}"]),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        wait_for(lambda: running(first) and running(second), "the command running")
        if how.startswith("SIGTERM"):
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
            assert proc.returncode == 128 + signal.SIGTERM and b"were stopped (SIGTERM)" in err, err
            assert running(first) == running(second) == []
        else:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            wait_for(lambda: running(first) == running(second) == [], "the command stopped")
    finally:
        for pid in running(first) + running(second):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
