"""Facts: one probe per node per preflight, sent over the transport → `NodeFacts` per node.

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

What tools print is parsed in `parsers.py`, the answer held to its shape in `shapes.py`, and the
job's path arguments guessed in `jobargs.py`.
"""

from __future__ import annotations

import json
import math
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import container
from ..config.container import Pins
from ..config.inventory import Inventory
from ..config.nodes import Node
from ..config.plan import gpu_devices, job_command
from ..errors import TransportError
from ..node import program as node_program
from ..transport import Cluster, Process, Transport
from ..transport.base import Progress
from . import jobcheck
from .jobargs import is_output_key, job_files
from .parsers import ChronyTracking, GpuFacts, IbDevice, parse_chrony_tracking, parse_gpus, parse_ib
from .shapes import FACTS_SHAPE, REACH_SHAPE, read_answer

if TYPE_CHECKING:
    from .controller_clock import ControllerClock
    from .fabric.job import FabricFacts

PHASE1_TIMEOUT_S = 150.0  # a cold `import torch` on a loaded node is the slow part
CONNECT_TIMEOUT_S = 5.0
REACH_TIMEOUT_S = CONNECT_TIMEOUT_S * 6 + 30
PING_TIMEOUT_S = 15.0
SERVE_S = 60.0
CHECK_RUN_ID = "preflight"
"""The run id the job's own check runs as when the preflight has none yet (`orch check`, the
first preflight of `orch up`): the trainer then names its run directory after it, a directory no
run has (the real run id is new too)."""


# ----------------------------------------------------------------------------- parsed facts


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
    """What the fabric job measured (`preflight/fabric/job.py`), the same object on every node; None
    where the fabric check was not selected."""
    controller_clock: ControllerClock | None = None
    """The controller's own offset to `checks.clock.ntp_server` (`controller_clock.measure`), the
    same object on every node; None where the clock check was not selected."""

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


# ----------------------------------------------------------------------------- probing


def probe_command(python: str, args: dict[str, Any]) -> list[str]:
    """`python -c <program> <json args>`: the probe rides compressed in argv, as bytecode where the
    node's Python can load this one's (its stdin carries the controller's commands)."""
    return [python, "-c", node_program("probe", ("trust",)), json.dumps(args, sort_keys=True)]


def probe_args(
    inv: Inventory, node: Node, want: Sequence[str], token: str, n_peers: int, run_id: str = CHECK_RUN_ID
) -> dict[str, Any]:
    """The JSON the probe gets: what to gather, which listeners to open, and the job's own check
    to run (`jobcheck.request`, as run `run_id`)."""
    paths = job_files(inv) if "job" in want else {}
    if not paths and inv.job.container is not None and "container" in want:  # its output folders, seen inside
        paths = {k: v for k, v in job_files(inv).items() if is_output_key(k)}
    is_master = node.name == inv.master.name
    net = "ports" in want or "rdma" in want
    return {
        "node": node.name,
        "token": token,
        "want": list(want),
        "inventory_env": sorted(node.env),
        "env_on_stdin": True,
        "ntp_server": inv.checks.clock.ntp_server if "clock" in want else None,
        "paths": paths,
        "text_for": [k for k in paths if k.replace("-", "_") == "data"],
        "outputs": [k for k in paths if is_output_key(k)],
        "workdir": inv.job.workdir if "job" in want else None,
        "run_root": inv.job.run_root if "job" in want else None,
        "master_port": inv.master_port if is_master and "ports" in want else None,
        "ring_addr": node.addr if net and n_peers > 1 else None,
        "expect": ((n_peers - 1) if is_master and "ports" in want else 0) + (1 if net and n_peers > 1 else 0),
        # later fan-out batches start after earlier ones finished phase 1; the heartbeat ends a
        # probe as soon as the controller hangs up, so a long deadline costs nothing
        "serve_s": SERVE_S + PHASE1_TIMEOUT_S * (math.ceil(len(inv.nodes) / inv.fanout) - 1),
        "software": "software" in want,
        "torch_cuda": bool(node.gpus) and "gpus" in want,
        "job_check": jobcheck.request(inv, node, run_id) if "job" in want else None,
        "job_argv": job_argvs(inv, node, run_id),
        "container_leftovers": container.leftovers_argv(inv.job.container, inv.name) or None
        if inv.job.container is not None and "container" in want
        else None,
        "container_image": container.image_argv(inv.job.container)
        if inv.job.container is not None and "container" in want
        else None,
        "outputs_inside": inv.job.container is not None and "container" in want,
        "verbs_device": inv.checks.rdma_devices[0]
        if "rdma" in want and inv.checks.rdma_devices and n_peers > 1
        else None,
    }


JOB_FACTS = ("software", "torch_cuda", "outputs")
"""The probe's facts gathered as the job's interpreter (each in a container of its own, at once)."""


def job_argvs(inv: Inventory, node: Node, run_id: str = CHECK_RUN_ID) -> dict[str, list[str]] | None:
    """What the probe runs the job's interpreter as for each of `JOB_FACTS` (`plan.job_command`,
    the code appended), or None: the job's interpreter is the probe's own."""
    if job_command(inv, node, []) == [node.python]:
        return None
    return {role: job_command(inv, node, [], run_id=run_id, env=list(node.env), role=role) for role in JOB_FACTS}


@dataclass(frozen=True)
class HeldImage:
    """What a node holds under `job.container.image` (the probe's `container_image` fact)."""

    image_id: str | None
    """Its ID (docker/podman, without `sha256:`) or the .sif's sha256; None: not there."""
    env: Mapping[str, str]
    """The image's configured environment (NVIDIA_REQUIRE_CUDA, CUDA_VERSION...)."""
    error: str | None = None
    """Why the node could not be asked (the runtime did not answer); None when it answered."""


_NO_SUCH_IMAGE = ("no such image", "no such object", "image not known", "not found", "no such file")


def held_image(nf: NodeFacts) -> HeldImage | None:
    """The `container_image` fact read back; None when the probe did not gather it."""
    res = nf.raw.get("container_image")
    if not res:
        return None
    out, err = (res.get("out") or "").strip(), (res.get("err") or "").strip()
    if res.get("rc") != 0:
        said = err.splitlines()[-1] if err else f"exit {res.get('rc')}"
        if res.get("rc") is not None and any(k in err.lower() for k in _NO_SUCH_IMAGE):
            return HeldImage(None, {})
        return HeldImage(None, {}, said)
    first = out.splitlines()[0] if out else ""
    ident, _, env_json = first.partition("\t")
    env: dict[str, str] = {}
    try:
        items = json.loads(env_json) if env_json.startswith("[") else []
    except ValueError:
        items = []
    for item in items or []:
        key, eq, value = str(item).partition("=")
        if eq:
            env[key] = value
    ident = ident.split()[0] if ident.split() else ""
    return HeldImage(ident.removeprefix("sha256:") or None, env)


def container_pins(inv: Inventory, facts: dict[str, NodeFacts]) -> Pins | None:
    """What a container launch pins from the probe's facts: each node's GPUs for its ranks by UUID
    (`plan.gpu_devices`' choice, an index turned into its GPU's UUID as nvidia-smi reports it). A
    node whose choice cannot be told by UUID keeps it as it is. None without `job.container`."""
    if inv.job.container is None:
        return None
    gpus: dict[str, tuple[str, ...]] = {}
    for node in inv.nodes:
        chosen = gpu_devices(inv, node)
        nf = facts.get(node.name)
        if not chosen or nf is None or not nf.ok:
            continue
        by_index = {str(g.index): g.uuid for g in nf.gpus.gpus if g.uuid}
        uuids = [d if d.startswith(("GPU-", "MIG-")) else by_index.get(d) for d in chosen]
        if all(uuids):
            gpus[node.name] = tuple(u for u in uuids if u)
    return Pins(image_id=pinned_image(inv, facts), gpus=gpus)


def pinned_image(inv: Inventory, facts: dict[str, NodeFacts]) -> str | None:
    """The image ID every node holds under `job.container.image` (docker/podman), which the launch
    then runs instead of the name: a tag moved after the preflight cannot change what runs. None
    when a node lacks it, disagrees, or was not asked."""
    c = inv.job.container
    if c is None or c.runtime == "apptainer":
        return None
    ids = set()
    for node in inv.nodes:
        nf = facts.get(node.name)
        held = held_image(nf) if nf is not None and nf.ok else None
        if held is None or held.image_id is None:
            return None
        ids.add(held.image_id)
    return ids.pop() if len(ids) == 1 else None


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
                    except (ValueError, KeyError, TypeError, RecursionError):
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


def _start_probe(
    inv: Inventory, t: Transport, want: Sequence[str], token: str, n: int, run_id: str = CHECK_RUN_ID
) -> _Probe:
    node = t.node
    nf = NodeFacts(node)
    try:
        nf.connect_ms = t.connect()
    except TransportError as exc:
        nf.error, nf.error_kind, nf.hint = exc.message, exc.kind, exc.hint
        return _Probe(nf)
    args = probe_args(inv, node, want, token, n, run_id)
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
        said = "; ".join(stream.noise[-3:]) or (
            "no output" if code is not None else f"no answer within {PHASE1_TIMEOUT_S:.0f} s"
        )
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
            out[node.name].append(
                {"kind": "master", "node": inv.master.name, "addr": inv.master.addr, "port": inv.master_port}
            )
        if len(alive) > 1:
            succ = alive[(i + 1) % len(alive)]
            ring = probes[succ.name].facts.listen.get("ring") or {}
            if ring.get("port"):
                out[node.name].append({"kind": "ring", "node": succ.name, "addr": succ.addr, "port": ring["port"]})
            verbs = probes[succ.name].facts.listen.get("verbs") or {}
            tools = (probes[node.name].facts.raw.get("ib") or {}).get("tools") or {}
            if verbs.get("port") and tools.get("ibv_rc_pingpong"):
                out[node.name].append(
                    {
                        "kind": "verbs",
                        "node": succ.name,
                        "addr": succ.addr,
                        "port": verbs["port"],
                        "device": verbs["device"],
                    }
                )
    return out


def collect(
    inv: Inventory, cluster: Cluster, want: Sequence[str], progress: Progress | None = None, run_id: str | None = None
) -> dict[str, NodeFacts]:
    """Probe every node (two bounded phases, see the module docstring); never raises for a node.
    `run_id`: the run the job's own check speaks for (a retry's); none yet: a fresh placeholder."""
    run_id = run_id or f"{CHECK_RUN_ID}-{secrets.token_hex(4)}"
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
        p = _start_probe(inv, t, want, token, n, run_id)
        tick(f"probed {t.node.name}")
        return p

    if progress:
        progress("probing", 0, n)
    started = cluster.fan_out(phase1)
    ok, failed = started.succeeded, started.failed
    probes = {}
    for node in inv.nodes:  # in inventory order, as the facts are returned
        exc = failed.get(node.name)
        probes[node.name] = (
            ok[node.name]
            if exc is None
            else _Probe(NodeFacts(node, error=f"{node.name}: {type(exc).__name__}: {exc}", error_kind="error"))
        )
    try:
        targets = _targets(inv, probes)
        if any(targets.values()):
            _phase2(probes, targets, progress)
    finally:
        for p in probes.values():
            if p.stream is not None:
                p.stream.proc.close()
    return {name: p.facts for name, p in probes.items()}


def _phase2(probes: dict[str, _Probe], targets: dict[str, list[dict[str, Any]]], progress: Progress | None) -> None:
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
            probes[name].facts.reach_error = (
                "the probe ended before answering" if stream.done else f"no answer within {REACH_TIMEOUT_S:.0f} s"
            ) + (f": {said}" if said else "")
        else:
            probes[name].facts.reach, bad = read_answer(reach, REACH_SHAPE, "reach")
            probes[name].facts.malformed += bad
        if progress:
            progress("testing reachability", i + 1, len(asked))
