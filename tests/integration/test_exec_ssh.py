"""`orch exec` over real sshd nodes: live `node: line` output and -b grouping, -w without an inventory, the
worst exit code, unreachable and timed-out
nodes, argv quoting, host-key rules, hostile output, Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster import TestCluster
from tests.up_helpers import REPO, Orch, leftover, wait_for


@pytest.fixture
def orch(tmp_path: Path) -> Orch:
    return Orch(tmp_path / "home")


def test_groups_identical_answers_and_exits_with_the_worst(cluster: TestCluster, orch: Orch) -> None:
    inv = str(cluster.write_inventory())
    cluster.stop_node("node4")
    line = (
        'echo same; if [ "$ORCH_TEST_NODE" = node3 ]; then echo "only on node3" >&2; exit 3; fi; '
        "printf '\\033]0;pwned\\007\\n'"
    )
    r = orch.run("exec", inv, "-b", "--", line)
    assert r.returncode == 255, r.stderr  # node4 unreachable outranks node3's 3
    out = r.stdout
    assert "\x1b" not in out and "\x07" not in out
    assert "----------------\nnode[1-2] (2)\n----------------\nsame\n\\x1b]0;pwned\\x07\n" in out
    assert "----------------\nnode3 (1): exit 3\n----------------\nsame\nonly on node3\n" in out
    assert "node4 (1): connection to root@" in out and "refused (exit 255)" in out
    assert "hint: is sshd running on that port?" in out
    assert "orch exec: 2 of 4 nodes failed (exit 255: node4; exit 3: node3)" in r.stderr

    j = orch.run("exec", inv, "--json", "--nodes", "node[3-4],node1", "--", line)
    doc = json.loads(j.stdout)
    assert j.returncode == 255 and doc["exit_code"] == 255 and doc["shell"] is True
    by_node = {n["node"]: n for n in doc["nodes"]}
    assert list(by_node) == ["node1", "node3", "node4"]  # inventory order
    assert by_node["node1"]["stdout"] == "same\n\x1b]0;pwned\x07\n"  # JSON carries it as it came
    assert by_node["node3"]["exit_code"] == 3 and by_node["node3"]["stderr"] == "only on node3\n"
    assert by_node["node3"]["stdout"] == "same\n"
    assert by_node["node4"]["exit_code"] == 255 and "refused" in by_node["node4"]["error"]

    cluster.start_node("node4")
    ok = orch.run("exec", inv, "--gather", "--", "true")
    assert ok.returncode == 0 and ok.stdout == "----------------\nnode[1-4] (4)\n----------------\n"


def test_live_output_is_node_colon_line_with_the_worst_exit_code(cluster: TestCluster, orch: Orch) -> None:
    """pdsh's and clush's default: each line as `node: line` on its own stream; an unreachable node
    named on stderr with why; the exit code the worst node's, as with -b."""
    inv = str(cluster.write_inventory())
    cluster.stop_node("node4")
    line = 'echo "hello from $ORCH_TEST_NODE"; [ "$ORCH_TEST_NODE" = node3 ] && echo oops >&2 && exit 3; exit 0'
    r = orch.run("exec", inv, "--", line)
    assert r.returncode == 255, r.stderr
    assert sorted(r.stdout.splitlines()) == [f"node{i}: hello from node{i}" for i in (1, 2, 3)]
    err = r.stderr.splitlines()
    assert "node3: oops" in err
    assert any(e.startswith("node4: connection to ") and e.endswith("(exit 255)") for e in err), err
    assert "orch exec: 2 of 4 nodes failed (exit 255: node4; exit 3: node3)" in err


def test_w_reaches_hosts_through_ssh_config_without_an_inventory(cluster: TestCluster, tmp_path: Path) -> None:
    """`orch exec -w node[1-2] -- cmd`: the hosts are ~/.ssh/config aliases (its HostName, Port,
    User and IdentityFile), their keys checked against ~/.ssh/known_hosts, as pdsh -w over ssh."""
    home = tmp_path / "user"
    (home / ".ssh").mkdir(parents=True)
    config = "".join(
        f"Host {n.name}\n  HostName {n.host}\n  Port {n.port}\n  User {cluster.user}\n"
        f"  IdentityFile {cluster.client_key}\n"
        for n in cluster.nodes
    )
    (home / ".ssh" / "config").write_text(config)
    (home / ".ssh" / "known_hosts").write_text(cluster.known_hosts.read_text())
    orch = Orch(tmp_path / "orch-home", env={"HOME": str(home)})
    r = orch.run("exec", "-w", "node[1-2]", "--", "echo $ORCH_TEST_NODE")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["node1: node1", "node2: node2"]
    (home / ".ssh" / "known_hosts").write_text("")  # strict, as an inventory's default: an unknown key refused
    r = orch.run("exec", "-w", "node1", "--", "true")
    assert r.returncode == 255 and "node1" in r.stderr


def test_argv_words_reach_the_node_as_they_are(cluster: TestCluster, orch: Orch) -> None:
    inv = str(cluster.write_inventory())
    words = ["a b", "$HOME", "`id`", ";", "*", "'", '"', "--json"]
    r = orch.run(
        "exec",
        inv,
        "--json",
        "--nodes",
        "node2",
        "--",
        sys.executable,
        "-c",
        "import json, sys; print(json.dumps(sys.argv[1:]))",
        *words,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(json.loads(r.stdout)["nodes"][0]["stdout"]) == words


@pytest.mark.waits  # mostly waits: runs beside the slow tests (tests/conftest.py)
def test_a_node_over_the_timeout_counts_124_and_the_others_answer(cluster: TestCluster, orch: Orch) -> None:
    inv = str(cluster.write_inventory())
    line = 'if [ "$ORCH_TEST_NODE" = node2 ]; then sleep 60; fi; echo done'
    t0 = time.monotonic()
    r = orch.run("exec", inv, "--timeout", "3", "--json", "--", line)
    assert time.monotonic() - t0 < 50
    doc = json.loads(r.stdout)
    assert r.returncode == 124
    codes = {n["node"]: (n["exit_code"], n["stdout"]) for n in doc["nodes"]}
    assert codes == {"node1": (0, "done\n"), "node2": (124, ""), "node3": (0, "done\n"), "node4": (0, "done\n")}
    assert "timed out after 3 s" in doc["nodes"][1]["error"]


@pytest.mark.waits  # mostly waits: runs beside the slow tests (tests/conftest.py)
@pytest.mark.parametrize("command", [["sleep", "30"], ["sleep 30 & sleep 30; wait"]], ids=["argv", "shell-line"])
def test_the_timeout_stops_the_command_and_its_process_group_on_the_node(
    cluster: TestCluster, orch: Orch, command: list[str]
) -> None:
    """Past --timeout, closing the SSH channel left `sleep 30` running on the node: the command
    now runs under timeout(1) there, which stops its process group (a backgrounded child too)."""
    inv = str(cluster.write_inventory())
    r = orch.run("exec", inv, "--nodes", "node1", "--timeout", "2", "--json", "--", *command)
    assert r.returncode == 124, r.stdout + r.stderr
    [node] = json.loads(r.stdout)["nodes"]
    assert node["exit_code"] == 124 and node["error"].startswith("timed out after 2 s"), node
    wait_for(lambda: not cluster.processes("node1", "sleep\x0030"), 10, "no sleep left on node1")
    assert cluster.processes("node1", "sleep\x0030") == []


def test_a_command_that_ends_in_time_keeps_its_own_exit_code_and_output(cluster: TestCluster, orch: Orch) -> None:
    inv = str(cluster.write_inventory())
    r = orch.run("exec", inv, "--nodes", "node1", "--timeout", "20", "--json", "--", "echo out; echo err >&2; exit 124")
    [node] = json.loads(r.stdout)["nodes"]
    assert (node["exit_code"], node["stdout"], node["stderr"], node["error"]) == (124, "out\n", "err\n", None)
    r = orch.run("exec", inv, "--nodes", "node1", "--timeout", "20", "--", "sh", "-c", 'echo "$0" "$@"', "a b", "c")
    assert r.returncode == 0 and "a b c" in r.stdout


def test_host_keys_are_verified_as_for_every_command(cluster: TestCluster, orch: Orch, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    strict = str(cluster.write_inventory(tmp_path / "strict.yaml", ssh={"known_hosts": str(empty)}))
    r = orch.run("exec", strict, "--nodes", "node1", "--", "echo reached")
    assert r.returncode == 255 and "reached" not in r.stdout
    assert "is not in" in r.stderr and "hint: verify it, then: ssh-keyscan" in r.stderr  # live: errors on stderr
    assert empty.read_text() == ""
    accept = str(
        cluster.write_inventory(
            tmp_path / "accept.yaml", ssh={"known_hosts": str(empty), "host_key_policy": "accept-new"}
        )
    )
    r = orch.run("exec", accept, "--nodes", "node1", "--", "echo reached")
    assert r.returncode == 0 and "reached" in r.stdout
    assert cluster.node("node1").host in empty.read_text()


@pytest.mark.parametrize("timeout", [None, 300])
def test_ctrl_c_closes_every_connection_exits_130_and_stops_the_command_everywhere(
    cluster: TestCluster, orch: Orch, tmp_path: Path, timeout: int | None
) -> None:
    """Closing an SSH connection leaves a command without a terminal running on the node (ssh's and
    pdsh's behaviour): orch's tether stops its whole process group there, background children too,
    with or without --timeout."""
    inv = str(cluster.write_inventory())
    started = tmp_path / "exec-started"
    started.mkdir()
    marker = f"orch-exec-ctrl-c-{time.monotonic_ns()}"
    # each node says it runs, then waits, with a child in the background
    line = f"export EXEC_MARK={marker}; sleep 130 & mktemp -p {started} >/dev/null && sleep 120; echo late"
    limit = ["--timeout", str(timeout)] if timeout else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "exec", inv, *limit, "--", line],
        cwd=REPO,
        env=orch.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while len(list(started.iterdir())) < len(cluster.nodes):  # running on every node: Ctrl-C interrupts it
        assert proc.poll() is None and time.monotonic() < deadline, "orch exec never ran the command everywhere"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)  # far less than the command's 120 s
    assert proc.returncode == 130, err
    assert "late" not in out
    # SIGTERM to the group once sshd's session process is gone (SIGKILL 5 s later)
    wait_for(lambda: leftover(cluster, marker) == {}, 30, "the command and its child to stop on every node")
