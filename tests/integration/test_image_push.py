"""`orch image push` on the real podman test bed: every node its own image store (tests/containers.py),
one missing the image, one holding another image under the same name, one already holding it."""

from __future__ import annotations

import json

import pytest

from tests.containers import IMAGE

pytestmark = pytest.mark.slow


def test_push_loads_where_missing_or_moved_skips_where_held(podman_cluster, cluster, container_image, orch):
    bed = podman_cluster
    bed.drop_image("node2")
    moved = bed.move_tag("node3")
    inv = cluster.write_inventory(only=["node1", "node2", "node3"])
    orch.env.update(container_image.store.env)  # the controller's podman holds the image
    r = orch.run("image", "push", IMAGE, str(inv), "--runtime", "podman", "--json", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["image_id"] == container_image.id
    assert report["size"] > 100_000_000
    nodes = {n["node"]: n for n in report["nodes"]}
    assert {name: n["action"] for name, n in nodes.items()} == {
        "node1": "present",
        "node2": "loaded",
        "node3": "loaded",
    }
    assert nodes["node2"]["before"] is None and nodes["node3"]["before"] == moved
    assert {n: bed.image_id(n) for n in ("node1", "node2", "node3")} == dict.fromkeys(
        ("node1", "node2", "node3"), container_image.id
    )

    # again: every node holds it now, nothing is exported or sent; the text names each node once
    r = orch.run("image", "push", IMAGE, str(inv), "--runtime", "podman", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"push {IMAGE} (podman, {container_image.id[:12]})")
    assert [ln.split()[:2] for ln in lines[1:]] == [[f"node{i}", "present"] for i in (1, 2, 3)]


def test_push_names_a_node_without_the_runtime_and_exits_its_code(
    podman_cluster, cluster, container_image, orch, tmp_path
):
    """A node whose podman is not there: 127 for that node (the worst), the others still loaded."""
    bed = podman_cluster
    bed.drop_image("node1")
    empty = tmp_path / "nopodman"
    empty.mkdir()
    inv = cluster.write_inventory(only=["node1", "node2"])
    # node2's login finds no podman (its PATH has none); node1 loads as usual
    cluster.set_env("node2", PATH=str(empty))
    orch.env.update(container_image.store.env)
    r = orch.run("image", "push", IMAGE, str(inv), "--runtime", "podman", timeout=600)
    assert r.returncode == 127, r.stdout + r.stderr
    assert "node1  loaded" in r.stdout, r.stdout
    assert "node2  FAILED: podman is not installed on this node (exit 127)" in r.stdout, r.stdout
    assert "failed on 1 of 2 nodes: node2" in r.stderr
    assert bed.image_id("node1") == container_image.id


def test_push_refuses_an_image_the_controller_does_not_hold(cluster, container_image, orch):
    inv = cluster.write_inventory(only=["node1"])
    orch.env.update(container_image.store.env)
    r = orch.run("image", "push", "localhost/orch-test:no-such-tag", str(inv), "--runtime", "podman")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "podman on this machine (the controller) has no image localhost/orch-test:no-such-tag" in r.stderr


@pytest.mark.parametrize("method", ["direct", "chain"])
def test_a_node_that_answers_escapes_for_an_id_fails_there_shown_escaped(
    podman_cluster, cluster, container_image, orch, tmp_path, method
):
    """node2's podman answers its first `image inspect` with terminal controls (OSC title, BEL,
    clear screen, a C1 CSI, a bidi override) before the ID: no ID, so node2 fails naming what it
    said, nothing is loaded there, and no byte of it reaches the terminal raw."""
    bed = podman_cluster
    bed.drop_image("node2")
    wrapper = tmp_path / "bin"
    wrapper.mkdir()
    (wrapper / "podman").write_text(
        "#!/bin/sh\n"
        f'if [ "$1 $2" = "image inspect" ] && mkdir "{tmp_path}/lied" 2>/dev/null; then\n'
        '  printf \'\\033]0;owned\\007\\033[2J\\302\\23331m\\342\\200\\256%s\\tnull\\n\' "$(/usr/bin/podman "$@")"\n'
        "  exit 0\n"
        "fi\n"
        'exec /usr/bin/podman "$@"\n'
    )
    (wrapper / "podman").chmod(0o755)
    cluster.set_env("node2", PATH=f"{wrapper}:/usr/bin:/bin")
    inv = cluster.write_inventory(only=["node1", "node2"])
    bed.drop_image("node1")
    orch.env.update(container_image.store.env)
    r = orch.run("image", "push", IMAGE, str(inv), "--runtime", "podman", "--method", method, timeout=600)
    acting = [c for c in r.stdout + r.stderr if c in "\x1b\x07\x9b\u202e"]
    assert acting == [], r.stdout + r.stderr
    assert r.returncode == 1, r.stdout + r.stderr
    assert "node1  loaded" in r.stdout, r.stdout
    assert "node2  FAILED: inspect: podman answered \\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\u202e" in r.stdout, r.stdout
    assert "not an image ID (64 hex digits)" in r.stdout and "login script" in r.stdout
    assert bed.image_id("node2") is None  # nothing was sent to it
