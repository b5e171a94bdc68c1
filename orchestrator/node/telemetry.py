"""Telemetry of one node while its job runs: every GPU, the node's CPU and memory, each rank.

Shipped beside `agent.py` (a module of the agent, `node.AGENT_MODULES`): stdlib only, Python >= 3.8,
nothing of orch. The agent runs `Sampler.sample()` every `job.telemetry_s` seconds in a thread
of its own and writes what it returns as one line of its node stream:

    <UTC stamp> orch telemetry {"v": 1, "gpus": [...], "cpu_pct": ..., ...}

so the samples travel with the log (the reader ships them, `orch logs` merges them by time) and
survive a controller restart. The JSON's fields are docs/CONTRACT.md's ("Telemetry lines"); the
controller reads them back in `orchestrator/logs/telemetry.py`.

GPUs come from NVML through `pynvml` (nvidia-ml-py) where it is installed for the agent's python
and NVML starts (optional: nothing else of the agent needs more than the standard library), else
from `nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits` (one short process per sample;
a missing nvidia-smi is a fact, `gpus` is then empty and `gpu_error` says why). Both give the same
record for the same GPUs. A field
nvidia-smi cannot read (`[N/A]`, `[Not Supported]`) is null; one it reports as broken (`ERR!`,
`[Unknown Error]`, `[GPU is lost]`, `[GPU requires reset]`) makes the GPU's `error` name it.
The node's CPU share and each rank's CPU share come from /proc deltas between two samples (the
first sample has none: null), memory from /proc/meminfo and each rank's RSS from /proc/PID/statm.
A rank is a process below the agent whose environment has torchrun's `RANK` and `LOCAL_RANK`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from typing import Any, Callable

PREFIX = "telemetry "
"""What the text of a telemetry line starts with (then one JSON object)."""
VERSION = 1
NOT_FOUND = "nvidia-smi: not found in PATH"
"""`gpu_error` of a node without nvidia-smi: taken as a node without GPUs (its ranks compute on the CPU)."""
GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "power.draw",
    "clocks.sm",
    "clocks_throttle_reasons.active",
    "fan.speed",
)
"""The `--query-gpu` fields sampled, in this order (`clocks_throttle_reasons.active`: the old
spelling, which newer drivers also accept as `clocks_event_reasons.active`)."""
KEYS = (
    "index",
    "uuid",
    "name",
    "util_pct",
    "mem_used_mb",
    "mem_total_mb",
    "temp_c",
    "power_w",
    "sm_mhz",
    "throttle",
    "fan_pct",
)
"""The JSON key of each field of GPU_FIELDS, in the same order."""
MISSING = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "")
BROKEN = ("ERR!", "[Unknown Error]", "[GPU is lost]", "[GPU requires reset]", "Unknown Error")
THROTTLE_BITS = (
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
)
"""The throttle reasons that slow a busy GPU (NVML's clocksThrottleReasons bits); idle (0x1),
application clocks (0x2), sync boost (0x10) and display clock (0x100) do not count."""


def throttle_names(mask: int) -> list[str]:
    """The slowing reasons set in a throttle bitmask."""
    return [name for bit, name in THROTTLE_BITS if mask & bit]


def parse_gpu_csv(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi --query-gpu=GPU_FIELDS --format=csv,noheader,nounits` → one dict per GPU."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(GPU_FIELDS):
            continue
        gpu: dict[str, Any] = {}
        broken = []
        for key, field, raw in zip(KEYS, GPU_FIELDS, values):
            if raw in BROKEN:
                broken.append(f"{field} {raw}")
                gpu[key] = None
            elif raw in MISSING:
                gpu[key] = None
            elif key in ("uuid", "name"):
                gpu[key] = raw
            elif key == "throttle":
                try:
                    mask = int(raw, 16)
                except ValueError:
                    gpu[key] = None
                    continue
                gpu[key] = throttle_names(mask)
            else:
                try:
                    number = float(raw.split()[0])
                except (ValueError, IndexError):
                    gpu[key] = None
                    continue
                if not math.isfinite(number):  # `nan`, `inf`, `1e999`: no reading
                    gpu[key] = None
                    continue
                gpu[key] = int(number) if key in ("index", "mem_used_mb", "mem_total_mb", "sm_mhz") else number
        gpu["error"] = "; ".join(broken) or None
        gpus.append(gpu)
    return gpus


def read_gpus(
    run: Callable[[list[str]], tuple[int | None, str, str]] | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """(every GPU, why there are none or None)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], NOT_FOUND
    argv = [exe, "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits"]
    rc, out, err = (run or _run)(argv)
    if rc != 0:
        why = (err or out).strip().splitlines()
        return [], f"nvidia-smi exit {rc}: {why[-1] if why else 'no output'}"[:300]
    return parse_gpu_csv(out), None


NVML_LOST = {15: "[GPU is lost]", 16: "[GPU requires reset]"}
"""NVML errors (NVML_ERROR_GPU_IS_LOST, _RESET_REQUIRED) named as nvidia-smi names them; any other
error but the not-there ones (`NVML_ABSENT`) is `ERR!`, as nvidia-smi shows it."""
NVML_ABSENT = (3, 6, 21)
"""NOT_SUPPORTED, NOT_FOUND, NO_DATA: a value the GPU does not have (nvidia-smi's `[N/A]`): null."""


def read_gpus_nvml(nvml: Any) -> list[dict[str, Any]]:
    """Every GPU through NVML (the `pynvml` module of `nvidia-ml-py`, initialised): the same dicts
    as `parse_gpu_csv` gives for nvidia-smi's answer about the same GPUs. Raises nvml.NVMLError
    when the GPUs cannot even be counted."""
    return [_nvml_gpu(nvml, i) for i in range(nvml.nvmlDeviceGetCount())]


def _nvml_gpu(nvml: Any, i: int) -> dict[str, Any]:
    """GPU `i` through NVML, as `parse_gpu_csv` gives it."""
    handle = nvml.nvmlDeviceGetHandleByIndex(i)
    broken: list[str] = []

    def value(field: str, get: Callable[[], Any]) -> Any:
        try:
            return get()
        except nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code not in NVML_ABSENT:
                broken.append(f"{field} {NVML_LOST.get(code, 'ERR!')}")  # type: ignore[arg-type]
            return None

    def text(raw: Any) -> str | None:
        return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw

    # in nvidia-smi's column order, so `error` names the broken fields in the same order
    uuid = text(value("uuid", lambda: nvml.nvmlDeviceGetUUID(handle)))
    name = text(value("name", lambda: nvml.nvmlDeviceGetName(handle)))
    util = value("utilization.gpu", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
    mem = value("memory.used", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    if mem is None and broken and broken[-1].startswith("memory.used "):  # one call answers both columns
        broken.append("memory.total " + broken[-1].split(" ", 1)[1])
    temp = value("temperature.gpu", lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
    power = value("power.draw", lambda: nvml.nvmlDeviceGetPowerUsage(handle))
    sm = value("clocks.sm", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
    mask = value("clocks_throttle_reasons.active", lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
    fan = value("fan.speed", lambda: nvml.nvmlDeviceGetFanSpeed(handle))
    return {
        "index": i,
        "uuid": uuid,
        "name": name,
        "util_pct": float(util.gpu) if util is not None else None,
        "mem_used_mb": int(mem.used) // 2**20 if mem is not None else None,
        "mem_total_mb": int(mem.total) // 2**20 if mem is not None else None,
        "temp_c": float(temp) if temp is not None else None,
        "power_w": power / 1000 if power is not None else None,
        "sm_mhz": int(sm) if sm is not None else None,
        "throttle": throttle_names(int(mask)) if mask is not None else None,
        "fan_pct": float(fan) if fan is not None else None,
        "error": "; ".join(broken) or None,
    }


_nvml_state: dict[str, Any] = {}


def nvml_module() -> Any:
    """`pynvml` initialised once, where nvidia-ml-py is installed and NVML starts; else None
    (nvidia-smi is asked instead). Optional: the agent needs nothing but the standard library."""
    if "module" not in _nvml_state:
        _nvml_state["module"] = None
        try:
            import pynvml  # type: ignore[import-not-found, unused-ignore]

            pynvml.nvmlInit()
            _nvml_state["module"] = pynvml
        except Exception:  # not installed, no driver, a library that does not load: nvidia-smi decides
            pass
    return _nvml_state["module"]


def read_gpus_any(
    nvml: Callable[[], Any] = nvml_module, smi: Callable[[], tuple[list[dict[str, Any]], str | None]] | None = None
) -> tuple[list[dict[str, Any]], str | None]:
    """(every GPU, why there are none or None): through NVML where `pynvml` is installed and works,
    else (and when NVML fails to list the GPUs) through nvidia-smi."""
    module = nvml()
    if module is not None:
        try:
            return read_gpus_nvml(module), None
        except Exception:  # NVML stopped answering: nvidia-smi says what it can
            pass
    return (smi or read_gpus)()


def _run(argv: list[str], timeout: float = 10.0) -> tuple[int | None, str, str]:
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, "", str(exc)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def cpu_times(proc: str = "/proc") -> tuple[float, float] | None:
    """(busy, total) jiffies of the whole node from /proc/stat's `cpu` line."""
    text = _read(os.path.join(proc, "stat"))
    if not text:
        return None
    parts = text.splitlines()[0].split()
    if not parts or parts[0] != "cpu":
        return None
    values = [float(v) for v in parts[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0.0)  # idle + iowait
    return sum(values[:8]) - idle, sum(values[:8])


def mem_mb(proc: str = "/proc") -> tuple[int | None, int | None]:
    """(used, total) MiB from /proc/meminfo (used = total - available)."""
    text = _read(os.path.join(proc, "meminfo")) or ""
    fields = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        try:
            fields[name] = int(rest.split()[0])
        except (ValueError, IndexError):
            continue
    total, avail = fields.get("MemTotal"), fields.get("MemAvailable")
    if total is None or avail is None:
        return None, None
    return (total - avail) // 1024, total // 1024


def proc_cpu_ticks(pid: int, proc: str = "/proc") -> float | None:
    """utime + stime of a process, in clock ticks."""
    text = _read(os.path.join(proc, str(pid), "stat"))
    if not text:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return float(fields[11]) + float(fields[12])
    except (IndexError, ValueError):
        return None


def proc_rss_mb(pid: int, proc: str = "/proc") -> float | None:
    text = _read(os.path.join(proc, str(pid), "statm"))
    try:
        return round(int(text.split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1) if text else None
    except (ValueError, IndexError, OSError):
        return None


def rank_of(pid: int, proc: str = "/proc") -> tuple[int, int] | None:
    """(RANK, LOCAL_RANK) from the process's environment, when torchrun gave it both."""
    try:
        with open(os.path.join(proc, str(pid), "environ"), "rb") as fh:
            env = fh.read().split(b"\0")
    except OSError:
        return None
    found = {}
    for item in env:
        name, _, value = item.partition(b"=")
        if name in (b"RANK", b"LOCAL_RANK", b"TORCHELASTIC_RUN_ID"):
            found[name] = value
    if b"RANK" not in found or b"LOCAL_RANK" not in found or b"TORCHELASTIC_RUN_ID" not in found:
        return None  # torchrun itself has neither; a worker's own children inherit them (see below)
    try:
        return int(found[b"RANK"]), int(found[b"LOCAL_RANK"])
    except ValueError:
        return None


class Sampler:
    """Samples of one node; CPU shares are deltas since the previous sample."""

    def __init__(
        self,
        pids: Callable[[], list[int]],
        proc: str = "/proc",
        clock: Callable[[], float] | None = None,
        gpus: Callable[[], tuple[list[dict[str, Any]], str | None]] = read_gpus_any,
    ) -> None:
        import time

        self.pids, self.proc, self.gpus = pids, proc, gpus
        self.clock = clock or time.monotonic
        self.ticks = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
        self.last_cpu: tuple[float, float] | None = None
        self.last_proc: dict[int, tuple[float, float]] = {}
        self.ranks: dict[int, tuple[int, int] | None] = {}

    def sample(self) -> dict[str, Any]:
        gpus, gpu_error = self.gpus()
        out: dict[str, Any] = {"v": VERSION, "gpus": gpus, "gpu_error": gpu_error}
        now_cpu = cpu_times(self.proc)
        cpu_pct = None
        if now_cpu and self.last_cpu and now_cpu[1] > self.last_cpu[1]:
            cpu_pct = round(100.0 * (now_cpu[0] - self.last_cpu[0]) / (now_cpu[1] - self.last_cpu[1]), 1)
        self.last_cpu = now_cpu
        used, total = mem_mb(self.proc)
        load = (_read(os.path.join(self.proc, "loadavg")) or "").split()
        out.update(
            cpu_pct=cpu_pct,
            load1=float(load[0]) if load else None,
            ncpu=os.cpu_count(),
            mem_used_mb=used,
            mem_total_mb=total,
        )
        out["ranks"] = self.rank_samples()
        return out

    def rank_samples(self) -> list[dict[str, Any]]:
        """Each rank: its worker (the process holding RANK whose parent does not), its RSS, and
        the CPU share (100 = one core) of the worker with its own children (data loaders)."""
        now = self.clock()
        groups: dict[int, list[int]] = {}
        alive = self.pids()
        for pid in alive:
            if pid not in self.ranks:
                self.ranks[pid] = rank_of(pid, self.proc)
            rl = self.ranks[pid]
            if rl is not None:
                groups.setdefault(rl[0], []).append(pid)
        current: dict[int, tuple[float, float]] = {}
        out = []
        for rank in sorted(groups):
            pids = groups[rank]
            worker = next((p for p in pids if parent_of(p, self.proc) not in pids), min(pids))
            busy, known = 0.0, False
            for pid in pids:
                ticks = proc_cpu_ticks(pid, self.proc)
                if ticks is None:
                    continue
                current[pid] = (now, ticks)
                before = self.last_proc.get(pid)
                if before is not None and now > before[0]:
                    busy += (ticks - before[1]) / self.ticks / (now - before[0])
                    known = True
            rl = self.ranks[worker]
            out.append(
                {
                    "rank": rank,
                    "local_rank": rl[1] if rl else None,
                    "pid": worker,
                    "cpu_pct": round(100.0 * busy, 1) if known else None,
                    "rss_mb": proc_rss_mb(worker, self.proc),
                }
            )
        self.last_proc = current
        live = set(alive)
        self.ranks = {p: r for p, r in self.ranks.items() if p in live}  # a pid gone may come back as another
        return out


def parent_of(pid: int, proc: str = "/proc") -> int | None:
    text = _read(os.path.join(proc, str(pid), "stat"))
    try:
        return int(text[text.rfind(")") + 2 :].split()[1]) if text else None
    except (IndexError, ValueError):
        return None


def finite(value: Any) -> Any:
    """`value` with every float that is not finite (a NaN or an infinity read from a tool) made
    None: a reading that is not a number is a missing one, and the line stays strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def line(sample: dict[str, Any]) -> str:
    """The text of a telemetry line (the agent stamps it): strict JSON."""
    return PREFIX + json.dumps(finite(sample), separators=(",", ":"), sort_keys=False, allow_nan=False)
