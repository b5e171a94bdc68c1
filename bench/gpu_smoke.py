"""One-shot GPU validation: every GPU path of orch and the trainer run once on a real GPU, measured.

Each step is timed against its own budget and becomes a row of the table printed last; a step that
overruns is stopped (its process group: SIGTERM, then SIGKILL) and recorded as ``timeout``, and
the others still run; the whole script stops starting steps at ``--budget-s`` (420 s: with the
install and the machine's start, one run fits in 10 minutes). The steps the lease exists for come
first (``PROVES``: their budgets together fit the whole run's); a later step the whole budget cuts
is recorded as skipped, with why. Steps:

 0. data: synthetic YOLO data (``python -m trainer.synth``): detection and polygon (seg) sets.
 1. environment: python, torch, CUDA, cuDNN, NCCL, driver, the build's arch list, each GPU's name
    and compute capability, one kernel run; then ``orch check --json`` of a one-node
    ``transport: local`` inventory declaring ``gpus: 1``: every check's row is reported, the step
    passes when none fails and ``gpus`` and ``software`` ran (they parse the real ``nvidia-smi``).
 2. gpu_tests: ``pytest -m gpu tests/gpu``: counts, and each failure named (fp16 autocast and its
    GradScaler, the NaN guard, channels_last, exact resume on CUDA, a one-rank NCCL group and the
    fabric job over NCCL, the real nvidia-smi, SyncBatchNorm's timing with CUDA events...).
 3. ddp: two ranks on the one GPU, over gloo (``--dist-backend gloo``: NCCL refuses two ranks on one
    device): DDP, the fp16 GradScaler with no_sync accumulation (``--accumulate 2``), the EMA buffer
    broadcast and sharded validation every epoch, fp16 gradient all-reduces (``--ddp-grad-dtype
    fp16``, their bytes counted in the hook); the ranks end with the same weights. The first
    multi-rank GPU execution of the trainer before a cluster's.
 4. sync_bn: the same two ranks with ``--sync-bn`` (SyncBatchNorm's all-gathers over gloo, timed
    apart: ``sync_s`` on the timing lines; last.pt holds plain BatchNorm) and fp32 all-reduces
    counted: goal, fp16's bytes per step are half of fp32's.
 5. trainer: ``python -m trainer --amp fp16`` against ultralytics' ``YOLO().train(device=0,
    amp=True)``, yolo12n on the same data, images/s from each run's results.csv
    (``bench/trainer_throughput.py``'s measure: every epoch but the first and the last); goal:
    ratio >= 1.0. The final mAP50-95 the trainer logs for best.pt against ``YOLO(best.pt).val()``
    (``bench/trainer_accuracy.py``'s evaluator); goal: within 0.002. (No bf16 run: the V100
    cluster has none.)
 6. syncs: host syncs per micro-step under ``torch.cuda.set_sync_debug_mode("warn")``, with the
    line of each (``bench/gpu_syncs.py``).
 7. orch_up: ``orch up`` of the one-node inventory, one epoch: ``succeeded``; ``orch stacks``
    during the run returns the rank's stack.
 8. fabric: ``orch check --only fabric``: the all_reduce job with NCCL on that node, its
    ``NCCL_DEBUG=INFO`` lines parsed (version, network, transports found).
 9. yoloe: yoloe-11s-seg built from its YAML (no checkpoint is carried: random initial weights),
    random 512-d text embeddings for the data's names, ``--prompt-mode full``, one epoch.
10. scaling: not run on one GPU: a row that says so.

``--cpu-dry-run`` runs the same steps on this CPU machine, tiny sizes, fp32, gloo, the GPU-only
parts skipped with the reason (each step lists them under ``skipped``), with the GPU's
``nvidia-smi`` replaced by a recorded one (``tests/fixtures/probe/h100-capture``) for step 1, and with
every Python module the GPU machine would lack made unimportable in the children (its package
list plus the carried wheels, below): the plumbing (steps, budgets, JSON, table, error capture)
and the package closure are proven here before any device time is spent (``make
gpu-smoke-dry-run``: tests/integration/test_gpu_smoke_dry_run.py, outside ``make test``).

Writes under ``--out`` (default ``$OUT``): ``gpu_smoke.json`` (every figure, every step's status,
error and skipped parts, versions; rewritten after each step), ``gpu_smoke.txt`` (the table) and
``gpu_smoke_logs.tar.gz`` (each command's output; at most 8 files come back from the device).

On the GPU machine (``python3`` there is 3.12 with torch 2.11.0+cu130, torchvision, numpy, rich,
click, pyyaml, psutil, tensorboard, opencv-python-headless, matplotlib; no ultralytics, paramiko,
fabric, invoke, ClusterShell, pydantic, ntplib, py-spy), first, here: ``make gpu-wheels``
(``bench/gpu_wheels.py``: those wheels and their own requirements for cp312 manylinux x86_64, at
the versions installed here, into the ignored ``.whl/``, 14 MiB; polars is left out, see its
``NOT_CARRIED``), then one ``run`` call with ``carry: [".whl"]`` and
``timeout_s: 480``, whose command is (``--print-run-command`` prints it)::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 || exit; python3 bench/gpu_smoke.py --out $OUT

Usage: ``python bench/gpu_smoke.py [--out DIR] [--cpu-dry-run] [--steps a,b] [--budget-s S]
[--step-budget NAME=S] [--gpu-tests PATH] [--work DIR --keep-work]``; exit 0 when no step failed
or timed out, 1 otherwise, 2 bad usage. The step runner is ``bench/steps.py``.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0] or ".").resolve() == REPO / "bench":
    sys.path.pop(0)  # run as bench/gpu_smoke.py: bench/fabric.py must not stand for the Fabric library
sys.path.insert(0, str(REPO))

from bench.gpu_wheels import RUN_COMMAND, RUN_TIMEOUT_S, WHEEL_DIR, device_site, fetch_wheels  # noqa: E402
from bench.steps import (  # noqa: E402
    Procs,
    Session,
    Step,
    StepContext,
    StepFailed,
    StepResult,
    StepSkipped,
    StepTimeout,
    counts,
    output_names,
    run_steps,
    stop_strays,
    table,
    write_outputs,
)
from bench.trainer_accuracy import evaluate_argv, parse_evaluation  # noqa: E402
from bench.trainer_throughput import PEER_NOTE, middle_ips, trainer_argv, ultralytics_argv  # noqa: E402
from tests.ports import job_port  # noqa: E402

NAME = "gpu_smoke"
SCHEMA = 1
DEFAULT_BUDGET_S = 420.0
"""The whole script on the GPU machine: 7 minutes, so that a second run fits in the lease."""
DRY_BUDGET_S = 1800.0
"""The dry run on a 2-core machine shared with other work."""
DRY_FIXTURE = REPO / "tests" / "fixtures" / "probe" / "h100-capture"
"""Recorded nvidia-smi output step 1 reads in the dry run (1 x H100 80GB, driver 590.48.01: this torch has kernels for it
and its CUDA 13 runtime this driver; the V100 recording would fail the gpus check, rightly)."""
EMBED_DIM = 512
"""Width of YOLOE's raw text embeddings (mobileclip:blt), which its head projects."""

# ----------------------------------------------------------------------------- what the steps train on


@dataclass(frozen=True)
class Sizes:
    """What the steps train on: the GPU run's figures, or the dry run's tiny ones."""

    model: str = "yolo12n.yaml"
    images: int = 512
    imgsz: int = 320
    epochs: int = 4
    """>= 3: the first and the last epoch are not measured (start-up; ultralytics' final validation)."""
    batch: int = 64
    workers: int = 8
    seg_images: int = 128
    seg_batch: int = 32
    yoloe_model: str = "yoloe-11s-seg.yaml"
    device: str = "0"
    amps: tuple[str, ...] = ("fp16",)
    """The trainer's --amp modes measured; the first is compared with ultralytics' amp=True (fp16 only:
    the V100 cluster has no bf16, and the trainer refuses it there)."""
    ddp_batch: int = 8
    """The two-rank steps' global batch (4 images per rank), accumulated over 2 micro-steps."""
    ddp_epochs: int = 2


GPU_SIZES = Sizes()
DRY_SIZES = Sizes(
    images=16,
    imgsz=64,
    epochs=3,
    batch=4,
    workers=0,
    seg_images=8,
    seg_batch=4,
    device="cpu",
    amps=("off",),
    ddp_batch=4,
    ddp_epochs=1,
)


# ----------------------------------------------------------------------------- environment for the children


def child_env(base: Mapping[str, str], repo: Path, python: str, extra_front: Sequence[str] = ()) -> dict[str, str]:
    """The children's environment: the repository (and ``extra_front``) first on PYTHONPATH, the
    py-spy of a ``--target`` install (``<entry>/bin`` of a PYTHONPATH entry) on PATH, Python's
    output unbuffered, ultralytics offline, plots headless."""
    from trainer.offline import OFFLINE_ENV

    paths = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]
    bins = [str(Path(p) / "bin") for p in paths if (Path(p) / "bin" / "py-spy").exists()]
    bins.append(str(Path(python).parent))
    env = {**base, **OFFLINE_ENV, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg"}
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*extra_front, str(repo), *paths]))
    env["PATH"] = os.pathsep.join(dict.fromkeys([*bins, *[p for p in base.get("PATH", "").split(os.pathsep) if p]]))
    return env


def orch(s: Session, *args: str) -> list[str]:
    """``orch ARGS`` from the working tree, with the session's python."""
    return [s.python, "-m", "orchestrator", *args]


def inventory(
    session: Session, name: str, gpus: bool, args: Mapping[str, Any], port: int, fabric: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A one-node `transport: local` inventory running the trainer with ``args`` (pure)."""
    node: dict[str, Any] = {"host": "localhost", "name": "gpu0" if gpus else "cpu0"}
    if gpus:
        node["gpus"] = 1
    env = {"PYTHONPATH": session.env.get("PYTHONPATH", str(REPO))}
    if not gpus:
        env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    inv: dict[str, Any] = {
        "name": name,
        "transport": "local",
        "nodes": [node],
        "master": {"port": port},
        "env": env,
        "job": {
            "python": session.python,
            "workdir": str(REPO),
            "run_root": str(session.work / "nodes"),
            "nproc_per_node": 1,
            "module": "trainer",
            "stop_grace_s": 5,
            "args": dict(args),
        },
    }
    if fabric is not None:
        inv["checks"] = {"fabric": dict(fabric)}
    return inv


def write_yaml(path: Path, data: Mapping[str, Any]) -> Path:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False))
    return path


def last_json(text: str, marker: str) -> dict[str, Any]:
    """The JSON object of the last ``MARKER {...}`` line."""
    for line in reversed(text.splitlines()):
        if line.startswith(marker + " "):
            return dict(json.loads(line[len(marker) + 1 :]))
    raise StepFailed(f"no {marker} line in the output")


def json_doc(text: str) -> dict[str, Any]:
    """A command's stdout as the JSON object it must be."""
    try:
        doc = json.loads(text)
    except ValueError:
        raise StepFailed(f"expected a JSON document on stdout, got: {text[:300]!r}") from None
    if not isinstance(doc, dict):
        raise StepFailed(f"expected a JSON object on stdout, got {type(doc).__name__}")
    return doc


def results_rows(path: Path) -> list[dict[str, float]]:
    with open(path) as f:
        return [{k.strip(): float(v) for k, v in row.items()} for row in csv.DictReader(f)]


# ----------------------------------------------------------------------------- the steps


def step_data(ctx: StepContext) -> None:
    """The synthetic sets (trainer.synth): detection for the trainers, polygons for YOLOE."""
    z, data = ctx.settings, ctx.s.work / "data"
    det = ctx.run(
        [
            ctx.s.python,
            "-m",
            "trainer.synth",
            str(data / "det"),
            "--images",
            str(z.images),
            "--classes",
            "3",
            "--imgsz",
            str(z.imgsz),
        ],
        "synth-det",
    )
    ctx.ok(det, "trainer.synth (detection)")
    seg = ctx.run(
        [
            ctx.s.python,
            "-m",
            "trainer.synth",
            str(data / "seg"),
            "--images",
            str(z.seg_images),
            "--classes",
            "3",
            "--imgsz",
            str(z.imgsz),
            "--segments",
        ],
        "synth-seg",
    )
    ctx.ok(seg, "trainer.synth (segments)")
    ctx.s.facts["det"] = data / "det" / "data.yaml"
    ctx.s.facts["seg"] = data / "seg" / "data.yaml"
    n_train = len(list((data / "det" / "images" / "train").iterdir()))
    ctx.s.facts["train_images"] = n_train
    ctx.figures.update(
        detect={"images": z.images, "train_images": n_train, "imgsz": z.imgsz, "classes": 3},
        segment={"images": z.seg_images, "imgsz": z.imgsz, "classes": 3},
    )
    ctx.figures["summary"] = f"{z.images} images ({n_train} train) and {z.seg_images} with polygons, {z.imgsz} px"


ENV_CODE = r"""
import importlib.metadata as md, json, platform, sys
out = {"python": sys.version.split()[0], "executable": sys.executable, "platform": platform.platform()}
import torch
cuda = torch.cuda.is_available()
out.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=cuda,
           cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
           arch_list=torch.cuda.get_arch_list() if cuda else [], gpus=[])
try:
    out["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if cuda else None
except Exception as e:
    out["nccl"], out["nccl_error"] = None, f"{type(e).__name__}: {e}"
if cuda:
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out["gpus"].append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                            "memory_gib": round(p.total_memory / 2**30, 1), "multiprocessors": p.multi_processor_count})
    a = torch.randn(2048, 2048, device="cuda")
    out["kernel_ok"] = bool(torch.isfinite((a @ a).sum()).item())
for name in ("torchvision", "numpy", "ultralytics", "opencv-python-headless", "opencv-python", "paramiko",
             "pydantic", "click", "rich", "PyYAML", "tensorboard", "py-spy"):
    try:
        out.setdefault("packages", {})[name] = md.version(name)
    except md.PackageNotFoundError:
        out.setdefault("packages", {})[name] = None
print("ENV " + json.dumps(out))
"""


def arch_covers(capability: str, arch_list: Sequence[str]) -> bool:
    """Whether a build's arch list runs a GPU of ``capability`` ("9.0"): its own sm_XY, or PTX
    (compute_XY) of an equal or older architecture for the driver to compile."""
    major, minor = (int(x) for x in capability.split("."))
    want = major * 10 + minor
    for arch in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+)[a-z]?", arch)
        if not m:
            continue
        n = int(m.group(2))
        if (m.group(1) == "sm" and n == want) or (m.group(1) == "compute" and n <= want):
            return True
    return False


def step_environment(ctx: StepContext) -> None:
    env = last_json(ctx.ok(ctx.run([ctx.s.python, "-c", ENV_CODE], "versions"), "the version probe").text, "ENV")
    ctx.figures["versions"] = env
    ctx.s.facts["versions"] = env
    ctx.s.facts["gpu_count"] = len(env["gpus"])
    if ctx.dry:
        for part in ("gpus", "arch", "driver", "kernel"):
            ctx.skip_part(part, "no CUDA GPU on this machine (dry run)")
    else:
        ctx.require(
            env["cuda_available"],
            f"torch {env['torch']} sees no CUDA GPU (run with --cpu-dry-run to rehearse on a machine without one)",
        )
        ctx.require(env.get("kernel_ok"), "a matrix product on the GPU did not give a finite result")
        smi = ctx.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap,memory.total", "--format=csv,noheader"],
            "nvidia-smi",
        )
        ctx.ok(smi, "nvidia-smi --query-gpu")
        smi_rows = [[c.strip() for c in line.split(",")] for line in smi.text.splitlines()[1:] if line.strip()]
        ctx.figures["nvidia_smi"] = smi_rows
        env["driver"] = smi_rows[0][1] if smi_rows and len(smi_rows[0]) > 1 else None
        for gpu in env["gpus"]:
            ok = arch_covers(gpu["capability"], env["arch_list"])
            ctx.goal(
                f"torch's arch list runs GPU {gpu['index']} ({gpu['name']}, sm_{gpu['capability'].replace('.', '')})",
                " ".join(env["arch_list"]),
                "covers it",
                ok,
            )
            ctx.require(
                ok,
                f"torch {env['torch']} was built for {env['arch_list']}, which does not run "
                f"{gpu['name']} (compute capability {gpu['capability']})",
            )
    # orch check of a one-node inventory declaring one GPU
    port = job_port()
    ctx.s.facts["port"] = port
    args = trainer_job_args(ctx.s, epochs=1, project=ctx.s.work / "up-runs")
    inv = write_yaml(ctx.s.work / "inventory-gpu.yaml", inventory(ctx.s, "gpu-smoke", True, args, port))
    ctx.s.facts["inventory_gpu"] = inv
    fixtures = {"ORCH_PROBE_FIXTURES": str(DRY_FIXTURE)} if ctx.dry else {}
    if ctx.dry:
        ctx.skip_part(
            "real nvidia-smi",
            f"no GPU: the gpus check reads recorded nvidia-smi output ({DRY_FIXTURE.relative_to(REPO)})",
        )
    home = {"ORCH_HOME": str(ctx.s.work / "orch-home")}
    check = ctx.run(orch(ctx.s, "check", str(inv), "--json"), "orch-check", env={**home, **fixtures}, json_stdout=True)
    ctx.ok(check, "orch check", codes=(0, 1))
    doc = json_doc(check.stdout)
    rows = {
        f"{r['check']}@{r['node']}": {k: r.get(k) for k in ("status", "value", "detail", "hint")}
        for r in doc["results"]
    }
    ctx.figures["orch_check"] = {"exit_code": check.code, "elapsed_s": doc.get("elapsed_s"), "results": rows}
    failed = [f"{k}: {v['detail']}" for k, v in rows.items() if v["status"] == "fail"]
    for name in ("gpus", "software"):
        row = next((v for k, v in rows.items() if k.startswith(name + "@")), None)
        ctx.require(
            row is not None and row["status"] != "skip",
            f"the {name} check did not run: {row['detail'] if row else 'no row'}",
        )
    ctx.require(not failed, "orch check failed: " + "; ".join(failed))
    statuses = ", ".join(f"{k.split('@')[0]} {v['status']}" for k, v in rows.items())
    gpus = next(v for k, v in rows.items() if k.startswith("gpus@"))
    ctx.figures["summary"] = (
        f"torch {env['torch']} CUDA {env['torch_cuda']} "
        + (
            f"{env['gpus'][0]['name']} sm_{env['gpus'][0]['capability'].replace('.', '')}; "
            if env["gpus"]
            else "no GPU; "
        )
        + f"gpus: {gpus['value']}; {statuses}"
    )


def trainer_job_args(s: Session, epochs: int, project: Path) -> dict[str, Any]:
    """The trainer's arguments in an inventory's job.args (a mapping becomes --key value)."""
    z = s.settings
    args: dict[str, Any] = {
        "model": z.model,
        "data": str(s.facts["det"]),
        "epochs": epochs,
        "batch": z.batch,
        "imgsz": z.imgsz,
        "workers": z.workers,
        "project": str(project),
        "log-every": 1,
    }
    args["device"] = "cpu" if s.dry else "auto"
    if not s.dry:
        args["amp"] = z.amps[0]
    return args


def step_trainer(ctx: StepContext) -> None:
    """python -m trainer (each --amp) against YOLO().train() on the same data; then the logged final
    mAP of best.pt against ultralytics' validator on it."""
    from trainer.logs import parse_final, parse_throughput

    z, s = ctx.settings, ctx.s
    data, n_train = s.facts["det"], s.facts["train_images"]
    accumulate = max(round(64 / z.batch), 1)  # what ultralytics derives from nbs=64
    runs: dict[str, Any] = {}
    ctx.figures.update(
        model=z.model,
        imgsz=z.imgsz,
        batch=z.batch,
        epochs=z.epochs,
        accumulate=accumulate,
        workers=z.workers,
        train_images=n_train,
        measured_epochs=z.epochs - 2,
        compared=z.amps[0],
        runs=runs,
    )
    if ctx.dry:
        ctx.skip_part(
            "--amp fp16, --amp bf16, amp=True",
            "CUDA only: fp16 and bf16 autocast on the GPU; the dry run trains in fp32 (--amp off, amp=False)",
        )

    def ours(amp: str) -> None:
        out = s.work / f"trainer-{amp}"
        argv = [
            s.python,
            *trainer_argv(
                z.model,
                data,
                z.imgsz,
                z.epochs,
                z.batch,
                z.workers,
                accumulate,
                out,
                device=z.device,
                amp=amp,
                val_period=z.epochs,
            ),
        ]
        ran = ctx.ok(ctx.run(argv, f"trainer-{amp}"), f"python -m trainer --amp {amp}")
        lines = ran.text.splitlines()
        tp, final = parse_throughput(lines), parse_final(lines)
        runs[f"trainer-{amp}"] = {
            "ips": middle_ips(out / "results.csv", n_train),
            "logged_ips": tp.total,
            "wall_s": round(ran.seconds, 1),
            "final": final[2] if final else None,
            "best": str(out / "weights" / "best.pt"),
        }

    def theirs() -> None:
        out = s.work / "ultralytics"
        argv = [
            s.python,
            *ultralytics_argv(
                z.model,
                data,
                z.imgsz,
                z.epochs,
                z.batch,
                z.workers,
                out,
                0,
                device=z.device if not ctx.dry else "cpu",
                amp=not ctx.dry,
            ),
        ]
        ran = ctx.ok(ctx.run(argv, "ultralytics"), "ultralytics YOLO().train()")
        runs["ultralytics"] = {
            "ips": middle_ips(out / "results.csv", n_train),
            "wall_s": round(ran.seconds, 1),
            "notes": [ln[len(PEER_NOTE) :].strip() for ln in ran.text.splitlines() if ln.startswith(PEER_NOTE + " ")],
        }

    first = z.amps[0]
    ours(first)
    theirs()
    for amp in z.amps[1:]:
        ours(amp)
    peer = runs["ultralytics"]["ips"]
    for amp in z.amps:
        mine = runs[f"trainer-{amp}"]["ips"]
        ratio = mine / peer if peer else None
        runs[f"trainer-{amp}"]["ratio"] = ratio
        precision = "fp32" if amp == "off" else amp
        judged = amp == first and not ctx.dry  # tiny CPU runs of a dry run measure nothing worth a goal
        ctx.goal(
            f"training images/s, python -m trainer --amp {amp} / ultralytics amp={not ctx.dry} ({precision})",
            round(ratio, 3) if ratio else None,
            ">= 1.0" if judged else "report",
            (ratio is not None and ratio >= 1.0) if judged else None,
        )
    # the mAP the trainer logs for best.pt, against ultralytics' validator on the same file
    final = ctx.need(runs[f"trainer-{first}"]["final"], f"python -m trainer --amp {first} logged no final val line")
    ctx.require("metrics/mAP50-95(B)" in final, "the final val line has no box mAP50-95")
    ev = ctx.ok(
        ctx.run(
            [s.python, *evaluate_argv(Path(runs[f"trainer-{first}"]["best"]), data, z.imgsz, z.device)], "yolo-val"
        ),
        "YOLO(best.pt).val()",
    )
    val = parse_evaluation(ev.text)
    logged, measured = final["metrics/mAP50-95(B)"], val["box"]["map"]
    diff = abs(logged - measured)
    ctx.figures["map"] = {
        "weights": f"trainer-{first}/weights/best.pt",
        "logged": logged,
        "val": measured,
        "difference": diff,
        "val_settings": "YOLO(best.pt).val(batch=32, half=False)",
    }
    ctx.goal(
        "final mAP50-95: the trainer's logged value vs YOLO(best.pt).val(), |difference|",
        round(diff, 5),
        "<= 0.002",
        diff <= 0.002,
    )
    ctx.figures["summary"] = (
        f"{runs[f'trainer-{first}']['ips']:.1f} vs {peer:.1f} images/s "
        f"(x{runs[f'trainer-{first}']['ratio']:.2f}); mAP50-95 {logged:.4f} logged, {measured:.4f} val"
    )


def step_syncs(ctx: StepContext) -> None:
    """Host syncs per micro-step of one epoch (bench/gpu_syncs.py around the trainer's loop)."""
    z, s = ctx.settings, ctx.s
    report = s.work / "syncs.json"
    args = [
        "--model",
        z.model,
        "--data",
        str(s.facts["det"]),
        "--epochs",
        "1",
        "--batch",
        str(z.batch),
        "--imgsz",
        str(z.imgsz),
        "--workers",
        str(z.workers),
        "--device",
        z.device,
        "--log-every",
        "1000",
        "--out",
        str(s.work / "syncs-run"),
    ]
    if not ctx.dry:
        args += ["--amp", z.amps[0]]
    ran = ctx.run([s.python, "-m", "bench.gpu_syncs", "--json", str(report), "--", *args], "gpu-syncs")
    ctx.ok(ran, "python -m bench.gpu_syncs")
    counts = json.loads(report.read_text())
    ctx.figures.update(counts)
    ctx.require(counts["micro_steps"] > 0, "the driver counted no micro-step: the trainer's loop was not wrapped")
    if not counts["cuda"]:
        ctx.require(ctx.dry, "torch sees no CUDA: the sync debug mode had nothing to watch")
        ctx.skip_part(
            "sync debug mode",
            f"no CUDA: the mode watches CUDA calls; the driver ran the loop "
            f"({counts['micro_steps']} micro-steps) without it",
        )
    ctx.goal("host syncs per micro-step (one epoch, sync debug mode warn)", counts["per_micro_step"], "report", None)
    top = ", ".join(f"{x['site']} x{x['count']}" for x in counts["sites"][:3]) or "no site"
    ctx.figures["summary"] = f"{counts['syncs']} syncs in {counts['micro_steps']} micro-steps" + (
        f" ({counts['per_micro_step']:.2f} each): {top}" if counts["micro_steps"] else ""
    )


EMBED_CODE = r"""
import sys, torch, yaml
names = list(yaml.safe_load(open(sys.argv[1]))["names"].values())
g = torch.Generator().manual_seed(0)
torch.save({n: torch.randn(int(sys.argv[3]), generator=g) for n in names}, sys.argv[2])
print("EMBED " + ",".join(names))
"""


def step_yoloe(ctx: StepContext) -> None:
    """YOLOE-seg from its YAML with text embeddings from a file, every layer training, one epoch."""
    z, s = ctx.settings, ctx.s
    pe = s.work / "text_pe.pt"
    ctx.ok(
        ctx.run([s.python, "-c", EMBED_CODE, str(s.facts["seg"]), str(pe), str(EMBED_DIM)], "embeddings"),
        "writing the embeddings file",
    )
    out = s.work / "yoloe"
    argv = [
        s.python,
        "-m",
        "trainer",
        "--model",
        z.yoloe_model,
        "--data",
        str(s.facts["seg"]),
        "--text-embeddings",
        str(pe),
        "--prompt-mode",
        "full",
        "--epochs",
        "1",
        "--batch",
        str(z.seg_batch),
        "--imgsz",
        str(z.imgsz),
        "--workers",
        str(z.workers),
        "--device",
        z.device,
        "--out",
        str(out),
        "--log-every",
        "1000",
    ]
    if not ctx.dry:
        argv += ["--amp", z.amps[0]]
    ran = ctx.ok(ctx.run(argv, "trainer-yoloe"), f"python -m trainer --model {z.yoloe_model}")
    from trainer.logs import parse_final, parse_throughput

    lines = ran.text.splitlines()
    final = ctx.need(parse_final(lines), "no final validation line")
    ctx.require(any("YOLOE full" in ln for ln in lines), "the trainer did not say it trains a YOLOE model in full mode")
    ctx.require("metrics/mAP50-95(M)" in final[2], "the final validation has no mask metrics")
    last = out / "weights" / "last.pt"
    ctx.require(last.is_file(), f"no {last}")
    ctx.figures.update(
        model=z.yoloe_model,
        weights="none carried: built from the YAML (random initial weights)",
        embeddings=f"random {EMBED_DIM}-d vectors per class (mobileclip:blt's width), {pe.stat().st_size} B",
        final=final[2],
        logged_ips=parse_throughput(lines).total,
        wall_s=round(ran.seconds, 1),
        last_pt_bytes=last.stat().st_size,
    )
    ctx.figures["summary"] = (
        f"{z.yoloe_model} full, 1 epoch in {ran.seconds:.0f} s; mask mAP50-95 {final[2]['metrics/mAP50-95(M)']:.4f}"
    )


def step_orch_up(ctx: StepContext) -> None:
    """orch up of the one-node inventory (preflight included), and orch stacks while it runs.

    A preflight that fails (exit 3) fails the step, but the run is launched again with
    --skip-checks first, so that one run on the device still measures the launch and the stacks."""
    s = ctx.s
    args = trainer_job_args(s, epochs=1, project=s.work / "up-runs")
    inv = write_yaml(s.work / "inventory-up.yaml", inventory(s, "gpu-smoke-up", not ctx.dry, args, job_port()))
    if ctx.dry:
        ctx.skip_part("NCCL", "no GPU: the dry run's node declares no gpus, the trainer runs on CPU")
    ctx.figures["process_group"] = "none: one rank joins no process group (NCCL is step 6's)"
    preflight = None
    for extra in ([], ["--skip-checks"]):
        code, stacks = orch_up_once(ctx, inv, extra)
        if code != 3:
            break
        preflight = ctx.figures["preflight_failure"] = ctx.figures.pop("tail")
    ctx.require(code == 0, f"orch up exited {code}:\n{ctx.figures.get('tail')}")
    run_id = ctx.figures["run_id"]
    status = json_doc(
        ctx.ok(
            ctx.run(orch(s, "status", run_id, "--json"), "orch-status", env=orch_home(s), json_stdout=True),
            "orch status",
        ).stdout
    )
    ctx.figures["state"] = status.get("state")
    ctx.require(status.get("state") == "succeeded", f"the run is {status.get('state')}, not succeeded")
    stacks = ctx.need(
        stacks, f"orch stacks gave no complete stack in {ctx.figures['stack_tries']} tries while the run ran"
    )
    group = stacks["groups"][0] if stacks.get("groups") else {}
    ctx.figures["stacks"] = {
        "summary": group.get("summary"),
        "frames": group.get("frames", []),
        "ranks": group.get("ranks"),
        "problems": stacks.get("problems"),
        "in_trainer": in_trainer(stacks),
    }
    ctx.require(
        preflight is None,
        f"orch up's preflight failed (exit 3; the run then succeeded with --skip-checks):\n{preflight}",
    )
    ctx.figures["summary"] = f"succeeded in {ctx.figures['wall_s']:.0f} s; rank 0 stood in {group.get('summary')}"


def orch_home(s: Session) -> dict[str, str]:
    return {"ORCH_HOME": str(s.work / "orch-home")}


def in_trainer(stacks: Mapping[str, Any]) -> bool:
    """Whether a rank's stack has a frame of the trainer's own code (the run got past its imports)."""
    return any(
        "/trainer/" in str(f.get("file", ""))
        for g in stacks.get("groups", [])
        for f in g.get("frames", [])
        if isinstance(f, dict)
    )


def orch_up_once(ctx: StepContext, inv: Path, extra: Sequence[str]) -> tuple[int, dict[str, Any] | None]:
    """One attached ``orch up``; while it runs, ``orch stacks`` until a complete stack stands in the
    trainer's code (else the first complete one). Returns up's exit code and that stack."""
    s, home = ctx.s, orch_home(ctx.s)
    run_id = f"smoke-up-{secrets.token_hex(3)}"
    up, up_log = ctx.start(orch(s, "up", str(inv), "--run-id", run_id, *extra), "orch-up", env=home)
    stacks: dict[str, Any] | None = None
    tries = 0
    t0 = s.clock()
    try:
        while up.poll() is None and ctx.left() > 0 and not (stacks and in_trainer(stacks)):
            if (s.work / "orch-home" / "runs" / run_id / "run.json").exists():
                tries += 1
                got = ctx.run(
                    orch(s, "stacks", run_id, "--json", "--timeout", "10"),
                    f"orch-stacks-{tries}",
                    env=home,
                    limit_s=40,
                    json_stdout=True,
                )
                doc = json_doc(got.stdout) if got.code == 0 else {}
                if doc.get("complete") and any(r.get("threads") for r in doc.get("ranks", [])):
                    stacks = doc if stacks is None or in_trainer(doc) else stacks
            if up.poll() is None:  # again soon, not busily: each try starts orch and py-spy on the node's CPUs
                time.sleep(0.5 if tries == 0 else 2.0)
        code = s.procs.wait(up, ctx.deadline)
        if code is None:
            raise StepTimeout(f"orch up still running at {ctx.limit}: stopped (SIGTERM: it tears the run down)")
        s.procs.live.remove(up)
    finally:
        if up.poll() is None:  # stopped, not ended: make sure of the nodes too (its teardown may have been cut)
            s.procs.stop(up)
            ctx.run(orch(s, "down", run_id), "orch-down", env=home, limit_s=60, cleanup=True)
    ctx.figures.update(
        exit_code=code,
        wall_s=round(s.clock() - t0, 1),
        run_id=run_id,
        stack_tries=tries,
        tail="\n".join(up_log.read_text(errors="replace").splitlines()[-20:]),
    )
    return code, stacks


def step_fabric(ctx: StepContext) -> None:
    """orch check --only fabric: the all_reduce job on the node, NCCL's INFO lines parsed."""
    s = ctx.s
    fabric = {"max_bytes": "4M", "budget_s": 5, "timeout_s": 150} if ctx.dry else {"timeout_s": 120}
    args = trainer_job_args(s, epochs=1, project=s.work / "fabric-runs")
    inv = write_yaml(
        s.work / "inventory-fabric.yaml", inventory(s, "gpu-smoke-fabric", not ctx.dry, args, job_port(), fabric=fabric)
    )
    ran = ctx.run(
        orch(s, "check", str(inv), "--only", "fabric", "--json"),
        "orch-check-fabric",
        env={"ORCH_HOME": str(s.work / "orch-home")},
        json_stdout=True,
    )
    ctx.ok(ran, "orch check --only fabric", codes=(0, 1))
    doc = json_doc(ran.stdout)
    row = ctx.need(next((r for r in doc["results"] if r["check"] == "fabric"), None), "no fabric row in the JSON")
    f = doc.get("fabric") or {}
    ctx.figures.update(
        exit_code=ran.code,
        status=row["status"],
        detail=row["detail"],
        backend=f.get("backend"),
        busbw_gbps=f.get("busbw_gbps"),
        world_size=f.get("world_size"),
        nccl_version=f.get("nccl_version"),
        wall_s=f.get("wall_s"),
        sweep=f.get("sweep"),
        errors=f.get("errors"),
        job_errors=f.get("job_errors"),
    )
    ctx.require(row["status"] in ("ok", "warn"), f"the fabric check is {row['status']}: {row['detail']}")
    if ctx.dry:
        ctx.require(f.get("backend") == "gloo", f"backend {f.get('backend')}, expected gloo on CPU")
        ctx.skip_part("NCCL_DEBUG=INFO lines", "no GPU: the job runs gloo, NCCL prints nothing")
        ctx.figures["summary"] = f"gloo, busbw {f.get('busbw_gbps')} GB/s; {row['detail']}"
        return
    ctx.require(f.get("backend") == "nccl", f"backend {f.get('backend')}, expected nccl on a GPU node")
    nccl = f.get("nccl") or {}
    ctx.figures["nccl"] = nccl
    hosts = {n: d.get("hosts", {}) for n, d in nccl.items()}
    transports = {n: {h: v.get("transports") for h, v in hs.items()} for n, hs in hosts.items()}
    networks = sorted({net for hs in hosts.values() for v in hs.values() for net in v.get("networks", [])})
    ctx.figures.update(transports=transports, networks=networks)
    ctx.require(
        any(d.get("nccl_version") for d in nccl.values()),
        "no NCCL version line parsed from the job's NCCL_DEBUG=INFO output",
    )
    ctx.goal("NCCL transports found in the fabric job's NCCL_DEBUG=INFO lines", json.dumps(transports), "report", None)
    ctx.figures["summary"] = (
        f"NCCL {f.get('nccl_version')}, network {', '.join(networks) or 'none'}, "
        f"busbw {f.get('busbw_gbps')} GB/s (one rank: no links)"
    )


def junit_counts(xml: str) -> dict[str, Any]:
    """tests, failures, errors, skipped and the failing tests' ids of a pytest junit XML."""
    root = ET.fromstring(xml)
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    out: dict[str, Any] = {k: sum(int(x.get(k, 0)) for x in suites) for k in ("tests", "failures", "errors", "skipped")}
    out["failed"] = [
        f"{c.get('classname')}::{c.get('name')}"
        for c in root.iter("testcase")
        if c.find("failure") is not None or c.find("error") is not None
    ]
    return out


def step_gpu_tests(ctx: StepContext) -> None:
    """pytest -m gpu tests/gpu: the GPU unit tests; collected and skipped without a GPU."""
    s = ctx.s
    where = Path(s.facts.get("gpu_tests") or "tests/gpu")
    if not (where if where.is_absolute() else REPO / where).exists():
        raise StepSkipped(f"{where} does not exist in this tree")
    xml = s.work / "gpu-tests.xml"
    ran = ctx.run(
        [s.python, "-m", "pytest", "-m", "gpu", str(where), "-q", "-p", "no:cacheprovider", f"--junitxml={xml}"],
        "pytest-gpu",
    )
    if ran.code == 5:
        raise StepSkipped(f"pytest collected no test in {where}")
    ctx.ok(ran, f"pytest -m gpu {where}", codes=(0, 1))
    counts = junit_counts(xml.read_text())
    ctx.figures.update(counts)
    ctx.figures["exit_code"] = ran.code
    ctx.require(
        counts["failures"] + counts["errors"] == 0,
        f"{counts['failures']} failed, {counts['errors']} errors: " + ", ".join(counts["failed"][:10]),
    )
    ran_tests = counts["tests"] - counts["skipped"]
    if ctx.dry:
        ctx.skip_part("the GPU tests themselves", f"no CUDA: {counts['skipped']} of {counts['tests']} skipped")
    else:
        ctx.require(ran_tests > 0, f"every one of the {counts['tests']} GPU tests skipped on a GPU machine")
    ctx.figures["summary"] = f"{counts['tests']} collected, {ran_tests} passed, {counts['skipped']} skipped"


def one_gpu_reason(ctx: StepContext, what: str) -> str:
    n = ctx.s.facts.get("gpu_count", 0)
    if ctx.dry or n == 0:
        return f"{what} needs >= 2 GPUs; this dry run has none"
    if n == 1:
        return (
            f"{what} needs >= 2 GPUs and this machine has one: NCCL refuses two ranks on one device, and "
            "two ranks on CPU would measure nothing of the GPU path; not faked"
        )
    return f"{what} is not part of this one-GPU validation ({n} GPUs here)"


def two_ranks_argv(ctx: StepContext, out: Path, *extra: str) -> list[str]:
    """torchrun with 2 ranks of ``python -m trainer`` on this machine: on the GPU both share it over
    gloo (``--dist-backend gloo``: NCCL refuses two ranks on one device), fp16 AMP with its
    GradScaler, accumulating 2 micro-steps (DDP's no_sync on the first), validating every epoch
    (the EMA's buffers broadcast from rank 0, each rank its shard of the validation set); on the
    dry run's CPU, gloo as always, fp32."""
    z, s = ctx.settings, ctx.s
    gpu = not ctx.dry
    return [
        s.python,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(job_port()),
        "-m",
        "trainer",
        *("--model", z.model, "--data", str(s.facts["det"]), "--imgsz", str(z.imgsz)),
        *("--epochs", str(z.ddp_epochs), "--batch", str(z.ddp_batch), "--accumulate", "2", "--val-period", "1"),
        *("--workers", str(min(z.workers, 2)), "--log-every", "2", "--plots", "false", "--warmup-epochs", "0"),
        *(("--device", "cuda", "--dist-backend", "gloo", "--amp", z.amps[0]) if gpu else ("--device", "cpu")),
        *("--out", str(out), "--debug-dir", str(out / "debug")),
        *extra,
    ]


def two_ranks(ctx: StepContext, name: str, *extra: str) -> tuple[Any, list[dict[str, Any]], Path]:
    """One two-rank run (``two_ranks_argv``) that must end well: its output, every rank's debug
    record (weights checksum, what its gradient all-reduces sent) and its run directory; the
    ranks must end with the same weights."""
    out = ctx.s.work / name
    ran = ctx.ok(ctx.run(two_ranks_argv(ctx, out, *extra), name, env={"OMP_NUM_THREADS": "1"}), f"2 ranks ({name})")
    debug = [json.loads((out / "debug" / f"rank{r}.json").read_text()) for r in range(2)]
    ctx.require(debug[0]["checksum"] == debug[1]["checksum"], "the two ranks ended with different weights")
    return ran, debug, out


def step_ddp(ctx: StepContext) -> None:
    """Two ranks on the one GPU (gloo over CUDA tensors): DDP, the GradScaler with no_sync
    accumulation, the EMA buffer broadcast and sharded validation on CUDA, fp16 gradient
    all-reduces (--ddp-grad-dtype fp16, their bytes counted in the hook)."""
    from trainer.logs import parse_final, parse_timing

    ran, debug, out = two_ranks(ctx, "ddp", "--ddp-grad-dtype", "fp16")
    lines = ran.text.splitlines()
    final = ctx.need(parse_final(lines), "no final validation line (best.pt over both ranks' shards)")
    rows = results_rows(out / "results.csv")
    steps = [d["grad_comm"]["steps"] for d in debug]
    ctx.require(steps[0] == steps[1] > 0, f"gradient all-reduces per rank {steps}: the ranks did not step together")
    skipped = sum(r["steps/skipped"] for r in rows)
    ctx.require(skipped < steps[0], f"the GradScaler skipped all {steps[0]} optimizer steps: nothing trained")
    timed = {ln.split("]")[0] for ln in lines if parse_timing(ln) is not None}
    ctx.require(timed == {"[rank 0", "[rank 1"}, f"timing lines from {sorted(timed)}, expected both ranks")
    said = [ln for ln in lines if "of gradients per optimizer step" in ln]
    ctx.require(said and "in fp16" in said[0], "the start-up did not say the fp16 gradient all-reduce")
    ctx.s.facts["fp16_bytes_per_step"] = debug[0]["grad_comm"]["bytes_per_step"]
    ctx.figures.update(
        backend="gloo" if not ctx.dry else "gloo (CPU)",
        device="one GPU, both ranks" if not ctx.dry else "cpu",
        amp=ctx.settings.amps[0] if not ctx.dry else "off",
        optimizer_steps=steps[0],
        skipped_steps=skipped,
        grad_comm=debug[0]["grad_comm"],
        final=final[2],
        epochs=[r["epoch"] for r in rows],
        wall_s=round(ran.seconds, 1),
        proved=[
            "DDP over a process group on CUDA tensors",
            "GradScaler steps with no_sync accumulation (2 micro-steps)",
            "EMA buffer broadcast and sharded validation on CUDA",
            "fp16 gradient all-reduce (compression hook)",
        ]
        if not ctx.dry
        else ["DDP on CPU (gloo)", "fp16 gradient all-reduce (compression hook)"],
    )
    if ctx.dry:
        ctx.skip_part("CUDA, fp16 AMP", "no GPU: 2 ranks on the CPU, fp32")
    ctx.figures["summary"] = (
        f"2 ranks, {steps[0]} steps ({skipped:.0f} skipped), identical weights; fp16 all-reduce "
        f"{debug[0]['grad_comm']['bytes_per_step'] / 1e6:.2f} MB/step; mAP50-95 {final[2]['metrics/mAP50-95(B)']:.4f}"
    )


def step_sync_bn(ctx: StepContext) -> None:
    """Two ranks on the one GPU with --sync-bn (SyncBatchNorm's all-gathers over gloo, timed apart:
    sync_s on the timing lines) and fp32 gradient all-reduces counted: twice fp16's bytes."""
    from trainer.logs import parse_timing

    extra = ["--ddp-grad-dtype", "fp32"] + ([] if ctx.dry else ["--sync-bn"])
    if ctx.dry:
        ctx.skip_part(
            "--sync-bn", "CUDA only: torch's SyncBatchNorm has no CPU implementation (the trainer refuses it)"
        )
    ran, debug, out = two_ranks(ctx, "sync-bn", *extra)
    lines = ran.text.splitlines()
    timings = [t for t in map(parse_timing, lines) if t is not None]
    if not ctx.dry:
        ctx.require(
            timings and all(" sync_s " in ln for ln in lines if parse_timing(ln)), "no sync_s on the timing lines"
        )
        kinds = {type(m).__name__ for m in torch_load(out / "weights" / "last.pt")["model"].modules()}
        ctx.require("SyncBatchNorm" not in kinds, f"last.pt holds {sorted(kinds)}: SyncBatchNorm, not plain BatchNorm")
    fp32 = debug[0]["grad_comm"]["bytes_per_step"]
    fp16 = ctx.s.facts.get("fp16_bytes_per_step")
    ratio = fp16 / fp32 if fp16 and fp32 else None
    ctx.goal("gradient bytes per optimizer step, fp16 / fp32 all-reduce (2 ranks)", ratio, "= 0.5", ratio == 0.5)
    ctx.figures.update(
        grad_comm=debug[0]["grad_comm"],
        bytes_ratio=ratio,
        sync_s=sum(t.sync_s for t in timings),
        compute_s=sum(t.compute_s for t in timings),
        wall_s=round(ran.seconds, 1),
    )
    ctx.figures["summary"] = (
        ("SyncBatchNorm on 2 ranks, " if not ctx.dry else "")
        + f"fp32 all-reduce {fp32 / 1e6:.2f} MB/step (fp16/fp32 {ratio})"
        + (f"; sync_s {ctx.figures['sync_s']:.3f} of compute {ctx.figures['compute_s']:.3f}" if not ctx.dry else "")
    )


def torch_load(path: Path) -> Any:
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)


def step_scaling(ctx: StepContext) -> None:
    raise StepSkipped(one_gpu_reason(ctx, "multi-GPU scaling (images/s per GPU from 1 to N)"))


STEPS = (
    Step("data", "synthetic datasets (python -m trainer.synth)", 20, 120, step_data),
    Step(
        "environment",
        "versions, GPU, arch list; orch check of a one-node gpus: 1 inventory",
        40,
        150,
        step_environment,
        ("data",),
    ),
    Step("gpu_tests", "pytest -m gpu tests/gpu", 150, 200, step_gpu_tests, ("environment",)),
    Step(
        "ddp",
        "2 ranks on the one GPU (gloo): DDP, GradScaler with no_sync, EMA broadcast, sharded validation, fp16 "
        "all-reduce",
        60,
        300,
        step_ddp,
        ("data", "environment"),
    ),
    Step(
        "sync_bn",
        "2 ranks on the one GPU with --sync-bn (sync_s timed apart), fp32 all-reduce bytes",
        50,
        300,
        step_sync_bn,
        ("data", "environment"),
    ),
    Step(
        "trainer",
        "python -m trainer --amp fp16 vs YOLO().train(amp=True); logged mAP vs YOLO(best.pt).val()",
        70,
        600,
        step_trainer,
        ("data", "environment"),
    ),
    Step(
        "syncs",
        "host syncs per micro-step, torch.cuda.set_sync_debug_mode('warn')",
        30,
        200,
        step_syncs,
        ("data", "environment"),
    ),
    Step(
        "orch_up",
        "orch up of the one-node inventory, 1 epoch; orch stacks during the run",
        45,
        300,
        step_orch_up,
        ("data", "environment"),
    ),
    Step(
        "fabric",
        "orch check --only fabric (NCCL all_reduce job, NCCL_DEBUG=INFO parsed)",
        30,
        240,
        step_fabric,
        ("data", "environment"),
    ),
    Step(
        "yoloe",
        "yoloe-11s-seg + text embeddings file, --prompt-mode full, 1 epoch",
        40,
        300,
        step_yoloe,
        ("data", "environment"),
    ),
    Step("scaling", "multi-GPU scaling", 0, 0, step_scaling, ("environment",)),
)
PROVES = ("data", "environment", "gpu_tests", "ddp", "sync_bn")
"""The steps the lease exists for, first in the run: their budgets together fit the whole run's
(``DEFAULT_BUDGET_S``), whatever the others take."""
STEP_NAMES = tuple(s.name for s in STEPS)


def select_steps(names: Sequence[str] | None) -> list[Step]:
    """The steps asked for, with the steps they need, in the script's order.

    Raises:
        ValueError: an unknown step name.
    """
    if not names:
        return list(STEPS)
    unknown = [n for n in names if n not in STEP_NAMES]
    if unknown:
        raise ValueError(f"unknown step(s) {', '.join(unknown)}: choose from {', '.join(STEP_NAMES)}")
    want = set(names)
    by_name = {s.name: s for s in STEPS}
    todo = list(names)
    while todo:
        for need in by_name[todo.pop()].requires:
            if need not in want:
                want.add(need)
                todo.append(need)
    return [s for s in STEPS if s.name in want]


def parse_budgets(items: Sequence[str]) -> dict[str, float]:
    """``NAME=SECONDS`` pairs (``--step-budget``).

    Raises:
        ValueError: not NAME=SECONDS, an unknown step, a negative budget.
    """
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in STEP_NAMES:
            raise ValueError(f"--step-budget {item}: expected NAME=SECONDS with NAME one of {', '.join(STEP_NAMES)}")
        try:
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"--step-budget {item}: {value!r} is not a number of seconds") from None
        if out[name] < 0:
            raise ValueError(f"--step-budget {item}: a budget cannot be negative")
    return out


# ----------------------------------------------------------------------------- the report


def document(
    results: Sequence[StepResult],
    session: Session,
    started: float,
    wall_s: float,
    total_s: float,
    machine: Mapping[str, Any],
) -> dict[str, Any]:
    """gpu_smoke.json: every step's status, figures, goals, skipped parts and logs; the versions;
    `summary` rows for bench/summary.py (measured on a GPU only)."""
    c = counts(results)
    versions = dict(session.facts.get("versions") or {})
    versions["orch"] = orch_version()
    versions["commit"] = git_commit()
    return {
        "benchmark": NAME,
        "schema": SCHEMA,
        "mode": "cpu-dry-run" if session.dry else "gpu",
        "ok": c["fail"] == 0 and c["timeout"] == 0,
        "counts": c,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(wall_s, 1),
        "budget_s": total_s,
        "machine": dict(machine),
        "versions": versions,
        "sizes": asdict(session.settings),
        "steps": [asdict(r) for r in results],
        "summary": [] if session.dry else summary_rows(results, versions),
        "proved": proved(results),
        "strays": list(session.facts.get("strays", [])),
    }


def proved(results: Sequence[StepResult]) -> dict[str, list[str]]:
    """What the lease was for (``PROVES``), each step's title under ``proved`` when it passed, else
    under ``not_proved`` with how it ended."""
    out: dict[str, list[str]] = {"proved": [], "not_proved": []}
    ended = {r.name: r for r in results}
    for name in PROVES:
        r = ended.get(name)
        if r is not None and r.status == "pass":
            out["proved"].append(f"{name}: {r.title}")
        else:
            out["not_proved"].append(f"{name}: {r.status if r else 'not run'}{': ' + r.summary() if r else ''}")
    return out


def summary_rows(results: Sequence[StepResult], versions: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The GPU rows of bench/results/summary.md (bench/summary.py's shape), from the trainer step
    and the sync_bn step's bytes per step (fp16 against fp32 all-reduces, two ranks)."""
    gpu = (versions.get("gpus") or [{}])[0].get("name", "GPU")
    rows: list[dict[str, Any]] = []
    sync_bn = next((r for r in results if r.name == "sync_bn" and r.status == "pass"), None)
    if sync_bn is not None and sync_bn.figures.get("bytes_ratio") is not None:
        fp32 = sync_bn.figures["grad_comm"]["bytes_per_step"]
        ratio = sync_bn.figures["bytes_ratio"]
        rows.append(
            {
                "what": f"gradient bytes per optimizer step per rank, DDP all-reduce in fp16 vs fp32, 2 ranks on 1 x {gpu}",
                "orch": fp32 * ratio,
                "peer": fp32,
                "ratio": ratio,
                "goal": "= 0.5",
                "met": ratio == 0.5,
            }
        )
    step = next((r for r in results if r.name == "trainer" and r.status == "pass"), None)
    if step is None:
        return rows
    f = step.figures
    peer = f["runs"]["ultralytics"]["ips"]
    for key, run in f["runs"].items():
        if not key.startswith("trainer-"):
            continue
        amp = key.split("-", 1)[1]
        first = amp == f["compared"]
        rows.append(
            {
                "what": f"training images/s, {f['model']} {f['imgsz']}px batch {f['batch']}, 1 x {gpu} --amp {amp}, "
                "python -m trainer vs ultralytics YOLO().train(amp=True)",
                "orch": run["ips"],
                "peer": peer,
                "ratio": run["ratio"],
                "goal": ">= 1.0" if first else "report",
                "met": (run["ratio"] >= 1.0) if first and run["ratio"] is not None else None,
            }
        )
    m = f["map"]
    rows.append(
        {
            "what": f"final mAP50-95 logged by python -m trainer vs YOLO(best.pt).val(), 1 x {gpu}",
            "orch": m["logged"],
            "peer": m["val"],
            "ratio": m["logged"] / m["val"] if m["val"] else None,
            "goal": "|difference| <= 0.002",
            "met": m["difference"] <= 0.002,
        }
    )
    return rows


def orch_version() -> str | None:
    try:
        from orchestrator import __version__

        return str(__version__)
    except ImportError:
        return None


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None  # the device gets the tree without .git
    return p.stdout.strip() or None


# ----------------------------------------------------------------------------- main


def interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def machine() -> dict[str, Any]:
    from bench.common import machine as m

    return m()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python bench/gpu_smoke.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="steps: " + ", ".join(STEP_NAMES) + "\n\nthe device's run command "
        f'(carry ["{WHEEL_DIR}"], timeout_s {RUN_TIMEOUT_S}):\n  {RUN_COMMAND}\n\n'
        "examples:\n  make gpu-wheels                          # here, once\n"
        "  python bench/gpu_smoke.py --cpu-dry-run --out /tmp/smoke   # rehearse here\n"
        "  python3 bench/gpu_smoke.py --out $OUT    # on the GPU machine",
    )
    ap.add_argument("--out", type=Path, help="where gpu_smoke.json, .txt and the logs' tarball go (default: $OUT)")
    ap.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="run every step that can run without a GPU: tiny sizes, fp32, gloo, the device's packages",
    )
    ap.add_argument("--steps", help=f"comma-separated subset of {', '.join(STEP_NAMES)} (with the steps they need)")
    ap.add_argument(
        "--budget-s",
        type=float,
        help=f"stop starting steps after this many seconds "
        f"(default {DEFAULT_BUDGET_S:.0f}; dry run {DRY_BUDGET_S:.0f})",
    )
    ap.add_argument(
        "--step-budget",
        action="append",
        default=[],
        metavar="NAME=SECONDS",
        help="one step's budget instead of its default (repeatable), e.g. trainer=240",
    )
    ap.add_argument("--work", type=Path, help="scratch directory (default: a new one under the system's temp dir)")
    ap.add_argument("--keep-work", action="store_true", help="keep the scratch directory (datasets, runs, logs)")
    ap.add_argument(
        "--gpu-tests",
        type=Path,
        default=Path("tests/gpu"),
        help="what the gpu_tests step gives pytest -m gpu (default tests/gpu)",
    )
    ap.add_argument(
        "--all-packages",
        action="store_true",
        help="dry run: let the children import everything installed here, not only the device's packages",
    )
    ap.add_argument(
        "--fetch-wheels",
        action="store_true",
        help=f"download the wheels the device lacks into {WHEEL_DIR}/ (cp312 manylinux x86_64) and exit",
    )
    ap.add_argument("--print-run-command", action="store_true", help="print the device's run command and exit")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.print_run_command:
        print(RUN_COMMAND)
        return 0
    if a.fetch_wheels:
        return fetch_wheels()
    try:
        steps = select_steps([n.strip() for n in a.steps.split(",") if n.strip()] if a.steps else None)
        budgets = parse_budgets(a.step_budget)
    except ValueError as e:
        ap.error(str(e))
    out = a.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    if out is None:
        ap.error("give --out DIR (or set $OUT): where gpu_smoke.json goes")
    total = a.budget_s if a.budget_s is not None else (DRY_BUDGET_S if a.cpu_dry_run else DEFAULT_BUDGET_S)
    work = a.work or Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    front = [str(device_site(work))] if a.cpu_dry_run and not a.all_packages else []
    session = Session(
        dry=a.cpu_dry_run,
        settings=DRY_SIZES if a.cpu_dry_run else GPU_SIZES,
        work=work,
        env=child_env(os.environ, REPO, sys.executable, front),
        procs=Procs(),
        cwd=REPO,
    )
    session.facts["gpu_tests"] = a.gpu_tests
    info = machine()
    signal.signal(signal.SIGTERM, interrupt)  # a `run` that reaches its limit: stop the step, write what is known
    started, t0 = time.time(), time.monotonic()

    def save(results: list[StepResult]) -> tuple[dict[str, Any], str]:
        doc = document(results, session, started, time.monotonic() - t0, total, info)
        text = table(results, doc)
        write_outputs(out, NAME, doc, text, session.logs)
        return doc, text

    print(
        f"gpu_smoke: {'cpu dry run' if session.dry else 'GPU run'}, {len(steps)} steps, budget {total:.0f} s, "
        f"work {work}, out {out}",
        flush=True,
    )

    def saved(rs: list[StepResult]) -> None:  # after each step: what a killed run leaves behind is current
        save(rs)

    results: list[StepResult] = []
    try:
        results = run_steps(steps, session, total, budgets, on_result=saved)
    finally:
        session.procs.stop_all()
        # what a stopped command left running in a session of its own (orch up's preflight probe, say)
        session.facts["strays"] = stop_strays(str(work))
        doc, text = save(results)
        if not a.keep_work and a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    said = doc["proved"]
    print(
        f"\n{text}\nproved: {'; '.join(said['proved']) or 'nothing'}"
        + (f"\nnot proved: {'; '.join(said['not_proved'])}" if said["not_proved"] else "")
        + f"\nJSON: {out / output_names(NAME)[0]}",
        flush=True,
    )
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
