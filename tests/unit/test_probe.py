"""The node probe and the parsers of what real tools print (recorded output in tests/fixtures/probe)."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
import zlib
from pathlib import Path

import pytest

from orchestrator.node import probe
from orchestrator.preflight import facts, parsers

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "probe"


def test_probe_command_carries_the_probe_source() -> None:
    import importlib.util
    import marshal

    argv = facts.probe_command("/opt/py/bin/python", {"mode": "facts", "node": "n1"})
    assert argv[0] == "/opt/py/bin/python" and argv[1] == "-c"
    code_blob = re.search(r"marshal\.loads\(zlib\.decompress\(b\.b64decode\('([^']+)'", argv[2]).group(1)  # type: ignore[union-attr]
    # the probe rides with `trust` (the agent's rule for a run directory, judged on job.run_root)
    (trust_blob, src_blob) = re.findall(r"'([^']+)'", argv[2].split("zip(N,(")[1].split(")")[0])
    assert zlib.decompress(base64.b64decode(src_blob)) == Path(probe.__file__).read_bytes()
    assert zlib.decompress(base64.b64decode(trust_blob)) == (Path(probe.__file__).parent / "trust.py").read_bytes()
    # the bytecode rides along for a Python with this one's magic number, the source for any other
    (_trust, code) = marshal.loads(zlib.decompress(base64.b64decode(code_blob)))
    assert code.co_filename == "orch-probe" and "facts_mode" in code.co_names
    assert repr(importlib.util.MAGIC_NUMBER) in argv[2]
    assert '"node": "n1"' in argv[3]


PY38 = Path("/root/.pyenv/versions/3.8.18/bin/python")


@pytest.mark.parametrize("python", ["this", "3.8"])
def test_probe_session_over_stdin(python: str) -> None:
    """The probe as the controller runs it (bytecode path on this Python, source path on 3.8):
    facts, then a ping answered with its clock, then stdin EOF ends it. No listeners, no network."""
    import json
    import subprocess
    import sys
    import time

    exe = sys.executable if python == "this" else str(PY38)
    if python == "3.8" and not PY38.exists():
        pytest.skip("no Python 3.8 on this machine")
    args = {"mode": "facts", "node": "n1", "token": "t", "want": ["ssh", "clock", "timezone"], "serve_s": 30}
    t1 = time.time()
    proc = subprocess.run(facts.probe_command(exe, args), input=b"PING 7\nPING 8\n", capture_output=True, timeout=60)
    t2 = time.time()
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.decode().splitlines() if line.startswith("ORCH-F"))
    facts_ = json.loads(lines["ORCH-FACTS"])
    assert facts_["python"]["executable"] == exe and facts_["tz"]["utcoffset"]
    pongs = [
        json.loads(line.split(" ", 1)[1]) for line in proc.stdout.decode().splitlines() if line.startswith("ORCH-TIME ")
    ]
    assert [p["seq"] for p in pongs] == ["7", "8"]
    assert all(t1 <= p["time"] <= t2 for p in pongs)
    assert t2 - t1 < 20, "stdin EOF must end the probe, not its 30 s deadline"


def test_a100_query_csv_dedupes_samples_by_bus_id() -> None:
    gpus = parsers.parse_gpu_query_csv((FIX / "a100-csv" / "nvidia-smi-query-gpu.csv").read_text())
    assert [g.bus_id for g in gpus] == ["00000000:0B:00.0", "00000000:3B:00.0", "00000000:8B:00.0"]
    assert {g.name for g in gpus} == {"NVIDIA A100-SXM4-40GB"}
    assert {g.driver for g in gpus} == {"545.23.08"}
    # the last sample of each GPU wins: 0B was last seen at 11:27:15 with 38803 MiB used
    assert gpus[0].memory_used_mib == 38803 and gpus[0].memory_total_mib == 40960
    assert gpus[2].memory_used_mib == 39671


def test_v100_table_gpus_driver_cuda_and_processes() -> None:
    driver, cuda, gpus, procs = parsers.parse_nvidia_smi_table((FIX / "v100" / "nvidia-smi.txt").read_text())
    assert (driver, cuda) == ("535.129.03", "12.2")
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[0].name == "Tesla V100-SXM2-16GB" and gpus[0].bus_id == "00000000:00:17.0"
    assert gpus[0].memory_used_mib == 3087 and gpus[0].memory_total_mib == 16384 and gpus[0].util_pct == 100
    assert len(procs) == 8 and procs[0].pid == 1552275 and procs[0].name == "/usr/bin/python3"


@pytest.mark.parametrize(
    "name,count,driver,cuda,model",
    [
        ("nvidia-smi_table_8xH100-80GB-HBM3_550.90.07_gpud.txt", 8, "550.90.07", "12.4", "NVIDIA H100 80GB HBM3"),
        ("nvidia-smi_table_1gpu_ERR_525.125.06_gpud.txt", 1, "525.125.06", "12.0", "NVIDIA GeForce ..."),
    ],
)
def test_other_real_tables(name: str, count: int, driver: str, cuda: str, model: str) -> None:
    d, c, gpus, procs = parsers.parse_nvidia_smi_table((FIX / "tables" / name).read_text())
    assert (d, c, len(gpus), procs) == (driver, cuda, count, [])
    assert gpus[0].name == model


def test_derived_missing_gpu_has_seven() -> None:
    _, _, gpus, procs = parsers.parse_nvidia_smi_table((FIX / "v100-missing-gpu" / "nvidia-smi.txt").read_text())
    assert len(gpus) == 7 and len(procs) == 7


def test_probe_reads_fixture_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_PROBE_FIXTURES", str(FIX / "v100"))
    g = parsers.parse_gpus(probe.gather_gpus())
    assert len(g.gpus) == 8 and g.driver == "535.129.03" and g.cuda == "12.2" and "fixture" in g.source
    ib = parsers.parse_ib(probe.gather_ib())
    assert set(ib) >= {"mlx5_0", "mlx5_bond_0"}
    port = ib["mlx5_0"].ports[0]
    assert port.active and port.rate == "400 Gb/sec (4X NDR)" and port.link_layer == "InfiniBand"
    assert ib["mlx5_bond_0"].ports[0].link_layer == "Ethernet"


def test_probe_fixture_port_down_and_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_PROBE_FIXTURES", str(FIX / "mlx5-port-down"))
    ib = parsers.parse_ib(probe.gather_ib())
    assert not ib["mlx5_0"].ports[0].active and ib["mlx5_1"].ports[0].active
    monkeypatch.setenv("ORCH_PROBE_FIXTURES", str(FIX / "mlx5-missing"))
    assert "mlx5_0" not in parsers.parse_ib(probe.gather_ib())


def test_absent_tools_are_facts_not_crashes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ORCH_PROBE_FIXTURES", str(tmp_path))  # an empty set: no nvidia-smi, no HCAs
    g = parsers.parse_gpus(probe.gather_gpus())
    assert g.gpus == () and g.error and "not found" in g.error
    assert probe.gather_ib()["devices"] == {}
    monkeypatch.setenv("PATH", str(tmp_path))
    assert probe.run_tool(["nvidia-smi"])["rc"] is None


def test_the_probe_asks_for_compute_cap_and_falls_back_on_an_nvidia_smi_without_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A stand-in nvidia-smi that, like one older than R510, refuses the `compute_cap` field: the
    probe asks again without the fields it added and still gets the GPUs (their capability unknown)."""
    recorded = (FIX / "a100-csv" / "nvidia-smi-query-gpu.csv").read_text()
    header = ", ".join(probe.GPU_QUERY.split(","))
    tool = tmp_path / "nvidia-smi"
    tool.write_text(
        "#!/bin/sh\n"
        'case "$*" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to query.\'; exit 2;; esac\n'
        'case "$*" in *--query-gpu*) cat "$(dirname "$0")/query.csv"; exit 0;; esac\n'
        "exit 0\n"
    )
    tool.chmod(0o755)
    (tmp_path / "query.csv").write_text(header + "\n" + recorded)
    monkeypatch.delenv("ORCH_PROBE_FIXTURES", raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    got = probe.gather_gpus()
    assert got["query"]["rc"] == 0
    g = parsers.parse_gpus(got)
    assert len(g.gpus) == 3 and {x.compute_cap for x in g.gpus} == {None} and g.driver == "545.23.08"
    # the recorded V100 set has the query as the probe asks for it (with its header): capability 7.0
    monkeypatch.setenv("ORCH_PROBE_FIXTURES", str(FIX / "v100"))
    g = parsers.parse_gpus(probe.gather_gpus())
    assert [(x.index, x.compute_cap) for x in g.gpus] == [(i, (7, 0)) for i in range(8)]
    assert g.gpus[3].uuid == "GPU-00000000-0000-0000-0000-000000000003" and g.cuda == "12.2"


def test_the_jobs_own_check_runs_with_its_workdir_and_environment(tmp_path: Path) -> None:
    import json
    import sys

    from orchestrator.node import script

    (tmp_path / "mytrain.py").write_text("")
    req = {
        "kind": "module",
        "inner": ["-c", script("findmodule"), "mytrain"],
        "cwd": str(tmp_path),
        "env": {"RANK": "0"},
        "timeout": 60,
    }
    python = [sys.executable]
    got = probe.gather_job_check({"job_python": python, "job_check": req})
    assert got is not None and got["rc"] == 0, got
    assert json.loads(got["out"]) == {"module": "mytrain", "found": True, "origin": str(tmp_path / "mytrain.py")}
    gone = probe.gather_job_check({"job_python": python, "job_check": {**req, "cwd": str(tmp_path / "nope")}})
    assert gone == {"kind": "module", "error": f"not run: workdir {tmp_path / 'nope'} is not a directory here"}
    slow = probe.gather_job_check(
        {"job_python": python, "job_check": {**req, "inner": ["-c", "import time; time.sleep(30)"], "timeout": 1}}
    )
    assert slow is not None and slow["rc"] is None and slow["error"] == "no answer within 1 s"
    assert probe.gather_job_check({}) is None


def test_one_run_of_the_jobs_container_answers_every_question_inside(tmp_path: Path) -> None:
    """`in_image`: the output folders and the job's own check from one run of the job's
    interpreter (a container's, here this python), each question in a child of its own; only the
    check sees the check's environment."""
    import json
    import sys

    out = tmp_path / "runs"
    args = {
        "job_python": [sys.executable],
        "software": False,
        "outputs_inside": True,
        "in_container": {"project": str(out), "weights": str(tmp_path / "w.pt"), "data": str(tmp_path)},
        "inside_only": ["weights", "data"],  # the job's inputs in the image's own files
        "outputs": ["project"],
        "job_check": {
            "kind": "module",
            "inner": ["-c", "import os, json; print(json.dumps({'found': True, 'origin': os.environ['RANK']}))"],
            "cwd": str(tmp_path),
            "env": {"RANK": "3"},
            "timeout": 60,
        },
    }
    got = probe.gather_in_image(args)
    assert got["outputs_inside"] == {"paths": {"project": {"checked": str(tmp_path), "writable": True}}}
    assert got["job_check"]["rc"] == 0 and json.loads(got["job_check"]["out"]) == {"found": True, "origin": "3"}
    inside = got["paths_inside"]["paths"]
    assert (inside["weights"]["exists"], inside["data"]["is_dir"]) == (False, True), inside
    tasks = {
        "fact": {"argv": ["-c", "import os; print(os.environ.get('RANK'))"], "timeout": 30},
        "check": {"argv": ["-c", "import os; print(os.environ.get('RANK'))"], "timeout": 30, "check": True},
    }
    ran = subprocess.run(
        [sys.executable, "-c", probe.IN_IMAGE_CODE, json.dumps({"tasks": tasks, "check_env": ["RANK"]})],
        capture_output=True,
        text=True,
        env={**os.environ, "RANK": "3"},
    )
    answers = json.loads(ran.stdout.split("ORCH-IN-IMAGE ", 1)[1])
    assert (answers["fact"]["out"], answers["check"]["out"]) == ("None\n", "3\n")


def test_a_container_that_does_not_start_answers_every_question_with_what_the_runtime_said(tmp_path: Path) -> None:
    said = "Error: unresolvable CDI devices nvidia.com/gpu=0"
    args = {
        "job_python": ["/bin/sh", "-c", f"echo '{said}' >&2; exit 126"],
        "torch_cuda": True,
        "outputs_inside": True,
        "paths": {},
        "outputs": [],
        "job_check": {"kind": "trainer", "inner": ["-m", "trainer", "--check"], "env": {}, "timeout": 60},
    }
    got = probe.gather_in_image(args)
    assert got["software"]["error"] == f"version probe failed: {said}\n"
    assert got["torch_cuda"] == {"error": f"python could not tell torch's CUDA build: {said}"}
    assert got["outputs_inside"] == {"error": f"could not look inside the container: {said}"}
    assert (got["job_check"]["rc"], got["job_check"]["err"]) == (126, said + "\n")
    assert got["container_start"] == {"rc": 126, "out": "", "err": said + "\n"}  # the container row's words


def test_file_facts_hash_and_text(tmp_path: Path) -> None:
    f = tmp_path / "data.yaml"
    f.write_text("names: {0: a}\n")
    got = probe.file_facts(str(f), True)
    assert got["exists"] and got["is_file"] and got["size"] == 14 and got["text"] == "names: {0: a}"
    assert got["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
    missing = probe.file_facts(str(tmp_path / "nope"), True)
    assert missing["exists"] is False and "sha256" not in missing


def test_probe_sees_interfaces_and_zone() -> None:
    ifaces = probe.gather_ifaces()
    lo = next(i for i in ifaces if i["name"] == "lo")
    assert lo["up"] and lo["ipv4"] == ["127.0.0.1"]
    tz = probe.gather_tz()
    assert set(tz) == {"TZ", "localtime", "etc_timezone", "abbr", "utcoffset"}


def test_sysfs_words() -> None:
    port = parsers.IbPort("1", "4: ACTIVE", "5: LinkUp", "100 Gb/sec (4X EDR)", "InfiniBand")
    assert port.active
    assert not parsers.IbPort("1", "4: ACTIVE", "3: Disabled", None, None).active
    assert not parsers.IbPort("1", None, None, None, None).active


@pytest.mark.parametrize(
    "name,offset_ms,leap,local",
    [
        ("chronyc_tracking_large-offset_omnios-2576.txt", -7810.536861, "Normal", False),
        ("chronyc_tracking_local-refid-7F7F0101_no-leap-line_omicron-5192.txt", 120.790944, None, True),
        ("chronyc_tracking_synced_fast_scale-network-121.txt", 0.260112, "Normal", False),
        ("chronyc_tracking_synced_openSUSE_rockstor-2098.txt", -0.052616, "Normal", False),
        ("chronyc_tracking_synced_pingcap-docs.txt", -0.022151, "Normal", False),
    ],
)
def test_chronyc_tracking(name: str, offset_ms: float, leap: str | None, local: bool) -> None:
    ch = parsers.parse_chrony_tracking((FIX / "chrony" / name).read_text())
    assert ch is not None
    assert ch.system_offset_ms == pytest.approx(offset_ms)
    assert ch.leap_status == leap and ch.local_reference is local
    assert parsers.parse_chrony_tracking("506 Cannot talk to daemon") is None


def test_roce_gid_index(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    port = tmp_path / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "gid_attrs" / "types").mkdir(parents=True)
    (port / "gids").mkdir()
    (port / "link_layer").write_text("Ethernet\n")
    for i, (kind, gid) in enumerate(
        [
            ("IB/RoCE v1", "fe80:0000:0000:0000:0000:0000:0000:0001"),
            ("RoCE v2", "0000:0000:0000:0000:0000:0000:0000:0000"),
            ("RoCE v2", "0000:0000:0000:0000:0000:ffff:0a00:0001"),
        ]
    ):
        (port / "gid_attrs" / "types" / str(i)).write_text(kind + "\n")
        (port / "gids" / str(i)).write_text(gid + "\n")
    monkeypatch.setenv("ORCH_PROBE_FIXTURES", str(tmp_path))
    assert probe.roce_gid_index("mlx5_0") == "2"  # index 1 is v2 but all zeros
    assert probe.verbs_argv("ibv_rc_pingpong", "mlx5_0", 18515, "10.0.0.2") == [
        "ibv_rc_pingpong",
        "-d",
        "mlx5_0",
        "-p",
        "18515",
        "-g",
        "2",
        "10.0.0.2",
    ]
    (port / "link_layer").write_text("InfiniBand\n")
    assert probe.roce_gid_index("mlx5_0") is None


def test_dist_versions_reads_dist_info_in_path_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for base, name, version in (
        (first, "nvidia_nccl_cu12-2.21.5.dist-info", "2.21.5"),
        (second, "nvidia_nccl_cu13-2.30.7.dist-info", "2.30.7"),
        (second, "Ultralytics-8.3.1.dist-info", "8.3.1"),
    ):
        (base / name).mkdir(parents=True)
        (base / name / "METADATA").write_text(f"Metadata-Version: 2.1\nName: x\nVersion: {version}\n\nbody\n")
    (first / "torch-2.0.dist-info").mkdir()  # no METADATA: skipped, not a crash
    monkeypatch.setattr(probe.sys, "path", [str(tmp_path / "missing"), str(first), str(second)])
    got = probe.dist_versions(("ultralytics", "torch", "absent"), ("nvidia-nccl",))
    assert got == {"nvidia-nccl": "2.21.5", "ultralytics": "8.3.1"}


def test_software_without_torch_falls_back_to_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert probe.software_from_files() is None


def test_the_data_yamls_splits_are_read_without_a_yaml_library() -> None:
    text = (
        "# comment\npath: ../datasets/coco  # root\ntrain: images/train2017\nval: [images/val, 'images/extra val']\n"
        'test:\n  - a.txt\n  - "b"\nnames:\n  0: person\ndownload: |\n  train: not/this\n'
    )
    assert probe.data_splits(text) == {
        "path": "../datasets/coco",
        "train": "images/train2017",
        "val": ["images/val", "images/extra val"],
        "test": ["a.txt", "b"],
    }
    assert probe.data_splits("train: null\nval: ~\n") == {}


def test_what_a_data_yaml_lists_is_counted_sized_and_sampled(tmp_path: Path) -> None:
    from trainer.synth import write_dataset

    yaml_path = write_dataset(tmp_path / "d", images=12, classes=2, imgsz=32)
    text = yaml_path.read_text()
    got = probe.dataset_facts(str(yaml_path), text)
    assert set(got) == {"train", "val", "train labels", "val labels"}
    train = got["train"]
    assert train["path"] == str(tmp_path / "d" / "images" / "train") and train["files"] == 9 and not train["capped"]
    assert train["bytes"] == sum(f.stat().st_size for f in (tmp_path / "d" / "images" / "train").iterdir())
    assert got["train labels"]["files"] == 9 and got["val"]["files"] == 3
    assert probe.dataset_facts(str(yaml_path), text) == got  # deterministic: nodes with the same files agree

    images = sorted((tmp_path / "d" / "images" / "train").iterdir())
    last = images[-1]
    data = last.read_bytes()
    last.write_bytes(bytes([data[0] ^ 1]) + data[1:])  # same name, same size, other bytes (a sampled file)
    changed = probe.dataset_facts(str(yaml_path), text)["train"]
    assert (changed["files"], changed["bytes"], changed["listing"]) == (9, train["bytes"], train["listing"])
    assert changed["sample"] != train["sample"]
    images[0].unlink()
    fewer = probe.dataset_facts(str(yaml_path), text)["train"]
    assert fewer["files"] == 8 and fewer["listing"] != train["listing"]

    listed = tmp_path / "d" / "train.txt"  # a split given as a list of images, ./ relative to the list
    listed.write_text("".join(f"./images/train/{p.name}\n" for p in images[1:]))
    as_list = probe.dataset_facts(str(yaml_path), text.replace("train: images/train", "train: train.txt"))
    assert as_list["train"]["files"] == 8 and as_list["train"]["bytes"] == fewer["bytes"]
    missing = probe.dataset_facts(str(yaml_path), text.replace("train: images/train", "train: images/nope"))
    assert "does not exist" in missing["train"]["error"]


def test_a_listing_past_its_budget_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.synth import write_dataset

    yaml_path = write_dataset(tmp_path / "d", images=12, classes=2, imgsz=32)
    monkeypatch.setattr(probe, "LIST_BUDGET_S", -1.0)
    got = probe.dataset_facts(str(yaml_path), yaml_path.read_text())
    assert "listing stopped after 0 files" in got["train"]["error"]
    monkeypatch.setattr(probe, "LIST_BUDGET_S", 60.0)
    monkeypatch.setattr(probe, "LIST_MAX_FILES", 4)
    capped = probe.dataset_facts(str(yaml_path), yaml_path.read_text())["train"]
    assert capped["files"] == 4 and capped["capped"] and "error" not in capped


def test_a_link_back_up_the_dataset_is_walked_once(tmp_path: Path) -> None:
    split = tmp_path / "images" / "train"
    (split / "sub").mkdir(parents=True)
    (split / "a.jpg").write_bytes(b"a")
    (split / "sub" / "b.jpg").write_bytes(b"bb")
    (split / "sub" / "loop").symlink_to(split)  # a cycle: the walk must end, each folder once
    (tmp_path / "data.yaml").write_text("train: images/train\n")
    got = probe.dataset_facts(str(tmp_path / "data.yaml"), "train: images/train\n")["train"]
    assert (got["files"], got["bytes"]) == (2, 3) and "error" not in got
