"""SSHTransport against real sshd nodes: errors by kind, host key policies, put, popen, quoting."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.config import inventory, nodes
from orchestrator.errors import TransportError
from orchestrator.transport import Cluster, LocalTransport, SSHTransport, Transport
from tests.cluster import KeyStore, TestCluster

MODES = [pytest.param("loopback"), pytest.param("netns", marks=pytest.mark.netns)]

ECHO = [sys.executable, "-S", "-c", "import json,os,sys; print(json.dumps([sys.argv[1:], os.environ.get('X')]))"]
# Anything a shell might interpret (quotes, newlines, $(), backticks, spaces) plus unicode;
# NUL cannot exist in argv or environ at all, lone surrogates cannot be encoded.
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
NASTY = [
    "",
    " ",
    "a b",
    "'",
    '"',
    "$(id)",
    "`id`",
    "$HOME",
    "\\",
    "line1\nline2",
    "\r\t",
    "*",
    ";rm -rf /;",
    "ünïcødé ✓ 日本",
    "--",
    "-c",
    "~",
    "%s{}",
]


@pytest.fixture(scope="module")
def shared(cluster_keys: KeyStore, tmp_path_factory: pytest.TempPathFactory):
    """One 4-node loopback cluster for the tests that do not change it (saves a start per test)."""
    c = TestCluster(cluster_keys, 4, "loopback", root=tmp_path_factory.mktemp("shared")).start()
    try:
        yield c
    finally:
        c.stop()


def _inv(c: TestCluster, **ssh: object) -> inventory.Inventory:
    """The cluster's inventory with some `ssh:` keys overridden."""
    path = c.root / f"inv-{time.monotonic_ns()}.yaml"
    return inventory.load(c.write_inventory(path, ssh=ssh) if ssh else c.write_inventory(path))


def _connect_error(node: nodes.Node) -> TransportError:
    with pytest.raises(TransportError) as err, SSHTransport(node) as t:
        t.run(["true"])
    return err.value


# ----------------------------------------------------------------------------- fan-out


@pytest.mark.parametrize("mode", MODES)
def test_fan_out_with_one_sshd_stopped_reports_every_node(cluster_in, mode):
    c = cluster_in(mode)
    inv = inventory.load(c.write_inventory())
    with Cluster(inv) as cl:
        before = cl.fan_out(lambda t: t.run(["hostname"]).check().stdout.strip())
    assert all(isinstance(v, str) for v in before.values())
    if mode == "netns":
        assert before == {n: n for n in before}
    c.stop_node("node3")
    with Cluster(inv) as cl:
        start = time.monotonic()
        got = cl.fan_out(lambda t: t.run(["sh", "-c", "echo $ORCH_TEST_NODE"]).check().stdout.strip())
        elapsed = time.monotonic() - start
    assert list(got) == ["node1", "node2", "node3", "node4"]
    assert {k: v for k, v in got.items() if k != "node3"} == {"node1": "node1", "node2": "node2", "node4": "node4"}
    err = got["node3"]
    assert isinstance(err, TransportError) and err.kind == "unreachable" and err.node == "node3"
    assert "refused" in str(err)
    assert elapsed < inv.node("node3").ssh.connect_timeout  # refused fast, not after a timeout


@pytest.mark.foreground  # bounds a fan-out to 3.5 s
@pytest.mark.netns
def test_fan_out_with_one_link_down_waits_connect_timeout_not_more(netns_cluster):
    inv = inventory.load(netns_cluster.write_inventory(ssh={"connect_timeout": 2}))
    netns_cluster.link_down("node2")
    took: dict[str, float] = {}

    def hostname(t: Transport) -> str:
        start = time.monotonic()
        try:
            return t.run(["hostname"]).check().stdout.strip()
        finally:
            took[t.node.name] = time.monotonic() - start

    with Cluster(inv) as cl:
        got = cl.fan_out(hostname)
    assert {k: v for k, v in got.items() if k != "node2"} == {"node1": "node1", "node3": "node3", "node4": "node4"}
    assert isinstance(got["node2"], TransportError) and got["node2"].kind == "unreachable"
    # the dead node costs its connect_timeout (a TCP timer, not CPU-bound), not more
    assert took["node2"] < 2 + 1.5


def test_a_direct_connection_sends_without_nagle(shared):
    """The socket under a direct connection has TCP_NODELAY (each handshake round trip otherwise
    waits for sshd's delayed ACK), and commands run over it as before."""
    inv = _inv(shared)
    with SSHTransport(inv.nodes[0]) as t:
        assert t.run(["sh", "-c", "echo $ORCH_TEST_NODE"]).check().stdout.strip() == "node1"
        sock = t._conn.client.get_transport().sock
        assert isinstance(sock, socket.socket)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


PROBE_TWO = """
import sys
from orchestrator.config import inventory
from orchestrator.transport import SSHTransport
for path, name in ((sys.argv[1], "node1"), (sys.argv[2], "node2")):
    with SSHTransport(inventory.load(path).node(name)) as t:
        got = t.run(["sh", "-c", "echo $ORCH_TEST_NODE"]).check().stdout.strip()
        print(got, type(t._conn).__name__, "invoke" in sys.modules)
"""


def test_no_ssh_config_is_bare_paramiko_and_an_alias_with_match_exec_still_works(shared, tmp_path):
    """A node without an ssh config file connects on bare paramiko, without importing invoke; an
    ssh config alias with `Match exec` (which paramiko runs through invoke) then still resolves in
    the same process, through Fabric."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f'Match exec "test -d /"\n  ServerAliveInterval 7\n\nHost alias-two\n  HostName {shared.node("node2").host}\n'
    )
    direct = shared.write_inventory(tmp_path / "direct.yaml")
    aliased = shared.write_inventory(
        tmp_path / "aliased.yaml", ssh={"ssh_config": str(cfg)}, nodes_extra={"node2": {"host": "alias-two"}}
    )
    proc = subprocess.run(
        [sys.executable, "-c", PROBE_TWO, str(direct), str(aliased)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:2] == ["node1 _Direct False", "node2 Connection True"], proc.stdout


def test_a_proxyjump_hop_from_the_ssh_config_has_its_host_key_verified(shared, tmp_path):
    """ProxyJump in the ssh config: node2 is reached through node1, and node1's key is checked
    against the inventory's known_hosts like any node's (strict: unknown is refused)."""
    n1, n2 = shared.node("node1"), shared.node("node2")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Host hop-one\n  HostName {n1.host}\n  Port {n1.port}\n  IdentityFile {shared.client_key}\n"
        f"  User {shared.user}\n\nHost via-one\n  HostName {n2.host}\n  ProxyJump hop-one\n"
    )
    inv = _inv(shared, ssh_config=str(cfg))
    path = tmp_path / "inv.yaml"
    path.write_text(inv.source.replace(f"host: {n2.host}", "host: via-one", 1))
    logins = shared.sshd_log("node1").count("Accepted publickey")
    with SSHTransport(inventory.load(path).node("node2")) as t:
        assert t.run(["sh", "-c", "echo $ORCH_TEST_NODE"]).check().stdout.strip() == "node2"
    assert shared.sshd_log("node1").count("Accepted publickey") == logins + 1  # the hop's login
    only_node2 = tmp_path / "known_hosts"
    only_node2.write_text(
        "".join(line + "\n" for line in shared.known_hosts.read_text().splitlines() if line.startswith(f"[{n2.host}]"))
    )
    path.write_text(path.read_text().replace(str(shared.known_hosts), str(only_node2)))
    err = _connect_error(inventory.load(path).node("node2"))
    assert err.kind == "host_key_unknown" and n1.host in str(err), err


@pytest.mark.netns
def test_a_gateway_hop_reaches_a_node_through_another(netns_cluster):
    """`ssh.gateway` on bare paramiko: node2 is reached through a direct-tcpip channel of node1."""
    n1 = netns_cluster.node("node1")
    inv = inventory.load(netns_cluster.write_inventory(nodes_extra={"node2": {"gateway": n1.host}}))
    with SSHTransport(inv.node("node2")) as t:
        assert t.run(["sh", "-c", "echo $ORCH_TEST_NODE"]).check().stdout.strip() == "node2"
        conn = t._conn
        assert conn.gateway is not None and conn.gateway.is_connected
    assert f"from {n1.host} port" in netns_cluster.sshd_log("node2")
    assert not conn.is_connected and not conn.gateway.is_connected  # closing closes the hop too


# ----------------------------------------------------------------------------- host keys and auth


def test_strict_refuses_unknown_host_key_with_keyscan_hint(shared, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    inv = _inv(shared, known_hosts=str(empty))
    err = _connect_error(inv.node("node1"))
    assert err.kind == "host_key_unknown"
    assert err.hint and "ssh-keyscan" in err.hint and str(inv.node("node1").ssh.port) in err.hint
    assert empty.read_text() == ""  # strict never writes known_hosts


def test_strict_refuses_changed_host_key(shared, cluster_keys, tmp_path):
    node = shared.node("node2")
    other = Path(str(cluster_keys.new_key("impostor")) + ".pub").read_text().split()
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[{node.host}]:{node.port} {other[0]} {other[1]}\n")
    for policy in ("strict", "accept-new"):  # accept-new only accepts *unknown* keys
        err = _connect_error(_inv(shared, known_hosts=str(kh), host_key_policy=policy).node("node2"))
        assert err.kind == "host_key_changed", policy
        assert err.hint and "ssh-keygen -R" in err.hint
    assert kh.read_text().count("\n") == 1


def test_accept_new_records_the_key_then_strict_connects(shared, tmp_path):
    kh = tmp_path / "sub" / "known_hosts"
    inv = _inv(shared, known_hosts=str(kh), host_key_policy="accept-new")
    with Cluster(inv) as cl:
        got = cl.fan_out(lambda t: t.run(["true"]).exit_code)
    assert got == {f"node{i}": 0 for i in range(1, 5)}
    recorded = sorted(kh.read_text().splitlines())
    assert recorded == sorted(shared.known_hosts.read_text().splitlines())
    strict = _inv(shared, known_hosts=str(kh))
    with SSHTransport(strict.node("node4")) as t:
        assert t.run(["sh", "-c", "echo $ORCH_TEST_NODE"]).check().stdout == "node4\n"


def test_hashed_known_hosts_and_one_parse_for_all_nodes(shared, tmp_path, monkeypatch):
    """known_hosts hashed by `ssh-keygen -H` (HashKnownHosts yes) verifies every node, and is read
    once for the whole fan-out, not once per node."""
    from orchestrator.transport import hostkeys

    kh = tmp_path / "known_hosts"
    kh.write_text(shared.known_hosts.read_text())
    subprocess.run(["ssh-keygen", "-H", "-f", str(kh)], check=True, capture_output=True, timeout=30)
    assert "|1|" in kh.read_text() and shared.node("node1").host not in kh.read_text()
    parsed: list[str] = []
    parse = hostkeys.parse_known_hosts

    def counting(path: str, text: str) -> hostkeys.KnownHosts:
        parsed.append(path)
        return parse(path, text)

    monkeypatch.setattr(hostkeys, "parse_known_hosts", counting)
    monkeypatch.setattr(hostkeys, "_KNOWN_HOSTS", {})
    with Cluster(_inv(shared, known_hosts=str(kh))) as cl:
        got = cl.fan_out(lambda t: t.run(["sh", "-c", "echo $ORCH_TEST_NODE"]).check().stdout.strip())
    assert got == {f"node{i}": f"node{i}" for i in range(1, 5)}
    assert parsed == [str(kh)]


@pytest.mark.parametrize("ssh_config", [False, True], ids=["paramiko", "fabric"])
def test_a_revoked_host_key_is_refused_under_either_policy_and_never_recorded(shared, tmp_path, ssh_config):
    """An `@revoked` line made every connection fail with paramiko's `InvalidHostKey ... Incorrect
    padding`. Now the node offering that key is refused (named, with the fix), the others connect."""
    n1 = shared.node("node1")
    lines = shared.known_hosts.read_text().splitlines()
    mine = next(ln for ln in lines if ln.startswith(f"[{n1.host}]:{n1.port} "))
    kh = tmp_path / "known_hosts"
    kh.write_text(
        "\n".join(
            [
                "# keys of the test cluster",
                f"@revoked * {mine.split(' ', 1)[1]}",
                *lines,
                "[10.9.9.9]:22 ssh-ed25519 not-base64!!",
                "@unknown-marker x y z",
            ]
        )
        + "\n"
    )
    before = kh.read_text()
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host *\n  ServerAliveInterval 9\n")
    extra = {"ssh_config": str(cfg)} if ssh_config else {}
    for policy in ("strict", "accept-new"):
        inv = _inv(shared, known_hosts=str(kh), host_key_policy=policy, **extra)
        err = _connect_error(inv.node("node1"))
        assert err.kind == "host_key_revoked", (policy, err)
        assert f"{kh} line 2 marks it @revoked" in err.message and err.message.startswith("node1: ")
        assert err.hint and "new host key" in err.hint
        with SSHTransport(inv.node("node2")) as t:
            assert t.run(["sh", "-c", "echo $ORCH_TEST_NODE"]).check().stdout == "node2\n"
    assert kh.read_text() == before  # accept-new never records a revoked key


def test_cert_authority_lines_are_skipped_and_said_when_a_node_is_unknown(shared, tmp_path):
    n1 = shared.node("node1")
    others = [ln for ln in shared.known_hosts.read_text().splitlines() if not ln.startswith(f"[{n1.host}]:{n1.port} ")]
    ca = Path(str(shared.client_key) + ".pub").read_text().split()
    kh = tmp_path / "known_hosts"
    kh.write_text("\n".join([f"@cert-authority *.example,{n1.host} {ca[0]} {ca[1]}", *others]) + "\n")
    inv = _inv(shared, known_hosts=str(kh))
    err = _connect_error(inv.node("node1"))
    assert err.kind == "host_key_unknown" and "@cert-authority line(s) (1) are not used" in err.message, err
    assert err.hint and "ssh-keyscan" in err.hint
    with Cluster(inv) as cl:
        got = cl.fan_out(lambda t: t.run(["true"]).exit_code, [n for n in inv.nodes if n.name != "node1"])
    assert got == {"node2": 0, "node3": 0, "node4": 0}


def test_wrong_identity_is_an_auth_error(shared, cluster_keys):
    err = _connect_error(_inv(shared, identity=str(cluster_keys.new_key("stranger"))).node("node1"))
    assert err.kind == "auth"
    assert err.hint and "authorized_keys" in err.hint


def test_missing_identity_file_is_reported(shared, tmp_path):
    err = _connect_error(_inv(shared, identity=str(tmp_path / "no-such-key")).node("node1"))
    assert err.kind == "auth"
    assert "identity file" in str(err) and "no-such-key" in str(err)
    assert err.hint and "ssh.identity" in err.hint


# ----------------------------------------------------------------------------- commands


def test_nonzero_exit_and_both_streams(shared):
    with SSHTransport(_inv(shared).node("node1")) as t:
        r = t.run(["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")


def test_a_command_that_exits_before_reading_its_stdin_is_its_exit_and_stderr(shared):
    """`orch up` on a node whose `python:` does not exist: the shell exits 127 before reading the
    agent's spec on stdin. With stdin larger than the channel's window the write is still going when
    the channel closes: that is the command's answer (127 and the shell's line), not "cannot reach
    ...: Socket is closed", and the connection stays usable (one full run saw this race)."""
    with SSHTransport(_inv(shared).node("node3")) as t:
        for _ in range(3):
            r = t.run(["/nonexistent/bin/python3", "-c", "pass"], stdin=b"x" * (8 << 20), timeout=30)
            assert r.exit_code == 127 and "/nonexistent/bin/python3" in r.stderr, r
        assert t.run(["echo", "again"]).check().stdout == "again\n"


@pytest.mark.foreground  # bounds a 0.5 s timeout to 3 s
def test_timeout_is_a_timeout_error_and_the_transport_stays_usable(shared):
    with SSHTransport(_inv(shared).node("node2")) as t:
        start = time.monotonic()
        with pytest.raises(TransportError) as err:
            t.run(["sleep", "30"], timeout=0.5)
        assert err.value.kind == "timeout"
        assert time.monotonic() - start < 3
        assert t.run(["echo", "again"]).check().stdout == "again\n"


def test_popen_streams_lines_as_they_come(shared):
    with SSHTransport(_inv(shared).node("node4")) as t:
        p = t.popen(["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.2; done; echo err >&2; exit 4"])
        stamps, lines = [], []
        for line in p.lines():
            stamps.append(time.monotonic())
            lines.append(line)
        assert p.wait(5) == 4
        p.close()
    assert lines == [b"1\n", b"2\n", b"3\n", b"err\n"]  # stderr merged into the stream
    assert stamps[2] - stamps[0] >= 0.3  # streamed, not delivered all at once at the end


def test_popen_close_ends_a_remote_command_that_keeps_writing(shared):
    """Closing the channel closes the command's pipes: its next write gets SIGPIPE.

    (A command that stays silent outlives close(): sshd refuses the SSH `signal` request for
    root logins - "session signalling requires privilege separation" - so followers must write
    heartbeats or watch a pid, as `tail --pid` does.)"""
    marker = f"popen-close-{shared.id}"
    with SSHTransport(_inv(shared).node("node1")) as t:
        p = t.popen(["sh", "-c", "echo started; while :; do echo tick; sleep 0.1; done", marker])
        assert next(p.lines()) == b"started\n"
        assert p.poll() is None
        assert shared.processes("node1", marker)
        p.close()
        deadline = time.monotonic() + 5
        while shared.processes("node1", marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert shared.processes("node1", marker) == []


def test_many_concurrent_channels_on_one_connection(shared):
    with SSHTransport(_inv(shared).node("node2")) as t:
        procs = [t.popen(["sh", "-c", f"sleep 0.3; echo {i}"]) for i in range(20)]
        outs = [b"".join(p.lines()) for p in procs]
        for p in procs:
            p.close()
    # Each channel gets its own command's output. A login shell may print first (stderr is merged;
    # root's pyenv init here reports `cannot rehash` when twenty logins race): only the command's
    # own line, the last, is compared.
    assert [o.splitlines()[-1:] for o in outs] == [[str(i).encode()] for i in range(20)]


# ----------------------------------------------------------------------------- quoting property


def _roundtrip(t: Transport, args: list[str], value: str) -> None:
    result = t.run([*ECHO, *args], env={"X": value}).check()
    assert json.loads(result.stdout) == [args, value]


@pytest.fixture(scope="module")
def ssh_node(shared):
    t = SSHTransport(_inv(shared).node("node1"))
    yield t
    t.close()


@pytest.fixture(scope="module")
def local_node():
    inv = inventory.parse("transport: local\nnodes:\n  - host: localhost\n", "local.yaml")
    return LocalTransport(inv.nodes[0])


@pytest.mark.parametrize("which", ["ssh_node", "local_node"])
def test_nasty_values_arrive_byte_for_byte(request, which):
    _roundtrip(request.getfixturevalue(which), NASTY, "".join(NASTY))


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(args=st.lists(TEXT, max_size=4), value=TEXT)
def test_ssh_args_and_env_arrive_byte_for_byte(ssh_node, args, value):
    _roundtrip(ssh_node, args, value)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(args=st.lists(TEXT, max_size=4), value=TEXT)
def test_local_args_and_env_arrive_byte_for_byte(local_node, args, value):
    _roundtrip(local_node, args, value)


# ----------------------------------------------------------------------------- the stream verbs


def test_pipe_streams_into_a_node_command_over_the_openssh_reach(shared):
    """`pipe` (what `orch image push` streams an archive through): every byte arrives, the
    argument words arrive as they are, the command's own failure stays its own exit code."""
    data = bytes(range(256)) * (32 << 10)  # 8 MiB
    with SSHTransport(_inv(shared).node("node2")) as t:
        got = t.pipe(["sh", "-c", 'sha256sum; printf "%s|" "$@" >&2', "sh", *NASTY[:9]], [data[:100], data[100:]])
        assert got.exit_code == 0 and got.stdout.split()[0] == hashlib.sha256(data).hexdigest()
        assert got.stderr == "".join(f"{a}|" for a in NASTY[:9])
        own = t.pipe(["sh", "-c", "cat >/dev/null; exit 255"], b"x")
        assert own.exit_code == 255  # the command's 255 (ssh said nothing of its own), not a reach failure


def test_pipe_to_a_node_whose_host_key_is_unknown_is_a_transport_error(shared, tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    node = _inv(shared, known_hosts=str(kh)).node("node1")
    with pytest.raises(TransportError) as err, SSHTransport(node) as t:
        t.pipe(["cat"], b"x")
    assert err.value.kind == "host_key_unknown" and f"is not in {kh}" in err.value.message
    assert err.value.hint and "ssh-keyscan" in err.value.hint and kh.read_text() == ""


def test_the_tar_fallback_copies_a_tree_over_the_ssh_pipe(shared, tmp_path):
    """The base class's `copy_tree` (a transport without an rsync reach gets it) through a real
    sshd: the tree lands at its own path under `dest` on the node, modes and links kept."""
    src = tmp_path / "job"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "pkg" / "w e'ird.bin").write_bytes(bytes(range(256)) * 40)
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)
    (src / "link").symlink_to("train.py")
    dest = f"{shared.home}/fallback-{shared.id}"
    with SSHTransport(_inv(shared).node("node3")) as t:
        got = Transport.copy_tree(t, [str(src)], dest)
        script = 'cd "$1" && sha256sum train.py "pkg/w e\'ird.bin" && stat -c %a run.sh && readlink link'
        listing = t.run(["sh", "-c", script, "sh", dest + str(src)]).check()
    want = [hashlib.sha256((src / p).read_bytes()).hexdigest() for p in ("train.py", "pkg/w e'ird.bin")]
    assert [ln.split()[0] for ln in listing.stdout.splitlines()[:2]] == want
    assert listing.stdout.splitlines()[2:] == ["755", "train.py"]
    assert got.files == 3 and got.sent > 0
