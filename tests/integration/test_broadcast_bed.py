"""The broadcast bed's promises (tests/cluster.py `rate` and `tmpfs`, issue 51): every port of the
switch, the controller's included, carries at most its rate, so a star from the controller is
bounded by one uplink; each node's ``NODE_LOCAL`` is a disk of its own, so N nodes hold N copies and
one node's disk can fill alone. These are properties of the bed, not of orch: bench/broadcast.py
times orch on it.

The throughput bounds are upper bounds on plain TCP copies (a loaded machine only makes them
slower): 10 MB at 100 Mbit/s takes at least 0.8 s, where the same veths without the buckets carry
more than 1 Gbit/s here."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.cluster import KeyStore, TestCluster, missing, netns_supported

pytestmark = pytest.mark.netns

MB = 1 << 20
SIZE = 10 * MB
RATE = "100mbit"
CEILING_MBIT = 110.0
"""What a stream (or the streams through one port together) may reach at RATE: the token bucket's
100 Mbit/s counts the frames' headers too, and its 256 kB burst passes at once."""
TMPFS = "32m"

RECEIVE = r"""
import json, socket, sys, time
srv = socket.socket()
srv.bind((sys.argv[1], 0))
srv.listen(1)
srv.settimeout(30)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
conn.settimeout(30)
got, first = 0, None
while True:
    chunk = conn.recv(1 << 16)
    if not chunk:
        break
    if first is None:
        first = time.monotonic()
    got += len(chunk)
print(json.dumps({"bytes": got, "first": first, "last": time.monotonic()}), flush=True)
"""
SEND = r"""
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
block = bytes(1 << 20)
for _ in range(int(sys.argv[3]) // len(block)):
    s.sendall(block)
s.close()
"""


@pytest.fixture(scope="module")
def bed(cluster_keys: KeyStore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    reason = netns_supported()
    if reason:
        missing(reason)
    c = TestCluster(cluster_keys, n=3, mode="netns", root=tmp_path_factory.mktemp("bcast-bed"), rate=RATE, tmpfs=TMPFS)
    try:
        yield c.start()
    finally:
        c.stop()


def _where(c: TestCluster, end: str) -> tuple[list[str], str]:
    """The argv prefix that runs a command at `end` (a node, or "controller": this machine) and the
    address the others reach it at."""
    if end == "controller":
        return [], f"198.18.{c.subnet}.254"
    return c._enter(c.node(end)), c.node(end).addr


def _copy(c: TestCluster, streams: Sequence[tuple[str, str]]) -> list[dict[str, float]]:
    """Send SIZE bytes over plain TCP along every (sender, receiver) at once; per stream what the
    receiver saw: bytes, and the monotonic clock (one clock for every namespace) at its first and
    last byte."""
    receivers, senders = [], []
    try:
        for src, dst in streams:
            enter, addr = _where(c, dst)
            recv = subprocess.Popen(
                [*enter, c.python, "-c", RECEIVE, addr], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            receivers.append(recv)
            assert recv.stdout is not None
            port = recv.stdout.readline().strip()
            assert port.isdigit(), f"{dst}: the receiver did not start: {recv.stderr.read() if recv.stderr else ''}"
            senders.append(subprocess.Popen([*_where(c, src)[0], c.python, "-c", SEND, addr, port, str(SIZE)]))
        for send in senders:
            assert send.wait(60) == 0
        return [json.loads(recv.communicate(timeout=60)[0]) for recv in receivers]
    finally:
        for proc in [*senders, *receivers]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _mbit(results: Sequence[dict[str, float]]) -> float:
    """The streams' rate together, first byte of any to last byte of all, in Mbit/s."""
    assert all(r["bytes"] == SIZE for r in results), results
    seconds = max(r["last"] for r in results) - min(r["first"] for r in results)
    return sum(r["bytes"] for r in results) * 8 / seconds / 1e6


def test_every_port_carries_at_most_its_rate(bed: TestCluster) -> None:
    # controller -> two nodes at once: the nodes' ports could take 200 Mbit/s, the controller's one port not
    down = _copy(bed, [("controller", "node1"), ("controller", "node2")])
    # two nodes -> the controller at once: the controller's port, the other way
    up = _copy(bed, [("node1", "controller"), ("node2", "controller")])
    # node -> node, not through the controller's port: the nodes' own ports
    across = _copy(bed, [("node3", "node1")])
    rates = {"controller's port, out": _mbit(down), "controller's port, in": _mbit(up), "node3->node1": _mbit(across)}
    assert all(rate <= CEILING_MBIT for rate in rates.values()), rates
    # 10 MB through a 100 Mbit/s port takes at least 0.8 s
    assert across[0]["last"] - across[0]["first"] >= 0.8, across


def test_qdiscs_are_the_ports_after_a_reset(bed: TestCluster) -> None:
    """`tbf(node, "")` and the reset put a node's port back, not an unlimited link."""
    bed.tbf("node2", "10mbit")
    bed.reset()
    for node in bed.nodes:
        inside = bed.exec(node.name, ["tc", "qdisc", "show", "dev", "eth0"]).stdout
        outside = subprocess.run(
            ["tc", "qdisc", "show", "dev", str(node.host_veth)], capture_output=True, text=True, check=True
        ).stdout
        assert "tbf" in inside and "rate 100Mbit" in inside, (node.name, inside)
        assert "tbf" in outside and "rate 100Mbit" in outside, (node.name, outside)


def _write(c: TestCluster, node: str, name: str, size: int) -> subprocess.CompletedProcess[str]:
    """Write `size` bytes to NODE_LOCAL/name as a process of that node does."""
    code = "import sys; open(sys.argv[1], 'wb').write(bytes(int(sys.argv[2])))"
    return c.exec(node, [c.python, "-c", code, f"{TestCluster.NODE_LOCAL}/{name}", str(size)])


def test_each_node_has_a_private_tmpfs(bed: TestCluster) -> None:
    assert _write(bed, "node1", "payload", MB).returncode == 0
    assert bed.node_path("node1", f"{TestCluster.NODE_LOCAL}/payload").stat().st_size == MB
    for node in ("node2", "node3"):
        assert not bed.node_path(node, f"{TestCluster.NODE_LOCAL}/payload").exists(), node
        assert bed.exec(node, ["test", "-e", f"{TestCluster.NODE_LOCAL}/payload"]).returncode == 1
    assert not Path(TestCluster.NODE_LOCAL, "payload").exists()  # nor on this machine's disk
    assert not any(bed.node("node1").local_dir.iterdir())  # nor in the node's directory there
    fs = os.statvfs(bed.node_path("node1", TestCluster.NODE_LOCAL))
    assert fs.f_blocks * fs.f_frsize == 32 * MB
    mounts = bed.exec("node1", ["findmnt", "-n", "-o", "FSTYPE", TestCluster.NODE_LOCAL]).stdout.split()
    assert mounts == ["tmpfs"]


def test_a_full_tmpfs_fails_on_its_node_only(bed: TestCluster) -> None:
    bed.resize_tmpfs("node2", "1m")
    full = _write(bed, "node2", "big", 2 * MB)
    assert full.returncode != 0 and os.strerror(errno.ENOSPC) in full.stderr, full.stderr
    for node in ("node1", "node3"):
        assert _write(bed, node, "big", 2 * MB).returncode == 0, node
    bed.reset()  # back to the cluster's size, every tmpfs empty
    for node in bed.nodes:
        local = bed.node_path(node.name, TestCluster.NODE_LOCAL)
        fs = os.statvfs(local)
        assert (fs.f_blocks * fs.f_frsize, list(local.iterdir())) == (32 * MB, []), node.name


def test_a_podman_store_lives_on_its_nodes_tmpfs(bed: TestCluster, tmp_path: Path) -> None:
    """`start_podman_bed(on_node=True)`: an image loaded on node1 is in node1's tmpfs, and neither
    node2's store nor its disk sees it."""
    from tests.containers import NODE_STORE, start_podman_bed

    for tool in ("podman", "runc"):
        if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            missing(f"the podman store test needs {tool} (.ci/packages)")
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    (rootfs / "payload").write_bytes(os.urandom(2 * MB))
    tarball = tmp_path / "rootfs.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
    conf = Path(bed.root) / "podman-conf"
    podman = start_podman_bed(bed, None, conf, ["node1", "node2"], on_node=True)
    try:
        used = {n: _used(bed, n) for n in ("node1", "node2")}
        image_id = podman.stores["node1"].import_rootfs(tarball, "localhost/bed:1", enter=podman.enter("node1"))
        assert podman.image_id("node1", "localhost/bed:1") == image_id
        assert podman.image_id("node2", "localhost/bed:1") is None
        store = f"{TestCluster.NODE_LOCAL}/{NODE_STORE}/graph"
        assert bed.node_path("node1", store).is_dir()
        assert _used(bed, "node1") - used["node1"] >= 2 * MB  # the layer is on node1's tmpfs
        assert _used(bed, "node2") - used["node2"] < MB
        assert not (conf / "node1" / "graph").exists()  # and not beside the configuration
    finally:
        podman.remove_all()
        shutil.rmtree(conf, ignore_errors=True)


def _used(c: TestCluster, node: str) -> int:
    fs = os.statvfs(c.node_path(node, TestCluster.NODE_LOCAL))
    return (fs.f_blocks - fs.f_bfree) * fs.f_frsize
