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
from orchestrator.node import agent_files
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


# ----------------------------------------------------------------------------- the way to $ORCH_HOME (issue 53.2)

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="plays a second user: needs root to chown a link")


def consistent_run(home: Path, tmp_path: Path, python: str) -> Path:
    """A run in `home` whose run.json and inventory snapshot agree (`python` runs its agent, as
    the snapshot says: no guard refuses it); returns its directory."""
    plant(home, tmp_path, None)
    run = next((home / "runs").iterdir())
    (run / "inventory.yaml").write_text(inventory_text(python, str(tmp_path / "nodes")))
    data = json.loads((run / "run.json").read_text())
    data["nodes"][0].update(python=python, remote_dir=str(tmp_path / "nodes" / run.name / "n1"))
    (run / "run.json").write_text(json.dumps(data))
    return run


def turn(link: Path, target: Path) -> None:
    """Point `link` at `target` in one step (rename over it), as an attacker flipping it would."""
    new = link.with_name(f".{link.name}.new")
    new.symlink_to(target)
    os.replace(new, link)


def test_what_orch_reads_is_the_run_it_judged_whatever_a_link_to_orch_home_says_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flip race of issue 53 made deterministic: $ORCH_HOME is a link, and the moment orch has
    judged the run (its last `check_private`), the link is turned to another tree holding a run of
    the same id whose `python` is a script that leaves a marker (run.json and snapshot agreeing).
    `orch status` reads, and runs, only the run it judged: every path is built from where the
    link led when $ORCH_HOME was resolved, once."""
    from orchestrator import store
    from orchestrator.run.control import status

    judged, planted = tmp_path / "judged", tmp_path / "planted"
    judged.mkdir(mode=0o700)
    planted.mkdir(mode=0o700)
    run = consistent_run(judged, tmp_path, "python3")
    marker = plant(planted, tmp_path, None)  # the same run id; its python a script that leaves the marker
    evil = tmp_path / "evil.sh"
    theirs = planted / "runs" / run.name
    (theirs / "inventory.yaml").write_text(inventory_text(str(evil), str(tmp_path / "nodes")))
    data = json.loads((theirs / "run.json").read_text())
    data["nodes"][0].update(remote_dir=str(tmp_path / "nodes" / run.name / "n1"))
    (theirs / "run.json").write_text(json.dumps(data))
    (tmp_path / "nodes" / run.name / "n1").mkdir(parents=True, mode=0o700)  # where the agent is asked
    link = tmp_path / "orch-home"
    link.symlink_to(judged)
    monkeypatch.setenv("ORCH_HOME", str(link))
    flips = []
    check = store.check_private

    def check_then_turn(path: Path) -> Path:
        out = check(path)
        if path.name == "inventory.yaml":  # the last check before the run is read: now turn the link
            turn(link, planted)
            flips.append(path)
        return out

    monkeypatch.setattr(store, "check_private", check_then_turn)
    report = status(run.name)
    assert flips, "the link was never turned: the test proved nothing"
    assert os.readlink(link) == str(planted)
    assert not marker.exists(), "orch ran the script of the run the link was turned to"
    assert report.run == run.name and json.loads((run / "run.json").read_text())["nodes"][0]["python"] == "python3"
    assert store.RunStore().get(run.name).path == run  # built from where $ORCH_HOME led when it was resolved


@ROOT_ONLY
@pytest.mark.parametrize("where", ["orch_home", "above"])
def test_a_link_another_user_owns_on_the_way_to_orch_home_is_refused(tmp_path: Path, where: str) -> None:
    """Whoever owns a link can turn it at any time, between orch's check and its read: a link
    of another user's on the way to $ORCH_HOME (the home itself, or a directory above it) is
    refused (exit 2, the link and its owner named, the fix said), even while it leads to the
    user's own, private home; nothing of the run is run."""
    mine = tmp_path / "mine"
    (mine / ".orch").mkdir(parents=True, mode=0o700)
    run = consistent_run(mine / ".orch", tmp_path, "python3")
    if where == "orch_home":
        link = tmp_path / "orch-victim"
        link.symlink_to(mine / ".orch")
        home = link
    else:
        link = tmp_path / "data"
        link.symlink_to(mine)
        home = link / ".orch"
    os.lchown(link, OTHER_UID, OTHER_UID)
    for command in ("status", "runs", "logs"):
        res = Orch(home).run(command, timeout=60)
        said = " ".join(res.stderr.split())
        assert res.returncode == 2, (command, res.stdout, res.stderr)
        assert f"{link}, a link on the way to {home}, belongs to uid {OTHER_UID}" in said, said
        assert f"use {os.readlink(link)} itself, or set $ORCH_HOME" in said, said
    assert run.exists()


def test_the_preflight_refuses_a_run_root_reached_through_a_link_into_a_directory_others_can_write(
    tmp_path: Path,
) -> None:
    """job.run_root through a link (this user's own) into a directory its group can write: the
    directories judged are those the link leads through, where someone else could rename the run
    directory away. `orch check` fails the job row with the words the agent refuses it with."""
    shared = tmp_path / "shared"
    (shared / "sub").mkdir(parents=True)
    shared.chmod(0o775)
    link = tmp_path / "runs"
    link.symlink_to(shared / "sub")
    inv = tmp_path / "inv.yaml"
    inv.write_text(inventory_text(sys.executable, str(link / "nodes")).replace("/bin/true", str(tmp_path / "job.py")))
    (tmp_path / "job.py").write_text("print('hi')\n")
    res = Orch(tmp_path / "home").run("check", str(inv), "--only", "job", timeout=120)
    said = " ".join(res.stdout.split())
    from orchestrator.node import trust

    rundir = link / "nodes" / "r" / "n1"
    rundir.mkdir(parents=True, mode=0o700)
    with pytest.raises(trust.UntrustedDir) as refused:  # what the agent says of a run directory there
        trust.check_run_dir(str(rundir))
    assert f"{shared}, above the run directory, can be changed by others" in str(refused.value)
    assert res.returncode != 0 and str(refused.value) in said, said


@ROOT_ONLY
def test_the_preflight_refuses_a_run_root_through_a_link_another_user_owns(tmp_path: Path) -> None:
    """job.run_root through another user's link to the SSH user's own directory: the agent
    refuses the run directory there (its owner could turn the link between the agent's check and
    its read), and `orch check` fails the job row with the same words, before anything starts."""
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = tmp_path / "runs"
    link.symlink_to(mine)
    os.lchown(link, OTHER_UID, OTHER_UID)
    inv = tmp_path / "inv.yaml"
    inv.write_text(inventory_text(sys.executable, str(link / "nodes")).replace("/bin/true", str(tmp_path / "job.py")))
    (tmp_path / "job.py").write_text("print('hi')\n")
    res = Orch(tmp_path / "home").run("check", str(inv), "--only", "job", timeout=120)
    said = " ".join(res.stdout.split())
    from orchestrator.node import trust

    rundir = mine / "nodes" / "r" / "n1"
    rundir.mkdir(parents=True, mode=0o700)
    with pytest.raises(trust.UntrustedDir) as refused:
        trust.check_run_dir(str(link / "nodes" / "r" / "n1"))
    assert f"{link}, a link on the way to the run directory, belongs to uid {OTHER_UID}" in str(refused.value)
    assert res.returncode != 0 and str(refused.value) in said, said


def container_run(home: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A run of a podman `job.container` inventory in `home` whose run.json and snapshot agree, with
    `podman` on PATH a script that leaves a marker whenever anything runs it: (the run, the marker)."""
    run = consistent_run(home, tmp_path, "python3")
    text = yaml.safe_load((run / "inventory.yaml").read_text())
    text["job"]["container"] = {"runtime": "podman", "image": "img:1", "python": "/usr/bin/python3"}
    (run / "inventory.yaml").write_text(yaml.safe_dump(text))
    rundir = tmp_path / "nodes" / run.name / "n1"
    rundir.mkdir(parents=True, mode=0o700)
    for name, text in agent_files().items():  # the agent answers (nothing started here): what follows is reached
        (rundir / name).write_text(text)
    marker = tmp_path / "runtime-ran"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "podman").write_text(f'#!/bin/sh\necho "$@" >> {marker}\n')
    (bin_dir / "podman").chmod(0o755)
    return run, marker


@pytest.mark.parametrize("nonce", ["`touch {pwned}`", "$(touch {pwned})", "0123456789ab; touch {pwned}"])
def test_a_run_json_nonce_not_of_orchs_form_is_refused_before_anything_runs(tmp_path: Path, nonce: str) -> None:
    """Issue 53's reproduction: the nonce `orch exec --container` once wrote into a node's `sh -c`
    (a nonce of `` `id` `` ran `id` there). A run.json nonce orch did not write (12 hex digits) is
    refused, exit 2, naming run.json and the key, by every command that takes one to a node; nothing
    runs there, not even the runtime."""
    home = tmp_path / ".orch"
    home.mkdir(mode=0o700)
    run, ran = container_run(home, tmp_path)
    pwned = tmp_path / "pwned"
    evil = nonce.format(pwned=pwned)
    data = json.loads((run / "run.json").read_text())
    data["nonce"] = evil
    data["nodes"][0]["nonce"] = evil
    (run / "run.json").write_text(json.dumps(data))
    orch = Orch(home, env={"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"})
    for command in (["exec", "--container", run.name, "--", "true"], ["down"], ["status"], ["stacks"], ["logs"]):
        res = orch.run(*command, timeout=60)
        said = " ".join(res.stderr.split())
        assert not pwned.exists() and not ran.exists(), command
        assert res.returncode == 2 and "is not one orch writes (12 lowercase hex digits)" in said, (command, said)
        assert str(run / "run.json") in said, said


def test_a_planted_container_sweep_in_run_json_is_refused_by_orch_down(tmp_path: Path) -> None:
    """Issue 53's other reproduction: `orch down` once ran run.json's container `sweep` argv as
    written. A record whose sweep (or its removal) is not what the snapshot says is refused, exit 2,
    and nothing of it runs."""
    home = tmp_path / ".orch"
    home.mkdir(mode=0o700)
    run, ran = container_run(home, tmp_path)
    pwned = tmp_path / "pwned"
    orch = Orch(home, env={"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"})
    original = json.loads((run / "run.json").read_text())
    for key, planted in (("sweep", ["sh", "-c", f"touch {pwned}"]), ("sweep_remove", ["sh", "-c", f"touch {pwned}"])):
        data = json.loads(json.dumps(original))
        data["nonce"] = data["nodes"][0]["nonce"] = "0123456789ab"
        data["nodes"][0][key] = planted
        (run / "run.json").write_text(json.dumps(data))
        res = orch.run("down", timeout=60)
        said = " ".join(res.stderr.split())
        assert not pwned.exists() and not ran.exists(), key
        assert res.returncode == 2 and f"{key} " in said and "is not what the run's inventory snapshot says" in said, (
            said
        )
