"""The copy chain (issue 51) on the broadcast bed: netns nodes with a real sshd each, every port at
100 Mbit/s, each node's NODE_LOCAL a private tmpfs. `orch sync --method chain` and `orch image push
--method chain` send the payload once from here through the nodes; every failure the chain claims
to survive is made real here (a pulled cable, a corrupted chunk, a full disk) and each node's
copy is read back through its own namespace (sha256 of every file; the image ID its store holds)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import KeyStore, TestCluster, missing, netns_supported
from tests.up_helpers import Orch

pytestmark = [pytest.mark.netns, pytest.mark.timeout(600)]

MB = 1_000_000
NODES = 8


@pytest.fixture(scope="module")
def bed(cluster_keys: KeyStore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    reason = netns_supported()
    if reason:
        missing(reason)
    c = TestCluster(
        cluster_keys, n=NODES, mode="netns", root=tmp_path_factory.mktemp("chain-bed"), rate="100mbit", tmpfs="96m"
    )
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture
def chain_bed(bed: TestCluster) -> Iterator[TestCluster]:
    bed.reset()
    yield bed
    bed.reset()


@pytest.fixture
def orch(tmp_path: Path) -> Orch:
    return Orch(tmp_path / "home")


def tree(c: TestCluster, total: int, files: int = 4, seed: int = 0) -> tuple[Path, dict[str, str]]:
    """A tree of random files on the controller, under a path every node sees empty; each file's sha256."""
    root = c.controller_dir(f"tree{seed}")
    rng = random.Random(seed)
    digests = {}
    for i in range(files):
        rel = f"part{i % 2}/shard-{i:02d}.bin"
        data = rng.randbytes(total // files)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        digests[rel] = hashlib.sha256(data).hexdigest()
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "run.sh").chmod(0o755)
    digests["run.sh"] = hashlib.sha256(b"#!/bin/sh\necho run\n").hexdigest()
    (root / "latest").symlink_to("part0/shard-00.bin")
    return root, digests


def held(c: TestCluster, node: str, root: Path, digests: dict[str, str]) -> dict[str, str]:
    """What the node holds of the tree: each file's sha256, or `missing`."""
    out = {}
    for rel in digests:
        path = c.node_path(node, root / rel)
        out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
    return out


def leftovers(c: TestCluster, node: str, root: Path) -> list[str]:
    """Temporary files of the chain on the node (`.NAME.orch-TID`)."""
    top = c.node_path(node, root)
    return sorted(str(p.relative_to(top)) for p in top.rglob(".*.orch-*")) if top.exists() else []


def sync(orch: Orch, inv: Path, *args: str) -> tuple[int, dict[str, Any]]:
    r = orch.run("sync", str(inv), "--json", *args, timeout=300)
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


@pytest.mark.parametrize("n", [2, 3, NODES])
def test_a_chain_of_n_nodes_gives_each_the_verified_files_then_sends_nothing(
    chain_bed: TestCluster, orch: Orch, tmp_path: Path, n: int
) -> None:
    c = chain_bed
    root, digests = tree(c, 4 * MB)
    names = [node.name for node in c.nodes[:n]]
    inv = c.write_inventory(tmp_path / "inv.yaml", only=names, job={"sync": [str(root)]})
    code, doc = sync(orch, inv, "--method", "chain")
    assert code == 0, doc
    assert doc["method"] == "chain" and doc["chain"]["order"] == [names]
    roles = [node["role"] for node in doc["nodes"]]
    assert roles == ["head", *["relay"] * (n - 2), "tail"]
    stream = doc["chain"]["bytes"]
    assert stream > 4 * MB and all(node["received_bytes"] == stream for node in doc["nodes"])
    for name in names:
        assert held(c, name, root, digests) == digests, name
        assert c.node_path(name, root / "run.sh").stat().st_mode & 0o777 == 0o755
        assert str(c.node_path(name, root / "latest").readlink()) == "part0/shard-00.bin"
        assert leftovers(c, name, root) == []
    for name in [node.name for node in c.nodes[n:]]:
        assert not c.node_path(name, root).exists(), name  # only the chain's members
    # rsync's rule on every node: nothing differs, nothing is sent, no node takes part
    code, again = sync(orch, inv, "--method", "chain")
    assert code == 0 and again["chain"] is None, again
    assert all(node["files"] == 0 and node["role"] is None for node in again["nodes"]), again


def test_the_dry_run_says_what_each_node_lacks_and_the_report_names_the_chain(
    chain_bed: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    c = chain_bed
    root, digests = tree(c, 4 * MB)
    names = ["node1", "node2", "node3"]
    inv = c.write_inventory(tmp_path / "inv.yaml", only=names, job={"sync": [str(root)]})
    code, dry = sync(orch, inv, "--method", "chain", "--dry-run")
    assert code == 0 and dry["method"] == "chain" and dry["chain"] is None, dry
    for node in dry["nodes"]:
        assert sorted(node["changes"]) == sorted(f"<f+++++++++ {root / rel}" for rel in digests), node
        assert not c.node_path(node["node"], root).exists()  # nothing written
    refused = orch.run("sync", str(inv), "--method", "chain", "--delete")
    assert refused.returncode == 2 and "never deletes" in refused.stderr, refused.stderr
    r = orch.run("sync", str(inv), "--method", "chain", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].endswith("→ 3 node(s), chain (--method chain)"), lines
    assert any(
        ln.startswith("  chain: this machine → node1 → node2 → node3 (4.0 MB sent once from here)") for ln in lines
    )
    assert [ln.split()[:2] for ln in lines if ln.startswith("    node")] == [
        ["node1", "head"],
        ["node2", "relay"],
        ["node3", "tail"],
    ], lines
    assert any(ln.startswith("  limited by the hop ") for ln in lines), lines
    for name in names:
        assert held(c, name, root, digests) == digests, name


def test_a_node_that_holds_the_files_already_is_left_out_of_the_chain(
    chain_bed: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    c = chain_bed
    root, digests = tree(c, 4 * MB)
    names = ["node1", "node2", "node3"]
    inv = c.write_inventory(tmp_path / "inv.yaml", only=names, job={"sync": [str(root)]})
    code, first = sync(orch, inv, "--method", "chain", "--nodes", "node2")
    assert code == 0 and held(c, "node2", root, digests) == digests, first
    # one file changed here: node2 lacks that one only, the others lack all
    changed = root / "part1/shard-01.bin"
    changed.write_bytes(b"x" * MB)
    digests["part1/shard-01.bin"] = hashlib.sha256(b"x" * MB).hexdigest()
    code, doc = sync(orch, inv, "--method", "chain")
    assert code == 0, doc
    nodes = {node["node"]: node for node in doc["nodes"]}
    assert [ch for ch in nodes["node2"]["changes"]] == [f"<f.st...... {changed}"]
    assert nodes["node1"]["files"] == 5 and nodes["node3"]["files"] == 5
    for name in names:
        assert held(c, name, root, digests) == digests, name
    # a node that holds everything is no member at all
    code, doc = sync(orch, inv, "--method", "chain", "--nodes", "node2,node3")
    assert code == 0 and doc["chain"] is None and all(n["role"] is None for n in doc["nodes"]), doc


def test_a_node_whose_cable_is_pulled_mid_transfer_is_named_and_the_nodes_after_it_complete(
    chain_bed: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    c = chain_bed
    root, digests = tree(c, 24 * MB)
    names = ["node1", "node2", "node3", "node4"]
    inv = c.write_inventory(tmp_path / "inv.yaml", only=names, job={"sync": [str(root)]})
    proc = orch.popen("sync", str(inv), "--json", "--method", "chain")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:  # node2 is writing its first file
            if any(p.stat().st_size >= 2 * MB for p in c.node_path("node2", root).rglob(".*.orch-*")):
                break
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()
        c.link_down("node2")
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, (out, err)
    doc = json.loads(out)
    nodes = {node["node"]: node for node in doc["nodes"]}
    assert not nodes["node2"]["ok"] and "dropped from the chain" in nodes["node2"]["error"], nodes["node2"]
    assert "no word from its relay" in nodes["node2"]["error"]
    for name in ("node1", "node3", "node4"):
        assert nodes[name]["ok"], nodes[name]
        assert held(c, name, root, digests) == digests, name
    assert doc["chain"]["final_order"] == [["node1", "node3", "node4"]]
    assert any("node1 now forwards to node3, which resumes at byte" in note for note in doc["chain"]["notes"])
    # nothing half-written in place on node2: a file there is whole or absent, and once its cable is
    # back its relay (no word from this machine) removes what it had not finished
    c.link_up("node2")
    partial = {rel: got for rel, got in held(c, "node2", root, digests).items() if got not in (digests[rel], "missing")}
    assert partial == {}
    deadline = time.monotonic() + 90
    while leftovers(c, "node2", root) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert leftovers(c, "node2", root) == []


def test_a_node_on_a_slow_link_is_moved_to_the_end_and_named_as_the_limit(
    chain_bed: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    c = chain_bed
    root, digests = tree(c, 16 * MB)
    c.tbf("node2", "20mbit")  # node2 receives at a fifth of the others' rate
    names = ["node1", "node2", "node3", "node4"]
    inv = c.write_inventory(tmp_path / "inv.yaml", only=names, job={"sync": [str(root)]})
    code, doc = sync(orch, inv, "--method", "chain")
    assert code == 0, doc
    assert doc["chain"]["order"] == [names]
    assert doc["chain"]["final_order"] == [["node1", "node3", "node4", "node2"]], doc["chain"]
    assert any(n.startswith("node2 received at") and n.endswith("moved to the end") for n in doc["chain"]["notes"])
    assert doc["chain"]["limited_by"]["to"] == "node2", doc["chain"]
    roles = {node["node"]: node["role"] for node in doc["nodes"]}
    assert roles == {"node1": "head", "node3": "relay", "node4": "relay", "node2": "tail"}
    for name in names:
        assert held(c, name, root, digests) == digests, name


def test_a_node_its_predecessor_cannot_reach_is_fed_by_this_machine(
    chain_bed: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    """A firewall on node3 drops what node2 sends it (the controller still reaches it): node2's
    tries end, the chain is cut there, and this machine feeds node3 and the nodes after it."""
    if shutil.which("iptables", path="/usr/sbin:/sbin:/usr/bin") is None:
        missing("the cut test needs iptables (.ci/packages)")
    c = chain_bed
    root, digests = tree(c, 4 * MB)
    names = ["node1", "node2", "node3", "node4"]
    inv = c.write_inventory(tmp_path / "inv.yaml", only=names, job={"sync": [str(root)]})
    rule = ["INPUT", "-p", "tcp", "-s", c.node("node2").addr, "-j", "DROP"]
    wall = ["ip", "netns", "exec", str(c.node("node3").netns), "iptables"]
    subprocess.run([*wall, "-A", *rule], check=True, timeout=30)
    try:
        code, doc = sync(orch, inv, "--method", "chain")
    finally:
        subprocess.run([*wall, "-D", *rule], check=True, timeout=30)
    assert code == 0, doc
    assert doc["chain"]["final_order"] == [["node1", "node2"], ["node3", "node4"]], doc["chain"]
    assert any(n.startswith("node2 could not reach node3 (") for n in doc["chain"]["notes"]), doc["chain"]
    roles = {node["node"]: node["role"] for node in doc["nodes"]}
    assert roles == {"node1": "head", "node2": "tail", "node3": "head", "node4": "tail"}
    for name in names:
        assert held(c, name, root, digests) == digests, name


def test_a_chunk_corrupted_on_one_hop_is_refused_and_sent_again(
    chain_bed: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    c = chain_bed
    root, digests = tree(c, 4 * MB)
    c.set_env("node2", ORCH_RELAY_TEST_FLIP="1")  # node2's relay flips a byte of the first chunk it forwards
    names = ["node1", "node2", "node3"]
    inv = c.write_inventory(tmp_path / "inv.yaml", only=names, job={"sync": [str(root)]})
    code, doc = sync(orch, inv, "--method", "chain")
    assert code == 0, doc
    notes = doc["chain"]["notes"]
    assert any(note.startswith("node3 refused a chunk at byte 0") for note in notes), notes
    assert not any("node2 refused" in note for note in notes), notes
    for name in names:
        assert held(c, name, root, digests) == digests, name


def test_a_node_without_room_is_named_before_anything_is_sent_and_the_others_complete(
    chain_bed: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    c = chain_bed
    root, digests = tree(c, 8 * MB)
    c.resize_tmpfs("node2", "2m")
    names = ["node1", "node2", "node3"]
    inv = c.write_inventory(tmp_path / "inv.yaml", only=names, job={"sync": [str(root)]})
    code, doc = sync(orch, inv, "--method", "chain")
    assert code == 1, doc
    nodes = {node["node"]: node for node in doc["nodes"]}
    assert nodes["node2"]["error"].startswith("no room: needs 8.0 MB on "), nodes["node2"]
    assert nodes["node2"]["role"] is None and doc["chain"]["order"] == [["node1", "node3"]]
    for name in ("node1", "node3"):
        assert held(c, name, root, digests) == digests, name
    assert not c.node_path("node2", root / "part0").exists() or leftovers(c, "node2", root) == []


def test_a_disk_that_fills_mid_transfer_fails_its_node_which_still_relays_to_the_others(
    chain_bed: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    c = chain_bed
    root, digests = tree(c, 24 * MB)
    names = ["node1", "node2", "node3"]
    inv = c.write_inventory(tmp_path / "inv.yaml", only=names, job={"sync": [str(root)]})
    proc = orch.popen("sync", str(inv), "--json", "--method", "chain")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:  # node2 is writing its first file
            if any(p.stat().st_size >= MB for p in c.node_path("node2", root).rglob(".*.orch-*")):
                break
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()
        filler = c.node_path("node2", f"{TestCluster.NODE_LOCAL}/filler")
        with open(filler, "wb") as fh:  # node2's disk fills up under it (the room check said yes)
            try:
                while True:
                    fh.write(bytes(MB))
                    fh.flush()
            except OSError:
                pass
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, (out, err)
    nodes = {node["node"]: node for node in json.loads(out)["nodes"]}
    assert nodes["node2"]["error"].startswith("could not write what it received: "), nodes["node2"]
    assert "No space left on device" in nodes["node2"]["error"]
    assert nodes["node2"]["role"] == "relay"  # it failed, and forwarded everything all the same
    for name in ("node1", "node3"):
        assert nodes[name]["ok"] and held(c, name, root, digests) == digests, name
    got = held(c, "node2", root, digests)
    assert all(v in (digests[rel], "missing") for rel, v in got.items()), got  # whole or absent
    assert leftovers(c, "node2", root) == []


@dataclass
class ImageBed:
    """A podman image of `mb` MB of random data on the controller (`ref`, its `image_id`), and a
    podman store in each node's own tmpfs (`podman`: the bed; TMPDIR, where a load stages, there too)."""

    ref: str
    image_id: str
    size: int
    """Bytes of the archive `podman save` writes (what a push sends)."""
    podman: Any
    env: dict[str, str]
    conf: Path

    def push(self, orch: Orch, inv: Path, *args: str) -> tuple[int, dict[str, Any]]:
        r = orch.run("image", "push", self.ref, str(inv), "--runtime", "podman", "--json", *args, timeout=300)
        assert r.stdout, r.stderr
        return r.returncode, json.loads(r.stdout)

    def staged(self, c: TestCluster, node: str) -> list[Path]:
        """What a load is staging on the node now: podman's copy of the archive (`podmanN`) and of
        its layers (`storageN/`) in its TMPDIR."""
        tmp = c.node_path(node, self.podman.stores[node].tmp)
        found = tmp.rglob("*") if tmp.exists() else iter(())
        return [p for p in found if p.is_file() and re.match(r"(podman|storage)\d", p.relative_to(tmp).parts[0])]


@pytest.fixture
def image_bed(chain_bed: TestCluster, orch: Orch, tmp_path: Path) -> Iterator[ImageBed]:
    from tests.containers import PodmanStore, short_dir, start_podman_bed

    for tool in ("podman", "runc"):
        if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            missing(f"the image tests need {tool} (.ci/packages)")
    conf = short_dir("chain")
    try:
        controller = PodmanStore(conf / "controller")
        rootfs = tmp_path / "rootfs"
        (rootfs / "payload").mkdir(parents=True)
        (rootfs / "payload" / "blob.bin").write_bytes(random.Random(5).randbytes(12 * MB))
        tarball = tmp_path / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], check=True, timeout=120)
        ref = "localhost/orch-chain:test"
        image_id = controller.import_rootfs(tarball, ref)
        controller.podman("save", "-o", str(tmp_path / "image.tar"), ref)
        size = (tmp_path / "image.tar").stat().st_size
        podman = start_podman_bed(chain_bed, None, conf / "nodes", [n.name for n in chain_bed.nodes[:4]], on_node=True)
        orch.env.update(controller.env)
        yield ImageBed(ref, image_id, size, podman, controller.env, conf)
        podman.remove_all()
    finally:
        shutil.rmtree(conf, ignore_errors=True)


def test_the_image_goes_through_the_chain_into_each_nodes_store_and_a_holder_is_skipped(
    chain_bed: TestCluster, image_bed: ImageBed, orch: Orch, tmp_path: Path
) -> None:
    c, img = chain_bed, image_bed
    names = ["node1", "node2", "node3"]
    inv = c.write_inventory(tmp_path / "inv.yaml", only=names)
    code, first = img.push(orch, inv, "--method", "chain", "--nodes", "node2")
    assert code == 0, first
    code, doc = img.push(orch, inv, "--method", "chain")
    assert code == 0, doc
    nodes = {node["node"]: node for node in doc["nodes"]}
    assert doc["method"] == "chain" and doc["chain"]["order"] == [["node1", "node3"]]
    assert nodes["node2"]["action"] == "present" and nodes["node2"]["role"] is None
    assert [nodes[n]["role"] for n in ("node1", "node3")] == ["head", "tail"]
    for name in names:
        assert img.podman.image_id(name, img.ref) == img.image_id, name


@pytest.mark.parametrize("method", ["direct", "chain"])
def test_a_node_without_room_for_the_image_is_named_before_a_byte_is_sent(
    chain_bed: TestCluster, image_bed: ImageBed, orch: Orch, tmp_path: Path, method: str
) -> None:
    """podman's load keeps three copies of the archive at once (staged, each layer copied beside it,
    the store's): node2's tmpfs holds two and a half. Both ways refuse it before sending, by one rule."""
    c, img = chain_bed, image_bed
    c.resize_tmpfs("node2", "31m")
    names = ["node1", "node2", "node3"]
    inv = c.write_inventory(tmp_path / "inv.yaml", only=names)
    code, doc = img.push(orch, inv, "--method", method)
    assert code == 1, doc
    nodes = {node["node"]: node for node in doc["nodes"]}
    size = doc["size"] / MB
    assert nodes["node2"]["error"].startswith(f"no room: needs {3 * size:.1f} MB on "), nodes["node2"]
    assert nodes["node2"]["hint"] == "free space there, or leave the node out (--nodes)"
    assert nodes["node2"]["role"] is None and img.staged(c, "node2") == []
    assert img.podman.image_id("node2", img.ref) is None
    for name in ("node1", "node3"):
        assert nodes[name]["action"] == "loaded" and img.podman.image_id(name, img.ref) == img.image_id, name


@pytest.mark.parametrize("method", ["direct", "chain"])
def test_a_disk_that_fills_mid_load_fails_its_node_with_the_loads_own_words(
    chain_bed: TestCluster, image_bed: ImageBed, orch: Orch, tmp_path: Path, method: str
) -> None:
    """The room check said yes; then, while node2's load stages the archive (its link slowed),
    another writer takes all but what the staging still needs and half a copy: the load stages it
    all, says "Getting image source signatures", and fails storing its layer. Its row carries
    podman's own last lines (the full disk), not its first."""
    c, img = chain_bed, image_bed
    c.tbf("node2", "16mbit")
    names = ["node1", "node2", "node3"]
    inv = c.write_inventory(tmp_path / "inv.yaml", only=names)
    argv = ["image", "push", img.ref, str(inv), "--runtime", "podman", "--json", "--method", method]
    proc = orch.popen(*argv)
    try:
        deadline = time.monotonic() + 120
        staged = 0
        while time.monotonic() < deadline and proc.poll() is None and staged < MB:  # node2 is mid-stream
            staged = sum(p.stat().st_size for p in img.staged(c, "node2") if p.exists())
            time.sleep(0.02)
        assert proc.poll() is None and staged >= MB, proc.communicate()
        disk = os.statvfs(c.node_path("node2", TestCluster.NODE_LOCAL))
        take = disk.f_bavail * disk.f_frsize - (img.size - staged) - img.size // 2
        with open(c.node_path("node2", f"{TestCluster.NODE_LOCAL}/filler"), "wb") as fh:
            os.posix_fallocate(fh.fileno(), 0, take)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, (out, err)
    nodes = {node["node"]: node for node in json.loads(out)["nodes"]}
    said = nodes["node2"]["error"]
    assert said.startswith("load exited 125: ") and "no space left on device" in said, said
    assert "Getting image source signatures" not in said, said
    for name in ("node1", "node3"):
        assert nodes[name]["action"] == "loaded" and img.podman.image_id(name, img.ref) == img.image_id, name


def load_on(img: ImageBed, node: str) -> int | None:
    """The pid of the `podman load` running for that node's store (this test's own), or None."""
    conf = f"CONTAINERS_STORAGE_CONF={img.podman.stores[node].storage_conf}".encode()
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            named = argv[0].rsplit(b"/", 1)[-1] == b"podman" and argv[1:2] == [b"load"]
            if named and conf in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                return int(entry)
        except (OSError, IndexError):
            continue
    return None


@pytest.mark.parametrize("method", ["direct", "chain"])
def test_a_load_stopped_mid_stream_fails_its_node_by_its_deadline_and_the_others_complete(
    chain_bed: TestCluster, image_bed: ImageBed, orch: Orch, tmp_path: Path, method: str
) -> None:
    """node2's `podman load` is SIGSTOPped while it stages the archive: its SSH session and its
    relay stay alive, so nothing but a deadline on its progress ends the wait. It fails by that
    deadline (exit 124, how far it got); directly the stream to it is ended and the stopped load is
    left as it is (the row says so), by the chain its relay ends the load and relays on."""
    c, img = chain_bed, image_bed
    c.tbf("node2", "16mbit")
    names = ["node1", "node2", "node3"]
    inv = c.write_inventory(tmp_path / "inv.yaml", only=names)
    argv = ["image", "push", img.ref, str(inv), "--runtime", "podman", "--json", "--method", method]
    proc = orch.popen(*argv)
    pid = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and pid is None:  # node2 is mid-stream
            if sum(p.stat().st_size for p in img.staged(c, "node2") if p.exists()) >= MB:
                pid = load_on(img, "node2")
            time.sleep(0.02)
        assert pid is not None, proc.communicate()
        os.kill(pid, signal.SIGSTOP)
        out, err = proc.communicate(timeout=240)
        if method == "chain":  # its relay ended it
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
                time.sleep(0.1)
            assert not Path(f"/proc/{pid}").exists()
        else:  # left as it was: the row says it was not ended
            assert Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "T"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pid is not None and Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 124, (out, err)
    nodes = {node["node"]: node for node in json.loads(out)["nodes"]}
    said = nodes["node2"]
    assert said["error"].startswith("load took no byte for 3"), said
    assert said["exit_code"] == 124 and said["hint"].startswith("is its load stopped"), said
    ended = "; its load was ended" if method == "chain" else "; the stream to it was ended (not its load there"
    assert ended in said["error"], said
    assert 0 < said["received_bytes"] <= img.size, said
    for name in ("node1", "node3"):
        assert nodes[name]["action"] == "loaded" and img.podman.image_id(name, img.ref) == img.image_id, name


def rsyncs_on(c: TestCluster, node: str) -> list[int]:
    """The pids of the `rsync --server` processes (receiver and generator) in that node's network
    namespace."""
    holder = c.node(node).holder
    assert holder is not None
    mine = os.stat(f"/proc/{holder.pid}/ns/net").st_ino
    found = []
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            named = argv[0].rsplit(b"/", 1)[-1] == b"rsync" and b"--server" in argv
            if named and os.stat(f"/proc/{entry}/ns/net").st_ino == mine:
                found.append(int(entry))
        except (OSError, IndexError):
            continue
    return found


def test_an_apptainer_copy_whose_rsync_stops_fails_its_node_by_its_deadline(
    chain_bed: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    """apptainer's .sif goes by rsync: node2's rsync (receiver and generator) is SIGSTOPped
    mid-file. rsync's --timeout (the push's --stall-timeout) ends the copy: node2 fails with 124,
    the others hold the file."""
    c = chain_bed
    c.tbf("node2", "16mbit")
    sif = c.controller_dir("sif") / "image.sif"
    sif.write_bytes(random.Random(9).randbytes(12 * MB))
    names = ["node1", "node2", "node3"]
    inv = c.write_inventory(tmp_path / "inv.yaml", only=names)
    argv = ["image", "push", str(sif), str(inv), "--runtime", "apptainer", "--json", "--stall-timeout", "5"]
    proc = orch.popen(*argv)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and len(pids) < 2:  # node2 is mid-file
            partial = c.node_path("node2", sif.parent)
            took = sum(p.stat().st_size for p in partial.glob(".image.sif.*")) if partial.exists() else 0
            if took >= MB:
                pids = rsyncs_on(c, "node2")
            time.sleep(0.02)
        assert len(pids) == 2, (pids, proc.communicate())
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in pids:
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 124, (out, err)
    nodes = {node["node"]: node for node in json.loads(out)["nodes"]}
    said = nodes["node2"]
    assert said["error"] == "rsync moved no byte for 5 s: the copy was ended here", said
    assert said["exit_code"] == 124 and said["hint"].startswith("is the rsync there stopped"), said
    for name in ("node1", "node3"):
        assert nodes[name]["action"] == "copied", nodes[name]
        assert c.node_path(name, sif).read_bytes() == sif.read_bytes(), name
