"""Fixtures the integration modules share across modules (tests/conftest.py has the cluster)."""

from __future__ import annotations

import pytest

from tests.trainer_helpers import Reference, make_reference


@pytest.fixture(scope="session")
def trainer_reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """One uninterrupted reference run for the session, shared by the exact-resume tests of
    test_trainer_ddp.py (node-local storage) and test_up_resume.py (a rank killed under `orch up`):
    each proves its resumed run ends with these weights, bit for bit. Ranks, world size and every
    flag that changes the numbers are the same in all of them (log lines and paths are not numbers)."""
    return make_reference(tmp_path_factory.mktemp("trainer-reference"))
