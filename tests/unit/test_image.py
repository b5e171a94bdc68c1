"""`orch image push`'s pure parts (orchestrator/remote/image.py): the node commands, golden; the
guard that names a missing runtime, run by a real /bin/sh; the IDs as each runtime prints them;
the worst exit code; the rendered lines."""

from __future__ import annotations

import io
import os
import shlex
import subprocess

import pytest

from orchestrator.config import inventory, runtimes
from orchestrator.errors import UsageError
from orchestrator.remote.image import (
    ROOM,
    ImageReport,
    NodePush,
    check_image_arg,
    inspect_argv,
    last_words,
    load_argv,
    no_room,
    read_room,
    room_argvs,
    save_argv,
)
from orchestrator.transport import Result, command_line, open_transport

MB = 1_000_000

GUARD = (
    'command -v "$0" >/dev/null 2>&1 || { echo "orch: $0 is not installed on this node" >&2; exit 127; }; '
    'exec "$0" "$@"'
)
"""One fixed script: the runtime's own argv (the table's) after it, every value a positional parameter."""


def test_node_commands_golden():
    fmt = "{{.Id}}\t{{json .Config.Env}}"
    assert inspect_argv("docker", "yoloe:latest") == [
        "/bin/sh",
        "-c",
        GUARD,
        *["docker", "image", "inspect", "--format", fmt, "yoloe:latest"],
    ]
    assert load_argv("podman") == ["/bin/sh", "-c", GUARD, "podman", "load"]
    assert inspect_argv("apptainer", "/images/y.sif") == [
        "/bin/sh",
        "-c",
        GUARD,
        *["sha256sum", "/images/y.sif"],
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


def test_an_image_the_node_lacks_is_read_as_not_there_and_a_runtime_that_fails_as_its_failure(tmp_path):
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Error: No such image: img' >&2\nexit 1\n")
    fake.chmod(0o755)
    docker = runtimes.runtime("docker")
    proc = subprocess.run(
        inspect_argv("docker", "img"), capture_output=True, text=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"}
    )
    assert runtimes.held(docker, proc.returncode, proc.stdout, proc.stderr) == runtimes.HeldImage(None, {})
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    proc = subprocess.run(
        inspect_argv("docker", "img"), capture_output=True, text=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"}
    )
    assert (
        runtimes.held(docker, proc.returncode, proc.stdout, proc.stderr).error == "Cannot connect to the Docker daemon"
    )
    sif = tmp_path / "y.sif"
    apptainer = runtimes.runtime("apptainer")
    proc = subprocess.run(inspect_argv("apptainer", str(sif)), capture_output=True, text=True)
    assert runtimes.held(apptainer, proc.returncode, proc.stdout, proc.stderr) == runtimes.HeldImage(None, {})
    sif.write_bytes(b"sif")
    proc = subprocess.run(inspect_argv("apptainer", str(sif)), capture_output=True, text=True)
    import hashlib

    assert (
        runtimes.held(apptainer, proc.returncode, proc.stdout, proc.stderr).image_id
        == hashlib.sha256(b"sif").hexdigest()
    )


def test_the_room_a_push_writes_to_is_looked_at_on_the_node_and_judged_by_one_rule(tmp_path):
    """The direct push looks at each room by a real /bin/sh and df (the nearest directory that
    exists, its free bytes); the chain's relay by statvfs; both judged by `short_of_room` with one
    need: podman's store one copy of the archive, its staging two (`Runtime.tmp_copies`)."""
    assert [what for what, _ in room_argvs("podman", "img")] == ["store", "staging"]
    assert [what for what, _ in room_argvs("docker", "img")] == ["store"]
    (what, argv) = room_argvs("apptainer", "/images/y.sif")[0]
    assert what == "file" and subprocess.run(argv, capture_output=True, text=True).stdout == "/images\n"
    where = tmp_path / "graph" / "not-yet"
    proc = subprocess.run(ROOM.argv("/bin/sh", "-c", 'echo "$1"', "sh", str(where)), capture_output=True, text=True)
    room = read_room("store", Result("n1", (), proc.returncode, proc.stdout, proc.stderr, 0.0))
    fs = os.statvfs(tmp_path)
    assert room is not None and room["what"] == "store" and room["path"] == str(tmp_path), proc
    assert abs(room["free"] - fs.f_bavail * fs.f_frsize) < 64 * MB  # others write to this disk meanwhile
    said = subprocess.run(ROOM.argv("/bin/sh", "-c", "echo not a path"), capture_output=True, text=True)
    assert read_room("store", Result("n1", (), said.returncode, said.stdout, said.stderr, 0.0)) is None
    rooms = [
        {"what": "store", "path": "/var/lib/containers", "free": 35 * MB, "dev": "/"},
        {"what": "staging", "path": "/var/tmp", "free": 35 * MB, "dev": "/"},
    ]
    full = no_room("n1", "podman", rooms, 12 * MB, None)
    assert full is not None and full.exit_code == 1 and full.action == "failed"
    assert full.error == "no room: needs 36.0 MB on /var/lib/containers, 35.0 MB free there"
    assert no_room("n1", "podman", [{**rooms[0], "dev": "/data"}, rooms[1]], 12 * MB, None) is None
    assert no_room("n1", "docker", rooms[:1], 12 * MB, None) is None
    assert no_room("n1", "podman", [], 12 * MB, None) is None  # a node that could not say: its load will


PODMAN_SAYS = {
    "logfmt": 'time="2026-12-07T17:45:15Z" level=debug msg="Using graph root {root}"',
    "terminal": "DEBU[0000] Using graph root {root}",
    "silent": 'time="2026-12-07T17:45:15Z" level=debug msg="Using storage driver overlay"',
    "quoted": 'time="2026-12-07T17:45:15Z" level=debug msg="Using graph root {root}\\"x"',
}


@pytest.mark.parametrize("says", sorted(PODMAN_SAYS))
def test_podmans_store_is_read_from_its_own_debug_line_else_asked_of_podman_info(tmp_path, says):
    """podman's store for the room check: the "Using graph root" line podman writes while it
    opens its store for `image exists` (0.03 CPU-s), and only where it writes none that reads as a
    whole path, `podman info` (0.2-0.3 CPU-s; the same answer, asked of every node before a push)."""
    root = "/srv/containers/node 1/storage"
    fake = tmp_path / "podman"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {shlex.quote(str(tmp_path / "asked"))}\n'
        'case "$*" in info*) echo /from/podman/info; exit 0;; esac\n'
        f"echo {shlex.quote(PODMAN_SAYS[says].format(root=root))} >&2\n"
        "echo 'stdout is not read'\n"
        "exit 1\n"
    )
    fake.chmod(0o755)
    argv = room_argvs("podman", "img")[0][1]
    proc = subprocess.run(argv, capture_output=True, text=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    asked = (tmp_path / "asked").read_text().splitlines()
    assert asked[0] == "--log-level=debug image exists orch-store-probe:none"
    if says in ("logfmt", "terminal"):
        assert (proc.returncode, proc.stdout, asked[1:]) == (0, root + "\n", []), proc
    else:
        assert (proc.returncode, proc.stdout) == (0, "/from/podman/info\n"), proc
        assert asked[1:] == ["info --format {{.Store.GraphRoot}}"]
    missing = subprocess.run(argv, capture_output=True, text=True, env={"PATH": "/nonexistent"})
    assert (missing.returncode, missing.stderr) == (127, "orch: podman is not installed on this node\n")


PODMAN_FULL = """Getting image source signatures
Copying blob sha256:47ec9fdcdbe1371f6713c95b0f54e2f5355c7d6827f5c971bbc589583c57f109
Error: payload does not match any of the supported image formats:
 * oci: initializing source oci:/s/tmp/podman3731988144:: open /s/tmp/podman3731988144/index.json: not a directory
 * oci-archive: loading index: open /var/tmp/oci3672695152/index.json: no such file or directory
 * docker-archive: writing blob: storing blob to file "/s/tmp/storage125603771/1": write /s/tmp/storage125603771/1: \
no space left on device
 * dir: open /s/tmp/podman3731988144/manifest.json: not a directory
"""
"""`podman load`'s stderr where the disk filled storing the layer (podman 4.3, recorded on a tmpfs)."""


def test_a_failed_load_is_told_by_its_last_lines_from_its_error_on():
    said = last_words(PODMAN_FULL)
    assert said.startswith("Error: payload does not match any of the supported image formats: | * oci: ")
    assert "no space left on device | * dir: open " in said and "Getting image source" not in said
    assert last_words("a\nb\n\n" + "".join(f"line {i}\n" for i in range(9))) == " | ".join(
        f"line {i}" for i in range(3, 9)
    )
    assert last_words("") == "(no message)"


def test_the_stream_reaches_the_node_over_the_transports_openssh_with_one_line():
    """`orch image push` pipes the archive through `Transport.pipe`, whose process here is `reach`."""
    inv = inventory.parse(
        "ssh: {user: me, port: 2222, ssh_config: /nonexistent}\nnodes:\n  - host: 10.0.0.1\n", "t.yaml"
    )
    line = command_line(["/bin/sh", "-c", "echo $0", "podman"])
    argv = open_transport(inv, inv.nodes[0]).reach(line)
    assert argv[0] == "ssh" and argv[-2:] == ["10.0.0.1", "exec /bin/sh -c 'echo $0' podman"]
    assert argv[argv.index("-p") : argv.index("-p") + 2] == ["-p", "2222"]
    assert "StrictHostKeyChecking=yes" in argv and "BatchMode=yes" in argv
    local = inventory.parse("transport: local\nnodes:\n  - host: localhost\n", "t.yaml")
    assert open_transport(local, local.nodes[0]).reach(command_line(["true"])) == ["/bin/sh", "-c", "exec true"]


@pytest.mark.parametrize(
    ("printed", "want"),
    [
        (f'sha256:{"d9" * 32}\t["PATH=/usr/bin"]\n', "d9" * 32),  # docker
        (f"{'d9' * 32}\t[]\n", "d9" * 32),  # podman
        ("", None),
        ("\n  \n", None),
    ],
)
def test_the_id_as_each_runtime_prints_it(printed, want):
    assert runtimes.held(runtimes.runtime("podman"), 0, printed, "").image_id == want


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
        "role": None,
        "received_bytes": None,
        "bytes_per_s": None,
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
    assert "bare.yaml has no job.container.runtime" in err and f"--runtime {'|'.join(runtimes.RUNTIMES)}" in err


def test_a_stalled_load_is_told_by_how_far_it_got_what_was_ended_and_exits_124():
    from orchestrator.remote.image import TIMED_OUT, stalled_hint, stalled_row

    row = stalled_row(30, 3_145_728, 12_582_912, "its load was ended, the chain relayed on")
    assert row == (
        "load took no byte for 30 s at byte 3145728 of 12582912 (25%); its load was ended, the chain relayed on"
    )
    hint = stalled_hint("podman")
    assert hint.startswith("is its load stopped") and "ps -o pid,stat,args -C podman" in hint
    assert "raise --stall-timeout" in hint
    stalled = NodePush("gpu2", "failed", None, None, row, hint, TIMED_OUT)
    loaded = NodePush("gpu1", "loaded", "a" * 64, None)
    assert ImageReport("y", "podman", "a" * 64, 1, (loaded, stalled)).exit_code == 124
    lost = NodePush("gpu3", "failed", None, None, "ssh: refused", None, 255)
    assert ImageReport("y", "podman", "a" * 64, 1, (loaded, stalled, lost)).exit_code == 255


def test_the_stall_deadline_is_one_value_in_the_code_the_cli_and_the_contract(tmp_path, monkeypatch, capsys):
    """image.STALL_S defines it; the CLI's default and CONTRACT.md are held to it; the option reaches
    the push as given, and a deadline that is none (0, nan, inf) is refused, exit 2."""
    from pathlib import Path

    from orchestrator.cli import commands, main
    from orchestrator.remote import image

    assert commands.IMAGE_STALL_S == image.STALL_S
    from orchestrator.remote import chain

    docs = Path(__file__).resolve().parents[2] / "docs"
    contract, guide = (docs / "CONTRACT.md").read_text(), (docs / "guide.md").read_text()
    assert f"`--stall-timeout SECONDS` ({image.STALL_S:g}" in contract
    assert f"`--stall-timeout` seconds ({image.STALL_S:g})" in contract
    assert f"`chain.SINK_GRACE_S` ({chain.SINK_GRACE_S:g} s)" in contract
    assert f"`--stall-timeout` ({image.STALL_S:g} s" in guide
    floor = f"{image.relay.LOAD_FLOOR_BPS / (1 << 20):g} MiB/s"  # the finishing's deadline
    assert contract.count(floor) == 2 and guide.count(floor) == 1, floor
    local = inventory.parse("transport: local\nnodes:\n  - host: localhost\n", "t.yaml")
    with pytest.raises(UsageError, match="stall deadline"):  # the library refuses it too, asking nothing
        image.push_image(local, [], "y", "podman", stall_s=0)
    seen = []

    def fake_push(inv, nodes, ref, runtime, **kw):
        seen.append(kw["stall_s"])
        return ImageReport(ref, runtime, "a" * 64, 0, ())

    monkeypatch.setattr(image, "push_image", fake_push)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    inv = tmp_path / "c.yaml"
    inv.write_text("transport: local\nnodes:\n  - host: localhost\n")
    for extra, code in (([], 0), (["--stall-timeout", "120"], 0), (["--stall-timeout", "0"], 2)):
        with pytest.raises(SystemExit) as info:
            main(["image", "push", "y:latest", str(inv), "--runtime", "podman", *extra])
        assert info.value.code == code, extra
    for bad in ("nan", "inf", "-1"):
        with pytest.raises(SystemExit) as info:
            main(["image", "push", "y:latest", str(inv), "--runtime", "podman", "--stall-timeout", bad])
        assert info.value.code == 2, bad
    assert seen == [image.STALL_S, 120.0]
    assert "--stall-timeout" in capsys.readouterr().err


def test_the_direct_push_shows_what_each_node_took_as_it_goes():
    """DirectWatch draws a View per node from its stream's count: waiting its turn, sending (with
    its bytes), loading once every byte went, then its outcome."""
    import threading

    from orchestrator.remote.image import DirectWatch
    from orchestrator.transport import Fed

    drawn: list[list] = []
    got = threading.Event()

    def watch(views):
        drawn.append(list(views))
        got.set()

    shown = DirectWatch(watch, 1000, ["gpu1", "gpu2"])
    try:
        fed = Fed(30.0)
        fed.took(400)
        shown.feds["gpu1"] = fed
        views = {v.node: v for v in shown.views()}
        assert (views["gpu1"].got, views["gpu1"].total, views["gpu1"].state) == (400, 1000, "sending")
        assert (views["gpu2"].got, views["gpu2"].state, views["gpu2"].role) == (0, "waiting", None)
        fed.took(600)
        fed.ended = True
        assert {v.node: v.state for v in shown.views()}["gpu1"] == "loading"
        shown.ended["gpu1"] = "loaded"
        assert {v.node: v.state for v in shown.views()}["gpu1"] == "loaded"
        assert got.wait(10), "its thread draws"
    finally:
        shown.stop()
    assert drawn and all(len(views) == 2 for views in drawn)


def test_a_direct_load_that_took_every_byte_and_hangs_fails_by_its_finish_deadline(tmp_path, monkeypatch):
    """Directly: the stream into a load that took it whole and then hangs is ended `finish_s` after
    the last byte; the node's row says so (exit 124), and what to look at."""
    from orchestrator.remote import image
    from orchestrator.transport import Fed, LocalTransport

    archive = tmp_path / "image.tar"
    archive.write_bytes(b"x" * 300_000)
    monkeypatch.setattr(image, "load_argv", lambda runtime: ["sh", "-c", "cat >/dev/null; exec sleep 60"])
    local = inventory.parse("transport: local\nnodes:\n  - host: localhost\n", "t.yaml")
    t = LocalTransport(local.nodes[0])
    fed = Fed(0.3, finish_s=1.0)
    got = image._load(t, runtimes.runtime("podman"), "y:1", str(archive), "a" * 64, None, fed, 300_000)
    assert got.exit_code == image.TIMED_OUT and got.action == "failed", got
    assert got.error == "load took every byte (300000) and did not finish within 1 s; its load was ended", got
    assert got.hint is not None and "raise --stall-timeout" in got.hint
