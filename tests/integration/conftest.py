"""Fixtures the integration modules share across modules (tests/conftest.py has the cluster)."""

from __future__ import annotations

import fcntl
import os

import pytest

from tests.trainer_helpers import Reference, make_reference

collect_ignore = [] if os.environ.get("ORCH_GPU_SMOKE_DRY_RUN") == "1" else ["test_gpu_smoke_dry_run.py"]
"""The CPU rehearsal of bench/gpu_smoke.py (3 minutes of real training) is `make gpu-smoke-dry-run`'s,
not `make test`'s: a run over the directories leaves it out unless ORCH_GPU_SMOKE_DRY_RUN=1; named
on the command line (as that target names it), it runs."""


@pytest.fixture(scope="session")
def trainer_reference(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """One uninterrupted reference run for the session, shared by the exact-resume tests of
    test_trainer_ddp.py (node-local storage) and test_trainer_preempt.py (a warned rank, mid-epoch):
    each proves its resumed run ends with these weights, bit for bit. Ranks, world size and every
    flag that changes the numbers are the same in all of them (log lines and paths are not numbers).
    Under `pytest -n` the workers share it: the first trains it, the other reads what it left."""
    base = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):
        base = base.parent  # the run's directory, above each worker's own
    with open(base / "trainer-reference.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = base / "trainer-reference" / "reference.json"
        if done.exists():
            return Reference.from_json(done.read_text())
        ref = make_reference(base / "trainer-reference")
        done.write_text(ref.to_json())
        return ref
