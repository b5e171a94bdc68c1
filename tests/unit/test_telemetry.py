"""The node agent's sampler on a /proc written for the test and on recorded nvidia-smi answers
(orchestrator/node/telemetry.py): the values, the ranks, CPU shares as deltas."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.node import telemetry
from tests.telemetry_support import recorded_gpus

TICK = os.sysconf("SC_CLK_TCK")


def write_proc(root: Path, cpu: tuple[int, int], procs: dict[int, tuple[int, dict[str, str], int, int]]) -> None:
    """/proc/stat with `cpu` = (busy, idle) jiffies, and per pid (ppid, environ, utime+stime ticks, rss pages)."""
    root.mkdir(exist_ok=True)
    busy, idle = cpu
    (root / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    (root / "meminfo").write_text("MemTotal:       16384000 kB\nMemFree:  100 kB\nMemAvailable:    8192000 kB\n")
    (root / "loadavg").write_text("3.50 2.00 1.00 2/300 12345\n")
    for pid, (ppid, env, ticks, pages) in procs.items():
        d = root / str(pid)
        d.mkdir(exist_ok=True)
        (d / "stat").write_text(f"{pid} (py thon) S {ppid} 1 1 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0 1 0 100 0 0\n")
        (d / "statm").write_text(f"1000 {pages} 10 1 0 100 0\n")
        (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")


def rank_env(rank: int) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "TORCHELASTIC_RUN_ID": "x", "PATH": "/bin"}


def test_two_samples_give_gpus_memory_load_and_each_ranks_cpu_with_its_loader(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    tree = {
        10: (1, {"PATH": "/bin"}, 0, 100),
        11: (10, rank_env(0), 0, 2560),
        12: (11, rank_env(0), 0, 512),
        13: (10, rank_env(1), 0, 1280),
    }
    write_proc(proc, (1000, 9000), tree)
    now = [100.0]
    gpus = recorded_gpus("h100x8")
    s = telemetry.Sampler(lambda: sorted(tree), proc=str(proc), clock=lambda: now[0], gpus=lambda: (gpus, None))
    first = s.sample()
    assert first["cpu_pct"] is None and [r["cpu_pct"] for r in first["ranks"]] == [None, None]
    # 2 s later: rank 0's worker used 1 s of CPU and its loader 0.5 s; rank 1 2 s; the node 25 % busy
    tree = {
        10: (1, {"PATH": "/bin"}, 0, 100),
        11: (10, rank_env(0), TICK, 2560),
        12: (11, rank_env(0), TICK // 2, 512),
        13: (10, rank_env(1), 2 * TICK, 1280),
    }
    write_proc(proc, (2000, 12000), tree)
    now[0] = 102.0
    out = s.sample()
    assert out["cpu_pct"] == 25.0 and out["load1"] == 3.5
    assert (out["mem_used_mb"], out["mem_total_mb"]) == (8000, 16000)
    page_mb = os.sysconf("SC_PAGE_SIZE") / 2**20
    assert out["ranks"] == [
        {"rank": 0, "local_rank": 0, "pid": 11, "cpu_pct": 75.0, "rss_mb": round(2560 * page_mb, 1)},
        {"rank": 1, "local_rank": 1, "pid": 13, "cpu_pct": 100.0, "rss_mb": round(1280 * page_mb, 1)},
    ]
    assert len(out["gpus"]) == 8 and out["gpus"][0]["throttle"] == ["hw_slowdown", "hw_power_brake"]
    line = telemetry.line(out)
    assert line.startswith("telemetry {") and "\n" not in line


def test_nvidia_smi_values_missing_broken_and_throttle_bits() -> None:
    v100 = recorded_gpus("v100x8")
    assert v100[0] == {
        "index": 0,
        "uuid": "GPU-v100-0",
        "name": "Tesla V100-SXM2-16GB",
        "util_pct": 100.0,
        "mem_used_mb": 3087,
        "mem_total_mb": 16384,
        "temp_c": 51.0,
        "power_w": 80.0,
        "sm_mhz": None,
        "throttle": None,
        "fan_pct": None,
        "error": None,
    }
    err = recorded_gpus("err")[0]
    assert err["fan_pct"] is None and err["error"] == "fan.speed ERR!"
    assert telemetry.throttle_names(0x1 | 0x2 | 0x10 | 0x100) == []  # idle, app clocks, sync boost, display
    assert telemetry.throttle_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal"]
    row = "0, GPU-x, NVIDIA H100, 97, 100, 81559, 64, 612.3, 1980, 0x0000000000000000, [Not Supported]"
    assert telemetry.parse_gpu_csv(row)[0]["throttle"] == [] and telemetry.parse_gpu_csv(row)[0]["fan_pct"] is None
    assert telemetry.parse_gpu_csv("short, line\n\n") == []


def test_a_missing_or_failing_nvidia_smi_is_a_fact(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert telemetry.read_gpus() == ([], "nvidia-smi: not found in PATH")
    fake = tmp_path / "nvidia-smi"
    fake.write_text("")
    fake.chmod(0o755)
    gpus, why = telemetry.read_gpus(
        run=lambda argv: (9, "", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    )
    assert (
        gpus == []
        and why == "nvidia-smi exit 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    )


def test_the_detectors_view_of_a_sample_tells_a_node_without_gpus_from_unreadable_gpus() -> None:
    """No nvidia-smi: a CPU node (its ranks compute there); nvidia-smi failing: GPUs unknown."""
    from orchestrator.logs.lines import LogLine
    from orchestrator.logs.telemetry import parse_sample
    from orchestrator.run.straggler import NodeLoad

    def load(gpu_error: str | None, gpus: str = "[]") -> NodeLoad:
        text = f'telemetry {{"v": 1, "gpus": {gpus}, "gpu_error": {json.dumps(gpu_error)}, "cpu_pct": 50.0}}'
        sample = parse_sample(LogLine(1.0, "n1", 0, None, None, "orch", text))
        assert sample is not None
        return sample.load()

    cpu = load(telemetry.NOT_FOUND)
    assert cpu.no_gpu and cpu.gpu_error == telemetry.NOT_FOUND
    failed = load("nvidia-smi exit 9: NVIDIA-SMI has failed")
    assert not failed.no_gpu and failed.gpu_error == "nvidia-smi exit 9: NVIDIA-SMI has failed"
    gpu = load(None, '[{"index": 0, "util_pct": 12.0}]')
    assert not gpu.no_gpu and gpu.gpus[0].util_pct == 12.0


class FakeNvml:
    """A `pynvml` whose answers are the recorded nvidia-smi rows of a set (tests/fixtures/telemetry):
    a value nvidia-smi could not read (`[N/A]`) is NVML's NOT_SUPPORTED, `ERR!` its UNKNOWN error."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

    def __init__(self, gpu_set: str) -> None:
        import csv

        from tests.telemetry_support import FIX

        with open(FIX / gpu_set / "gpus.csv", newline="") as fh:
            self.rows = list(csv.DictReader(fh))

    def _raw(self, i: int, field: str) -> str:
        raw = self.rows[i][field].strip()
        if raw in telemetry.MISSING:
            raise self.NVMLError(3)
        if raw in telemetry.BROKEN:
            raise self.NVMLError(15 if raw == "[GPU is lost]" else 999)
        return raw

    def nvmlDeviceGetCount(self) -> int:
        return len(self.rows)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._raw(h, "uuid")

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self._raw(h, "name").encode()  # older nvidia-ml-py answers bytes

    def nvmlDeviceGetUtilizationRates(self, h: int) -> object:
        return type("Util", (), {"gpu": int(self._raw(h, "utilization.gpu")), "memory": 0})()

    def nvmlDeviceGetMemoryInfo(self, h: int) -> object:
        used, total = (int(self._raw(h, f)) * 2**20 for f in ("memory.used", "memory.total"))
        return type("Mem", (), {"used": used, "total": total, "free": total - used})()

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return int(self._raw(h, "temperature.gpu"))

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return round(float(self._raw(h, "power.draw")) * 1000)  # milliwatts

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return int(self._raw(h, "clocks.sm"))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return int(self._raw(h, "clocks_throttle_reasons.active"), 16)

    def nvmlDeviceGetFanSpeed(self, h: int) -> int:
        return int(self._raw(h, "fan.speed"))


@pytest.mark.parametrize("gpu_set", ["h100x8", "v100x8", "a100", "err"])
def test_nvml_gives_the_same_record_as_nvidia_smi_for_the_same_gpus(gpu_set: str) -> None:
    assert telemetry.read_gpus_nvml(FakeNvml(gpu_set)) == recorded_gpus(gpu_set)


def test_nvml_is_used_where_it_works_else_nvidia_smi() -> None:
    smi = ([{"index": 0}], None)
    nvml = FakeNvml("v100x8")
    assert telemetry.read_gpus_any(lambda: nvml, lambda: smi) == (recorded_gpus("v100x8"), None)
    assert telemetry.read_gpus_any(lambda: None, lambda: smi) == smi  # not installed, or NVML did not start

    class Failing(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise self.NVMLError(999)

    assert telemetry.read_gpus_any(lambda: Failing("v100x8"), lambda: smi) == smi


def test_a_lost_gpu_through_nvml_is_named_as_nvidia_smi_names_it() -> None:
    class Lost(FakeNvml):
        def nvmlDeviceGetMemoryInfo(self, h: int) -> object:
            raise self.NVMLError(15)

    gpu = telemetry.read_gpus_nvml(Lost("err"))[0]
    assert gpu["mem_used_mb"] is None and gpu["mem_total_mb"] is None
    assert gpu["error"] == "memory.used [GPU is lost]; memory.total [GPU is lost]; fan.speed ERR!"
