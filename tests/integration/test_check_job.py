"""`orch check` asks the job itself (real sshd per node, this machine's torch and trainer): a typo in
the trainer's arguments, a misspelled module and an `--out` that holds a run fail the preflight
with the trainer's own message; and the example V100 inventory, adapted to the test cluster with
recorded V100s behind nvidia-smi, fails on exactly the GPU check: this torch (CUDA 13) has no
kernels for sm_70."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.config.inventory import load
from tests.cluster import TestCluster
from tests.integration.test_check import (
    FIX,
    MakeCluster,
    failures,
    orch_check_json,
    preflight,
    result,
)
from tests.ports import job_port
from tests.trainer_helpers import make_dataset

REPO = Path(__file__).resolve().parents[2]
ONLY_JOB = ("clock", "timezone", "nccl_env", "rdma", "gpus", "software", "ports", "container", "fabric")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("job-data"), images=8, imgsz=32)


def trainer_inventory(c: TestCluster, workdir: Path, **args: Any) -> Path:
    return c.write_inventory(
        master={"port": job_port()}, job={"module": "trainer", "workdir": str(workdir), "args": args}
    )


def test_a_typo_in_the_trainers_arguments_fails_orch_check_with_the_trainers_line(
    make_cluster: MakeCluster, data: Path, tmp_path: Path
) -> None:
    c = make_cluster(2)
    inv = trainer_inventory(c, tmp_path, data=str(data), batch=4, epocs=24)
    code, report, err = orch_check_json(inv, tmp_path / "home")
    assert code == 1, (err, report)
    bad = [(r["check"], r["node"]) for r in report["results"] if r["status"] == "fail"]  # type: ignore[index]
    assert bad == [("job", "node1")], report
    job = next(r for r in report["results"] if r["check"] == "job" and r["node"] == "node1")  # type: ignore[union-attr]
    assert job["detail"] == (
        "the trainer refuses the arguments: python -m trainer: error: unrecognized arguments: "
        "--epocs (did you mean --epochs?)"
    ), job
    assert "usage:" not in job["detail"] and "fix job.args in" in job["hint"]


def test_a_misspelled_module_and_an_out_that_holds_a_run_fail_before_launch(
    make_cluster: MakeCluster, data: Path, tmp_path: Path
) -> None:
    c = make_cluster(2)
    inv = c.write_inventory(
        master={"port": job_port()}, job={"module": "trainr", "workdir": str(tmp_path), "args": {"data": str(data)}}
    )
    report = preflight(inv, skip=ONLY_JOB)
    assert failures(report) == {("job", "node1")}
    r = result(report, "job", "node1")
    assert "module trainr is not importable by" in r["detail"] and r["hint"].startswith("did you mean module: trainer?")
    out = tmp_path / "y12"
    (out / "weights").mkdir(parents=True)
    (out / "weights" / "last.pt").write_bytes(b"not yet")
    report = preflight(trainer_inventory(c, tmp_path, data=str(data), batch=4, out=str(out)), skip=ONLY_JOB)
    assert failures(report) == {("job", "node1")}
    assert result(report, "job", "node1")["detail"] == (
        f"the trainer refuses the arguments: --out {out} already holds a run (weights/last.pt): add --resume, "
        "or pick another --out"
    )
    report = preflight(
        trainer_inventory(c, tmp_path, data=str(data), batch=4, out=str(tmp_path / "fresh")), skip=ONLY_JOB
    )
    assert failures(report) == set(), [r for r in report.results if r.status == "fail"]
    ok = result(report, "job", "node1")
    assert ok["status"] == "ok" and f"writes {tmp_path / 'fresh'}" in ok["detail"], ok
    assert "the job's own check runs on node1" in result(report, "job", "node2")["detail"]
    assert not (tmp_path / "fresh").exists(), "the check wrote the run directory"


def v100_inventory_for(c: TestCluster, data: Path, workdir: Path) -> Path:
    """inventory/v100.yaml with only what its ADAPT comments ask changed to this test cluster: the
    nodes' addresses and SSH, the NTP server, the interface, python, workdir and data; and TZ in the
    env (the example's zone), since these test nodes run in this machine's zone."""
    doc = yaml.safe_load((REPO / "inventory" / "v100.yaml").read_text())
    mine = yaml.safe_load(c.write_inventory(master={"port": job_port()}).read_text())
    doc["ssh"] = mine["ssh"]
    doc["nodes"] = [{**n, "gpus": 8} for n in mine["nodes"]]
    doc["master"] = {"node": mine["nodes"][0]["name"], "port": mine["master"]["port"]}
    doc["checks"]["clock"]["ntp_server"] = mine["checks"]["clock"]["ntp_server"]
    doc["env"].update(NCCL_SOCKET_IFNAME="lo", TZ=doc["checks"]["timezone"])
    doc["job"].update(python=mine["job"]["python"], run_root=mine["job"]["run_root"], workdir=str(workdir))
    doc["job"]["args"]["data"] = str(data)
    path = c.root / "v100-adapted.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.slow
def test_the_v100_example_on_v100s_with_a_cuda_13_torch_fails_on_exactly_the_gpu_check(
    make_cluster: MakeCluster, data: Path, tmp_path: Path
) -> None:
    c = make_cluster(4, node_env={f"node{i}": {"ORCH_PROBE_FIXTURES": str(FIX / "v100")} for i in range(1, 5)})
    inv = v100_inventory_for(c, data, tmp_path)
    assert load(inv).job.module == "trainer" and load(inv).job.raw_args["batch"] == 384
    code, report, err = orch_check_json(inv, tmp_path / "home")
    assert code == 1, err
    results = report["results"]
    assert isinstance(results, list)
    bad = {(r["check"], r["node"]) for r in results if r["status"] == "fail"}
    assert bad == {("gpus", f"node{i}") for i in range(1, 5)}, [r for r in results if r["status"] != "ok"]
    gpus = next(r for r in results if r["check"] == "gpus" and r["node"] == "node3")
    assert (
        "GPU 0-7 Tesla V100-SXM2-16GB (sm_70, compute capability 7.0): torch 2.14.1+cu130 has kernels for "
        "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 and no PTX this GPU can compile"
    ) in gpus["detail"], gpus
    assert "--index-url https://download.pytorch.org/whl/cu126" in gpus["hint"]
    job = next(r for r in results if r["check"] == "job" and r["node"] == "node1")
    assert job["status"] == "ok" and "the trainer accepts the arguments" in job["detail"], job


def test_a_stale_dataset_copy_on_one_node_fails_the_job_check_naming_the_node_and_the_split(
    make_cluster: MakeCluster, tmp_path: Path
) -> None:
    """Each node its own HOME with its own copy of the dataset (`data: ~/data/data.yaml`, the same
    YAML everywhere): node3's images/train holds fewer files. The data YAML's hash agreed, so the
    `job` check said ok and node3 trained fewer batches per epoch; now node3 fails, naming the split."""
    import shutil

    template = make_dataset(tmp_path / "template", images=16, imgsz=32).parent
    (template / "data.yaml").write_text(
        "\n".join(ln for ln in (template / "data.yaml").read_text().splitlines() if not ln.startswith("path:")) + "\n"
    )  # the YAML's own folder
    homes = {f"node{i}": tmp_path / f"home{i}" for i in (1, 2, 3)}
    for home in homes.values():
        shutil.copytree(template, home / "data")
    stale = sorted((homes["node3"] / "data" / "images" / "train").iterdir())
    for image in stale[:5]:
        image.unlink()
    c = make_cluster(3, node_env={name: {"HOME": str(home)} for name, home in homes.items()})
    report = preflight(trainer_inventory(c, tmp_path, data="~/data/data.yaml", batch=3, epochs=1), skip=ONLY_JOB)
    assert failures(report) == {("job", "node3")}, [r for r in report.results if r.status != "ok"]
    bad = result(report, "job", "node3")
    train = homes["node3"] / "data" / "images" / "train"
    assert f"the train split of ~/data/data.yaml ({train}) differs here from the other nodes: 7 files" in bad["detail"]
    assert "12 files" in bad["detail"] and "on 2 node(s)" in bad["detail"], bad
    assert "rsync" in bad["hint"]
    ok = result(report, "job", "node2")
    assert ok["status"] == "ok" and "(train 12 files" in ok["detail"] and "the same on every node" in ok["detail"], ok


def test_field_guide_001s_line_on_cpu_nodes_is_refused_once_with_every_problem(
    make_cluster: MakeCluster, data: Path, tmp_path: Path
) -> None:
    """`--amp --sync-bn --gradient-accumulation 2 --device 0,1,2,3` on CPU nodes took three launches
    (one refusal each): one `orch check` names --device, --amp and --sync-bn together."""
    c = make_cluster(2)
    inv = trainer_inventory(
        c,
        tmp_path,
        data=str(data),
        batch=4,
        amp=True,
        **{"sync-bn": True, "gradient-accumulation": 2, "device": "0,1,2,3"},
    )
    report = preflight(inv, skip=ONLY_JOB)
    assert ("job", "node1") in failures(report)
    detail = result(report, "job", "node1")["detail"]
    assert "the trainer refuses the arguments: 4 problems: " in detail, detail
    for said in (
        "--device 0,1,2,3 names 4 GPUs but torchrun started 1 process(es)",
        "--device 0,1,2,3 but torch sees no GPU",
        "--amp on: fp16",
        "--sync-bn needs CUDA",
    ):
        assert said in detail, detail
