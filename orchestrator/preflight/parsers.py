"""What tools print on a node, parsed: nvidia-smi's CSV query and its plain table, the sysfs
attributes of /sys/class/infiniband, `chronyc tracking`. Pure, tested on output recorded from
real machines (tests/fixtures); the probe (`node/probe.py`) only gathers the raw text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from ..node import probe


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi reports it."""

    index: int
    name: str
    bus_id: str
    driver: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    util_pct: int | None = None
    uuid: str | None = None
    """`GPU-8932f937-...`, as CUDA_VISIBLE_DEVICES may name it (the query's `uuid`)."""
    compute_cap: tuple[int, int] | None = None
    """(major, minor) from the query's `compute_cap` (`7.0` on a V100); None where not reported."""


@dataclass(frozen=True)
class GpuProcess:
    gpu: int
    pid: int
    name: str
    memory: str


@dataclass(frozen=True)
class GpuFacts:
    """What the node's nvidia-smi says; `error` when it is absent or failed."""

    source: str
    gpus: tuple[Gpu, ...] = ()
    driver: str | None = None
    cuda: str | None = None
    processes: tuple[GpuProcess, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class IbPort:
    port: str
    state: str | None
    phys_state: str | None
    rate: str | None
    link_layer: str | None

    @property
    def active(self) -> bool:
        return _sysfs_word(self.state) == "ACTIVE" and _sysfs_word(self.phys_state) == "LINKUP"


@dataclass(frozen=True)
class IbDevice:
    name: str
    hca_type: str | None
    fw_ver: str | None
    ports: tuple[IbPort, ...]


def _sysfs_word(value: str | None) -> str:
    """`4: ACTIVE` → `ACTIVE`, `5: LinkUp` → `LINKUP` (kernel format `<num>: <name>`)."""
    if not value:
        return ""
    return value.split(":", 1)[-1].strip().upper()


def _int(text: str) -> int | None:
    m = re.search(r"-?\d+", text or "")
    return int(m.group()) if m else None


def _compute_cap(text: str | None) -> tuple[int, int] | None:
    m = re.fullmatch(r"(\d+)\.(\d+)", (text or "").strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def _known(text: str | None) -> str | None:
    """A cell's value; None for nvidia-smi's `[N/A]`, `[Not Supported]`, `N/A` or an empty cell."""
    value = (text or "").strip()
    return None if not value or value.startswith("[") or value == "N/A" else value


def parse_gpu_query_csv(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=... --format=csv[,noheader]` → one Gpu per bus id.

    Repeated samples of the same GPU (the output of `-l` or a log of several runs) keep the last.
    A header line, when present, names the columns (the probe asks with one); without it they are
    probe.GPU_QUERY's, the columns of the recording such output comes from. A GPU's index is the
    `index` column where there is one, else its place in bus-id order (nvidia-smi's own order)."""
    cols = probe.GPU_QUERY.split(",")
    by_bus: dict[str, tuple[int | None, Gpu]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 2:
            continue
        if cells[0].startswith("timestamp") or "name" in cells:
            cols = [re.sub(r"\s*\[.*\]$", "", c) for c in cells]
            continue
        row = dict(zip(cols, cells))
        bus = row.get("pci.bus_id") or str(len(by_bus))
        index = _known(row.get("index"))
        by_bus[bus] = (
            int(index) if index and index.isdigit() else None,
            Gpu(
                index=0,
                name=row.get("name", "?"),
                bus_id=bus,
                driver=row.get("driver_version"),
                memory_total_mib=_int(row.get("memory.total", "")),
                memory_used_mib=_int(row.get("memory.used", "")),
                util_pct=_int(row.get("utilization.gpu", "")),
                uuid=_known(row.get("uuid")),
                compute_cap=_compute_cap(row.get("compute_cap")),
            ),
        )
    ordered = sorted(by_bus.values(), key=lambda ig: ig[1].bus_id)
    return [replace(g, index=i if index is None else index) for i, (index, g) in enumerate(ordered)]


_TABLE_GPU = re.compile(r"^\|\s+(\d+)\s+(.+?)\s+(On|Off)\s*\|\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s")
_TABLE_MEM = re.compile(r"\|\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|\s*(\d+)%")
_TABLE_PROC = re.compile(r"^\|\s+(\d+)\s+\S+\s+\S+\s+(\d+)\s+(\S+)\s+(.+?)\s+(\d+MiB|N/A)\s*\|")


def parse_nvidia_smi_table(text: str) -> tuple[str | None, str | None, list[Gpu], list[GpuProcess]]:
    """The plain `nvidia-smi` table → (driver, CUDA version, GPUs, processes)."""
    driver = re.search(r"Driver Version:\s*([\d.]+)", text)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", text)
    gpus: list[Gpu] = []
    procs: list[GpuProcess] = []
    in_procs = False
    pending: tuple[int, str, str] | None = None
    for line in text.splitlines():
        if "Processes:" in line:
            in_procs = True
            continue
        if in_procs:
            m = _TABLE_PROC.match(line)
            if m:
                procs.append(GpuProcess(int(m.group(1)), int(m.group(2)), m.group(4), m.group(5)))
            continue
        m = _TABLE_GPU.match(line)
        if m:
            pending = (int(m.group(1)), m.group(2).strip(), m.group(4))
            continue
        mem = _TABLE_MEM.search(line)
        if pending and mem:
            gpus.append(
                Gpu(
                    pending[0],
                    pending[1],
                    pending[2],
                    driver.group(1) if driver else None,
                    int(mem.group(2)),
                    int(mem.group(1)),
                    int(mem.group(3)),
                )
            )
            pending = None
    return (driver.group(1) if driver else None, cuda.group(1) if cuda else None, gpus, procs)


def parse_gpus(raw: dict[str, Any]) -> GpuFacts:
    """Combine the probe's CSV query (authoritative list) with the table (CUDA, processes)."""
    source = str(raw.get("source", "nvidia-smi"))
    if "error" in raw and "query" not in raw:
        return GpuFacts(source, error=str(raw["error"]))
    query, table = raw.get("query") or {}, raw.get("table") or {}
    gpus = parse_gpu_query_csv(query.get("out", "")) if query.get("rc") == 0 else []
    driver = cuda = None
    procs: list[GpuProcess] = []
    if table.get("rc") == 0:
        driver, cuda, table_gpus, procs = parse_nvidia_smi_table(table.get("out", ""))
        gpus = gpus or table_gpus
    if not gpus and query.get("rc") != 0 and table.get("rc") != 0:
        err = (query.get("err") or table.get("err") or "nvidia-smi failed").strip().splitlines()
        return GpuFacts(source, error=err[-1] if err else "nvidia-smi failed")
    drivers = sorted({g.driver for g in gpus if g.driver})
    return GpuFacts(source, tuple(gpus), driver or (drivers[0] if drivers else None), cuda, tuple(procs))


def parse_ib(raw: dict[str, Any]) -> dict[str, IbDevice]:
    """The probe's raw /sys/class/infiniband attributes → devices with typed ports."""
    out = {}
    for name, info in (raw.get("devices") or {}).items():
        ports = tuple(
            IbPort(p, a.get("state"), a.get("phys_state"), a.get("rate"), a.get("link_layer"))
            for p, a in sorted((info.get("ports") or {}).items())
        )
        out[name] = IbDevice(name, info.get("hca_type"), info.get("fw_ver"), ports)
    return out


@dataclass(frozen=True)
class ChronyTracking:
    """What `chronyc tracking` says about this node's own synchronisation."""

    reference: str
    stratum: int | None
    system_offset_ms: float | None
    """This clock minus NTP time, as chrony estimates it (`fast` is positive)."""
    leap_status: str | None

    @property
    def local_reference(self) -> bool:
        """Reference ID 7F7F0101 (127.127.1.1): chrony serves its own clock, synced to nothing."""
        return self.reference.upper().startswith("7F7F0101")


def parse_chrony_tracking(text: str) -> ChronyTracking | None:
    """`chronyc tracking` output → ChronyTracking; None when it is not that output."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip().lower()] = value.strip()
    if "reference id" not in fields:
        return None
    offset = None
    m = re.match(r"([\d.]+) seconds (fast|slow)", fields.get("system time", ""))
    if m:
        offset = float(m.group(1)) * 1000 * (1 if m.group(2) == "fast" else -1)
    return ChronyTracking(fields["reference id"], _int(fields.get("stratum", "")), offset, fields.get("leap status"))
