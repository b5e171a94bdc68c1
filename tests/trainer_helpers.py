"""Shared helpers for the trainer tests: datasets, free ports, torchrun runs, a network block.

Run as a script (``python tests/trainer_helpers.py ARGS``, also under torchrun) it installs the
network block in the process and then runs ``trainer.train.main(ARGS)``: any attempt to reach a
non-loopback address raises and is appended to ``$TRAINER_NET_LOG``. With ``$TRAINER_SYNC_LOG``
it also counts the calls that read a tensor back to the host (``item``, ``tolist``, ``float()``...)
made from the trainer's own code, per calling function, and writes them there as JSON at exit.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.ports import job_port

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
LOOPBACK = {"127.0.0.1", "::1", "localhost", "0.0.0.0", "", None}
TRAINER_TIMEOUT_S = 540
"""A trainer run that takes longer hangs (the modules' test timeout is 600 s): runs here take a
minute or two, but under `pytest -n 2` four of them may share the two cores with other work."""


def unplotted(args: list[str]) -> list[str]:
    """``args`` with ``--plots false`` unless they say how to plot: ultralytics' end-of-training
    plots cost about 10 s of CPU per run (matplotlib), which only tests/local/test_trainer_plots.py
    needs to spend; every other run here trains exactly as it would, without drawing."""
    if any(a.startswith(("--plots", "plots=")) for a in args):
        return args
    return [*args, "--plots", "false"]


def make_dataset(root: Path, images: int = 24, classes: int = 3, imgsz: int = 64, segments: bool = False) -> Path:
    """A synthetic YOLO dataset under ``root``; returns its absolute data YAML."""
    sys.path.insert(0, str(REPO))
    from trainer.synth import write_dataset

    return write_dataset(root, images=images, classes=classes, imgsz=imgsz, segments=segments)


def save_checkpoint(path: Path, arch: str, names: list[str], seed: int = 0) -> Any:
    """A pretrained-style checkpoint ``path`` of ``arch`` with classes ``names``, written the way
    ultralytics writes its released weights (the final, stripped form: an fp16 ``model``, its
    ``train_args``, ``epoch`` -1), with random weights and random BatchNorm statistics (so that a
    test can tell them from a fresh model's). Returns the fp32 model it saved."""
    import torch
    from ultralytics.nn.tasks import DetectionModel, SegmentationModel, YOLOEModel, YOLOESegModel
    from ultralytics.utils import DEFAULT_CFG_DICT

    torch.manual_seed(seed)
    seg, yoloe = "-seg" in arch, arch.startswith("yoloe")
    cls = (YOLOESegModel if seg else YOLOEModel) if yoloe else (SegmentationModel if seg else DetectionModel)
    model = cls(arch, nc=len(names), verbose=False)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
    model.names = dict(enumerate(names))
    model.args = {**DEFAULT_CFG_DICT, "task": "segment" if seg else "detect"}
    from copy import deepcopy

    torch.save(
        {
            "epoch": -1,
            "model": deepcopy(model).half(),
            "ema": None,
            "optimizer": None,
            "train_args": dict(model.args),
            "date": "2026-01-01T00:00:00",
            "version": "8.4.190",
        },
        path,
    )
    return model


@dataclass
class Result:
    """What a trainer run left behind."""

    returncode: int
    stdout: str
    stderr: str

    def rank_lines(self, stream: str = "stdout") -> list[str]:
        """Lines the trainer printed (those with the rank prefix)."""
        return [ln for ln in getattr(self, stream).splitlines() if ln.startswith("[rank ")]

    def explain(self) -> str:
        """Both streams, for assertion messages."""
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-6000:]}\n--- stderr\n{self.stderr[-6000:]}"


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a child: repo importable, one thread per rank (2 cores here); the trainer sets its own
    offline switches."""
    e = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    e.update(extra or {})
    return e


def run_trainer(
    args: list[str],
    nproc: int = 0,
    timeout: float = TRAINER_TIMEOUT_S,
    blocked_net_log: Path | None = None,
    cwd: Path | None = None,
    slow_build_s: float = 0.0,
    inf_loss_at: int = 0,
    confusion_log: Path | None = None,
    extra_env: dict[str, str] | None = None,
    default_plots: bool = False,
    overflow_steps: int = 0,
    mkdir_log: Path | None = None,
    late_rank_s: float = 0.0,
) -> Result:
    """Run the trainer: plain ``python -m trainer`` (nproc 0) or torchrun with ``nproc`` ranks.

    With ``blocked_net_log`` the run goes through this file as a script, so every rank runs
    with the network blocked in-process and attempts are logged there; with ``slow_build_s``
    too, and rank 0's first dataset build takes that many seconds longer (a slow file system);
    with ``inf_loss_at``, every rank's loss of that criterion call (1-based) is infinite, once;
    with ``confusion_log``, every confusion matrix ultralytics plots is appended there as a JSON
    line (``{"rank", "normalize", "matrix"}``); with ``overflow_steps``, a GradScaler on the CPU whose
    first that many optimizer steps overflow; with ``mkdir_log``, every directory a rank creates is
    appended there (``{rank} {path}``); with ``late_rank_s``, every rank but 0 starts that many
    seconds late (a peer still importing its libraries). ``extra_env``: more environment for the run.
    The run draws no plots unless ``args`` ask for them (``unplotted``) or ``default_plots`` leaves
    the trainer's default (ultralytics' plots=True) in place.
    """
    args = args if default_plots else unplotted(args)
    script = (
        blocked_net_log is not None
        or slow_build_s > 0
        or inf_loss_at > 0
        or confusion_log is not None
        or overflow_steps > 0
        or mkdir_log is not None
        or late_rank_s > 0
    )
    entry = [str(Path(__file__).resolve())] if script else ["-m", "trainer"]
    if nproc:
        cmd = [
            PYTHON,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(nproc),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(job_port()),
            *entry,
            *args,
        ]
    else:
        cmd = [PYTHON, *entry, *args]
    extra = {"TRAINER_NET_LOG": str(blocked_net_log)} if blocked_net_log else {}
    if slow_build_s:
        extra["TRAINER_SLOW_BUILD_S"] = str(slow_build_s)
    if inf_loss_at:
        extra["TRAINER_INF_LOSS_AT"] = str(inf_loss_at)
    if confusion_log is not None:
        extra["TRAINER_CONFUSION_LOG"] = str(confusion_log)
    if overflow_steps:
        extra["TRAINER_OVERFLOW_STEPS"] = str(overflow_steps)
    if mkdir_log is not None:
        extra["TRAINER_MKDIR_LOG"] = str(mkdir_log)
    if late_rank_s:
        extra["TRAINER_LATE_RANK_S"] = str(late_rank_s)
    extra.update(extra_env or {})
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(extra), cwd=cwd or REPO)
    return Result(p.returncode, p.stdout, p.stderr)


def run_trainers(*runs: tuple[list[str], int]) -> list[Result]:
    """Independent trainer runs ((args, nproc) each) at the same time, their results in order: a
    run leaves a core idle while its torchrun starts and while rank 0 alone validates and saves,
    which the other run fills. For runs whose results do not depend on each other's timing."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(runs)) as pool:
        futures = [pool.submit(run_trainer, args, nproc) for args, nproc in runs]
        return [f.result() for f in futures]


RESUME_EPOCHS, RESUME_BATCH = 3, 4
RESUME_FLAGS = [
    "--model",
    "yolo12n.yaml",
    "--epochs",
    str(RESUME_EPOCHS),
    "--batch",
    str(RESUME_BATCH),
    "--imgsz",
    "64",
    "--log-every",
    "2",
    "--seed",
    "1",
    "--warmup-epochs",
    "1",
    "--workers",
    "0",
    "--val-period",
    "0",
    "--lr",
    "0.05",
    "--accumulate",
    "1",
    "--close-mosaic",
    "0",
]
"""The run every exact-resume test interrupts: 2 ranks, 3 epochs of 64 px, mosaic all the way
(close_mosaic=0), augmentation in the process (workers 0). What the resumed runs must end with
is this run uninterrupted (`trainer_reference`)."""


@dataclass(frozen=True)
class Reference:
    """The uninterrupted run of RESUME_FLAGS on `data`, 2 ranks (torchrun, gloo)."""

    data: Path
    """The dataset's data YAML (20 synthetic images): resumed runs train on this same file."""
    out: Path
    result: Result

    def checksum(self, rank: int) -> str:
        """The parameter checksum rank `rank` ended with (its --debug-dir record)."""
        return str(json.loads((self.out.parent / "debug" / f"rank{rank}.json").read_text())["checksum"])

    def rows(self) -> list[dict[str, float]]:
        return read_results(self.out)

    def to_json(self) -> str:
        return json.dumps({"data": str(self.data), "out": str(self.out), "result": vars(self.result)})

    @classmethod
    def from_json(cls, text: str) -> Reference:
        doc = json.loads(text)
        return cls(Path(doc["data"]), Path(doc["out"]), Result(**doc["result"]))

    def args(self, **paths: Any) -> list[str]:
        """RESUME_FLAGS on this dataset, plus e.g. out=..., debug_dir=... (as --out, --debug-dir)."""
        extra = [a for k, v in paths.items() for a in (f"--{k.replace('_', '-')}", str(v))]
        return [*RESUME_FLAGS, "--data", str(self.data), *extra]


def make_reference(root: Path) -> Reference:
    """Train the reference under `root` (its dataset, run and debug records)."""
    data = make_dataset(root / "ds", images=20)
    ref = Reference(data, root / "run", Result(0, "", ""))
    result = run_trainer(ref.args(out=ref.out, debug_dir=root / "debug"), nproc=2)
    assert result.returncode == 0, result.explain()
    return Reference(data, ref.out, result)


def read_results(run_dir: Path) -> list[dict[str, float]]:
    """results.csv rows as floats."""
    with open(run_dir / "results.csv") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def read_debug(debug_dir: Path, world_size: int) -> list[dict[str, Any]]:
    """Every rank's debug record, in rank order."""
    return [json.loads((debug_dir / f"rank{r}.json").read_text()) for r in range(world_size)]


def train_loss(row: dict[str, float]) -> float:
    """Sum of the train loss components of a results.csv row."""
    return sum(v for k, v in row.items() if k.startswith("train/"))


def _is_loopback(host: Any) -> bool:
    """Whether ``host`` (name or address) stays on this machine."""
    return host in LOOPBACK or (isinstance(host, str) and host.startswith("127."))


def install_network_block(log: Path) -> None:
    """Make every non-loopback connect or name lookup in this process raise, and log it."""

    def refuse(what: str) -> OSError:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {what}\n")
        return OSError(f"network blocked by test: {what}")

    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
            raise refuse(f"connect {address}")
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
            raise refuse(f"connect_ex {address}")
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not _is_loopback(host):
            raise refuse(f"getaddrinfo {host}")
        return real_getaddrinfo(host, *args, **kwargs)

    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
    socket.getaddrinfo = getaddrinfo


HOST_READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__", "__format__")
"""Tensor methods that wait for the device and copy a value to the host."""


def install_sync_counter(log: Path) -> None:
    """Count host reads of tensors made directly by trainer/ code, by (file, function); dump at exit."""
    import atexit
    from collections import Counter

    import torch

    counts: Counter[str] = Counter()
    trainer_dir = str(REPO / "trainer")

    def wrap(name: str) -> None:
        real = getattr(torch.Tensor, name)

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_code
            if caller.co_filename.startswith(trainer_dir):
                counts[f"{Path(caller.co_filename).name}:{caller.co_name}"] += 1
            return real(self, *args, **kwargs)

        setattr(torch.Tensor, name, counted)

    for name in HOST_READS:
        wrap(name)
    atexit.register(lambda: log.write_text(json.dumps(counts)))


def run_trainer_counting_syncs(
    args: list[str], log: Path, timeout: float = TRAINER_TIMEOUT_S
) -> tuple[Result, dict[str, int]]:
    """One plain process of the trainer with the host-read counter; returns its result and the counts."""
    p = subprocess.run(
        [PYTHON, str(Path(__file__).resolve()), *unplotted(args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env({"TRAINER_SYNC_LOG": str(log)}),
        cwd=REPO,
    )
    return Result(p.returncode, p.stdout, p.stderr), json.loads(log.read_text()) if log.exists() else {}


def run_nodes(
    args: list[str], homes: list[Path], timeout: float = TRAINER_TIMEOUT_S, extra_env: dict[str, str] | None = None
) -> list[Result]:
    """A job of ``len(homes)`` torchrun "nodes" of one process each on this machine, every node with its
    own HOME: paths under ``~/`` are node-local, as on machines that share no storage. A node still
    running after ``timeout`` seconds is killed and raises ``subprocess.TimeoutExpired``."""
    port = job_port()
    procs = []
    for rank, home in enumerate(homes):
        home.mkdir(parents=True, exist_ok=True)
        cmd = [
            PYTHON,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(len(homes)),
            "--node-rank",
            str(rank),
            "--nproc-per-node",
            "1",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "-m",
            "trainer",
            *unplotted(args),
        ]
        procs.append(
            subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env({**(extra_env or {}), "HOME": str(home)}),
                cwd=REPO,
                start_new_session=True,
            )
        )
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append(Result(p.returncode, out, err))
    finally:
        for p in procs:  # a node that hangs (the others gone) must not outlive the test
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)  # torchrun and its worker: the node's own process group
                p.wait()
    return results


def install_slow_build(seconds: float) -> None:
    """Make this process's first dataset build take ``seconds`` longer (the fault a test injects:
    a label scan or image cache on a slow file system)."""
    import time

    import trainer.data as tdata

    build = tdata.build_dataset
    slowed = [False]

    def slow(*args: Any, **kwargs: Any) -> Any:
        if not slowed[0]:
            slowed[0] = True
            time.sleep(seconds)  # the injected slowness itself, not a wait for anything
        return build(*args, **kwargs)

    tdata.build_dataset = slow


def install_inf_loss(at: int) -> None:
    """Make the training loss of this process's ``at``-th criterion call (1-based, counted over the
    run) infinite, once: the fault a test injects, as an fp16 overflow or a bad label would."""
    import trainer.loop as tloop

    advance = tloop.advance_criterion
    calls = [0]

    def patched(model: Any, epoch: int) -> None:
        advance(model, epoch)
        criterion = model.criterion
        if getattr(criterion, "inf_at", None) is not None:
            return
        original = type(criterion).__call__

        class InfOnce(type(criterion)):  # type: ignore[misc]
            def __call__(self, preds: Any, batch: Any) -> Any:
                loss, items = original(self, preds, batch)
                calls[0] += 1
                if calls[0] == at:
                    print(f"[test] criterion call {at}: loss made infinite", file=sys.stderr, flush=True)
                    loss = loss * float("inf")
                return loss, items

        criterion.__class__ = InfOnce
        criterion.inf_at = at

    tloop.advance_criterion = patched


def install_overflowing_scaler(steps: int) -> None:
    """Train with a real GradScaler on the CPU whose first ``steps`` optimizer steps overflow (a
    gradient made infinite before unscaling, as an fp16 backward makes it while the scale is too
    high): fp16's warm-up, which a CPU cannot run itself."""
    import torch

    import trainer.loop as tloop

    build = tloop.build_parts

    class Overflowing(torch.amp.GradScaler):
        seen = 0

        def unscale_(self, optimizer: Any) -> None:
            if Overflowing.seen < steps:
                grad = next(p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None)
                grad.view(-1)[0] = float("inf")
            Overflowing.seen += 1
            super().unscale_(optimizer)

    def with_scaler(*args: Any, **kwargs: Any) -> Any:
        parts, train_set, val_set = build(*args, **kwargs)
        parts.scaler = Overflowing("cpu")
        return parts, train_set, val_set

    tloop.build_parts = with_scaler


def install_mkdir_record(log: Path) -> None:
    """Append every directory this process creates (``os.mkdir``, which ``Path.mkdir`` and
    ``os.makedirs`` call) to ``log`` as ``{RANK} {absolute path}``, then create it."""
    real = os.mkdir
    rank = os.environ.get("RANK", "-1")

    def recorded(path: Any, *args: Any, **kwargs: Any) -> None:
        with open(log, "a") as f:
            f.write(f"{rank} {os.path.abspath(os.fspath(path))}\n")
        real(path, *args, **kwargs)

    os.mkdir = recorded


def install_confusion_record(log: Path) -> None:
    """Append every confusion matrix ultralytics plots in this process to ``log`` (one JSON line
    each, before it is drawn): what the plot shows, as numbers a test can count."""
    from ultralytics.utils.metrics import ConfusionMatrix

    plot = ConfusionMatrix.plot

    def recorded(self: Any, normalize: bool = True, *args: Any, **kwargs: Any) -> Any:
        with open(log, "a") as f:
            f.write(
                json.dumps(
                    {"rank": int(os.environ.get("RANK", "-1")), "normalize": normalize, "matrix": self.matrix.tolist()}
                )
                + "\n"
            )
        return plot(self, normalize, *args, **kwargs)

    ConfusionMatrix.plot = recorded  # type: ignore[method-assign]


if __name__ == "__main__":
    if os.environ.get("TRAINER_LATE_RANK_S") and os.environ.get("RANK", "0") != "0":
        time.sleep(float(os.environ["TRAINER_LATE_RANK_S"]))
    if os.environ.get("TRAINER_SYNC_LOG"):
        install_sync_counter(Path(os.environ["TRAINER_SYNC_LOG"]))
    if os.environ.get("TRAINER_NET_LOG"):
        install_network_block(Path(os.environ["TRAINER_NET_LOG"]))
    sys.path.insert(0, str(REPO))
    if os.environ.get("TRAINER_SLOW_BUILD_S") and os.environ.get("RANK", "0") == "0":
        install_slow_build(float(os.environ["TRAINER_SLOW_BUILD_S"]))
    if os.environ.get("TRAINER_INF_LOSS_AT"):
        install_inf_loss(int(os.environ["TRAINER_INF_LOSS_AT"]))
    if os.environ.get("TRAINER_OVERFLOW_STEPS"):
        install_overflowing_scaler(int(os.environ["TRAINER_OVERFLOW_STEPS"]))
    if os.environ.get("TRAINER_MKDIR_LOG"):
        install_mkdir_record(Path(os.environ["TRAINER_MKDIR_LOG"]))
    if os.environ.get("TRAINER_CONFUSION_LOG"):
        from trainer.offline import set_offline_env

        set_offline_env()  # before ultralytics is imported, as trainer.train does
        install_confusion_record(Path(os.environ["TRAINER_CONFUSION_LOG"]))
    from trainer.train import main

    main(sys.argv[1:])
