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

Stopped (Ctrl-C, or SIGTERM, which `collect` turns into the same), the controller closes every
probe's channel at once, in either phase, and the probe ends what it started (`node/probe.py`:
the job's check, the throw-away container of the job's image, removed by its stop hook).

What tools print is parsed in `parsers.py`, the answer held to its shape in `shapes.py`, and the
job's path arguments guessed in `jobargs.py`.
"""

from __future__ import annotations

import json
import math
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..config.inventory import Inventory
from ..config.jobenv import job_env
from ..config.nodes import Node
from ..config.plan import job_command
from ..errors import TransportError
from ..node import program as node_program
from ..transport import Cluster, Process, Transport
from ..transport.base import Progress
from ..waits import sigterm_as_interrupt
from . import jobcheck
from .jobargs import is_output_key, job_files
from .results import NodeFacts
from .shapes import REACH_SHAPE, read_answer

PHASE1_TIMEOUT_S = 150.0  # a cold `import torch` on a loaded node is the slow part
CONNECT_TIMEOUT_S = 5.0
REACH_TIMEOUT_S = CONNECT_TIMEOUT_S * 6 + 30
PING_TIMEOUT_S = 15.0
SERVE_S = 60.0
CHECK_RUN_ID = "preflight"
"""The run id the job's own check runs as when the preflight has none yet (`orch check`, the
first preflight of `orch up`): the trainer then names its run directory after it, a directory no
run has (the real run id is new too)."""


# ----------------------------------------------------------------------------- probing


def probe_command(python: str, args: dict[str, Any]) -> list[str]:
    """`python -c <program> <json args>`: the probe rides compressed in argv, as bytecode where the
    node's Python can load this one's (its stdin carries the controller's commands)."""
    return [python, "-c", node_program("probe", ("trust",)), json.dumps(args, sort_keys=True)]


def probe_args(
    inv: Inventory, node: Node, want: Sequence[str], token: str, n_peers: int, run_id: str = CHECK_RUN_ID
) -> dict[str, Any]:
    """The JSON the probe gets: what to gather, which listeners to open, the job's own check to
    run (`jobcheck.request`, as run `run_id`), and the job's environment (`jobenv.JobEnv`): with a
    container, one run of it answers every question only the job's interpreter can (`job_python`,
    `in_image`), and the runtime lists the leftover containers and the image the node holds."""
    env = job_env(inv, node, run_id=run_id)
    apart = env.apart
    files = job_files(inv) if "job" in want or apart and "container" in want else {}
    inside = {k: v for k, v in files.items() if apart and not k.startswith("sync[")}
    """The job's paths as the job sees them (in its container: `job.sync` entries are the host's)."""
    on_host = {k: v if k not in inside or not v.startswith("/") else env.host_path(v) for k, v in files.items()}
    paths = {k: v for k, v in on_host.items() if v is not None} if "job" in want else {}
    """Each path where it is on the node's host (through the container's mounts): judged there."""
    only_inside = sorted(k for k, v in on_host.items() if v is None and not is_output_key(k)) if "job" in want else []
    """The job's inputs in the image's own files: judged inside (`paths_inside`)."""
    is_master = node.name == inv.master.name
    in_image = bool({"software", "job", "gpus"} & set(want))
    net = "ports" in want or "rdma" in want
    check = jobcheck.request(inv, node, run_id) if "job" in want else None
    names = [*node.env, *(check["env"] if check and apart else ())]  # what the one container gets by name
    return {
        "node": node.name,
        "token": token,
        "want": list(want),
        "inventory_env": sorted(node.env),
        "env_on_stdin": True,
        "ntp_server": inv.checks.clock.ntp_server if "clock" in want else None,
        "paths": paths,
        "text_for": [k for k in paths if k.replace("-", "_") == "data"],
        "outputs": [k for k in files if is_output_key(k)],
        "in_container": inside,
        "inside_only": only_inside,
        "mounts": env.mounts() if apart else [],
        "workdir": inv.job.workdir if "job" in want else None,
        "run_root": inv.job.run_root if "job" in want else None,
        "master_port": inv.master_port if is_master and "ports" in want else None,
        "master_addr": inv.master.addr if "ports" in want and n_peers > 1 else None,
        "ring_addr": node.addr if net and n_peers > 1 else None,
        "expect": ((n_peers - 1) if is_master and "ports" in want else 0) + (1 if net and n_peers > 1 else 0),
        # later fan-out batches start after earlier ones finished phase 1; the heartbeat ends a
        # probe as soon as the controller hangs up, so a long deadline costs nothing
        "serve_s": SERVE_S + PHASE1_TIMEOUT_S * (math.ceil(len(inv.nodes) / inv.fanout) - 1),
        "software": "software" in want,
        "torch_cuda": bool(node.gpus) and "gpus" in want,
        "job_check": check,
        "job_python": job_command(inv, node, [], run_id=run_id, env=names, role=PROBE_ROLE),
        "job_stop": env.stop(PROBE_ROLE) or None,
        "in_image": apart,
        "container_leftovers": (env.leftovers() or None) if "container" in want else None,
        # the image the launch runs, asked before anything starts in it: where it is missing (and will
        # not be pulled) the probe starts no container of it, and the rows that need one say so once
        "container_image": (env.inspect() or None) if "container" in want or apart and in_image else None,
        "image_required": apart and env.needs_image,
        "outputs_inside": apart and "container" in want,
        "verbs_device": inv.checks.rdma_devices[0]
        if "rdma" in want and inv.checks.rdma_devices and n_peers > 1
        else None,
    }


PROBE_ROLE = "probe"
"""The name the probe's one throw-away container of the job's image adds (`orch-<run>-<node>-probe`)."""


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


def facts_shape() -> Any:
    """`checks.FACTS_SHAPE`: what the probe answers, declared by the checks that read it. Imported
    once the first answer is in, so that the checks' import still overlaps the probe (the runner
    imports them beside it) and a preflight whose checks do not import still stops in the runner."""
    from .checks import FACTS_SHAPE

    return FACTS_SHAPE


class _Opened:
    """Every probe process this preflight started: `close_all` ends them (a transport's own close
    leaves a `popen` process to its caller), and one that starts after it is ended at once."""

    def __init__(self) -> None:
        self.procs: list[Process] = []
        self.closed = False
        self.lock = threading.Lock()

    def add(self, proc: Process) -> Process:
        with self.lock:
            self.procs.append(proc)
            late = self.closed
        if late:
            proc.close()
        return proc

    def close_all(self) -> None:
        with self.lock:
            self.closed, procs = True, list(self.procs)
        for proc in procs:
            proc.close()


@dataclass
class _Probe:
    facts: NodeFacts
    stream: _Stream | None = None
    python: str = ""


def _start_probe(
    inv: Inventory,
    t: Transport,
    want: Sequence[str],
    token: str,
    n: int,
    run_id: str = CHECK_RUN_ID,
    opened: _Opened | None = None,
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
            if opened is not None:
                opened.add(proc)
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
            nf.raw, nf.malformed = read_answer(facts, facts_shape(), "facts")
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
    `run_id`: the run the job's own check speaks for (a retry's); none yet: a fresh placeholder.
    Ctrl-C or SIGTERM closes every probe's channel at once (which ends it on its node) and raises
    KeyboardInterrupt."""
    with sigterm_as_interrupt():
        return _collect(inv, cluster, want, progress, run_id)


def _collect(
    inv: Inventory, cluster: Cluster, want: Sequence[str], progress: Progress | None, run_id: str | None
) -> dict[str, NodeFacts]:
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

    opened = _Opened()

    def phase1(t: Transport) -> _Probe:
        p = _start_probe(inv, t, want, token, n, run_id, opened)
        tick(f"probed {t.node.name}")
        return p

    if progress:
        progress("probing", 0, n)
    try:
        started = cluster.fan_out(phase1, interruptible=True)
    except KeyboardInterrupt:  # every probe's channel closed at once: each ends what it started
        opened.close_all()
        raise
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
