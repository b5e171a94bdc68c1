"""Facts: one probe per node per preflight, sent over the transport; parsers for what tools print.

The probe (`orchestrator/node/probe.py`, stdlib only) travels compressed inside `python -c`, run by
the node's `python` (falling back to `python3` when that interpreter does not exist, which the
`software` check then reports). It runs with the job's environment (`node.env` on top of the
login environment, sent as the first line on its stdin, never in argv) so it sees exactly what a
job would see.

One SSH connection and one exec per node; two phases, both bounded:
1. per node, in parallel: connect (timed), start the probe with its stdin kept open: it opens
   its listeners, prints them, gathers facts, prints them and keeps answering connections. Then
   the controller pings it over the same channel (`PING` → the node's time): the round trip is
   the `ssh` value, and its midpoint against the node's time the SSH clock estimate (± rtt/2;
   best of three when the clock check rests on it);
2. once every node's listeners are known: each probe gets its targets on stdin (the master's
   port; its successor in a ring of all probed nodes), tries them and answers on the same
   channel. Then the channels are closed, which ends the probes (stdin EOF).

Parsing (CSV, nvidia-smi tables, sysfs strings) is pure and lives here, tested on recorded output.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config.inventory import Inventory
from ..config.nodes import Node
from ..errors import TransportError
from ..node import probe
from ..node import program as node_program
from ..transport import Cluster, Process, Transport

if TYPE_CHECKING:
    from .fabric import FabricFacts

Progress = Callable[[str, int, int], None]
# args whose value is a file the job reads: checked for absolute path, existence, same content
PATH_KEYS = ("weights", "data", "model", "cfg", "resume", "pretrained", "hyp", "tracker")
# args whose value is a directory the job writes: it need not exist yet, only be creatable
OUTPUT_KEYS = ("out", "project", "save_dir", "output", "output_dir", "log_dir", "logdir", "runs_dir",
               "debug_dir", "checkpoint_dir", "ckpt_dir")


def is_output_key(key: str) -> bool:
    return key.replace("-", "_") in OUTPUT_KEYS
PHASE1_TIMEOUT_S = 150.0    # a cold `import torch` on a loaded node is the slow part
CONNECT_TIMEOUT_S = 5.0
REACH_TIMEOUT_S = CONNECT_TIMEOUT_S * 6 + 30
PING_TIMEOUT_S = 15.0
SERVE_S = 60.0


# ----------------------------------------------------------------------------- parsed facts


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


@dataclass
class NodeFacts:
    """Everything known about one node after the probe (or why nothing is)."""

    node: Node
    error: str | None = None
    """Why the node could not be probed; then every other field may be empty."""
    error_kind: str | None = None
    hint: str | None = None
    connect_ms: float | None = None
    rtt_ms: float | None = None
    ssh_offset_ms: float | None = None
    """Node clock minus controller clock, from the `date` round trip (± rtt/2)."""
    python_fallback: str | None = None
    """Set when node.python could not run the probe and python3 did: what went wrong."""
    raw: dict[str, Any] = field(default_factory=dict)
    listen: dict[str, Any] = field(default_factory=dict)
    reach: list[dict[str, Any]] = field(default_factory=list)
    reach_error: str | None = None
    malformed: list[str] = field(default_factory=list)
    """Parts of the probe's answer that were not of the shape the probe writes (dropped): a
    mismatched or tampered probe; the `ssh` check fails on it."""
    fabric: FabricFacts | None = None
    """What the fabric job measured (`preflight/fabric.py`), the same object on every node; None
    where the fabric check was not selected."""

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def env(self) -> dict[str, str]:
        return dict(self.raw.get("env") or {})

    @property
    def gpus(self) -> GpuFacts:
        return parse_gpus(self.raw.get("gpus") or {})

    @property
    def ib(self) -> dict[str, IbDevice]:
        return parse_ib(self.raw.get("ib") or {})

    @property
    def chrony(self) -> ChronyTracking | None:
        res = self.raw.get("chrony") or {}
        return parse_chrony_tracking(res.get("out", "")) if res.get("rc") == 0 else None


# ----------------------------------------------------------------------------- parsers (pure)


def _sysfs_word(value: str | None) -> str:
    """`4: ACTIVE` → `ACTIVE`, `5: LinkUp` → `LINKUP` (kernel format `<num>: <name>`)."""
    if not value:
        return ""
    return value.split(":", 1)[-1].strip().upper()


def _int(text: str) -> int | None:
    m = re.search(r"-?\d+", text or "")
    return int(m.group()) if m else None


def parse_gpu_query_csv(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=<probe.GPU_QUERY> --format=csv,noheader` → one Gpu per bus id.

    Repeated samples of the same GPU (the output of `-l` or a log of several runs) keep the last.
    A header line, when present, names the columns; otherwise they are probe.GPU_QUERY's."""
    cols = probe.GPU_QUERY.split(",")
    by_bus: dict[str, Gpu] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 2:
            continue
        if cells[0].startswith("timestamp") or "name" in cells:
            cols = [re.sub(r"\s*\[.*\]$", "", c) for c in cells]
            continue
        row = dict(zip(cols, cells))
        bus = row.get("pci.bus_id") or str(len(by_bus))
        by_bus[bus] = Gpu(
            index=0, name=row.get("name", "?"), bus_id=bus, driver=row.get("driver_version"),
            memory_total_mib=_int(row.get("memory.total", "")), memory_used_mib=_int(row.get("memory.used", "")),
            util_pct=_int(row.get("utilization.gpu", "")))
    ordered = sorted(by_bus.values(), key=lambda g: g.bus_id)
    return [Gpu(i, g.name, g.bus_id, g.driver, g.memory_total_mib, g.memory_used_mib, g.util_pct)
            for i, g in enumerate(ordered)]


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
            gpus.append(Gpu(pending[0], pending[1], pending[2], driver.group(1) if driver else None,
                            int(mem.group(2)), int(mem.group(1)), int(mem.group(3))))
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
        ports = tuple(IbPort(p, a.get("state"), a.get("phys_state"), a.get("rate"), a.get("link_layer"))
                      for p, a in sorted((info.get("ports") or {}).items()))
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


def path_args(inv: Inventory) -> dict[str, str]:
    """The job args that name files (PATH_KEYS, or any value that looks like a path)."""
    out = {}
    for key, value in inv.job.raw_args.items():
        if not isinstance(value, str) or not value:
            continue
        norm = key.replace("-", "_")
        if norm in PATH_KEYS or value.startswith(("/", "~/", "./", "../")):
            out[key] = value
    return out


def job_files(inv: Inventory) -> dict[str, str]:
    """Every path the `job` check looks at on each node: the path-like args, an absolute
    `job.script`, and each `job.sync` entry (files by size and sha256, directories by existence),
    each path once."""
    out = path_args(inv)
    extra = [("script", inv.job.script)] if inv.job.script and inv.job.script.startswith(("/", "~/")) else []
    extra += [(f"sync[{i}]", p) for i, p in enumerate(inv.job.sync)]
    for key, path in extra:
        if path not in out.values() and key not in out:
            out[key] = path
    return out


# ----------------------------------------------------------------------------- the probe's answer, checked


class _Opt:
    """A value of `shape`, or null."""

    def __init__(self, shape: Any) -> None:
        self.shape = shape


class _MapOf:
    """A mapping of any string keys to values of `shape`."""

    def __init__(self, shape: Any) -> None:
        self.shape = shape


class _ListOf:
    def __init__(self, shape: Any) -> None:
        self.shape = shape


NUMBER, INT = "number", "int"  # JSON numbers (finite; never a bool), integers among them
_BAD = object()
_RUN = {"rc": _Opt(INT), "out": str, "err": str, "error": str}
_FILE = {"path": str, "exists": bool, "is_file": bool, "is_dir": bool, "size": INT, "sha256": str,
         "text": _Opt(str), "error": str, "output": bool, "writable": bool, "ancestor": str,
         "ancestor_is_dir": bool, "ancestor_writable": bool}
LISTEN_SHAPE = {"master_port": {"port": INT, "bound": bool, "error": _Opt(str), "holder": _Opt(str)},
                "ring": {"addr": str, "port": _Opt(INT), "error": _Opt(str)},
                "verbs": _Opt({"port": INT, "device": str, "tool": str})}
REACH_SHAPE = _ListOf({"kind": str, "node": str, "addr": str, "port": INT, "device": str, "ok": bool, "ms": NUMBER,
                       "error": _Opt(str), "answered_by": str, "result": _Opt(str)})
FACTS_SHAPE = {
    "probe": INT, "node": _Opt(str), "host": str, "home": str, "time": NUMBER,
    "python": {"executable": _Opt(str), "version": str},
    "env": _MapOf(str), "inventory_env": _ListOf(str),
    "tz": {"TZ": _Opt(str), "localtime": _Opt(str), "etc_timezone": _Opt(str), "abbr": _Opt(str),
           "utcoffset": _Opt(str)},
    "ifaces": _ListOf({"name": str, "up": bool, "ipv4": _ListOf(str)}),
    "ib": {"root": str, "source": str, "tools": _MapOf(_Opt(str)), "error": str,
           "devices": _MapOf({"hca_type": _Opt(str), "fw_ver": _Opt(str), "board_id": _Opt(str),
                              "ports": _MapOf({k: _Opt(str) for k in ("state", "phys_state", "rate", "link_layer")})})},
    "gpus": {"source": str, "query": _RUN, "table": _RUN, "error": str},
    "software": {k: _Opt(str) for k in ("python", "executable", "torch", "cuda", "nccl", "source", "ultralytics",
                                        "error", "torch_error", "nccl_error")},
    "ntp": _Opt({"server": str, "method": str, "samples": INT, "errors": _ListOf(str), "offset_ms": NUMBER,
                 "delay_ms": NUMBER, "stratum": INT, "error": str}),
    "chrony": _Opt(_RUN),
    "paths": _MapOf(_FILE), "workdir": _Opt(_FILE), "timings_s": _MapOf(NUMBER), "listen": LISTEN_SHAPE,
}
"""What the probe (node/probe.py) answers, key by key: what the checks may rely on."""


def conform(value: Any, shape: Any, where: str, problems: list[str]) -> Any:
    """`value` where it has `shape`, else _BAD (noted in `problems`): a mapping keeps its keys of
    the right shape and drops the others (keys the shape does not name are kept as they are)."""
    if isinstance(shape, _Opt):
        return None if value is None else conform(value, shape.shape, where, problems)
    ok = True
    if shape in (NUMBER, INT):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ok = ok and (shape == NUMBER or isinstance(value, int))
    elif isinstance(shape, type):
        ok = type(value) is shape
    elif isinstance(shape, (dict, _MapOf)):
        if not isinstance(value, dict):
            ok = False
        else:
            out = {}
            for key, item in value.items():
                sub = shape.get(key, Any) if isinstance(shape, dict) else shape.shape
                got = item if sub is Any else conform(item, sub, f"{where}.{key}", problems)
                if got is not _BAD:
                    out[key] = got
            return out
    elif isinstance(shape, _ListOf):
        if not isinstance(value, list):
            ok = False
        else:
            items = (conform(item, shape.shape, f"{where}[{i}]", problems) for i, item in enumerate(value))
            return [item for item in items if item is not _BAD]
    if not ok:
        problems.append(f"{where}: {type(value).__name__} {str(value)[:40]!r}")
        return _BAD
    return value


def read_answer(value: Any, shape: Any, what: str) -> tuple[Any, list[str]]:
    """A tagged answer of the probe held to its shape: (what conforms, every part that did not)."""
    problems: list[str] = []
    got = conform(value, shape, what, problems)
    if got is _BAD:
        got = [] if isinstance(shape, _ListOf) else {}
    return got, problems


# ----------------------------------------------------------------------------- probing


def probe_command(python: str, args: dict[str, Any]) -> list[str]:
    """`python -c <program> <json args>`: the probe rides compressed in argv, as bytecode where the
    node's Python can load this one's (its stdin carries the controller's commands)."""
    return [python, "-c", node_program("probe"), json.dumps(args, sort_keys=True)]


def probe_args(inv: Inventory, node: Node, want: Sequence[str], token: str, n_peers: int) -> dict[str, Any]:
    """The JSON the probe gets: what to gather and which listeners to open."""
    paths = job_files(inv) if "job" in want else {}
    is_master = node.name == inv.master.name
    net = "ports" in want or "rdma" in want
    return {
        "node": node.name, "token": token, "want": list(want),
        "inventory_env": sorted(node.env), "env_on_stdin": True,
        "ntp_server": inv.checks.clock.ntp_server if "clock" in want else None,
        "paths": paths, "text_for": [k for k in paths if k.replace("-", "_") == "data"],
        "outputs": [k for k in paths if is_output_key(k)],
        "workdir": inv.job.workdir if "job" in want else None,
        "master_port": inv.master_port if is_master and "ports" in want else None,
        "ring_addr": node.addr if net and n_peers > 1 else None,
        "expect": ((n_peers - 1) if is_master and "ports" in want else 0) + (1 if net and n_peers > 1 else 0),
        # later fan-out batches start after earlier ones finished phase 1; the heartbeat ends a
        # probe as soon as the controller hangs up, so a long deadline costs nothing
        "serve_s": SERVE_S + PHASE1_TIMEOUT_S * (math.ceil(len(inv.nodes) / inv.fanout) - 1),
        "software": "software" in want,
        "verbs_device": inv.checks.rdma_devices[0] if "rdma" in want and inv.checks.rdma_devices and n_peers > 1
        else None,
    }


class _Stream:
    """Reads a probe's tagged lines in a thread, so the caller can wait with a timeout; writes
    the controller's commands (ping, connect targets) to the probe's stdin."""

    TAGS = ("ORCH-LISTEN", "ORCH-FACTS", "ORCH-REACH")

    def __init__(self, proc: Process) -> None:
        self.proc = proc
        self.tagged: dict[str, Any] = {}
        self.pongs: dict[str, tuple[float, float]] = {}
        """ping seq → (node time, controller time when the answer was read)."""
        self.noise: list[str] = []
        self.cond = threading.Condition()
        self.done = False
        threading.Thread(target=self._read, daemon=True, name="orch-probe-read").start()

    def _read(self) -> None:
        try:
            for raw in self.proc.lines():
                now = time.time()  # first: the ping's arrival time is this line's
                line = raw.decode("utf-8", "replace").rstrip("\n")
                tag, _, rest = line.partition(" ")
                with self.cond:
                    try:
                        if tag == "ORCH-TIME":
                            pong = json.loads(rest)
                            node_time = float(pong["time"])
                            if not math.isfinite(node_time):
                                raise ValueError(f"not a time: {node_time}")
                            self.pongs[str(pong["seq"])] = (node_time, now)
                        elif tag in self.TAGS:
                            self.tagged[tag] = json.loads(rest)
                        else:
                            self.noise = (self.noise + [line])[-20:]
                    except (ValueError, KeyError, TypeError):
                        self.noise = (self.noise + [line[:300]])[-20:]
                    self.cond.notify_all()
        except Exception as exc:  # a broken stream ends the wait below with what we have
            with self.cond:
                self.noise.append(f"stream error: {exc}")
        finally:
            with self.cond:
                self.done = True
                self.cond.notify_all()

    def _wait(self, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not ready() and not self.done:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)

    def wait_for(self, tag: str, timeout: float) -> Any:
        self._wait(lambda: tag in self.tagged, timeout)
        with self.cond:
            return self.tagged.get(tag)

    def send(self, line: str) -> None:
        self.proc.write(line.encode() + b"\n")

    def ping(self, seq: str, timeout: float) -> tuple[float, float] | None:
        """(node minus controller offset ms, round trip ms) of one ping, or None without an answer."""
        t1 = time.time()
        self.send(f"PING {seq}")
        self._wait(lambda: seq in self.pongs, timeout)
        with self.cond:
            pong = self.pongs.get(seq)
        if pong is None:
            return None
        node_time, t2 = pong
        return (node_time - (t1 + t2) / 2) * 1000, (t2 - t1) * 1000

    def measure_clock(self, samples: int) -> tuple[float | None, float | None]:
        """(node minus controller offset ms, its round trip ms) of the fastest of `samples` pings."""
        best: tuple[float, float] | None = None
        for i in range(samples):
            got = self.ping(str(i), PING_TIMEOUT_S)
            if got is not None and (best is None or got[1] < best[1]):
                best = got
        return best if best is not None else (None, None)


@dataclass
class _Probe:
    facts: NodeFacts
    stream: _Stream | None = None
    python: str = ""


def _start_probe(inv: Inventory, t: Transport, want: Sequence[str], token: str, n: int) -> _Probe:
    node = t.node
    nf = NodeFacts(node)
    try:
        nf.connect_ms = t.connect()
    except TransportError as exc:
        nf.error, nf.error_kind, nf.hint = exc.message, exc.kind, exc.hint
        return _Probe(nf)
    args = probe_args(inv, node, want, token, n)
    # Best of three pings only when the clock check rests on this estimate; with an NTP server (or
    # no clock check) one round trip gives the `ssh` value.
    pings = 3 if "clock" in want and not inv.checks.clock.ntp_server else 1
    for python in dict.fromkeys([node.python, "python3"]):
        try:
            # the job's environment goes first on stdin: on the command line `ps` (and -v) would show its values
            proc = t.popen(probe_command(python, args), keep_stdin=True)
        except TransportError as exc:
            nf.error, nf.error_kind, nf.hint = exc.message, exc.kind, exc.hint
            return _Probe(nf)
        try:
            proc.write((json.dumps(dict(node.env)) + "\n").encode())
        except OSError:
            pass  # the probe is already gone: what it said (or its silence) is read below
        stream = _Stream(proc)
        facts = stream.wait_for("ORCH-FACTS", PHASE1_TIMEOUT_S)
        if facts is not None:
            nf.raw, nf.malformed = read_answer(facts, FACTS_SHAPE, "facts")
            nf.listen = nf.raw.get("listen") or {}
            try:
                nf.ssh_offset_ms, nf.rtt_ms = stream.measure_clock(pings)
            except Exception as exc:  # the channel broke right after the facts: still a failed probe
                nf.error, nf.error_kind = f"{node.name}: the probe stopped answering: {exc}", "probe"
                stream.proc.close()
                return _Probe(nf)
            return _Probe(nf, stream, python)
        code = stream.proc.wait(5) if stream.done else stream.proc.poll()
        stream.proc.close()
        said = "; ".join(stream.noise[-3:]) or ("no output" if code is not None else
                                               f"no answer within {PHASE1_TIMEOUT_S:.0f} s")
        # 126/127: the shell could not execute that interpreter; anything else is the probe's own failure
        if code in (126, 127) and python == node.python and python != "python3":
            nf.python_fallback = f"{python} could not run the probe: {said}"
            continue
        nf.error, nf.error_kind = f"{node.name}: the probe failed ({python}): {said}", "probe"
        nf.hint = "run the python named in the inventory on that node by hand; is it Python >= 3.8?"
    return _Probe(nf)


def _targets(inv: Inventory, probes: dict[str, _Probe]) -> dict[str, list[dict[str, Any]]]:
    """Who connects where: every node to the master's port, and each to its ring successor."""
    alive = [n for n in inv.nodes if probes[n.name].facts.ok]
    master = probes[inv.master.name].facts
    mp = master.listen.get("master_port") or {}
    out: dict[str, list[dict[str, Any]]] = {n.name: [] for n in alive}
    for i, node in enumerate(alive):
        if node.name != inv.master.name and master.ok and mp.get("bound"):
            out[node.name].append({"kind": "master", "node": inv.master.name, "addr": inv.master.addr,
                                   "port": inv.master_port})
        if len(alive) > 1:
            succ = alive[(i + 1) % len(alive)]
            ring = probes[succ.name].facts.listen.get("ring") or {}
            if ring.get("port"):
                out[node.name].append({"kind": "ring", "node": succ.name, "addr": succ.addr, "port": ring["port"]})
            verbs = probes[succ.name].facts.listen.get("verbs") or {}
            tools = (probes[node.name].facts.raw.get("ib") or {}).get("tools") or {}
            if verbs.get("port") and tools.get("ibv_rc_pingpong"):
                out[node.name].append({"kind": "verbs", "node": succ.name, "addr": succ.addr,
                                       "port": verbs["port"], "device": verbs["device"]})
    return out


def collect(inv: Inventory, cluster: Cluster, want: Sequence[str],
            progress: Progress | None = None) -> dict[str, NodeFacts]:
    """Probe every node (two bounded phases, see the module docstring); never raises for a node."""
    token = secrets.token_hex(8)
    n = len(inv.nodes)
    done = [0]
    lock = threading.Lock()

    def tick(label: str) -> None:
        with lock:
            done[0] += 1
            if progress:
                progress(label, done[0], n)

    def phase1(t: Transport) -> _Probe:
        p = _start_probe(inv, t, want, token, n)
        tick(f"probed {t.node.name}")
        return p

    if progress:
        progress("probing", 0, n)
    started = cluster.fan_out(phase1)
    ok, failed = started.succeeded, started.failed
    probes = {}
    for node in inv.nodes:  # in inventory order, as the facts are returned
        exc = failed.get(node.name)
        probes[node.name] = ok[node.name] if exc is None else _Probe(
            NodeFacts(node, error=f"{node.name}: {type(exc).__name__}: {exc}", error_kind="error"))
    try:
        targets = _targets(inv, probes)
        if any(targets.values()):
            _phase2(probes, targets, progress)
    finally:
        for p in probes.values():
            if p.stream is not None:
                p.stream.proc.close()
    return {name: p.facts for name, p in probes.items()}


def _phase2(probes: dict[str, _Probe], targets: dict[str, list[dict[str, Any]]],
            progress: Progress | None) -> None:
    """Send every probe its targets on its stdin, then collect the answers (one deadline for all)."""
    asked = {name: tg for name, tg in targets.items() if tg}
    if progress:
        progress("testing reachability", 0, len(asked))
    sent = []
    for name, tg in asked.items():
        stream = probes[name].stream
        assert stream is not None
        try:
            stream.send("CONNECT " + json.dumps({"targets": tg, "timeout": CONNECT_TIMEOUT_S}))
            sent.append(name)
        except Exception as exc:  # the channel is gone: this node's reachability is unknown
            probes[name].facts.reach_error = f"could not send the targets: {exc}"
    deadline = time.monotonic() + REACH_TIMEOUT_S
    for i, name in enumerate(sent):
        stream = probes[name].stream
        assert stream is not None
        reach = stream.wait_for("ORCH-REACH", max(0.0, deadline - time.monotonic()))
        if reach is None:
            said = "; ".join(stream.noise[-3:])
            probes[name].facts.reach_error = ("the probe ended before answering" if stream.done else
                                              f"no answer within {REACH_TIMEOUT_S:.0f} s") + (f": {said}" if said else "")
        else:
            probes[name].facts.reach, bad = read_answer(reach, REACH_SHAPE, "reach")
            probes[name].facts.malformed += bad
        if progress:
            progress("testing reachability", i + 1, len(asked))
