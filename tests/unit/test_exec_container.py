"""`orch exec --container RUN`: the node command (golden), run by a real /bin/sh against a fake
runtime on PATH, and the usage it refuses."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.config.container import NO_CONTAINER_EXIT, Container, exec_argv

FIND = (
    'id=$("$0" ps -q --filter label=orch.run=r1 --filter label=orch.nonce=abc); [ -n "$id" ] || '
    '{ echo "orch: no running container of run r1 on this node" >&2; exit 125; }; exec "$0" exec "$id" "$@"'
)


def test_exec_argv_golden() -> None:
    c = Container("podman", "img")
    assert exec_argv(c, "r1", "abc", ["nvidia-smi", "-L"]) == ["/bin/sh", "-c", FIND, "podman", "nvidia-smi", "-L"]
    assert exec_argv(c, "r1", "abc", ["echo $X | wc"]) == ["/bin/sh", "-c", FIND, "podman", "sh", "-c", "echo $X | wc"]


def fake_runtime(tmp_path: Path, running: str) -> dict[str, str]:
    rt = tmp_path / "podman"
    rt.write_text(f'#!/bin/sh\nif [ "$1" = ps ]; then echo "{running}"; exit 0; fi\nshift; echo "exec in $*"\n')
    rt.chmod(0o755)
    return {"PATH": f"{tmp_path}:/usr/bin:/bin"}


def test_the_node_command_finds_the_container_or_says_there_is_none(tmp_path: Path) -> None:
    argv = exec_argv(Container("podman", "img"), "r1", "abc", ["cat", "/etc/os-release"])
    ran = subprocess.run(argv, capture_output=True, text=True, env=fake_runtime(tmp_path, "3f2a"))
    assert (ran.returncode, ran.stdout) == (0, "exec in 3f2a cat /etc/os-release\n")
    ran = subprocess.run(argv, capture_output=True, text=True, env=fake_runtime(tmp_path, ""))
    assert ran.returncode == NO_CONTAINER_EXIT
    assert ran.stderr == "orch: no running container of run r1 on this node\n"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--container", "r1", "inv.yaml", "--", "true"], "--container RUN with an INVENTORY or -w"),
        (["--container", "r1", "--env", "A=1", "--", "true"], "--env with --container"),
    ],
)
def test_exec_container_usage(
    args: list[str], says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ORCH_HOME", str(tmp_path))
    with pytest.raises(SystemExit) as info:
        main(["exec", *args])
    assert info.value.code == 2
    assert says in capsys.readouterr().err
