"""`orch up` with `job.container` on the real podman test bed (tests/containers.py): the trainer runs
in a podman container on each node (the job's Python environment mounted into the test image, as
users mount their code and data), and no container of the run outlives any way the run ends."""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import TestCluster
from tests.containers import IMAGE, PodmanBed, python_mounts
from tests.ports import job_port
from tests.trainer_helpers import make_dataset
from tests.up_helpers import DDP_JOB, REPO, Orch, node_log, run_root, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

GONE_WITHIN_S = 20.0
"""How soon after `orch up` or `orch down` returns no container of the run may be left on any node
(README "Containers"): the stop hook removes it while the run is being stopped."""

TRAINER_FLAGS = {
    "model": "yolo12n.yaml",
    "epochs": 1,
    "batch": 4,
    "imgsz": 64,
    "workers": 0,
    "val-period": 0,
    "seed": 1,
    "plots": "false",
}


def container_keys(*extra_mounts: str, workdir: str = "/tmp") -> dict[str, Any]:
    """The test image with the job's Python environment mounted (less job.workdir: orch mounts it)."""
    mounts = [m for m in python_mounts(sys.executable) if m != workdir]
    return {
        "runtime": "podman",
        "image": IMAGE,
        "python": sys.executable,
        "mounts": [*mounts, *extra_mounts],
        "user": "root",
        "options": [],  # none needed on this sandbox without CAP_SYS_RESOURCE: orch asks for no --ulimit (no RDMA)
    }


def trainer_inventory(cluster: TestCluster, tmp: Path, nodes: list[str]) -> Path:
    data = make_dataset(tmp / "ds", images=8)
    (tmp / "runs").mkdir(exist_ok=True)
    return cluster.write_inventory(
        tmp / "trainer.yaml",
        only=nodes,
        job={
            "module": "trainer",
            "nproc_per_node": 1,
            "workdir": str(REPO),
            "stop_grace_s": 5,
            "args": {**TRAINER_FLAGS, "data": str(data), "project": str(tmp / "runs")},
            "container": container_keys(str(tmp), workdir=str(REPO)),
        },
        env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
        master={"port": job_port()},
    )


def ddp_inventory(cluster: TestCluster, tmp: Path, nodes: list[str], steps: int = 400) -> Path:
    return cluster.write_inventory(
        tmp / "ddp.yaml",
        only=nodes,
        job={
            "module": None,
            "script": DDP_JOB,
            "nproc_per_node": 1,
            "workdir": "/tmp",
            "stop_grace_s": 3,
            "telemetry_s": 2,
            "args": {"steps": steps, "sleep": 0.1},
            "container": container_keys(),
        },
        env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
        master={"port": job_port()},
    )


def run_label(run_id: str) -> str:
    return f"orch.run={run_id}"


def test_a_two_node_trainer_run_in_podman_containers(
    podman_cluster: PodmanBed, cluster: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    bed = podman_cluster
    inv = trainer_inventory(cluster, tmp_path, ["node1", "node2"])
    res = orch.run("up", str(inv), "--run-id", "ctr", timeout=540)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "succeeded on every node" in res.stderr
    # the merged log is the trainer's, from both nodes, as without a container
    merged = (orch.run_dir("ctr") / "merged.log").read_text()
    assert "node1" in merged and "node2" in merged
    assert "[rank 1]" in merged or "rank1" in merged or "r1" in merged
    assert bed.wait_no_containers(run_label("ctr"), within=GONE_WITHIN_S) == {}
    status = json.loads(orch.run("status", "--json", "ctr").stdout)
    assert status["state"] == "succeeded", status
    report = orch.run("report", "ctr", timeout=240)
    assert report.returncode == 0, report.stderr


def _running(cluster: TestCluster, run_id: str, bed: PodmanBed, nodes: list[str]) -> bool:
    """Every node's container is there and its job past its third step (its node.log says so)."""
    have = bed.all_containers(run_label(run_id))
    return all(have.get(n) and "step 3 " in node_log(run_root(cluster), run_id, n) for n in nodes)


@pytest.mark.parametrize(
    "how",
    [
        "sigint",
        "down",
        "fail_fast",
        "agent_kill9",
    ],
)
def test_every_stop_path_leaves_no_container(
    podman_cluster: PodmanBed, cluster: TestCluster, orch: Orch, tmp_path: Path, how: str
) -> None:
    """Ctrl-C of `orch up`, `orch down` of a detached run, a rank failing (fail-fast stops the other
    node), the node agent killed -9 then `orch down`: within GONE_WITHIN_S no container of the run
    is left on any node."""
    bed = podman_cluster
    nodes = ["node1", "node2"]
    inv = ddp_inventory(cluster, tmp_path, nodes)
    run_id = f"stop-{how.replace('_', '-')}"
    if how == "fail_fast":
        inv = cluster.write_inventory(
            tmp_path / "ddp.yaml",
            only=nodes,
            job={
                "module": None,
                "script": DDP_JOB,
                "nproc_per_node": 1,
                "workdir": "/tmp",
                "stop_grace_s": 3,
                "args": {"steps": 400, "sleep": 0.1, "fail-rank": 1, "fail-step": 5},
                "container": container_keys(),
            },
            env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
            master={"port": job_port()},
        )
        res = orch.run("up", str(inv), "--run-id", run_id, "--skip-checks", timeout=300)
        assert res.returncode == 1, res.stderr[-3000:]
    elif how == "sigint":
        up = orch.start(str(inv), "--run-id", run_id, "--skip-checks")
        try:
            wait_for(
                lambda: _running(cluster, run_id, bed, nodes) or up.proc.poll() is not None,
                180,
                "both containers running",
            )
            assert up.proc.poll() is None, up.err[-3000:]
            up.proc.send_signal(signal.SIGINT)
            assert up.proc.wait(120) == 130, up.err[-3000:]
        finally:
            if up.proc.poll() is None:
                up.proc.kill()
    else:
        res = orch.run("up", str(inv), "--run-id", run_id, "--skip-checks", "--detach", timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        wait_for(lambda: _running(cluster, run_id, bed, nodes), 180, "both containers running")
        if how == "agent_kill9":
            agents = [
                p
                for n in nodes
                for p in cluster.processes(n, run_id)
                if b"agent" in Path(f"/proc/{p}/cmdline").read_bytes()
            ]
            assert agents, "no agent process found"
            for pid in agents:
                with_kill(pid)
            time.sleep(0)  # the containers keep running without their agent: that is what down must finish
            assert bed.all_containers(run_label(run_id)), "containers went away with the agent"
        down = orch.run("down", run_id, timeout=180)
        if down.returncode == 1 and "still running" in down.stdout:
            # the contract's "a process survived (run it again)": a container's processes may outlive
            # the stop grace on this loaded machine; the second down must finish it
            down = orch.run("down", run_id, timeout=180)
        pids = [int(p) for p in re.findall(r"\d+", down.stdout.partition("still running")[2])]
        assert down.returncode == 0, (down.stdout + down.stderr, {p: _cmdline(p) for p in pids})
    left = bed.wait_no_containers(run_label(run_id), within=GONE_WITHIN_S)
    assert left == {}, (left, {n: node_log(run_root(cluster), run_id, n)[-1500:] for n in nodes})


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "(gone)"


def with_kill(pid: int) -> None:
    import os

    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_the_preflight_names_a_missing_image_and_a_moved_tag(
    podman_cluster: PodmanBed, cluster: TestCluster, container_image: Any, orch: Orch, tmp_path: Path
) -> None:
    """Real per-node podman stores: node2 lacks the image, node3's tag names another image. The
    container rows fail on those two nodes alone, naming node3's ID and the others'; after
    `orch image push` every row passes and the check pins the launch to the one ID."""
    bed = podman_cluster
    bed.drop_image("node2")
    moved = bed.move_tag("node3")
    inv = ddp_inventory(cluster, tmp_path, ["node1", "node2", "node3", "node4"])
    res = orch.run("check", str(inv), "--only", "container", "--json", timeout=180)
    assert res.returncode == 1, res.stdout + res.stderr
    rows = {r["node"]: r for r in json.loads(res.stdout)["results"] if r["check"] == "container"}
    assert rows["node1"]["status"] == "ok", (rows["node1"]["detail"], rows["node1"]["hint"])
    assert rows["node2"]["status"] == "fail" and f"{IMAGE} is not on this node" in rows["node2"]["detail"]
    assert "orch image push" in rows["node2"]["hint"]
    assert rows["node3"]["status"] == "fail"
    assert f"{IMAGE} is {moved[:12]} here but {container_image.id[:12]} on node[1,4]" in rows["node3"]["detail"]
    assert rows["node4"]["status"] == "ok"
    orch.env.update(container_image.store.env)
    push = orch.run("image", "push", IMAGE, str(inv), timeout=600)
    assert push.returncode == 0, push.stdout + push.stderr
    res = orch.run("check", str(inv), "--only", "container", "--json", timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = {r["node"]: r for r in json.loads(res.stdout)["results"] if r["check"] == "container"}
    assert {r["status"] for r in rows.values()} == {"ok"}
    assert f"is image {container_image.id[:12]} on every node that has it (4)" in rows["node1"]["detail"]


def test_top_and_stacks_reach_the_ranks_inside_the_containers(
    podman_cluster: PodmanBed, cluster: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    """A detached container run: `orch top` reads both nodes' telemetry, `orch stacks` dumps each
    rank's Python stack (py-spy on the host reaches the processes inside the container), `orch exec
    --container RUN` runs inside each node's container, then `orch down` leaves no container."""
    bed = podman_cluster
    nodes = ["node1", "node2"]
    inv = ddp_inventory(cluster, tmp_path, nodes, steps=2000)
    res = orch.run("up", str(inv), "--run-id", "ctr-live", "--skip-checks", "--detach", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    try:
        wait_for(lambda: _running(cluster, "ctr-live", bed, nodes), 180, "both containers running")

        def ranks_sampled() -> bool:  # the ranks are the runtime's processes, found by the launch's identity
            look = orch.run("top", "ctr-live", "--json", timeout=120)
            assert look.returncode == 0, look.stdout + look.stderr
            nodes_seen = json.loads(look.stdout)["nodes"]
            return len(nodes_seen) == 2 and all(
                n["ranks"] and all(r["pid"] and r["cpu_pct"] is not None for r in n["ranks"]) for n in nodes_seen
            )

        wait_for(ranks_sampled, 120, "orch top to show each node's rank inside its container, with its CPU share")
        top = orch.run("top", "ctr-live", "--json", timeout=120)
        assert top.returncode == 0, top.stdout + top.stderr
        rows = {n["node"]: n for n in json.loads(top.stdout)["nodes"]}
        assert {n: r["state"] for n, r in rows.items()} == dict.fromkeys(nodes, "running"), rows
        assert all(r["fetch_error"] is None and r["mem_total_mb"] for r in rows.values()), rows
        stacks = orch.run("stacks", "ctr-live", "--json", timeout=180)
        assert stacks.returncode == 0, stacks.stdout[-3000:] + stacks.stderr[-3000:]
        assert "ddp_job.py" in stacks.stdout
        # inside each node's container: its own ORCH_NODE, and pid 1 is the container's init
        inside = orch.run(
            "exec",
            "--container",
            "ctr-live",
            "--json",
            "--",
            'echo "$ORCH_NODE $(tr "\\0" " " < /proc/1/cmdline)"',
            timeout=120,
        )
        assert inside.returncode == 0, inside.stdout + inside.stderr
        said = {n["node"]: n["stdout"].strip() for n in json.loads(inside.stdout)["nodes"]}
        assert set(said) == set(nodes), said
        for node, line in said.items():
            assert line.startswith(f"{node} ") and "init" in line.split()[1], said
    finally:
        down = orch.run("down", "ctr-live", timeout=180)
        if down.returncode == 1:
            down = orch.run("down", "ctr-live", timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    assert bed.wait_no_containers(run_label("ctr-live"), within=GONE_WITHIN_S) == {}


def test_the_preflight_fails_a_container_with_a_small_dev_shm(
    podman_cluster: PodmanBed, cluster: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    """`--shm-size=64m` in job.container.options: orch does not share the host's IPC, and the
    container row fails on /dev/shm as measured inside the check's own container; without it, ok."""
    keys = container_keys()
    keys["options"] = [*keys["options"], "--shm-size=64m"]
    inv = cluster.write_inventory(
        tmp_path / "shm.yaml",
        only=["node1", "node2"],
        job={"module": None, "script": DDP_JOB, "nproc_per_node": 1, "workdir": "/tmp", "container": keys},
        env={"GLOO_SOCKET_IFNAME": "lo"},
        master={"port": job_port()},
    )
    res = orch.run("check", str(inv), "--only", "container,software", "--json", timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    rows = {r["node"]: r for r in json.loads(res.stdout)["results"] if r["check"] == "container"}
    for node in ("node1", "node2"):
        assert rows[node]["status"] == "fail", rows[node]
        assert "/dev/shm in the container is 64 MiB" in rows[node]["detail"], rows[node]
    res = orch.run(
        "check",
        str(ddp_inventory(cluster, tmp_path, ["node1", "node2"])),
        "--only",
        "container,software",
        "--json",
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_gpu_node_whose_runtime_cannot_pass_its_gpus_fails(
    podman_cluster: PodmanBed, cluster: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    """node1 declares 8 GPUs and its nvidia-smi is a recorded V100 node's (ORCH_PROBE_FIXTURES):
    the check's torch container asks podman for them by UUID (CDI), and this machine has no CDI
    spec, so the container row fails naming podman's refusal and `nvidia-ctk cdi generate`."""
    cluster.set_env("node1", ORCH_PROBE_FIXTURES=str(REPO / "tests" / "fixtures" / "probe" / "v100"))
    inv = cluster.write_inventory(
        tmp_path / "gpu.yaml",
        only=["node1"],
        nodes_extra={"node1": {"gpus": 8}},
        job={"module": None, "script": DDP_JOB, "nproc_per_node": 1, "workdir": "/tmp", "container": container_keys()},
        env={"GLOO_SOCKET_IFNAME": "lo"},
        master={"port": job_port()},
    )
    res = orch.run("check", str(inv), "--only", "container,gpus", "--json", timeout=300)
    row = next(r for r in json.loads(res.stdout)["results"] if r["check"] == "container")
    assert row["status"] == "fail", row
    assert "podman cannot give the container this node's GPUs" in row["detail"], row
    assert "unresolvable CDI devices nvidia.com/gpu=" in row["detail"], row["detail"]
    assert "nvidia-ctk cdi generate" in row["hint"], row


def test_an_output_folder_the_container_cannot_write_fails(
    podman_cluster: PodmanBed, cluster: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    """The project folder mounted read-only into the container: the container row fails on it, as
    the probe saw it from inside a container started as the launch's (the host sees it writable,
    and `python -m trainer --check` does not write). A user other than root:
    tests/integration/test_up_container_user.py."""
    import yaml

    inv = trainer_inventory(cluster, tmp_path, ["node1"])
    doc = yaml.safe_load(inv.read_text())
    mounts = doc["job"]["container"]["mounts"]
    mounts[mounts.index(str(tmp_path))] = f"{tmp_path}:{tmp_path}:ro"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = orch.run("check", str(inv), "--only", "job,container", "--json", timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    row = next(r for r in json.loads(res.stdout)["results"] if r["check"] == "container")
    assert row["status"] == "fail", row
    assert f"--project: {tmp_path / 'runs'} is not writable inside the container (as root)" in row["detail"], row
    assert "no :ro in job.container.mounts" in row["hint"]
