"""`orch sync` over real sshd nodes whose directories are private (no shared storage): every node
starts empty, gets byte-identical copies at the same absolute paths, a second sync sends nothing;
rsync missing on a node, host-key policies and a gateway hop as the transport has them; the `job`
check sees the synced files."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.cluster import ClusterError, TestCluster
from tests.ports import job_port
from tests.up_helpers import Orch

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def orch(tmp_path: Path) -> Orch:
    return Orch(tmp_path / "home")


def controller_tree(cluster: TestCluster) -> tuple[Path, Path]:
    """A job directory and a lone data file on the controller, under paths no node has."""
    try:
        root = cluster.controller_dir("sync")
    except ClusterError as exc:
        pytest.skip(str(exc))
    job = root / "job"
    (job / "pkg" / "deep").mkdir(parents=True)
    (job / "train.py").write_text("print('hello')\n")
    (job / "pkg" / "deep" / "w e i r d 'name'.bin").write_bytes(os.urandom(200_000))
    (job / "run.sh").write_text("#!/bin/sh\necho run\n")
    (job / "run.sh").chmod(0o755)
    (job / "link").symlink_to("train.py")
    data = root / "data.yaml"
    data.write_text("names: [a, b]\n")
    return job, data


def digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def on_node(cluster: TestCluster, node: str, script: str) -> str:
    r = cluster.exec(node, ["sh", "-c", script])
    assert r.returncode == 0, r.stderr
    return r.stdout


def sync_json(orch: Orch, *args: str) -> dict[str, dict]:
    r = orch.run("sync", *args, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return {n["node"]: n for n in json.loads(r.stdout)["nodes"]}


def test_empty_private_dirs_get_identical_copies_then_a_second_sync_sends_nothing(
    cluster: TestCluster, orch: Orch
) -> None:
    job, data = controller_tree(cluster)
    # the job is the tree's own script: the trainer's --check would refuse this two-line data.yaml
    inv = str(
        cluster.write_inventory(
            job={
                "sync": [str(job), str(data)],
                "workdir": str(job),
                "script": str(job / "train.py"),
                "args": {"data": str(data)},
            },
            master={"port": job_port()},
        )
    )
    for node in cluster.nodes:  # no shared storage: nothing of it on any node
        assert on_node(cluster, node.name, f"ls -A {cluster.NODE_LOCAL}") == ""

    first = sync_json(orch, inv)
    assert {n: (v["files"], v["ok"]) for n, v in first.items()} == {f"node{i}": (4, True) for i in range(1, 5)}
    want = digests(job)
    for node in cluster.nodes:
        # the same absolute paths, never job/job; modes and links kept
        listing = on_node(
            cluster,
            node.name,
            f"cd {job} && find . -type f -exec sha256sum {{}} + && stat -c %a run.sh && readlink link && cat {data}",
        )
        got = {line.split(None, 1)[1][2:]: line.split()[0] for line in listing.splitlines()[:-3]}
        assert got == want, node.name
        assert listing.splitlines()[-3:] == ["755", "train.py", "names: [a, b]"]

    second = sync_json(orch, inv)
    assert {n: (v["files"], v["bytes"], v["changes"]) for n, v in second.items()} == {
        f"node{i}": (0, 0, []) for i in range(1, 5)
    }
    text = orch.run("sync", inv)
    assert "node[1-4] (4): up to date" in text.stdout

    # the job check compares the synced file on every node; a node whose copy drifts fails it
    check = orch.run("check", inv, "--only", "job", "--json")
    assert check.returncode == 0, check.stdout
    on_node(cluster, "node3", f"echo 'names: [c]' > {data}")
    check = orch.run("check", inv, "--only", "job", "--json")
    bad = [r for r in json.loads(check.stdout)["results"] if r["status"] == "fail"]
    assert check.returncode == 1 and [r["node"] for r in bad] == ["node3"]
    assert "differs from the majority" in bad[0]["detail"] and "orch sync" in bad[0]["hint"]

    (job / "train.py").write_text("print('changed')\n")
    dry = orch.run("sync", inv, "--dry-run")
    assert dry.returncode == 0
    assert "node[1-2,4] (3): would copy 1 file(s), 17 B" in dry.stdout, dry.stdout
    assert f"<f.st...... {job}/train.py" in dry.stdout
    assert on_node(cluster, "node1", f"cat {job}/train.py") == "print('hello')\n"  # dry run changed nothing
    third = sync_json(orch, inv)
    assert {n: v["files"] for n, v in third.items()} == {"node1": 1, "node2": 1, "node3": 2, "node4": 1}
    assert orch.run("check", inv, "--only", "job").returncode == 0


def test_delete_removes_only_what_the_controller_lacks_inside_synced_dirs(cluster: TestCluster, orch: Orch) -> None:
    job, data = controller_tree(cluster)
    # Python's bytecode caches are the machine's own (its interpreter's, its paths'): the
    # controller's are not copied, and --delete leaves the node's alone
    (job / "__pycache__").mkdir()
    (job / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"controller's")
    inv = str(cluster.write_inventory(job={"sync": [str(job), str(data)]}))
    first = sync_json(orch, inv, "--nodes", "node2")["node2"]
    assert first["files"] == 4 and not any("__pycache__" in c for c in first["changes"]), first["changes"]
    on_node(
        cluster,
        "node2",
        f"touch {job}/stale.py {job.parent}/beside.txt {cluster.NODE_LOCAL}/mine && "
        f"mkdir -p {job}/pkg/__pycache__ && touch {job}/pkg/__pycache__/node.cpython-312.pyc",
    )
    kept = sync_json(orch, inv, "--nodes", "node2")["node2"]  # kept without --delete
    assert (kept["files"], kept["changes"]) == (0, [])
    got = sync_json(orch, inv, "--nodes", "node2", "--delete")["node2"]["changes"]
    assert got == [f"*deleting {job}/stale.py"]
    left = on_node(cluster, "node2", f"ls {job.parent} {cluster.NODE_LOCAL}")
    assert "beside.txt" in left and "mine" in left and "stale.py" not in on_node(cluster, "node2", f"ls {job}")
    assert (
        on_node(cluster, "node2", f"ls -A {job}/pkg/__pycache__; ls -A {job}")
        == "node.cpython-312.pyc\nlink\npkg\nrun.sh\ntrain.py\n"
    )


def test_a_symlinked_source_or_output_inside_a_synced_dir_leaves_the_node_intact(
    cluster: TestCluster, orch: Orch
) -> None:
    """With the controller's data/coco a link and the node's a real directory, --delete gave
    `*deleting data/coco/weights.pt` and put the link in its place; with the trainer's runs/ under
    a synced workdir, --delete would remove every checkpoint. Both refused (exit 2), nothing run."""
    job, data = controller_tree(cluster)
    root = job.parent
    (root / "big" / "coco").mkdir(parents=True)
    (root / "big" / "coco" / "train.txt").write_text("a.jpg\n")
    (root / "data").mkdir()
    (root / "data" / "coco").symlink_to(root / "big" / "coco")
    on_node(
        cluster,
        "node2",
        f"mkdir -p {root}/data/coco {job}/runs/train/r1/weights && "
        f"echo w > {root}/data/coco/weights.pt && echo ckpt > {job}/runs/train/r1/weights/last.pt",
    )
    linked = str(cluster.write_inventory(cluster.root / "linked.yaml", job={"sync": [str(root / "data" / "coco")]}))
    for flags in (["--delete"], []):
        r = orch.run("sync", linked, "--nodes", "node2", *flags)
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"{root}/data/coco is a symbolic link (to {root}/big/coco)" in r.stderr
    trained = str(
        cluster.write_inventory(
            cluster.root / "trained.yaml", job={"module": "trainer", "workdir": str(job), "sync": [str(job)]}
        )
    )
    r = orch.run("sync", trained, "--nodes", "node2", "--delete")
    assert (
        r.returncode == 2 and f"holds the trainer's default output folder (under job.workdir) {job}/runs:" in r.stderr
    ), r.stderr
    left = on_node(
        cluster,
        "node2",
        f"test -d {root}/data/coco && ! test -L {root}/data/coco && "
        f"cat {root}/data/coco/weights.pt {job}/runs/train/r1/weights/last.pt",
    )
    assert left == "w\nckpt\n"
    assert on_node(cluster, "node2", f"ls -A {job}") == "runs\n"  # nothing was copied either


def test_rsync_missing_on_a_node_is_named_and_the_others_still_sync(cluster: TestCluster, orch: Orch) -> None:
    job, data = controller_tree(cluster)
    inv = str(cluster.write_inventory(job={"sync": [str(job), str(data)]}))
    cluster.set_env("node2", PATH="/nonexistent")  # its logins find no rsync
    r = orch.run("sync", inv)
    assert r.returncode == 1
    assert "node2 (1): FAILED: rsync is not installed on this node" in r.stdout
    assert "hint: install it there: apt-get install rsync" in r.stdout
    assert "node[1,3-4] (3): copied 4 file(s)" in r.stdout
    assert "orch sync: failed on 1 of 4 nodes: node2" in r.stderr
    up = orch.run("up", inv, "--skip-checks")  # orch up syncs first: it launches nothing
    assert up.returncode == 3
    assert "node2 (1): FAILED: rsync is not installed on this node" in up.stderr
    assert "job.sync could not be copied to every node: nothing was launched" in up.stderr
    assert not (orch.home / "latest").exists()


def test_host_keys_follow_the_inventory_policy(cluster: TestCluster, orch: Orch, tmp_path: Path) -> None:
    job, data = controller_tree(cluster)
    known = tmp_path / "known_hosts"
    known.write_text("")
    strict = str(
        cluster.write_inventory(tmp_path / "strict.yaml", job={"sync": [str(job)]}, ssh={"known_hosts": str(known)})
    )
    r = orch.run("sync", strict, "--nodes", "node1")
    port = cluster.node("node1").port
    assert r.returncode == 1
    assert f"node1 (1): FAILED: ssh: host key of [127.0.1.1]:{port} is not in {known}" in r.stdout
    assert f"hint: verify it, then: ssh-keyscan -p {port} 127.0.1.1 >> {known}" in r.stdout
    assert known.read_text() == ""
    accept = str(
        cluster.write_inventory(
            tmp_path / "accept.yaml",
            job={"sync": [str(job)]},
            ssh={"known_hosts": str(known), "host_key_policy": "accept-new"},
        )
    )
    assert sync_json(orch, accept, "--nodes", "node1")["node1"]["files"] == 3
    assert f"[127.0.1.1]:{cluster.node('node1').port}" in known.read_text()
    # what OpenSSH recorded, orch's own transport verifies under strict
    assert orch.run("exec", strict, "--nodes", "node1", "--", "true").returncode == 0


@pytest.mark.netns
def test_a_gateway_hop_is_honoured(make_cluster, orch: Orch) -> None:
    cluster = make_cluster(3, "netns")
    job, data = controller_tree(cluster)
    hop = cluster.node("node1").host
    inv = str(cluster.write_inventory(job={"sync": [str(job), str(data)]}, nodes_extra={"node2": {"gateway": hop}}))
    got = sync_json(orch, inv, "--nodes", "node2")
    assert got["node2"]["files"] == 4
    assert f"from {hop} port" in cluster.sshd_log("node2")
    assert on_node(cluster, "node2", f"cat {data}") == "names: [a, b]\n"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_orch_up_syncs_first_and_nodes_with_empty_dirs_train(make_cluster, orch: Orch) -> None:
    """No shared storage: the dataset and the workdir exist on the controller only. `orch up` copies
    them, its preflight sees identical files, both nodes train; a second sync sends nothing."""
    from tests.trainer_helpers import make_dataset

    cluster = make_cluster(2)
    try:
        root = cluster.controller_dir("yolo")
    except ClusterError as exc:
        pytest.skip(str(exc))
    data = make_dataset(root / "data", images=12, classes=2, imgsz=64)
    work = root / "work"
    work.mkdir()
    (work / "NOTES.txt").write_text("the job's working directory\n")
    inv = str(
        cluster.write_inventory(
            job={
                "module": "trainer",
                "workdir": str(work),
                "nproc_per_node": 1,
                "sync": [str(root / "data"), str(work)],
                "args": {
                    "model": "yolo12n.yaml",
                    "data": str(data),
                    "epochs": 1,
                    "batch": 4,
                    "imgsz": 64,
                    "workers": 0,
                    "val-period": 0,
                },
            },
            env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
            master={"port": job_port()},
        )
    )
    for node in cluster.nodes:
        assert on_node(cluster, node.name, f"ls -A {cluster.NODE_LOCAL}") == ""
    files = sum(1 for p in root.rglob("*") if p.is_file())

    up = orch.run("up", inv, timeout=540)
    assert up.returncode == 0, up.stderr[-4000:]
    assert "syncing 2 path(s) of job.sync to 2 nodes" in up.stderr
    assert f"node[1-2] (2): copied {files} file(s)" in up.stderr, up.stderr[:3000]
    assert "preflight passed" in up.stderr and "succeeded on every node" in up.stderr
    run_id = (orch.home / "latest").read_text().strip()
    assert {n["node"]: n["files"] for n in json.loads((orch.run_dir(run_id) / "sync.json").read_text())["nodes"]} == {
        "node1": files,
        "node2": files,
    }
    # rank 0 wrote its weights into the workdir (runs/<task>/<run id>, as ultralytics 8.4), on node1 only
    assert "last.pt" in on_node(cluster, "node1", f"ls {work}/runs/detect/{run_id}/weights").split()

    again = sync_json(orch, inv)  # what the job wrote beside the synced files is neither sent nor reported
    assert {n: (v["files"], v["bytes"], v["changes"]) for n, v in again.items()} == {
        "node1": (0, 0, []),
        "node2": (0, 0, []),
    }
