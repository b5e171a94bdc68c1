"""Helpers for the `orch up` integration tests: run the real CLI as a subprocess and watch its run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DDP_JOB = str(REPO / "tests" / "ddp_job.py")


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll pred() until it returns something truthy; fail the test with `what` after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Orch:
    """`python -m orchestrator ...` with its own ORCH_HOME; output captured in files."""

    def __init__(self, home: Path, env: Mapping[str, str] | None = None) -> None:
        self.home = home
        self.env = dict(os.environ, ORCH_HOME=str(home), NO_COLOR="1", **(env or {}))
        self.env.pop("ORCH_INVENTORY", None)

    def run(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def popen(self, *args: str) -> subprocess.Popen[str]:
        """`orch ARGS` in the background, its stdout and stderr piped (the caller communicates)."""
        return subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *args],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def start(self, *args: str, verbose: bool = False) -> UpProcess:
        """`orch up ARGS` in the background (`orch -v up ARGS`: every remote command on stderr)."""
        return UpProcess(self, list(args), verbose)

    def run_dir(self, run_id: str) -> Path:
        return self.home / "runs" / run_id

    def run_json(self, run_id: str) -> dict[str, Any]:
        try:
            return dict(json.loads((self.run_dir(run_id) / "run.json").read_text()))
        except (OSError, ValueError):
            return {}


class UpProcess:
    """A running `orch up` whose stdout (the merged log) and stderr go to files."""

    def __init__(self, orch: Orch, args: list[str], verbose: bool = False) -> None:
        self.orch = orch
        self.out_path = orch.home.parent / f"up-{id(self)}.out"
        self.err_path = orch.home.parent / f"up-{id(self)}.err"
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "orchestrator", *(["-v"] if verbose else []), "up", *args]
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(argv, cwd=REPO, env=orch.env, stdout=out, stderr=err)
        self.started = time.monotonic()

    @property
    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def run_id(self, timeout: float = 60) -> str:
        def find() -> str | None:
            latest = self.orch.home / "latest"
            return latest.read_text().strip() if latest.exists() else None

        return str(wait_for(find, timeout, f"the run to be created; stderr: {self.err}"))

    def wait_running(self, timeout: float = 90) -> str:
        run_id = self.run_id()
        wait_for(
            lambda: self.orch.run_json(run_id).get("state") == "running" or self.proc.poll() is not None,
            timeout,
            "every node running",
        )
        assert self.proc.poll() is None, f"orch up ended early ({self.proc.returncode}): {self.err}"
        return run_id

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(60)
            raise AssertionError(f"orch up did not end within {timeout:.0f} s; stderr:\n{self.err}") from None


def run_root(cluster: Any) -> Path:
    """Where the test cluster's nodes keep their run directories (job.run_root)."""
    return Path(cluster.root) / "runs"


def node_state(run_root: Path, run_id: str, node: str) -> dict[str, Any]:
    """A node's state.json, read from the shared filesystem the test nodes live on."""
    try:
        return dict(json.loads((run_root / run_id / node / "state.json").read_text()))
    except (OSError, ValueError):
        return {}


def node_log(run_root: Path, run_id: str, node: str) -> str:
    try:
        return (run_root / run_id / node / "node.log").read_text(errors="replace")
    except OSError:
        return ""


def ddp_inventory(
    cluster: Any,
    *,
    nproc: int = 1,
    job_env: dict[str, str] | None = None,
    job: Mapping[str, Any] | None = None,
    **extra: Any,
) -> Path:
    """A tests/ddp_job.py inventory for a test cluster: gloo over loopback, a free master port,
    5 s stop grace; `job` adds or overrides job keys, `extra` top-level ones."""
    from tests.ports import job_port

    env = {"GLOO_SOCKET_IFNAME": "lo", **(job_env or ddp_job())}
    return Path(
        cluster.write_inventory(
            job={"script": DDP_JOB, "nproc_per_node": nproc, "workdir": str(REPO), "stop_grace_s": 5, **(job or {})},
            env=env,
            master={"port": job_port()},
            **extra,
        )
    )


def ddp_job(steps: int = 5, sleep: float = 0.2, **faults: int | str) -> dict[str, str]:
    """The env that configures tests/ddp_job.py (faults: fail_rank=, fail_step=, hang_rank=...)."""
    env = {"DDP_STEPS": str(steps), "DDP_SLEEP": str(sleep), "OMP_NUM_THREADS": "1"}
    env.update({f"DDP_{k.upper()}": str(v) for k, v in faults.items()})
    return env


def leftover(cluster: Any, marker: str, nodes: Sequence[str] | None = None) -> dict[str, list[str]]:
    """{node: pids} of processes still carrying `marker` on the test nodes (empty when clean)."""
    names = nodes or [n.name for n in cluster.nodes]
    found = {name: [f"{pid} {_cmdline(pid)}" for pid in cluster.processes(name, marker)] for name in names}
    return {k: v for k, v in found.items() if v}


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")[:300]
    except OSError:
        return "(gone)"
