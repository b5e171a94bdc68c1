"""The job's paths in a container run are judged where they live (issue 54.1, 54.2): each path
argument through the container's mounts to the node's host (`JobEnv.host_path`) for what the host
checks (size, sha256, the dataset's files); an input in the image's own files from inside the
job's container (`paths_inside`); an output (or the trainer's run directory) under no mount fails,
since `--rm` deletes it with the container."""

from __future__ import annotations

import copy
import json
from typing import Any

from orchestrator.config import inventory
from orchestrator.config.jobenv import job_env
from orchestrator.preflight import checks
from orchestrator.preflight.facts import probe_args
from tests.unit.test_checks import NODES, TRAINER_ACCEPTS, by, make_facts

MOUNTS = "[/data, '/mnt/nfs/ckpt:/ckpt', '/srv/models:/models:ro']"


def inv_with(args: str, container: str = "", nodes: int = 4) -> inventory.Inventory:
    """The field guide's image flow: `/mnt/nfs/ckpt:/ckpt`, pretrained weights under a remapped
    read-only mount, `cd /root/yoloe` as the container's workdir."""
    return inventory.parse(
        f"""
name: t
nodes:
  - host: 10.0.0.[1-{nodes}]
    name: n[1-{nodes}]
master: {{port: 29500}}
checks: {{clock: {{ntp_server: 10.0.0.1}}}}
job:
  python: /usr/bin/python3
  workdir: /mnt/nfs/orch
  nproc_per_node: 2
  args:
    data: /data/coco.yaml
    batch: 64
{args}
  container:
    runtime: docker
    image: yoloe:latest
    workdir: /root/yoloe
    mounts: {MOUNTS}
{container}
""",
        "t.yaml",
    )


FIELD = inv_with("    project: /ckpt/yoloe\n    text-embeddings: /models/coco_text_pe.pt\n")


def test_a_container_path_is_found_on_the_host_through_its_mount() -> None:
    env = job_env(FIELD, FIELD.nodes[0])
    assert env.host_path("/ckpt/yoloe") == "/mnt/nfs/ckpt/yoloe"
    assert env.host_path("/models/coco_text_pe.pt") == "/srv/models/coco_text_pe.pt"
    assert env.host_path("/data/coco.yaml") == "/data/coco.yaml"
    assert env.host_path("/mnt/nfs/orch/x") == "/mnt/nfs/orch/x"  # job.workdir, mounted at its own path
    assert env.host_path("/root/yoloe/runs") is None and env.host_path("/ckptx") is None
    bare = inventory.parse("nodes:\n  - host: a\njob: {workdir: /w}\n", "t")
    assert job_env(bare, bare.nodes[0]).host_path("/anything") == "/anything"


def test_the_probe_looks_up_each_path_on_the_host_where_the_mount_puts_it() -> None:
    """Before: `/ckpt/yoloe` and `/models/...` were looked up as such on the host ("cannot be
    created: / is not writable", "does not exist on this node")."""
    args = probe_args(FIELD, FIELD.nodes[0], ["job", "container"], "tok", 4)
    assert args["paths"] == {
        "data": "/data/coco.yaml",
        "project": "/mnt/nfs/ckpt/yoloe",
        "text-embeddings": "/srv/models/coco_text_pe.pt",
    }
    assert args["in_container"]["project"] == "/ckpt/yoloe"  # what the container's user is asked about
    assert args["outputs"] == ["project"] and args["inside_only"] == []
    assert ["/ckpt", "/mnt/nfs/ckpt"] in [list(m) for m in args["mounts"]]  # the data YAML's paths, mapped
    image = inv_with("    weights: /root/yoloe/pretrain/yoloe-v8l-seg.pt\n    project: /ckpt/y\n")
    args = probe_args(image, image.nodes[0], ["job"], "tok", 4)
    assert "weights" not in args["paths"] and args["inside_only"] == ["weights"]


def facts_for(inv: inventory.Inventory, out: str | None = None, inside: dict[str, Any] | None = None) -> Any:
    """Healthy facts of the field's inventory: every host path there; the trainer's check answering
    with its run directory `out`; `inside`: what the job's container saw of the image-only inputs."""

    def edit(raw: dict[str, Any], nf: Any) -> None:
        host = probe_args(inv, nf.node, ["job"], "tok", 4)["paths"]
        for key, path in host.items():
            if key == "project":
                raw["paths"][key] = {"path": path, "output": True, "exists": True, "is_dir": True, "writable": True}
            elif key != "data":
                raw["paths"][key] = {"path": path, "exists": True, "is_file": True, "size": 5, "sha256": "bb" * 32}
        raw["workdir"] = {"path": "/mnt/nfs/orch", "exists": True, "is_dir": True}
        if inside is not None:
            raw["paths_inside"] = {"paths": inside}
        if "job_check" in raw and out is not None:
            answer = json.loads(raw["job_check"]["out"])
            raw["job_check"] = copy.deepcopy(TRAINER_ACCEPTS)
            raw["job_check"]["out"] = json.dumps({**answer, "out": out}) + "\n"

    return make_facts(inv, dict.fromkeys(NODES, edit))


def test_the_field_inventory_passes_the_job_check() -> None:
    rows = by(checks.check_job(FIELD, facts_for(FIELD, out="/ckpt/yoloe/preflight-1")), "job")
    assert {r.status for r in rows.values()} == {"ok"}, {n: r.detail for n, r in rows.items()}


def test_a_forgotten_project_fails_naming_where_the_run_would_be_lost() -> None:
    """Issue 54.1: `cd /root/yoloe` and no project: the trainer writes into the container's own
    files and `docker run --rm` deletes them; `orch check` said ok and printed where it would write."""
    inv = inv_with("")
    rows = by(checks.check_job(inv, facts_for(inv, out="/root/yoloe/runs/detect/preflight-1")), "job")
    master = rows["n1"]
    assert master.status == "fail", master
    assert "the trainer would write its run to /root/yoloe/runs/detect/preflight-1, inside the container only" in (
        master.detail
    )
    assert "docker run --rm deletes it with the container" in master.detail
    assert "- /mnt/nfs/ckpt:/ckpt" in master.hint and "project: /ckpt/" in master.hint
    lost = inv_with("    project: /root/runs\n")
    rows = by(checks.check_job(lost, facts_for(lost, out="/root/runs/preflight-1")), "job")
    assert {r.status for r in rows.values()} == {"fail"}  # every node: an output argument, judged on each
    assert "project: /root/runs is inside the container only" in rows["n2"].detail
    assert rows["n1"].detail.count("inside the container only") == 1  # the trainer's out says it once


def test_an_input_in_the_image_is_judged_from_inside() -> None:
    """An input under no mount is in the image's own files (the official image's pretrained weights):
    it is not looked for on the host, but as the job's container saw it."""
    inv = inv_with("    weights: /root/yoloe/pretrain/yoloe-v8l-seg.pt\n    project: /ckpt/y\n")
    seen = {"path": "/root/yoloe/pretrain/yoloe-v8l-seg.pt", "exists": True, "is_file": True, "is_dir": False}
    ok = by(checks.check_job(inv, facts_for(inv, out="/ckpt/y/p", inside={"weights": seen})), "job")
    assert {r.status for r in ok.values()} == {"ok"}, {n: r.detail for n, r in ok.items()}
    gone = by(
        checks.check_job(inv, facts_for(inv, out="/ckpt/y/p", inside={"weights": {**seen, "exists": False}})), "job"
    )
    assert gone["n3"].status == "fail", gone["n3"]
    assert (
        "weights: /root/yoloe/pretrain/yoloe-v8l-seg.pt is under none of job.container.mounts and not in the image"
        in (gone["n3"].detail)
    )


def test_a_host_path_is_named_beside_the_containers() -> None:
    facts = facts_for(FIELD, out="/ckpt/yoloe/p")
    facts["n2"].raw["paths"]["text-embeddings"]["exists"] = False
    row = by(checks.check_job(FIELD, facts), "job")["n2"]
    assert row.status == "fail"
    assert "text-embeddings: /models/coco_text_pe.pt (/srv/models/coco_text_pe.pt on the host) does not exist" in (
        row.detail
    )
