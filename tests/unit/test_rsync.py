"""`orch sync`'s pure builders, golden-tested: the ssh command (the inventory's settings, the
host-key policy as OpenSSH spells it), the rsync argv of the SSH transport's `copy_tree`, rsync's -e
splitting, rsync's report; and the command line where no node is contacted."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.config import inventory, nodes
from orchestrator.errors import TransportError
from orchestrator.remote import sync
from orchestrator.transport.copy import NOT_INSTALLED, REMOTE_RSYNC, parse_output, rsync_failed
from orchestrator.transport.ssh import SSHTransport, openssh_argv, openssh_failure


def node(ssh: str = "", host: str = "gpu01") -> nodes.Node:
    return inventory.parse(f"ssh: {{{ssh}}}\nnodes:\n  - host: {host}\n", "t.yaml").nodes[0]


def test_ssh_argv_strict_with_every_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/me")
    n = node(
        "user: train, port: 2222, identity: ~/.ssh/id_ed25519, known_hosts: ~/.ssh/known_hosts, connect_timeout: 2.5"
    )
    assert openssh_argv(n.ssh, "/home/me/.ssh/config") == [
        "ssh",
        "-F",
        "/home/me/.ssh/config",
        "-p",
        "2222",
        "-l",
        "train",
        "-i",
        "/home/me/.ssh/id_ed25519",
        "-o",
        "UserKnownHostsFile=/home/me/.ssh/known_hosts",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=3",
        "-o",
        "ForwardAgent=no",
        "-o",
        "ForwardX11=no",
        "-o",
        "ClearAllForwardings=yes",
        "-o",
        "PermitLocalCommand=no",
        "-o",
        "ControlMaster=no",
        "-o",
        "ControlPath=none",
        "-o",
        "UpdateHostKeys=no",
        "-o",
        "RequestTTY=no",
        "-o",
        "ServerAliveInterval=10",
        "-o",
        "ServerAliveCountMax=6",
        "-o",
        "LogLevel=ERROR",
    ]


def test_ssh_argv_accept_new_without_user_identity_or_config() -> None:
    n = node("host_key_policy: accept-new, known_hosts: /etc/orch/known_hosts")
    assert openssh_argv(n.ssh, None) == [
        "ssh",
        "-F",
        "none",
        "-p",
        "22",
        "-o",
        "UserKnownHostsFile=/etc/orch/known_hosts",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=accept-new",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=10",
        "-o",
        "ForwardAgent=no",
        "-o",
        "ForwardX11=no",
        "-o",
        "ClearAllForwardings=yes",
        "-o",
        "PermitLocalCommand=no",
        "-o",
        "ControlMaster=no",
        "-o",
        "ControlPath=none",
        "-o",
        "UpdateHostKeys=no",
        "-o",
        "RequestTTY=no",
        "-o",
        "ServerAliveInterval=10",
        "-o",
        "ServerAliveCountMax=6",
        "-o",
        "LogLevel=ERROR",
    ]


def test_no_policy_ever_turns_host_key_checking_off() -> None:
    for policy in ("strict", "accept-new"):
        argv = openssh_argv(node(f"host_key_policy: {policy}").ssh, None)
        assert "StrictHostKeyChecking=no" not in argv and "UserKnownHostsFile=/dev/null" not in argv


def test_a_gateway_is_a_proxy_command_with_the_same_settings() -> None:
    n = node("user: train, port: 2222, identity: /keys/id 50%, known_hosts: /kh, gateway: jump.example")
    argv = openssh_argv(n.ssh, None)
    proxy = next(a for a in argv if a.startswith("ProxyCommand="))
    assert proxy == (
        "ProxyCommand=ssh -F none -p 2222 -l train -i '/keys/id 50%%' -o UserKnownHostsFile=/kh "
        "-o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes -o BatchMode=yes "
        "-o ConnectTimeout=10 -o ForwardAgent=no -o ForwardX11=no -o ClearAllForwardings=yes -o PermitLocalCommand=no -o ControlMaster=no -o ControlPath=none -o UpdateHostKeys=no -o RequestTTY=no -o ServerAliveInterval=10 -o ServerAliveCountMax=6 "
        "-o LogLevel=ERROR -W %h:%p jump.example"
    )
    assert argv[: argv.index("-o")] == ["ssh", "-F", "none", "-p", "2222", "-l", "train", "-i", "/keys/id 50%"]


def test_rsync_argv_golden() -> None:
    n = node("user: train, identity: /keys/id, known_hosts: /kh, host_key_policy: accept-new")
    argv = SSHTransport(n).rsync_argv(["/srv/yolo", "/data/coco.yaml"], dry_run=True, delete=True)
    assert argv == [
        "rsync",
        "--archive",
        "--omit-dir-times",
        "--relative",
        "--no-implied-dirs",
        "--itemize-changes",
        "--stats",
        "--exclude=__pycache__/",
        "--rsh",
        "ssh -F none -p 22 -l train -i /keys/id -o UserKnownHostsFile=/kh "
        "-o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=accept-new -o BatchMode=yes "
        "-o ConnectTimeout=10 -o ForwardAgent=no -o ForwardX11=no -o ClearAllForwardings=yes -o PermitLocalCommand=no -o ControlMaster=no -o ControlPath=none -o UpdateHostKeys=no -o RequestTTY=no -o ServerAliveInterval=10 -o ServerAliveCountMax=6 "
        "-o LogLevel=ERROR",
        "--rsync-path",
        REMOTE_RSYNC,
        "--dry-run",
        "--delete",
        "/srv/yolo",
        "/data/coco.yaml",
        "gpu01:/",
    ]
    assert SSHTransport(n).rsync_argv(["/a"], checksum=True)[-3:] == ["--checksum", "/a", "gpu01:/"]
    assert SSHTransport(n).rsync_argv(["/a"], stall_s=29.5)[-3:] == ["--timeout=30", "/a", "gpu01:/"]  # image push
    assert SSHTransport(node(host="fd00::7")).rsync_argv(["/a"])[-1] == "[fd00::7]:/"
    assert SSHTransport(n).rsync_argv(["/a"], "/srv/copies")[-1] == "gpu01:/srv/copies/"


@pytest.mark.parametrize("bad", ["relative", "/", "/srv/yolo/"])
def test_rsync_argv_refuses_what_would_land_elsewhere(bad: str) -> None:
    with pytest.raises(ValueError):
        SSHTransport(node()).rsync_argv([bad])


@pytest.fixture
def recording_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `ssh` first on PATH that records its argv and fails, as an unreachable host would."""
    record = tmp_path / "argv.json"
    fake = tmp_path / "bin" / "ssh"
    fake.parent.mkdir()
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\nsys.exit(255)\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    return record


def test_rsync_splits_the_rsh_command_into_exactly_our_argv(recording_ssh: Path, tmp_path: Path) -> None:
    """rsync, not a shell, splits --rsh: quotes and spaces in paths must survive its rules."""
    n = node("user: o'brien, identity: \"/keys/my key's\", known_hosts: '/kh \"x\"', gateway: jump")
    src = tmp_path / "src"
    src.mkdir()
    proc = subprocess.run(SSHTransport(n).rsync_argv([str(src)]), capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    recorded = json.loads(recording_ssh.read_text())
    expected = openssh_argv(n.ssh, None)[1:] + ["gpu01", REMOTE_RSYNC]
    assert recorded[: len(expected)] == expected
    assert recorded[len(expected)] == "--server"


def test_the_node_side_names_a_missing_rsync() -> None:
    """REMOTE_RSYNC as a node's login shell runs it (with rsync's server arguments after it)."""
    missing = subprocess.run(
        ["/bin/sh", "-c", REMOTE_RSYNC + " --version"],
        capture_output=True,
        text=True,
        env={"PATH": "/nonexistent"},
        timeout=30,
    )
    assert (missing.returncode, missing.stderr.strip()) == (127, NOT_INSTALLED)
    present = subprocess.run(["/bin/sh", "-c", REMOTE_RSYNC + " --version"], capture_output=True, text=True, timeout=30)
    assert present.returncode == 0 and present.stdout.startswith("rsync  version")


STATS = """\
>f+++++++++ srv/yolo/train.py
cd+++++++++ srv/yolo/cfg/
>f.st...... srv/yolo/cfg/my data.yaml
*deleting   srv/yolo/old.py

Number of files: 1,204 (reg: 1,180, dir: 24)
Number of created files: 1 (reg: 1)
Number of deleted files: 1 (reg: 1)
Number of regular files transferred: 2
Total file size: 12,345,678 bytes
Total transferred file size: 1,234,567 bytes
Literal data: 1,000 bytes
Matched data: 0 bytes
File list size: 0
File list generation time: 0.001 seconds
File list transfer time: 0.000 seconds
Total bytes sent: 2,345,678
Total bytes received: 35

sent 2,345,678 bytes  received 35 bytes  4,691,426.00 bytes/sec
total size is 12,345,678  speedup is 5.26
"""


def test_parse_output_golden() -> None:
    t = parse_output(STATS)
    assert (t.files, t.bytes, t.sent, t.deleted, t.up_to_date) == (2, 1234567, 2345678, 1, False)
    assert t.changes == (
        ">f+++++++++ /srv/yolo/train.py",
        "cd+++++++++ /srv/yolo/cfg/",
        ">f.st...... /srv/yolo/cfg/my data.yaml",
        "*deleting /srv/yolo/old.py",
    )


def test_parse_output_refuses_a_report_without_statistics() -> None:
    with pytest.raises(ValueError, match="Number of regular files transferred"):
        parse_output(">f+++++++++ srv/yolo/train.py\n")


def test_parse_output_of_a_real_local_rsync(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    (src / "sub").mkdir(parents=True)
    (src / "a.py").write_text("a" * 100)
    (src / "sub" / "b c.txt").write_text("b")
    cmd = [
        "rsync",
        "--archive",
        "--omit-dir-times",
        "--relative",
        "--no-implied-dirs",
        "--itemize-changes",
        "--stats",
        str(src),
        f"{dest}/",
    ]
    first = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}, check=True)
    t = parse_output(first.stdout)
    assert (t.files, t.bytes) == (2, 101)
    assert f"cd+++++++++ {src}/sub/" in t.changes and f">f+++++++++ {src}/sub/b c.txt" in t.changes
    again = parse_output(
        subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}, check=True).stdout
    )
    assert again.up_to_date and (again.files, again.bytes, again.changes) == (0, 0, ())


@pytest.mark.parametrize(
    ("stderr", "message", "hint"),
    [
        (
            f"{NOT_INSTALLED}\nrsync: connection unexpectedly closed (0 bytes received so far) [sender]\n"
            "rsync error: remote command not found (code 127) at io.c(232) [sender=3.2.7]\n",
            "rsync is not installed on this node",
            "apt-get install rsync",
        ),
        (
            "No ED25519 host key is known for gpu01 and you have requested strict checking.\n"
            "Host key verification failed.\nrsync: connection unexpectedly closed (0 bytes received so far) [sender]\n",
            "ssh: host key of gpu01 is not in ~/.ssh/known_hosts (No ED25519 host key is known for gpu01",
            "ssh-keyscan -p 22 gpu01 >> ~/.ssh/known_hosts (or set ssh.host_key_policy: accept-new)",
        ),
        (
            "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
            "Host key for gpu01 has changed and you have requested strict checking.\nHost key verification failed.\n",
            "ssh: host key of gpu01 CHANGED",
            "ssh-keygen -R 'gpu01' -f ~/.ssh/known_hosts",
        ),
        (
            "root@gpu01: Permission denied (publickey).\n",
            "authentication refused for gpu01:22 (root@gpu01: Permission denied (publickey))",
            "authorized_keys",
        ),
        (
            'rsync: [Receiver] mkdir "/srv/yolo" failed: Permission denied (13)\nrsync error: error in file IO (code 11)\n',
            'mkdir "/srv/yolo" failed',
            None,
        ),
    ],
)
def test_a_failure_is_one_line_with_its_fix(stderr: str, message: str, hint: str | None) -> None:
    n = node()
    failed = rsync_failed(n.name, 12, stderr, lambda said: openssh_failure(n, said))
    got, got_hint = failed.detail, failed.hint
    assert message in got and "\n" not in got and failed.returncode == 12
    assert (hint is None and got_hint is None) or (hint is not None and got_hint is not None and hint in got_hint)


# ----------------------------------------------------------------------------- the command line


def inv_file(tmp_path: Path, transport: str = "ssh", paths: list[str] | None = None) -> Path:
    f = tmp_path / "inv.yaml"
    doc = {
        "transport": transport,
        "nodes": [{"host": "localhost", "name": "n[0-1]"}] if transport == "local" else [{"host": "192.0.2.1"}],
    }
    if paths is not None:
        doc["job"] = {"sync": paths}
    f.write_text(yaml.safe_dump(doc))
    return f


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_empty_job_sync_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["sync", str(inv_file(tmp_path))], capsys)
    assert code == 2 and "job.sync is empty: nothing to sync" in err


def test_a_source_missing_here_is_named_before_any_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("nothing may run"))
    code, _, err = run(["sync", str(inv_file(tmp_path, paths=[str(tmp_path), "/nonexistent/orch-x"]))], capsys)
    assert code == 2 and "job.sync[1]: /nonexistent/orch-x does not exist on this machine (the controller)" in err


def test_rsync_missing_here_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "rsync" else "/usr/bin/" + name)
    code, _, err = run(["sync", str(inv_file(tmp_path, paths=[str(tmp_path)]))], capsys)
    assert code == 1
    assert err.splitlines()[0] == "orch: rsync is not installed on this machine (the controller): orch sync needs it"


def test_local_transport_copies_nothing_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["sync", str(inv_file(tmp_path, "local", [str(tmp_path)]))], capsys)
    assert code == 0 and "nothing copied: transport: local" in out
    code, out, _ = run(["sync", str(inv_file(tmp_path, "local", [str(tmp_path)])), "--json"], capsys)
    doc = json.loads(out)
    assert doc["ok"] and doc["skipped"].startswith("transport: local") and len(doc["nodes"]) == 2


def test_orch_up_without_rsync_here_launches_nothing_and_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "rsync" else "/usr/bin/" + name)
    code, _, err = run(["up", str(inv_file(tmp_path, paths=[str(tmp_path)]))], capsys)
    assert code == 3
    assert "rsync is not installed on this machine (the controller)" in err
    assert "job.sync could not be copied to every node: nothing was launched" in err
    assert not (tmp_path / "home").exists()


def test_a_symlinked_source_is_refused_naming_it_and_its_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """rsync copies a listed link as a link: the node's real directory there would become it."""
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("nothing may run"))
    real = tmp_path / "big" / "coco"
    real.mkdir(parents=True)
    link = tmp_path / "coco"
    link.symlink_to(real)
    for flags in ([], ["--delete"]):
        code, _, err = run(["sync", str(inv_file(tmp_path, paths=[str(tmp_path / "big"), str(link)])), *flags], capsys)
        assert code == 2, err
        assert (
            f"job.sync[1]: {link} is a symbolic link (to {real})" in err
            and f"list what it points to instead ({real})" in err
        )
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    code, _, err = run(["sync", str(inv_file(tmp_path, paths=[str(tmp_path / "dangling")]))], capsys)
    assert code == 2 and "is a symbolic link" in err


def trainer_inv(tmp_path: Path, job: dict[str, object]) -> Path:
    f = tmp_path / "inv.yaml"
    f.write_text(yaml.safe_dump({"nodes": [{"host": "192.0.2.1"}], "job": job}))
    return f


@pytest.mark.parametrize(
    ("job", "holds"),
    [
        (
            {"module": "trainer", "args": {"epochs": 1}},
            "the trainer's default output folder (under job.workdir) {w}/runs",
        ),
        # the trainer puts a relative project under runs/<task>/ (ultralytics 8.4): runs is what it writes
        ({"module": "trainer", "args": {"project": "out/exp"}}, "the job's --project (under job.workdir) {w}/runs"),
        ({"module": "trainer", "args": {"project": "{w}/out"}}, "the job's --project {w}/out"),
        ({"script": "/x/train.py", "args": ["--out", "{w}/keep/run1"]}, "the job's --out {w}/keep/run1"),
        ({"script": "/x/train.py", "args": {"debug-dir": "dbg"}}, "the job's --debug-dir (under job.workdir) {w}/dbg"),
        ({"script": "/x/train.py", "run_root": "{w}/.orch-runs"}, "job.run_root {w}/.orch-runs"),
    ],
)
def test_delete_is_refused_where_a_synced_directory_holds_what_the_run_writes(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    job: dict[str, object],
    holds: str,
) -> None:
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("nothing may run"))
    work = tmp_path / "work"
    work.mkdir()
    doc = json.loads(json.dumps(job).replace("{w}", str(work)))
    inv = trainer_inv(tmp_path, {**doc, "workdir": str(work), "sync": [str(work)]})
    code, _, err = run(["sync", str(inv), "--delete"], capsys)
    assert code == 2, err
    assert f"job.sync[0] {work} holds {holds.format(w=work)}: --delete would remove on every node" in err
    assert "hint: sync without --delete" in err


def test_delete_is_allowed_where_the_output_is_elsewhere(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    inv = inventory.load(
        trainer_inv(
            tmp_path,
            {
                "module": "trainer",
                "workdir": str(work),
                "sync": [str(work / "code")],
                "args": {"project": str(tmp_path / "runs")},
            },
        )
    )
    (work / "code").mkdir()
    sync.refuse_delete_over_output(inv, inv.job.sync)  # no output under work/code: nothing refused
    assert [w for w, _ in sync.kept_dirs(inv)] == ["job.run_root", "the job's --project"]


# ----------------------------------------------------------------------------- what the ssh config may not change

HOSTILE_CONFIG = """\
Host jumpbox
  HostName 192.0.2.9
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  ForwardAgent yes
Host gpu*
  ForwardAgent yes
  ForwardX11 yes
  PermitLocalCommand yes
  LocalCommand touch /tmp/orch-local-command
  ControlMaster auto
  ControlPath /tmp/orch-master-%r@%h:%p
  LocalForward 8888 localhost:8888
  ProxyJump jumpbox
Host chained
  ProxyJump hop1,admin@hop2:2200
Host hop1
  ProxyJump bastion
Host loop1
  ProxyJump loop2
Host loop2
  ProxyJump loop1
"""


def ssh_G(argv: list[str], host: str) -> dict[str, str]:
    """What OpenSSH makes of an argv for `host` (`ssh -G`: the configuration it would use)."""
    out = subprocess.run(
        [argv[0], "-G", *argv[1:], host],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env={**os.environ, "LC_ALL": "C"},
    ).stdout
    return {k: v for k, _, v in (line.partition(" ") for line in out.splitlines())}


def proxy_argv(proxy_command: str) -> tuple[list[str], str]:
    """A ProxyCommand of ours, as the ssh that runs it sees it: (the hop's argv, its host)."""
    words = [w.replace("%%", "%") for w in shlex.split(proxy_command)]
    assert words[-3:-1] == ["-W", "%h:%p"], words
    return words[:-3], words[-1]


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[nodes.SSHOptions, str]:
    cfg = tmp_path / "ssh_config"
    cfg.write_text(HOSTILE_CONFIG)
    kh = tmp_path / "known_hosts"
    return node(f"known_hosts: {kh}, user: train", host="gpu1").ssh, str(cfg)


def test_the_config_forwards_nothing_and_its_proxyjump_hop_is_verified(
    hostile: tuple[nodes.SSHOptions, str], tmp_path: Path
) -> None:
    """`ssh -G` over orch's argv with a config that forwards the agent, X11 and a port, runs a
    LocalCommand, shares a master connection and jumps through a host it does not verify."""
    opts, cfg = hostile
    kh = str(tmp_path / "known_hosts")
    argv = openssh_argv(opts, cfg, "gpu1")
    got = ssh_G(argv, "gpu1")
    assert (got["forwardagent"], got["forwardx11"], got["clearallforwardings"], got["permitlocalcommand"]) == (
        "no",
        "no",
        "yes",
        "no",
    )
    assert got["controlmaster"] == "false" and "controlpath" not in got and "localforward" not in got
    assert (got["stricthostkeychecking"], got["userknownhostsfile"], got["globalknownhostsfile"]) == (
        "true",
        kh,
        "/dev/null",
    )
    assert "proxyjump" not in got  # ours prevails: the hop is reached by the ssh below, verified
    hop, host = proxy_argv(got["proxycommand"])
    assert host == "jumpbox"
    # the same options as for the node (the hop's user and port are the config's: ProxyJump names none)
    assert hop == ["ssh", "-F", cfg, *argv[argv.index("-o") : -2]] and argv[-2:] == [
        "-o",
        "ProxyCommand=" + got["proxycommand"],
    ]
    jump = ssh_G(hop, host)
    assert (jump["hostname"], jump["stricthostkeychecking"], jump["userknownhostsfile"]) == ("192.0.2.9", "true", kh)
    assert (jump["forwardagent"], jump["batchmode"]) == ("no", "yes")


def test_a_chain_of_jumps_is_verified_hop_by_hop_and_a_loop_is_refused(hostile: tuple[nodes.SSHOptions, str]) -> None:
    opts, cfg = hostile
    got = ssh_G(openssh_argv(opts, cfg, "chained"), "chained")
    second, host2 = proxy_argv(got["proxycommand"])  # chained <- admin@hop2:2200 <- hop1 <- bastion
    assert host2 == "hop2" and second[second.index("-p") + 1] == "2200" and second[second.index("-l") + 1] == "admin"
    first, host1 = proxy_argv(ssh_G(second, host2)["proxycommand"])
    assert host1 == "hop1"
    bastion, host0 = proxy_argv(ssh_G(first, host1)["proxycommand"])
    assert host0 == "bastion" and "proxycommand" not in ssh_G(bastion, host0)
    for argv, h in ((second, host2), (first, host1), (bastion, host0)):
        assert ssh_G(argv, h)["stricthostkeychecking"] == "true"
    with pytest.raises(TransportError, match="ProxyJump loop"):
        openssh_argv(opts, cfg, "loop1")


def test_without_a_config_file_no_ssh_config_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    argv = openssh_argv(node().ssh, None, "gpu01", lambda *a: asked.append(a[1]) or "x")
    assert asked == [] and not any(a.startswith("ProxyCommand=") for a in argv)


def test_an_inventory_gateway_behind_a_config_proxyjump_is_verified_both_hops(
    hostile: tuple[nodes.SSHOptions, str], tmp_path: Path
) -> None:
    opts, cfg = hostile
    from dataclasses import replace

    argv = openssh_argv(replace(opts, gateway="gpu-gw"), cfg, "10.0.0.5")  # gpu-gw matches `Host gpu*`: jumpbox
    gw, host = proxy_argv(ssh_G(argv, "10.0.0.5")["proxycommand"])
    assert host == "gpu-gw" and gw[gw.index("-p") + 1] == "22" and gw[gw.index("-l") + 1] == "train"
    jump, host = proxy_argv(ssh_G(gw, "gpu-gw")["proxycommand"])
    assert host == "jumpbox" and ssh_G(jump, host)["userknownhostsfile"] == str(tmp_path / "known_hosts")
