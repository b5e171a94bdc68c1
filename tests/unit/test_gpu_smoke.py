"""bench/gpu_smoke.py's pure parts, and what it carries to the GPU machine (bench/gpu_wheels.py):
the run command the docs print, the package closure, the dry run's module block, the inventories it
writes, its JSON's summary rows, the parsers of what its commands print (bench/gpu_syncs.py too)."""

from __future__ import annotations

import configparser
import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from bench import gpu_smoke, gpu_wheels
from bench.gpu_smoke import (
    DRY_SIZES,
    GPU_SIZES,
    STEP_NAMES,
    arch_covers,
    child_env,
    inventory,
    junit_counts,
    parse_budgets,
    select_steps,
    summary_rows,
)
from bench.gpu_syncs import SyncRecorder, short_path
from bench.gpu_wheels import (
    CARRIED,
    DEVICE_PACKAGES,
    NOT_CARRIED,
    RUN_COMMAND,
    blocked_modules,
    closure_problems,
    norm,
    pip_download_argv,
    requirements,
)
from bench.steps import Procs, Session, StepResult

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- the run command


def test_the_run_command_fits_the_device_tool_and_the_docs_print_it_verbatim() -> None:
    assert len(RUN_COMMAND) <= 2000
    for part in (
        "--no-index --no-deps",
        "--target /tmp/site",
        ".whl/*.whl",
        "export PYTHONPATH=/tmp/site",
        "PATH=/tmp/site/bin:$PATH",
        "|| exit;",
        "python3 bench/gpu_smoke.py --out $OUT",
    ):
        assert part in RUN_COMMAND
    for doc in (gpu_smoke.__doc__, gpu_wheels.__doc__, (REPO / "bench" / "README.md").read_text()):
        assert RUN_COMMAND in str(doc)
    readme = (REPO / "bench" / "README.md").read_text()
    assert f"timeout_s: {gpu_wheels.RUN_TIMEOUT_S}" in readme and 'carry: [".whl"]' in readme
    # the script's budget, the install and a stopped step's grace fit in the call's timeout
    assert gpu_smoke.DEFAULT_BUDGET_S + 40 <= gpu_wheels.RUN_TIMEOUT_S <= 600


def test_wheels_are_ignored_by_git() -> None:
    assert "/.whl/" in (REPO / ".gitignore").read_text().split()


# ----------------------------------------------------------------------------- what travels


def requires_of_setup_cfg() -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    lines = cfg["options"]["install_requires"].split("\n") + cfg["options.extras_require"]["trainer"].split("\n")
    return {norm(re.match(r"[A-Za-z0-9._-]+", ln.strip()).group(0)) for ln in lines if ln.strip()}  # type: ignore[union-attr]


def test_every_requirement_of_orch_and_the_trainer_is_on_the_device_or_carried() -> None:
    have = {norm(n) for n in (*DEVICE_PACKAGES, *CARRIED)}
    missing = requires_of_setup_cfg() - have
    assert not missing, f"add to bench/gpu_wheels.CARRIED (or say why not in NOT_CARRIED): {missing}"


def test_the_carried_wheels_need_nothing_the_device_lacks() -> None:
    """The closure, read from the metadata of the versions installed here (the ones carried)."""
    wheels = {}
    for name in CARRIED:
        dist = metadata.distribution(name)
        meta = "\n".join(f"Requires-Dist: {r}" for r in (dist.requires or []))
        wheels[norm(name)] = requirements(meta)
    assert closure_problems(wheels) == []
    assert {"polars", "opencv-python"} <= set(wheels["ultralytics"])  # what NOT_CARRIED answers for
    assert set(NOT_CARRIED) & set(wheels["ultralytics"]) == set(NOT_CARRIED) - {"polars-runtime-32"}


def test_requirements_evaluate_markers_for_the_device_and_drop_extras() -> None:
    meta = "\n".join(
        [
            "Name: x",
            'Requires-Dist: numpy>=1.23.0; platform_system != "Darwin"',
            'Requires-Dist: numpy!=2.0.*; platform_system == "Darwin"',
            'Requires-Dist: ultralytics-platform>=0.1.45; python_version >= "3.11"',
            'Requires-Dist: inspect2; python_version < "3"',
            'Requires-Dist: pytest>=7; extra == "tests"',
            "Requires-Dist: Typing_Extensions (>=4.16)",
            "Requires-Dist: cffi>=2.0.0 ; platform_python_implementation != 'PyPy'",
        ]
    )
    assert requirements(meta) == ["numpy", "ultralytics-platform", "typing-extensions", "cffi"]
    assert requirements(meta, python="3.10") == ["numpy", "typing-extensions", "cffi"]


def test_closure_problems_name_the_wheel_and_the_missing_distribution() -> None:
    assert closure_problems({"paramiko": ["bcrypt", "cryptography", "invoke", "pynacl"]}) == []
    assert closure_problems({"ultralytics": ["numpy", "polars", "opencv-python"]}) == []  # device has / not carried
    assert closure_problems({"fabric": ["decorator", "frobnicate"]}) == [
        "fabric requires frobnicate: neither on the device nor carried (add it to CARRIED)"
    ]


def test_the_dry_run_blocks_what_the_device_lacks_and_nothing_it_has() -> None:
    packages = {
        "polars": ["polars"],
        "cv2": ["opencv-python"],
        "google": ["protobuf", "googleapis-common-protos"],
        "paramiko": ["paramiko"],
        "orchestrator": ["orch"],
        "mypy": ["mypy"],
        "yaml": ["PyYAML"],
    }
    blocked = blocked_modules(packages, (*DEVICE_PACKAGES, *CARRIED, "orch"))
    assert blocked == {"polars", "mypy"}  # cv2: the device's opencv-python-headless; google: protobuf is there


def test_the_dry_run_sitecustomize_refuses_a_blocked_import(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(gpu_wheels.SITECUSTOMIZE.format(blocked=["json", "nosuchthing"]))
    code = "import csv\ntry:\n import json\nexcept ModuleNotFoundError as e:\n print('refused', e.name, e)\n"
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("refused json ") and "the GPU machine does not have it" in p.stdout


def test_pip_download_asks_for_cp312_manylinux_wheels_only(tmp_path: Path) -> None:
    argv = pip_download_argv("python3", tmp_path, ["ntplib==0.4.0"])
    assert argv[:4] == ["python3", "-m", "pip", "download"]
    for flag in ("--no-deps", "--only-binary=:all:"):
        assert flag in argv
    assert argv[argv.index("--python-version") + 1] == "3.12" and argv[argv.index("--implementation") + 1] == "cp"
    platforms = [argv[i + 1] for i, a in enumerate(argv) if a == "--platform"]
    assert "manylinux_2_28_x86_64" in platforms and "manylinux1_x86_64" in platforms  # bcrypt; py-spy
    assert argv[-3:] == ["-d", str(tmp_path), "ntplib==0.4.0"]


# ----------------------------------------------------------------------------- the steps' pieces


@pytest.mark.parametrize(
    "capability, arch_list, runs",
    [
        ("9.0", ["sm_80", "sm_86", "sm_90"], True),
        ("9.0", ["sm_75", "sm_80", "compute_80"], True),  # PTX of an older architecture: the driver compiles it
        ("9.0", ["sm_75", "sm_80", "sm_86"], False),
        ("10.0", ["sm_90a"], False),  # architecture-specific code runs on 9.0 only
        ("12.0", ["sm_100", "sm_120"], True),
        ("8.0", [], False),
    ],
)
def test_arch_covers(capability: str, arch_list: list[str], runs: bool) -> None:
    assert arch_covers(capability, arch_list) is runs


def test_junit_counts_reads_pytests_xml() -> None:
    xml = (
        '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" errors="1" '
        'failures="1" skipped="2" tests="5" time="3.1"><testcase classname="tests.gpu.test_amp" name="test_bf16"/>'
        '<testcase classname="tests.gpu.test_amp" name="test_fp16"><failure message="x">AssertionError</failure>'
        '</testcase><testcase classname="tests.gpu.test_nccl" name="test_init"><error message="y"/></testcase>'
        '<testcase classname="tests.gpu.test_x" name="a"><skipped message="no CUDA"/></testcase>'
        '<testcase classname="tests.gpu.test_x" name="b"><skipped message="no CUDA"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert junit_counts(xml) == {
        "tests": 5,
        "failures": 1,
        "errors": 1,
        "skipped": 2,
        "failed": ["tests.gpu.test_amp::test_fp16", "tests.gpu.test_nccl::test_init"],
    }


def test_select_steps_adds_what_a_step_needs_in_the_scripts_order() -> None:
    assert [s.name for s in select_steps(None)] == list(STEP_NAMES)
    assert [s.name for s in select_steps(["ddp"])] == ["data", "environment", "ddp"]
    assert [s.name for s in select_steps(["gpu_tests", "data"])] == ["data", "environment", "gpu_tests"]
    with pytest.raises(ValueError, match="unknown step.s. nope: choose from data, environment"):
        select_steps(["nope"])


def test_the_steps_the_lease_is_for_come_first_and_fit_the_whole_budget() -> None:
    """tests/gpu, then the two-rank DDP and SyncBatchNorm runs, before any step that only measures:
    their budgets together fit the whole run's, so no other step's overrun can skip them (the GPU
    tests came last with 60 s of 720 s of budgets in a run of 420 s). No bf16 run: the cluster has
    none."""
    assert STEP_NAMES[: len(gpu_smoke.PROVES)] == gpu_smoke.PROVES
    assert {"gpu_tests", "ddp", "sync_bn"} <= set(gpu_smoke.PROVES)
    first = sum(s.budget_s for s in gpu_smoke.STEPS if s.name in gpu_smoke.PROVES)
    assert first <= gpu_smoke.DEFAULT_BUDGET_S, first
    assert GPU_SIZES.amps == ("fp16",) and "bf16" not in gpu_smoke.__doc__.split("Steps:")[1].split("(No bf16")[0]


def test_main_writes_the_json_and_the_table_of_every_step_and_says_what_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The script's plumbing without its commands (the dry run itself, 3 minutes of real training,
    is `make gpu-smoke-dry-run`): each step's ending becomes its status, budgets are the dry run's or
    the GPU's, a step whose requirement failed is skipped with why, and main writes the JSON and the
    table (printed last) and exits 1 when a step failed."""
    from bench.steps import Step, StepFailed

    def passes(ctx: Any) -> None:
        ctx.figures["summary"] = "all good"
        ctx.goal("a figure", 1.0, "report", None)

    def fails(ctx: Any) -> None:
        raise StepFailed("it broke")

    steps = (
        Step("data", "d", 11, 12, passes),
        Step("ddp", "two ranks", 21, 22, fails, ("data",)),
        Step("sync_bn", "after ddp", 31, 32, passes, ("ddp",)),
        Step("syncs", "t", 41, 42, passes, ("data",)),
    )
    monkeypatch.setattr(gpu_smoke, "STEPS", steps)
    monkeypatch.setattr(gpu_smoke, "STEP_NAMES", tuple(s.name for s in steps))
    monkeypatch.setattr(gpu_smoke, "machine", lambda: {"cpus": 2})
    monkeypatch.delenv("OUT", raising=False)
    for dry, budgets in ((True, [12, 22, 32, 42]), (False, [11, 21, 31, 41])):
        out = tmp_path / ("dry" if dry else "gpu")
        argv = ["--out", str(out), "--work", str(tmp_path / "work"), "--all-packages"] + (
            ["--cpu-dry-run"] if dry else []
        )
        assert gpu_smoke.main(argv) == 1
        doc = json.loads((out / "gpu_smoke.json").read_text())
        steps_ = {x["name"]: x for x in doc["steps"]}
        assert [x["status"] for x in doc["steps"]] == ["pass", "fail", "skip", "pass"]
        assert [x["budget_s"] for x in doc["steps"]] == budgets
        assert steps_["ddp"]["error"] == "it broke" and "ddp" in steps_["sync_bn"]["reason"]
        assert doc["mode"] == ("cpu-dry-run" if dry else "gpu") and doc["ok"] is False
        assert doc["counts"]["fail"] == 1 and doc["counts"]["pass"] == 2
        table = (out / "gpu_smoke.txt").read_text().rstrip("\n")
        printed = capsys.readouterr().out.rstrip("\n")
        assert doc["proved"] == {
            "proved": ["data: d"],
            "not_proved": [
                "environment: not run",
                "gpu_tests: not run",
                "ddp: fail: it broke",
                "sync_bn: skip: needs ddp, which did not pass",
            ],
        }
        said = "\nproved: data: d\nnot proved: " + "; ".join(doc["proved"]["not_proved"])
        assert printed.endswith(table + said + f"\nJSON: {out / 'gpu_smoke.json'}")  # the table, what it proved
        assert any(ln.startswith("ddp ") and " fail " in ln and "it broke" in ln for ln in table.splitlines())


def test_parse_budgets() -> None:
    assert parse_budgets(["trainer=240", "syncs=1.5"]) == {"trainer": 240.0, "syncs": 1.5}
    for bad, why in (
        ("trainer", "expected NAME=SECONDS"),
        ("nope=3", "expected NAME=SECONDS"),
        ("trainer=fast", "is not a number"),
        ("trainer=-1", "cannot be negative"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_budgets([bad])


def test_child_env_puts_the_repo_first_and_a_target_installs_py_spy_on_path(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "bin").mkdir(parents=True)
    (site / "bin" / "py-spy").write_text("")
    base = {"PYTHONPATH": f"{site}:/other", "PATH": "/usr/bin:/bin", "HOME": "/root"}
    env = child_env(base, REPO, "/opt/venv/bin/python3", extra_front=["/tmp/block"])
    assert env["PYTHONPATH"].split(":") == ["/tmp/block", str(REPO), str(site), "/other"]
    assert env["PATH"].split(":") == [str(site / "bin"), "/opt/venv/bin", "/usr/bin", "/bin"]
    assert env["YOLO_OFFLINE"] == "1" and env["PYTHONUNBUFFERED"] == "1" and env["HOME"] == "/root"


def make_session(tmp_path: Path, dry: bool) -> Session:
    s = Session(
        dry=dry,
        settings=DRY_SIZES if dry else GPU_SIZES,
        work=tmp_path,
        env={"PYTHONPATH": str(REPO)},
        procs=Procs(),
        python="/opt/venv/bin/python3",
        cwd=REPO,
    )
    s.facts["det"] = tmp_path / "data" / "det" / "data.yaml"
    return s


@pytest.mark.parametrize("dry", [False, True])
def test_the_inventories_it_writes_are_orchs_own(tmp_path: Path, dry: bool) -> None:
    import yaml

    from orchestrator.config.inventory import parse

    s = make_session(tmp_path, dry)
    args = gpu_smoke.trainer_job_args(s, epochs=1, project=tmp_path / "runs")
    doc = inventory(s, "gpu-smoke", not dry, args, 29555, fabric={"max_bytes": "4M"} if dry else None)
    inv = parse(yaml.safe_dump(doc), str(tmp_path / "inv.yaml"))
    node = inv.nodes[0]
    assert inv.transport == "local" and len(inv.nodes) == 1 and node.nproc_per_node == 1
    assert (node.gpus or 0) == (0 if dry else 1)
    assert inv.job.module == "trainer" and inv.job.python == "/opt/venv/bin/python3"
    argv = " ".join(inv.job.args)
    assert "--device cpu" in argv if dry else ("--device auto" in argv and "--amp fp16" in argv)
    assert f"--data {tmp_path / 'data' / 'det' / 'data.yaml'}" in argv and "--epochs 1" in argv
    assert inv.env["PYTHONPATH"] == str(REPO)
    if dry:
        assert inv.env["GLOO_SOCKET_IFNAME"] == "lo" and inv.checks.fabric.max_bytes == 4 << 20


def trainer_step(ips: float, peer: float, logged: float, val: float) -> StepResult:
    runs: dict[str, Any] = {
        "trainer-fp16": {"ips": ips, "ratio": ips / peer},
        "ultralytics": {"ips": peer},
        "trainer-bf16": {"ips": ips * 1.1, "ratio": ips * 1.1 / peer},
    }
    return StepResult(
        "trainer",
        "t",
        "pass",
        figures={
            "model": "yolo12n.yaml",
            "imgsz": 320,
            "batch": 64,
            "compared": "fp16",
            "runs": runs,
            "map": {"logged": logged, "val": val, "difference": abs(logged - val)},
        },
    )


def test_summary_rows_are_bench_summarys_shape_and_judge_fp16_only() -> None:
    rows = summary_rows([trainer_step(410.0, 400.0, 0.512, 0.5135)], {"gpus": [{"name": "NVIDIA H200"}]})
    assert [set(r) for r in rows] == [{"what", "orch", "peer", "ratio", "goal", "met"}] * 3
    fp16, bf16, m = rows
    assert (
        "1 x NVIDIA H200 --amp fp16" in fp16["what"] and fp16["ratio"] == pytest.approx(1.025) and fp16["met"] is True
    )
    assert bf16["goal"] == "report" and bf16["met"] is None
    assert m["goal"] == "|difference| <= 0.002" and m["met"] is True
    slow = summary_rows([trainer_step(300.0, 400.0, 0.5, 0.51)], {})
    assert slow[0]["met"] is False and slow[2]["met"] is False and "1 x GPU" in slow[0]["what"]
    assert summary_rows([StepResult("trainer", "t", "fail")], {}) == []


def test_the_bytes_row_is_fp16_against_fp32_from_the_sync_bn_step() -> None:
    sync_bn = StepResult(
        "sync_bn", "s", "pass", figures={"grad_comm": {"bytes_per_step": 10_274_468.0}, "bytes_ratio": 0.5}
    )
    (row,) = summary_rows([sync_bn], {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}]})
    assert row["orch"] == 5_137_234.0 and row["peer"] == 10_274_468.0 and row["met"] is True
    assert "fp16 vs fp32, 2 ranks on 1 x NVIDIA H100 80GB HBM3" in row["what"]


def test_the_dry_run_writes_no_summary_rows(tmp_path: Path) -> None:
    s = make_session(tmp_path, dry=True)
    doc = gpu_smoke.document([trainer_step(1.0, 2.0, 0.0, 0.0)], s, 0.0, 3.0, 1800.0, {"cpus": 2})
    assert doc["mode"] == "cpu-dry-run" and doc["summary"] == [] and doc["ok"] is True
    assert doc["sizes"]["device"] == "cpu" and doc["steps"][0]["name"] == "trainer"
    assert set(doc) >= {"benchmark", "schema", "counts", "started", "wall_s", "budget_s", "machine", "versions"}


# ----------------------------------------------------------------------------- gpu_syncs


def test_sync_recorder_counts_sync_warnings_per_site_and_micro_step() -> None:
    r = SyncRecorder()
    file = str(REPO / "trainer" / "loop.py")
    r.warning(UserWarning("an unrelated warning"), UserWarning, file, 3)
    r.micro_steps = 1
    r.warning(UserWarning("called a synchronizing CUDA operation"), UserWarning, file, 561)
    r.warning(
        UserWarning("called a synchronizing CUDA operation"),
        UserWarning,
        "/opt/venv/lib/python3.12/site-packages/torch/amp/grad_scaler.py",
        380,
    )
    r.micro_steps = 2
    r.warning(UserWarning("called a synchronizing CUDA operation"), UserWarning, file, 561)
    rep = r.report(cuda=True, exit_code=0)
    assert rep["syncs"] == 3 and rep["micro_steps"] == 2 and rep["per_micro_step"] == 1.5
    assert rep["per_step"] == [0, 2, 1]
    assert rep["sites"][0]["site"] == "trainer/loop.py:561" and rep["sites"][0]["count"] == 2
    assert rep["sites"][1]["site"] == "torch/amp/grad_scaler.py:380"
    assert SyncRecorder().report(cuda=False, exit_code=None)["per_micro_step"] is None


def test_short_path() -> None:
    assert short_path("/x/lib/python3.12/site-packages/ultralytics/utils/loss.py") == "ultralytics/utils/loss.py"
    assert short_path(str(REPO / "trainer" / "loop.py")) == "trainer/loop.py"
    assert short_path("<frozen importlib._bootstrap>") == "<frozen importlib._bootstrap>"
