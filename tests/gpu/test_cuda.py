"""The paths only a CUDA GPU reaches: the trainer's mixed-precision step (fp16 with GradScaler,
bf16) and channels_last, fp16's warm-up against divergence and the NaN guard, exact resume and the
throughput table, SyncBatchNorm under DDP on two GPUs, a one-rank NCCL process group (the trainer's
collectives and the fabric check's job), the probe's real nvidia-smi output through
`parsers.parse_gpus` and the `gpus` check, and the torch build's architecture list against this GPU.

tests/unit/test_gpu_tier.py holds every call here to the current signatures (a GPU run is rare:
the tier must not drift between them).

Collected everywhere, run where torch sees a GPU (`make test-gpu`, or `pytest -m gpu tests/gpu` on
a GPU machine); elsewhere each is skipped with the reason, also under ORCH_TEST_STRICT=1 (no
package installs a GPU). They use GPU 0 and little memory, and take seconds.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the shared test helpers
from tests.ports import job_port  # noqa: E402
from tests.trainer_helpers import make_dataset, read_debug, read_results, run_trainer, train_loss  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False"),
]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """32 synthetic 64 px images (8 steps of 4 per epoch): enough for a GradScaler to settle."""
    return make_dataset(tmp_path_factory.mktemp("ds"), images=40, classes=3, imgsz=64)


def cuda_inputs(data: Path, *argv: str) -> Any:
    from trainer.offline import set_offline_env

    set_offline_env()  # before ultralytics is imported
    from trainer import loop
    from trainer.config import parse_config
    from trainer.dist import Topology, select_device

    cfg = parse_config(
        [
            "--data",
            str(data),
            "--imgsz",
            "64",
            "--batch",
            "4",
            "--workers",
            "0",
            "--val-period",
            "0",
            "--device",
            "cuda:0",
            "--seed",
            "1",
            *argv,
        ]
    )
    return loop.prepare(cfg, Topology(), select_device(cfg.device, Topology()))


def native_bf16() -> str | None:
    """Why bf16 cannot run here (the trainer refuses it before compute capability 8.0), or None."""
    major, minor = torch.cuda.get_device_capability(0)
    return (
        None
        if major >= 8
        else f"GPU 0 has compute capability {major}.{minor}: no native bfloat16, --amp bf16 is refused"
    )


def is_spatial_conv(m: torch.nn.Module) -> bool:
    """A conv whose weight looks different in channels_last (several channels, a kernel over 1x1)."""
    return isinstance(m, torch.nn.Conv2d) and m.weight.shape[1] > 1 and m.weight.shape[2] > 1


@pytest.mark.parametrize("amp, dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_an_epoch_under_autocast_computes_in_that_dtype_and_trains(data: Path, amp: str, dtype: torch.dtype) -> None:
    """The trainer's own train_epoch on CUDA: convs compute in fp16/bf16, the loss stays finite,
    the weights move; fp16 goes through a GradScaler (unscale before clipping), bf16 needs none."""
    from trainer import loop

    if amp == "bf16" and native_bf16():
        pytest.skip(str(native_bf16()))
    inp = cuda_inputs(data, "--amp", amp, "--lr", "0.01")
    assert inp.amp == amp and inp.device.type == "cuda"
    parts, train_set, _ = loop.build_parts(inp, 4)
    assert (parts.scaler is not None) == (amp == "fp16")
    seen: list[torch.dtype] = []
    convs = [m for m in parts.model.modules() if isinstance(m, torch.nn.Conv2d)]
    hooks = [c.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype)) for c in convs]
    before = [p.detach().clone() for p in parts.model.parameters()]
    loader = loop.make_loader(train_set, 4, inp, restore=None)
    try:
        for epoch in range(3):  # fp16 skips steps while its scale falls from 2^16: an epoch of 8 may skip them all
            means, throughput, health = loop.train_epoch(epoch, loader, parts, inp, loop.State())
            assert not health.broken, health.why()
            if health.skipped < health.steps:
                break
    finally:
        for h in hooks:
            h.remove()
    torch.cuda.synchronize()
    assert seen and set(seen) == {dtype}, sorted(set(map(str, seen)))
    assert means and all(math.isfinite(v) and v > 0 for v in means.values()), means
    assert len(throughput) == 1 and throughput[0][0] > 0  # one rank; its images after the first step
    assert health.nonfinite == 0 and health.skipped < health.steps, health
    moved = [not torch.equal(a, b) for a, b in zip(before, parts.model.parameters())]
    assert any(moved), "no optimizer step changed a weight"
    assert all(torch.isfinite(p).all() for p in parts.model.parameters())
    if parts.scaler is not None:
        assert 0 < parts.scaler.get_scale() < math.inf
    else:
        assert health.skipped == 0


def test_fp16_warm_up_that_skips_a_whole_epoch_is_not_divergence(data: Path) -> None:
    """A GradScaler that starts far too high (2^40: every step of the first epoch overflows, as a
    short first epoch does from 2^16 on 32 GPUs) skips every step of an epoch; the epoch is not
    broken, the scale halved once per step, and training goes on to change the weights."""
    from trainer import loop

    inp = cuda_inputs(data, "--amp", "fp16", "--lr", "0.01", "--accumulate", "1")  # a step per batch: 8 an epoch
    parts, train_set, _ = loop.build_parts(inp, 4)
    parts.scaler = torch.amp.GradScaler("cuda", init_scale=2.0**40)
    loader = loop.make_loader(train_set, 4, inp, restore=None)
    before = [p.detach().clone() for p in parts.model.parameters()]
    _, _, first = loop.train_epoch(0, loader, parts, inp, loop.State())
    assert first.steps > 0 and first.skipped == first.steps and first.nonfinite == 0, first
    assert first.scale == 2.0 ** (40 - first.steps) and not first.broken, first.why()
    assert all(torch.equal(a, b) for a, b in zip(before, parts.model.parameters()))  # skipped: nothing moved
    for epoch in range(1, 8):  # from 2^32 down to where fp16 fits: about 20 more skipped steps
        _, _, health = loop.train_epoch(epoch, loader, parts, inp, loop.State())
        assert not health.broken, health.why()
        if health.skipped < health.steps:
            break
    assert health.skipped < health.steps, f"the scale never fitted: {health}"
    assert any(not torch.equal(a, b) for a, b in zip(before, parts.model.parameters()))


def make_loss_infinite(model: Any, every: int) -> list[int]:
    """Make every ``every``-th call of ``model``'s criterion return an infinite loss (the fault an
    fp16 overflow or a bad label makes); returns the calls made to it, counted."""
    if getattr(model, "criterion", None) is None:
        model.criterion = model.init_criterion()
    criterion, calls = model.criterion, [0]
    original = type(criterion).__call__

    class Infinite(type(criterion)):  # type: ignore[misc]
        def __call__(self, preds: Any, batch: Any) -> Any:
            loss, items = original(self, preds, batch)
            calls[0] += 1
            return (loss * float("inf"), items) if calls[0] % every == 0 else (loss, items)

    criterion.__class__ = Infinite
    return calls


@pytest.mark.parametrize("amp", ["fp16", "bf16"])
def test_the_nan_guard_on_cuda(data: Path, amp: str) -> None:
    """An infinite loss on CUDA: under fp16 the GradScaler skips that step, the guard counts it and
    the weights stay finite (not broken); under bf16 (no scaler) every loss infinite makes the
    weights non-finite, and the guard calls the epoch broken (recovery from last.pt)."""
    from trainer import loop

    if amp == "bf16" and native_bf16():
        pytest.skip(str(native_bf16()))
    inp = cuda_inputs(data, "--amp", amp, "--lr", "0.01", "--accumulate", "1")  # a step per batch
    parts, train_set, _ = loop.build_parts(inp, 4)
    loop.advance_criterion(parts.model, 0)
    calls = make_loss_infinite(parts.model, every=3 if amp == "fp16" else 1)
    _, _, health = loop.train_epoch(0, loop.make_loader(train_set, 4, inp, restore=None), parts, inp, loop.State())
    assert calls[0] == 8 and health.nonfinite == (2 if amp == "fp16" else 8), (calls, health)
    if amp == "fp16":
        assert health.skipped >= 2 and health.finite and not health.broken, health
        assert all(torch.isfinite(p).all() for p in parts.model.parameters())
    else:
        assert not health.finite and health.broken and "no longer finite" in health.why(), health


def test_the_model_trains_in_channels_last_on_cuda(data: Path) -> None:
    """On CUDA the trainer converts the model to channels_last (ultralytics does not): every
    spatial conv's weight is laid out NHWC, and a step keeps it so. fp16, which every CUDA GPU
    runs (bf16 is refused before compute capability 8.0)."""
    from trainer import loop

    inp = cuda_inputs(data, "--amp", "fp16")
    parts, train_set, _ = loop.build_parts(inp, 4)
    convs = [m for m in parts.model.modules() if is_spatial_conv(m)]
    assert convs
    assert all(c.weight.is_cuda and c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
    assert not any(c.weight.is_contiguous() for c in convs)  # not merely contiguous both ways
    loop.train_epoch(0, loop.make_loader(train_set, 4, inp, restore=None), parts, inp, loop.State())
    assert all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)


def test_a_one_rank_nccl_group_reduces_and_the_trainers_collectives_work_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """init (as trainer/dist.py does on CUDA: nccl, device_id), all_reduce, the trainer's own
    collectives on it, and the trainer's close, after which no group is left."""
    import torch.distributed as dist

    from trainer import dist as tdist

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(job_port()))
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    try:
        assert dist.get_backend() == "nccl" and dist.get_world_size() == 1
        t = torch.arange(1024, dtype=torch.float32, device=device)
        dist.all_reduce(t)
        torch.cuda.synchronize()
        assert torch.equal(t.cpu(), torch.arange(1024, dtype=torch.float32))
        row = torch.tensor([1.0, 2.5, 4.0], dtype=torch.float64, device=device)
        assert tdist.gather_rows(row) == [[1.0, 2.5, 4.0]]
        assert tdist.any_rank(True) is True and tdist.any_rank(False) is False
        assert tdist.broadcast_object({"out": "/runs/x", "epoch": 3}) == {"out": "/runs/x", "epoch": 3}
        tdist.barrier()
        assert torch.cuda.nccl.version()  # the NCCL torch was built with, as the fabric check reports it
    finally:
        tdist.close()
    assert not dist.is_initialized()


def test_the_fabric_job_runs_over_nccl_on_one_gpu() -> None:
    """The fabric check's job (orchestrator/node/jobs/allreduce.py) under torchrun, one rank, nccl:
    the device is CUDA, nothing comes back wrong, and the NCCL version is reported."""
    from orchestrator.node.jobs import allreduce as job

    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(job_port()),
        job.__file__,
        "--backend",
        "nccl",
        "--max-bytes",
        "4M",
    ]
    env = {**os.environ, "ORCH_NODE": "gpu0", "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")}
    p = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    (line,) = [x for x in p.stdout.splitlines() if x.startswith(job.MARKER + " ")]
    r = json.loads(line.split(" ", 1)[1])
    assert (r["backend"], r["device"], r["world_size"]) == ("nccl", "cuda", 1)
    assert re.fullmatch(r"\d+\.\d+\.\d+", r["nccl"] or ""), r["nccl"]
    assert r["sweep"] and all(s["wrong"] == 0 and s["time_us"] > 0 for s in r["sweep"]), r["sweep"]


@pytest.fixture
def nvidia_smi() -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        pytest.skip("torch sees a GPU but nvidia-smi is not on PATH")
    return exe


def test_the_probes_real_nvidia_smi_output_parses_to_this_machines_gpus(
    nvidia_smi: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.node import probe
    from orchestrator.preflight.parsers import parse_gpus

    monkeypatch.delenv("ORCH_PROBE_FIXTURES", raising=False)
    raw = probe.gather_gpus()
    assert raw["source"] == "nvidia-smi" and raw["query"]["rc"] == 0 and raw["table"]["rc"] == 0, raw
    facts = parse_gpus(raw)
    assert facts.error is None and facts.source == "nvidia-smi"
    assert len(facts.gpus) >= torch.cuda.device_count() >= 1  # nvidia-smi ignores CUDA_VISIBLE_DEVICES
    assert [g.index for g in facts.gpus] == list(range(len(facts.gpus)))
    assert all(re.fullmatch(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]", g.bus_id) for g in facts.gpus)
    assert facts.driver and re.fullmatch(r"\d+\.\d+(\.\d+)?", facts.driver), facts.driver
    assert facts.cuda and re.fullmatch(r"\d+\.\d+", facts.cuda), facts.cuda  # from the table's header
    assert {g.driver for g in facts.gpus} == {facts.driver}
    props = torch.cuda.get_device_properties(0)
    if "MIG" in props.name:  # torch sees a MIG slice ("NVIDIA H200 MIG 1g.18gb"); nvidia-smi the whole GPU
        assert any(g.name in props.name for g in facts.gpus), (props.name, facts.gpus)
    else:
        assert props.name in {g.name for g in facts.gpus}, (props.name, facts.gpus)
        total = props.total_memory / 2**20
        assert any(g.memory_total_mib and abs(g.memory_total_mib - total) <= 0.03 * total for g in facts.gpus), (
            total,
            [g.memory_total_mib for g in facts.gpus],
        )
    assert all(g.memory_total_mib and g.memory_used_mib is not None for g in facts.gpus), facts.gpus


def test_orch_check_gpus_passes_on_this_machine(nvidia_smi: str, tmp_path: Path) -> None:
    """`orch check --only gpus` on a one-node local inventory declaring this machine's GPUs: the
    probe runs nvidia-smi, the controller parses and judges it."""
    import yaml

    listed = listed_gpus(nvidia_smi)
    count = len(listed)
    inv = tmp_path / "gpu.yaml"
    inv.write_text(
        yaml.safe_dump(
            {
                "name": "gpu-smoke",
                "transport": "local",
                "nodes": [{"host": "localhost", "name": "gpu0", "gpus": count, "nproc_per_node": 1}],
                "master": {"port": job_port()},
                "job": {"python": sys.executable, "workdir": str(tmp_path), "run_root": str(tmp_path / "nodes")},
            }
        )
    )
    env = {**os.environ, "ORCH_HOME": str(tmp_path / "home"), "NO_COLOR": "1"}
    env.pop("ORCH_PROBE_FIXTURES", None)
    p = subprocess.run(
        [sys.executable, "-m", "orchestrator", "check", str(inv), "--only", "gpus", "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=REPO,
    )
    report = json.loads(p.stdout)
    (row,) = [r for r in report["results"] if r["check"] == "gpus"]
    assert row["status"] in ("ok", "warn"), row  # warn: another process already uses a GPU
    assert p.returncode == 0, p.stderr
    assert row["value"].startswith(f"{count} × ") and listed[0] in row["value"], row


def listed_gpus(nvidia_smi: str) -> list[str]:
    """The GPU names `nvidia-smi -L` lists (`GPU 0: NVIDIA H200 (UUID: ...)`; MIG slices are
    indented under their GPU): an independent count and name to hold the probe and check to."""
    out = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    names = [m.group(1) for m in re.finditer(r"^GPU \d+: (.+?) \(UUID: ", out.stdout, re.M)]
    assert names, out.stdout
    return names


def test_the_torch_build_has_code_for_this_gpu() -> None:
    """torch.cuda.get_arch_list(): a kernel image for this GPU's compute capability (sm_XY of the
    same major, minor at most this one's), or PTX (compute_XY) it can JIT; otherwise every kernel
    launch fails with `no kernel image is available`."""
    arch = torch.cuda.get_arch_list()
    assert arch and all(re.fullmatch(r"(sm|compute)_\d+[a-z]?", a) for a in arch), arch
    major, minor = torch.cuda.get_device_capability(0)
    sass = [a for a in arch if a.startswith("sm_")]
    ptx = [a for a in arch if a.startswith("compute_")]

    def cc(a: str) -> tuple[int, int]:
        digits = re.sub(r"\D", "", a.split("_")[1])
        return int(digits[:-1]), int(digits[-1])

    runs = [a for a in sass if cc(a)[0] == major and cc(a)[1] <= minor]
    jit = [a for a in ptx if cc(a) <= (major, minor)]
    assert runs or jit, f"compute capability {major}.{minor} but this torch has {arch}"
    x = torch.ones(4, device="cuda:0") * 2  # a kernel runs
    assert x.sum().item() == 8


def test_bf16_is_refused_exactly_on_a_gpu_without_native_bfloat16() -> None:
    """`--amp bf16` is refused exactly on a GPU without native bfloat16 (compute capability < 8.0),
    read from the device itself."""
    from trainer.errors import TrainerError
    from trainer.loop import resolve_amp

    device = torch.device("cuda", 0)
    if native_bf16():
        with pytest.raises(TrainerError, match="without native bfloat16"):
            resolve_amp("bf16", device)
    else:
        assert resolve_amp("bf16", device) == "bf16"
    assert resolve_amp("auto", device) == "fp16"


def test_resume_on_cuda_continues_exactly_and_the_throughput_table_is_logged(tmp_path: Path) -> None:
    """Killed after epoch 1 of 2 and resumed on GPU 0 (fp16, deterministic algorithms: the default), beside the
    uninterrupted run: the resumed run trains epoch 2 only and ends where the uninterrupted one does,
    bit for bit when epoch 1 itself was (the same code from the same seed: if epoch 1 differs, this
    GPU's kernels are not deterministic and only closeness can be asked). 16 optimizer steps an
    epoch (--batch 2 --accumulate 1): past fp16's warm-up, whose skipped steps change nothing (with
    --batch 8 both epochs' 2 steps were skips, and the comparison compared untrained weights), so
    the weights the comparison compares moved in epoch 2. The uninterrupted run's throughput table:
    one row for its one rank, a total, as `orch report` reads it."""
    from trainer.logs import parse_throughput

    data = make_dataset(tmp_path / "ds", images=40, classes=3, imgsz=64)
    flags = [
        "--model",
        "yolo12n.yaml",
        "--data",
        str(data),
        "--epochs",
        "2",
        "--batch",
        "2",
        "--accumulate",
        "1",
        "--imgsz",
        "64",
        "--device",
        "0",
        "--amp",
        "fp16",
        "--seed",
        "1",
        "--workers",
        "0",
        "--val-period",
        "0",
        "--warmup-epochs",
        "0",
        "--log-every",
        "4",
    ]
    full = run_trainer([*flags, "--out", str(tmp_path / "full"), "--debug-dir", str(tmp_path / "df")])
    assert full.returncode == 0, full.explain()
    cut = run_trainer([*flags, "--out", str(tmp_path / "cut"), "--debug-exit-after", "1"])
    assert cut.returncode != 0 and len(read_results(tmp_path / "cut")) == 1, cut.explain()
    resumed = run_trainer([*flags, "--out", str(tmp_path / "cut"), "--resume", "--debug-dir", str(tmp_path / "dc")])
    assert resumed.returncode == 0, resumed.explain()
    assert any("resuming at epoch 2 (checkpoint finished epoch 1, " in ln for ln in resumed.rank_lines())
    assert not any(" epoch 1/2 " in ln for ln in resumed.rank_lines())
    a, b = read_results(tmp_path / "full"), read_results(tmp_path / "cut")
    assert len(a) == len(b) == 2
    steps = 16  # 32 training images, 2 a step
    assert a[1]["steps/skipped"] < steps and b[1]["steps/skipped"] < steps, (a, b)  # epoch 2 moved the weights
    df, dc = read_debug(tmp_path / "df", 1)[0], read_debug(tmp_path / "dc", 1)[0]
    if train_loss(a[0]) == train_loss(b[0]):
        assert train_loss(b[1]) == train_loss(a[1]) and dc["checksum"] == df["checksum"], (a, b)
    else:
        assert train_loss(b[1]) == pytest.approx(train_loss(a[1]), rel=1e-2), (a, b)
    table = parse_throughput(full.rank_lines())
    assert table.epoch == 2 and list(table.ips) == [0] and table.ips[0] > 0 and table.total is not None
    assert table.total > 0, full.rank_lines()[-10:]


def test_sync_bn_under_ddp_on_two_gpus(tmp_path: Path) -> None:
    """torchrun, 2 ranks on GPUs 0 and 1, --sync-bn, 2 images per rank: the model trains with
    SyncBatchNorm (no small-batch warning then), the ranks end with identical weights, and last.pt
    holds plain BatchNorm (it loads without a process group)."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"SyncBatchNorm under DDP needs 2 GPUs; torch sees {torch.cuda.device_count()}")
    data = make_dataset(tmp_path / "ds", images=24, classes=3, imgsz=64)
    r = run_trainer(
        [
            "--model",
            "yolo12n.yaml",
            "--data",
            str(data),
            "--epochs",
            "1",
            "--batch",
            "4",
            "--imgsz",
            "64",
            "--device",
            "0,1",
            "--sync-bn",
            "--workers",
            "0",
            "--val-period",
            "0",
            "--seed",
            "1",
            "--out",
            str(tmp_path / "run"),
            "--debug-dir",
            str(tmp_path / "d"),
        ],
        nproc=2,
    )
    assert r.returncode == 0, r.explain()
    assert not any("without SyncBN" in ln for ln in r.rank_lines()), r.rank_lines()[:8]
    ranks = read_debug(tmp_path / "d", 2)
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    ckpt = torch.load(tmp_path / "run" / "weights" / "last.pt", map_location="cpu", weights_only=False)
    kinds = {type(m).__name__ for m in ckpt["model"].modules()}
    assert "BatchNorm2d" in kinds and "SyncBatchNorm" not in kinds, kinds


def test_yoloe_prompt_embeddings_move_with_the_model() -> None:
    """`model.pe` is a plain attribute that `.to()` leaves on the host; `models.to_device` moves it."""
    from trainer import models
    from trainer.offline import set_offline_env

    set_offline_env()
    from ultralytics.nn.tasks import YOLOEModel

    model = YOLOEModel("yoloe-11s.yaml", nc=2, verbose=False)
    model.set_classes(["a", "b"], torch.zeros(1, 2, model.model[-1].embed))
    moved = models.to_device(model, torch.device("cuda", 0))
    assert moved.pe.device.type == "cuda" and next(moved.parameters()).device.type == "cuda"


def test_the_forwards_syncbatchnorm_is_timed_apart_with_cuda_events() -> None:
    """On a GPU the pace is CUDA events, read once per window: a SyncBatchNorm layer's forward is
    timed apart from the rest of the forward (sync_s), and compute_s is what is left."""
    from trainer import pace as tpace
    from trainer.logs import parse_timing

    device = torch.device("cuda", 0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3), torch.nn.SyncBatchNorm(64), torch.nn.Conv2d(64, 64, 3)).to(
        device
    )
    pace = tpace.Pace(device, tpace.collective_layers(net))
    try:
        for _ in range(3):
            pace.forward_begins()
            net(torch.randn(8, 3, 128, 128, device=device)).sum()
            pace.forward_ends(8)
        t = parse_timing(pace.line(1, 3))
    finally:
        pace.close()
    assert t is not None and t.steps == 3 and t.images == 24
    assert t.sync_s > 0 and t.compute_s > 0 and t.sync_s + t.compute_s <= t.wall_s, t


def test_what_needs_bfloat16_follows_this_gpu() -> None:
    """--ddp-grad-dtype bf16 and MuSGD are refused exactly where --amp bf16 is, and --optimizer
    auto trains SGD instead of MuSGD there, from the device's own compute capability."""
    from trainer import loop
    from trainer.config import parse_config

    device = torch.device("cuda", 0)
    capability = torch.cuda.get_device_capability(0)
    cfg = parse_config(["--data", "/d.yaml", "--ddp-grad-dtype", "bf16", "--optimizer", "MuSGD"])
    problems = loop.capability_problems(cfg, device, capability)
    chosen = loop.auto_optimizer("auto", 30_000, device, capability)
    if native_bf16():
        assert len(problems) == 2 and chosen is not None and chosen[0][0] == "SGD", (problems, chosen)
    else:
        assert problems == [] and chosen is None


def test_the_gradient_all_reduce_hook_on_nccl_sends_half_the_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """DDP on GPU 0 in a one-rank NCCL group: fp16 all-reduces (the compression hook) count half
    fp32's bytes per step, and the gradients they bring back are fp32's to fp16's precision."""
    import torch.distributed as dist

    from trainer import dist as tdist
    from trainer import loop

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(job_port()))
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    try:
        grads, sent = {}, {}
        for dtype in ("fp32", "fp16"):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 256)).to(device)
            ddp, comm = loop.wrap_ddp(model, device, False, dtype, bucket_mb=1.0, count=True)
            assert comm is not None
            for _ in range(2):
                ddp(torch.ones(16, 256, device=device)).square().mean().backward()
            torch.cuda.synchronize()
            grads[dtype] = torch.cat([p.grad.flatten() for p in model.parameters()])
            sent[dtype] = comm.record()
        assert sent["fp16"]["steps"] == sent["fp32"]["steps"] == 2
        assert sent["fp16"]["bytes_per_step"] * 2 == sent["fp32"]["bytes_per_step"]
        assert torch.allclose(grads["fp16"], grads["fp32"], rtol=2e-3, atol=1e-4)
    finally:
        tdist.close()
    assert not dist.is_initialized()
