"""$ORCH_HOME on a shared controller host: private whatever the umask, and nothing another user
could have written there is ever run (docs/SECURITY.md)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.config.inventory import parse
from orchestrator.store import RunStore, write_private
from tests.up_helpers import REPO, Orch

OTHER_UID = 4242
"""Another user of the controller host (a group member under umask 002)."""


@pytest.fixture
def umask_002() -> Iterator[None]:
    old = os.umask(0o002)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def inventory_text(python: str, run_root: str = "~/.orch/nodes") -> str:
    return yaml.safe_dump(
        {
            "name": "planted",
            "transport": "local",
            "nodes": [{"host": "localhost", "name": "n1"}],
            "master": {"port": 29999},
            "job": {"python": python, "script": "/bin/true", "run_root": run_root},
        }
    )


def test_every_state_directory_is_private_under_umask_002(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask_002: None
) -> None:
    """$ORCH_HOME (and a parent it needs), runs/, the run, checks/: mode 0700 whatever the umask."""
    home = tmp_path / "user" / ".orch"
    monkeypatch.setenv("ORCH_HOME", str(home))
    run = RunStore().create(parse(inventory_text("python3"), "inv.yaml"))
    write_private(home / "checks" / "planted.json", "{}")
    for d in (home.parent, home, home / "runs", run.path, home / "checks"):
        assert mode(d) == 0o700, (d, oct(mode(d)))


def test_a_state_directory_others_can_write_is_refused_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / ".orch"
    home.mkdir()
    home.chmod(0o775)  # made by an older orch under umask 002
    monkeypatch.setenv("ORCH_HOME", str(home))
    inv = parse(inventory_text("python3"), "inv.yaml")
    with pytest.raises(Exception) as err:
        RunStore().create(inv)
    assert "can be changed by others" in str(err.value) or "writable by others" in str(err.value)
    assert f"chmod 700 {home}" in getattr(err.value, "hint", "")
    assert not (home / "runs").exists()


def test_a_directory_above_orch_home_others_can_change_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever can rename $ORCH_HOME away can put their own in its place: the directories above it
    are held to the node agent's rule for a run directory (this user's or root's, not writable by
    others unless sticky)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    monkeypatch.setenv("ORCH_HOME", str(shared / ".orch"))
    with pytest.raises(Exception) as err:
        RunStore().create(parse(inventory_text("python3"), "inv.yaml"))
    assert f"{shared}, above {shared / '.orch'}, can be changed by others" in str(err.value)
    assert getattr(err.value, "hint", "").startswith(f"chmod go-w {shared}, or set $ORCH_HOME")
    assert not (shared / ".orch").exists()  # nothing made in there


def plant(home: Path, tmp_path: Path, owner: int | None) -> Path:
    """A run planted in `home`: a local inventory and a run.json whose node record's `python` is a
    script that leaves a marker; `latest` names it. Returns the marker's path."""
    marker = tmp_path / "ran-as-victim"
    evil = tmp_path / "evil.sh"
    evil.write_text(f'#!/bin/sh\ntouch {marker}\necho \'{{"state": "running"}}\'\n')
    evil.chmod(0o755)
    run = home / "runs" / "20261206-000000-planted-x"
    run.mkdir(parents=True)
    (run / "inventory.yaml").write_text(inventory_text("python3", str(tmp_path / "nodes")))
    (run / "run.json").write_text(
        json.dumps(
            {
                "run": run.name,
                "inventory": "inv.yaml",
                "name": "planted",
                "created": 1.0,
                "state": "running",
                "nodes": [
                    {
                        "node": "n1",
                        "host": "localhost",
                        "node_rank": 0,
                        "base_rank": 0,
                        "nproc": 1,
                        "python": str(evil),
                        "remote_dir": str(tmp_path),
                        "state": "running",
                    }
                ],
            }
        )
    )
    (home / "latest").write_text(run.name + "\n")
    for p in (run / "inventory.yaml", run / "run.json", home / "latest"):
        p.chmod(0o600)
    if owner is not None:
        for p in (home / "runs", run, run / "inventory.yaml", run / "run.json", home / "latest"):
            os.chown(p, owner, owner)
    return marker


@pytest.mark.skipif(os.geteuid() != 0, reason="plays a second user: needs root to chown")
def test_a_run_planted_by_another_user_is_never_run(tmp_path: Path) -> None:
    """A group member could write ~/.orch (mode 0775): they planted runs/X with `transport: local`
    and a node record whose `python` is their script. The victim's plain `orch status` refuses it
    (exit 2, the fix said) and runs nothing of it, also once ~/.orch itself is made private."""
    home = tmp_path / "victim" / ".orch"
    home.mkdir(parents=True)
    home.chmod(0o775)
    marker = plant(home, tmp_path, OTHER_UID)
    orch = Orch(home)
    res = orch.run("status", timeout=60)
    assert res.returncode == 2 and f"chmod 700 {home}" in res.stderr, res.stderr
    assert not marker.exists()
    home.chmod(0o700)
    res = orch.run("status", timeout=60)
    assert res.returncode == 2 and f"uid {OTHER_UID}" in res.stderr, res.stderr
    assert not marker.exists()
    res = orch.run("down", timeout=60)
    assert res.returncode == 2 and not marker.exists(), res.stderr
    run = next((home / "runs").iterdir())
    for p in (home / "runs", run, home / "latest"):  # only the files are theirs now
        os.chown(p, os.geteuid(), os.getegid())
    res = orch.run("status", timeout=60)
    assert res.returncode == 2 and f"{run / 'run.json'} is not this user's alone" in res.stderr, res.stderr
    assert not marker.exists()


def test_run_json_never_says_what_runs_only_the_snapshot_does(tmp_path: Path) -> None:
    """Even in a private $ORCH_HOME, a node record's `python` (or `remote_dir`) that is not what
    the run's inventory snapshot says is refused, never run."""
    home = tmp_path / ".orch"
    home.mkdir(mode=0o700)
    marker = plant(home, tmp_path, None)
    orch = Orch(home)
    for command in ("status", "down", "stacks"):
        res = orch.run(command, timeout=60)
        assert res.returncode == 2 and "is not what the run's inventory snapshot says" in res.stderr, res.stderr
        assert not marker.exists(), command


def test_the_planted_script_is_what_orch_status_ran_before(tmp_path: Path) -> None:
    """The plant itself works: with the record's python the snapshot's, status runs the agent (no
    refusal), so the refusals above are the guard's doing, not a broken plant."""
    home = tmp_path / ".orch"
    home.mkdir(mode=0o700)
    plant(home, tmp_path, None)
    run = next((home / "runs").iterdir())
    data = json.loads((run / "run.json").read_text())
    data["nodes"][0].update(python="python3", remote_dir=str(tmp_path / "nodes" / run.name / "n1"))
    (run / "run.json").write_text(json.dumps(data))
    res = subprocess.run(
        [sys.executable, "-m", "orchestrator", "status", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, ORCH_HOME=str(home), NO_COLOR="1"),
    )
    assert res.returncode in (0, 1) and "refusing" not in res.stderr, res.stderr


def test_the_preflight_refuses_a_run_root_the_agent_would_refuse(tmp_path: Path) -> None:
    """job.run_root under a directory its group can write (an NFS home under umask 002): `orch
    check` fails the job row with the agent's own words for the run directory it would refuse."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    inv = tmp_path / "inv.yaml"
    inv.write_text(inventory_text(sys.executable, str(shared / "nodes")).replace("/bin/true", str(tmp_path / "job.py")))
    (tmp_path / "job.py").write_text("print('hi')\n")
    res = Orch(tmp_path / "home").run("check", str(inv), "--only", "job", timeout=120)
    assert res.returncode != 0 and "can be changed by others" in res.stdout, res.stdout + res.stderr
    from orchestrator.node import trust

    rundir = shared / "nodes" / "r" / "n1"
    rundir.mkdir(parents=True, mode=0o700)
    with pytest.raises(trust.UntrustedDir) as refused:  # what the agent says of a run directory there
        trust.check_run_dir(str(rundir))
    assert res.returncode != 0 and str(refused.value) in " ".join(res.stdout.split()), res.stdout + res.stderr
    shared.chmod(0o755)
    res = Orch(tmp_path / "home").run("check", str(inv), "--only", "job", timeout=120)
    assert "can be changed by others" not in res.stdout, res.stdout
