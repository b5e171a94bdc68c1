"""`orch image push`'s pure parts (orchestrator/remote/image.py): the node commands, golden; the
guard that names a missing runtime, run by a real /bin/sh; the IDs as each runtime prints them;
the worst exit code; the rendered lines."""

from __future__ import annotations

import io
import subprocess

import pytest

from orchestrator.config import inventory
from orchestrator.errors import UsageError
from orchestrator.remote.image import (
    ImageReport,
    NodePush,
    check_image_arg,
    inspect_argv,
    load_argv,
    node_argv,
    normal_id,
    save_argv,
)

GUARD = 'command -v "$0" >/dev/null 2>&1 || { echo "orch: $0 is not installed on this node" >&2; exit 127; }; '


def test_node_commands_golden():
    assert inspect_argv("docker", "yoloe:latest") == [
        "/bin/sh",
        "-c",
        GUARD + '"$0" image inspect --format "{{.Id}}" "$1" 2>/dev/null || true',
        "docker",
        "yoloe:latest",
    ]
    assert load_argv("podman", "yoloe:latest") == [
        "/bin/sh",
        "-c",
        GUARD + '"$0" load >&2 && "$0" image inspect --format "{{.Id}}" "$1"',
        "podman",
        "yoloe:latest",
    ]
    assert inspect_argv("apptainer", "/images/y.sif") == [
        "/bin/sh",
        "-c",
        GUARD + 'test -e "$1" || exit 0; sha256sum "$1" | cut -d" " -f1',
        "sha256sum",
        "/images/y.sif",
    ]
    assert save_argv("docker", "yoloe:latest", "/tmp/x/image.tar") == [
        "docker",
        "save",
        "-o",
        "/tmp/x/image.tar",
        "yoloe:latest",
    ]


def test_a_missing_runtime_is_named_by_the_node_shell():
    proc = subprocess.run(inspect_argv("podman", "img"), capture_output=True, text=True, env={"PATH": "/nonexistent"})
    assert proc.returncode == 127
    assert proc.stderr == "orch: podman is not installed on this node\n"


def test_an_image_the_node_lacks_prints_nothing_and_exits_0(tmp_path):
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Error: No such image: img' >&2\nexit 1\n")
    fake.chmod(0o755)
    proc = subprocess.run(
        inspect_argv("docker", "img"), capture_output=True, text=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"}
    )
    assert (proc.returncode, proc.stdout) == (0, "")


def test_node_argv_is_the_transports_openssh_with_one_line():
    inv = inventory.parse(
        "ssh: {user: me, port: 2222, ssh_config: /nonexistent}\nnodes:\n  - host: 10.0.0.1\n", "t.yaml"
    )
    argv = node_argv(inv, inv.nodes[0], ["/bin/sh", "-c", "echo $0", "podman"])
    assert argv[0] == "ssh" and argv[-2:] == ["10.0.0.1", "exec /bin/sh -c 'echo $0' podman"]
    assert argv[argv.index("-p") : argv.index("-p") + 2] == ["-p", "2222"]
    assert "StrictHostKeyChecking=yes" in argv and "BatchMode=yes" in argv
    local = inventory.parse("transport: local\nnodes:\n  - host: localhost\n", "t.yaml")
    assert node_argv(local, local.nodes[0], ["true"]) == ["/bin/sh", "-c", "exec true"]


@pytest.mark.parametrize(
    ("printed", "want"),
    [
        ("sha256:d9ff8d5725a6979dcf9fb3905a3d811e\n", "d9ff8d5725a6979dcf9fb3905a3d811e"),  # docker
        ("d9ff8d5725a6979dcf9fb3905a3d811e\n", "d9ff8d5725a6979dcf9fb3905a3d811e"),  # podman
        ("Loaded image: x\nsha256:abc\n", "abc"),
        ("", None),
        ("\n  \n", None),
    ],
)
def test_normal_id(printed, want):
    assert normal_id(printed) == want


@pytest.mark.parametrize(
    ("runtime", "image", "says"),
    [
        ("lxc", "img", "unknown container runtime 'lxc'"),
        ("apptainer", "yoloe.sif", "is not an absolute .sif path"),
        ("apptainer", "/images/yoloe", "is not an absolute .sif path"),
        ("docker", "--all", "is not an image"),
    ],
)
def test_bad_arguments_are_refused(runtime, image, says):
    with pytest.raises(UsageError, match=says):
        check_image_arg(runtime, image)


def test_worst_exit_code_and_the_lines():
    from orchestrator.cli.render import image_report

    nodes = (
        NodePush("gpu1", "present", "a" * 64, "a" * 64),
        NodePush("gpu2", "loaded", "a" * 64, "b" * 64, elapsed_s=4.25),
        NodePush(
            "gpu3",
            "failed",
            None,
            None,
            "podman is not installed on this node",
            "install podman there, or leave the node out (--nodes)",
            127,
        ),
        NodePush("gpu4", "failed", None, None, "ssh: connection to gpu4:22 refused", None, 255),
    )
    report = ImageReport("yoloe:latest", "podman", "a" * 64, 330_000_000, nodes, 9.0)
    assert report.exit_code == 255 and not report.ok
    assert ImageReport("y", "podman", "a", 0, nodes[:2]).exit_code == 0
    out = io.StringIO()
    image_report(report, out)
    assert out.getvalue().splitlines() == [
        "push yoloe:latest (podman, aaaaaaaaaaaa, 330.0 MB) → 4 node(s) in 9.0 s",
        "  gpu1  present aaaaaaaaaaaa, skipped",
        "  gpu2  loaded aaaaaaaaaaaa in 4.2 s, verified (was bbbbbbbbbbbb)",
        "  gpu3  FAILED: podman is not installed on this node (exit 127)",
        "        hint: install podman there, or leave the node out (--nodes)",
        "  gpu4  FAILED: ssh: connection to gpu4:22 refused (exit 255)",
    ]
    assert report.to_json()["nodes"][1] == {
        "node": "gpu2",
        "ok": True,
        "action": "loaded",
        "image_id": "a" * 64,
        "before": "b" * 64,
        "error": None,
        "hint": None,
        "exit_code": 0,
        "elapsed_s": 4.25,
    }


def test_the_runtime_comes_from_the_flag_or_job_container(tmp_path, monkeypatch, capsys):
    """Without --runtime: the inventory's job.container.runtime; with neither, exit 2 naming both."""
    from orchestrator.cli import main
    from orchestrator.remote import image

    seen = []

    def fake_push(inv, nodes, ref, runtime, **kw):
        seen.append(runtime)
        return ImageReport(ref, runtime, "a" * 64, 0, ())

    monkeypatch.setattr(image, "push_image", fake_push)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    bare = tmp_path / "bare.yaml"
    bare.write_text("transport: local\nnodes:\n  - host: localhost\n")
    with_container = tmp_path / "c.yaml"
    with_container.write_text(
        "transport: local\nnodes:\n  - host: localhost\n"
        "job:\n  container:\n    runtime: podman\n    image: yoloe:latest\n"
    )
    for args, code in (([str(with_container)], 0), ([str(with_container), "--runtime", "docker"], 0), ([str(bare)], 2)):
        with pytest.raises(SystemExit) as info:
            main(["image", "push", "yoloe:latest", *args])
        assert info.value.code == code
    assert seen == ["podman", "docker"]
    err = capsys.readouterr().err
    assert "bare.yaml has no job.container.runtime" in err and "--runtime docker|podman|apptainer" in err
