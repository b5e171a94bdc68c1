"""The copy chain (issue 51): `orch sync`'s files and `orch image push`'s image sent once from the
controller into a pipelined chain of the nodes that need them, each node writing what it receives
and forwarding it to the next as it arrives.

A relay (`node/relay.py`) is started on every selected node through its transport
(`Transport.spawn`: the reach, so whatever reaches a node carries it), its stdin and stdout the
controller's channel to it. The relays first say what their node holds (`ready`: the files it
lacks by rsync's rule, or the image ID it holds; the room where it would write); the caller
decides who needs what (`sync.py`, `image.py`); the members, in `chains`, are told where to
forward, and the controller feeds each chain's head. Between nodes the data goes over TCP on the
nodes' data-plane address (`addr`), each hop proving the transfer's secret (a new 32-byte secret
per transfer, sent to each relay over its transport, never on a command line); every chunk
carries its sha256 and a MAC.

Self-healing, here: a member that goes silent (no event for `SILENT_S`: a pulled cable, a stopped
node), whose relay ends, or that holds the chain up (`judge_stall`) is dropped and named; its
predecessor is told to connect to its successor (`splice`), which resumes from the offset it has
verified. A member that cannot reach its successor gets a cut instead (`cut`): the controller
feeds the successor itself. A member that is clearly slower than the one before it, measured on
the first chunks, is moved to the end of its chain (`bottleneck`, `move_last`), once.

The pure parts (the topology and its changes, the judges, the choice of method) are functions of
plain values; `Chain` is the side-effect part. tests/unit/test_chain.py holds the pure parts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import queue
import secrets
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config.nodes import Node
from ..errors import OrchError, TransportError
from ..node import FROM_STDIN_OPEN, relay
from ..node import program as node_program
from ..transport import Cluster, Transport

log = logging.getLogger("orch.chain")

METHODS = ("auto", "chain", "direct")
"""`--method` of `orch sync` and `orch image push`: `auto` chooses (`choose`)."""
CHAIN_MIN_BYTES = 16_000_000
"""Below this payload `auto` copies directly: starting the relays costs about what a direct copy
of this much to a second node does on a 100 Mbit/s link."""
CHUNK = 256 << 10
"""Bytes per data frame: the pipeline's fill costs one chunk per hop."""
WINDOW = 64 << 20
"""The most bytes a member (and the controller, for the head) holds that some reader after it may
still need: memory per relay, and how far the chain's tail may lag its head."""
HEARTBEAT_S = 0.5
PING_S = 2.0
SILENT_S = 15.0
"""A member not heard from for this long is dropped (its cable pulled, the node stopped)."""
STALL_S = 30.0
"""Nothing received anywhere in the chain for this long: the member holding it up is dropped
(`orch sync`'s; `orch image push --stall-timeout` sets its own, `Chain(stall_s=...)`)."""
SINK_GRACE_S = 5.0
"""Where the relays judge their own sinks (an image's load: `stall_s` in their config, ended by
the relay, which relays on), the controller blames a member for a stalled chain this much later
than they judge: the relay's word comes first, and the members after it complete."""
RELAY_SILENCE_S = 30.0
"""A relay that hears nothing from the controller for this long removes what it wrote and exits."""
START_S = 120.0
"""The longest a relay may take to start and say what its node holds."""
MAX_LINE = 8 << 20
NOISE_LINES = 200
"""Lines that are not events a login shell may print before the relay's first (a banner)."""
MEASURE_S = 2.0
"""How long a member receives before the chain is reordered (slowest last): the members' average
rates from their first byte, once one of them has received for this long."""
SLOW = 0.4
"""A member receiving at less than this fraction of its predecessor's rate is the bottleneck: a
slower link or disk, not a moment of a busy CPU (seen at 0.5 on a loaded test machine)."""


def choose(method: str, nodes: int, payload: int) -> tuple[str, str]:
    """(`chain` or `direct`, why), for `nodes` nodes and a payload of `payload` bytes."""
    if method == "chain":
        return "chain", "--method chain"
    if method == "direct":
        return "direct", "--method direct"
    if nodes < 2:
        return "direct", "one node: a chain would carry the same one copy"
    if payload < CHAIN_MIN_BYTES:
        return "direct", f"{payload / 1e6:.1f} MB, under the chain's {CHAIN_MIN_BYTES / 1e6:.0f} MB"
    return "chain", f"{nodes} nodes, {payload / 1e6:.1f} MB: one copy from here, relayed node to node"


# ----------------------------------------------------------------------------- the topology

Chains = tuple[tuple[str, ...], ...]
"""The members in order, per chain: each chain's head is fed by the controller."""


@dataclass(frozen=True)
class Action:
    """What the controller does to mend the topology: `feed` NODE itself (from NODE's verified
    offset), tell NODE to forward `next` to `to`, or tell NODE it is a `tail` (forwards to no one)."""

    op: str
    node: str
    to: str | None = None


def role(chains: Chains, name: str) -> str | None:
    """`head` (fed by the controller; a chain of one too), `relay`, `tail`, or None (not a member)."""
    for chain in chains:
        if name in chain:
            i = chain.index(name)
            return "head" if i == 0 else "tail" if i == len(chain) - 1 else "relay"
    return None


def upstream(chains: Chains, name: str) -> str | None:
    """Who feeds `name`: a member, "" (the controller), None (not a member)."""
    for chain in chains:
        if name in chain:
            i = chain.index(name)
            return chain[i - 1] if i else ""
    return None


def splice(chains: Chains, gone: str) -> tuple[Chains, list[Action]]:
    """`gone` out of its chain: its predecessor forwards to its successor (or the controller feeds
    the successor, or the predecessor becomes the tail)."""
    out, actions = [], []
    for chain in chains:
        if gone not in chain:
            out.append(chain)
            continue
        i = chain.index(gone)
        rest = chain[:i] + chain[i + 1 :]
        before, after = (chain[i - 1] if i else None), (chain[i + 1] if i + 1 < len(chain) else None)
        if after is not None:
            actions.append(Action("next", before, after) if before is not None else Action("feed", after))
        elif before is not None:
            actions.append(Action("tail", before))
        if rest:
            out.append(rest)
    return tuple(out), actions


def cut(chains: Chains, pred: str, succ: str) -> tuple[Chains, list[Action]]:
    """`pred` could not reach `succ`: the chain splits there, the controller feeding `succ`."""
    out, actions = [], []
    for chain in chains:
        if pred in chain and succ in chain and chain.index(succ) == chain.index(pred) + 1:
            i = chain.index(succ)
            out += [chain[:i], chain[i:]]
            actions += [Action("tail", pred), Action("feed", succ)]
        else:
            out.append(chain)
    return tuple(out), actions


def move_last(chains: Chains, slow: str) -> tuple[Chains, list[Action]]:
    """`slow` moved to the end of its chain: it stops forwarding, its predecessor forwards to its
    successor, and the old tail forwards to it."""
    out, actions = [], []
    for chain in chains:
        if slow not in chain or chain[-1] == slow:
            out.append(chain)
            continue
        i = chain.index(slow)
        rest = chain[:i] + chain[i + 1 :]
        actions.append(Action("tail", slow))
        after = chain[i + 1]
        actions.append(Action("next", chain[i - 1], after) if i else Action("feed", after))
        actions += [Action("next", rest[-1], slow)]
        out.append((*rest, slow))
    return tuple(out), actions


@dataclass(frozen=True)
class Seen:
    """What the controller knows of one member at a moment (from its events)."""

    got: int
    """Bytes it has verified."""
    sent: int
    """Bytes it has handed to its successor's connection."""
    wait: str = ""
    """What it waits on: `up` (data), `down` (its successor, or the window), `sink` (its disk or load)."""
    heard_s: float = 0.0
    """Seconds since its last event."""


def judge_silent(seen: Mapping[str, Seen], silent_s: float) -> list[tuple[str, str]]:
    """Members not heard from for `silent_s`, with why."""
    return [
        (name, f"no word from its relay for {s.heard_s:.0f} s (its link is down, or the node stalled)")
        for name, s in seen.items()
        if s.heard_s >= silent_s
    ]


def judge_stall(chains: Chains, seen: Mapping[str, Seen], fed: Mapping[str, int], total: int) -> tuple[str, str] | None:
    """The member that holds a stalled chain up, with why: the first whose feeder (the controller
    for a head: `fed`, what it wrote to it) has handed it bytes it has not verified. None when no
    member is waited on (everything sent was received)."""
    for chain in chains:
        for i, name in enumerate(chain):
            s = seen[name]
            if s.got >= total:
                continue
            given = fed.get(name, 0) if i == 0 else seen[chain[i - 1]].sent
            if given > s.got:
                what = "its disk or its load" if s.wait == "sink" else "its link"
                return name, f"took nothing more for a while though {given - s.got} bytes waited for it ({what})"
    return None


def rate(samples: Sequence[tuple[float, int]], span_s: float) -> float | None:
    """Bytes per second over the last `span_s` of (time, bytes) samples; None when they cover less."""
    if len(samples) < 2:
        return None
    end_t, end_b = samples[-1]
    for t, b in reversed(samples):
        if end_t - t >= span_s:
            return (end_b - b) / (end_t - t)
    return None


def bottleneck(chains: Chains, rates: Mapping[str, float | None], total: int, got: Mapping[str, int]) -> str | None:
    """The first member (not a head, not a tail) receiving at under `SLOW` of its predecessor's
    rate while it still lacks bytes: the chain's slowest link, which belongs at its end."""
    for chain in chains:
        for i in range(1, len(chain) - 1):
            mine, theirs = rates.get(chain[i]), rates.get(chain[i - 1])
            if mine is None or not theirs or got.get(chain[i], 0) >= total:
                continue
            if mine < SLOW * theirs:
                return chain[i]
    return None


def limiting_hop(chains: Chains, rates: Mapping[str, float]) -> tuple[str, str, float] | None:
    """(from, to, bytes/s) of the hop that set the chain's pace: the first member, in chain order,
    that received at the slowest rate (those after it are as slow only because it was); `from`
    "" is the controller."""
    known = [r for chain in chains for r in (rates.get(n) for n in chain) if r]
    if not known:
        return None
    slowest = min(known)
    for chain in chains:
        for i, name in enumerate(chain):
            r = rates.get(name)
            if r and r <= slowest * 1.05:
                return (chain[i - 1] if i else "", name, r)
    return None


# ----------------------------------------------------------------------------- the sources


class Source:
    """The stream the controller feeds, read at any offset (a head that dies is replaced by its
    successor, fed from its own offset)."""

    total: int

    def read(self, offset: int, n: int) -> bytes:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        pass


class ArchiveSource(Source):
    """An image archive on this machine's disk."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY)
        self.total = os.fstat(self.fd).st_size

    def read(self, offset: int, n: int) -> bytes:
        data = os.pread(self.fd, n, offset)
        if len(data) != n:
            raise OrchError(f"the image archive shrank while being sent (at byte {offset})", "push again")
        return data

    def close(self) -> None:
        os.close(self.fd)


class FileSource(Source):
    """Files one after another, each followed by its sha256 (`relay.DIGEST` bytes), computed as
    the stream first passes over it, so every node checks each file against the bytes this
    machine read."""

    def __init__(self, files: Sequence[tuple[str, int]]) -> None:
        self.files = list(files)
        self.starts = relay.layout([size for _, size in self.files])
        self.total = self.starts[-1] + self.files[-1][1] + relay.DIGEST if self.files else 0
        self.fds: dict[int, int] = {}
        self.digests: dict[int, bytes] = {}
        self.high = 0
        """The stream hashed so far: the files (and their digests) below it are known."""
        self.hashing: Any = None
        self.lock = threading.Lock()

    def _fd(self, i: int) -> int:
        fd = self.fds.get(i)
        if fd is None:
            fd = self.fds[i] = os.open(self.files[i][0], os.O_RDONLY)
        return fd

    def _bytes(self, i: int, at: int, n: int) -> bytes:
        data = os.pread(self._fd(i), n, at)
        if len(data) != n:
            path = self.files[i][0]
            raise OrchError(f"{path} changed on this machine while it was being sent", "sync again once it is written")
        return data

    def _extend(self, to: int) -> None:
        """Hash the files in stream order up to `to` (under the lock)."""
        while self.high < to:
            i = self._entry(self.high)
            start, size = self.starts[i], self.files[i][1]
            if self.high == start:
                self.hashing = hashlib.sha256()
            if self.high < start + size:
                n = min(1 << 20, start + size - self.high)
                self.hashing.update(self._bytes(i, self.high - start, n))
                self.high += n
                continue
            self.digests[i] = self.hashing.digest()
            self.high = start + size + relay.DIGEST

    def _entry(self, offset: int) -> int:
        lo, hi = 0, len(self.starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def read(self, offset: int, n: int) -> bytes:
        with self.lock:
            self._extend(min(self.total, offset + n))
        out = []
        while n > 0:
            i = self._entry(offset)
            start, size = self.starts[i], self.files[i][1]
            if offset < start + size:
                k = min(n, start + size - offset)
                out.append(self._bytes(i, offset - start, k))
            else:
                k = min(n, start + size + relay.DIGEST - offset)
                at = offset - start - size
                out.append(self.digests[i][at : at + k])
            offset += k
            n -= k
        return b"".join(out)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


# ----------------------------------------------------------------------------- the members


@dataclass
class Member:
    """One node's relay, as the controller sees it."""

    node: Node
    index: int
    transport: Transport
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    ready: dict[str, Any] | None = None
    heard: float = 0.0
    got: int = 0
    sunk: int = 0
    sent: int = 0
    low: int = 0
    wait: str = ""
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))
    """(its relay's clock, bytes it had verified then), from its heartbeats."""
    span: float = 0.0
    """Seconds from its first verified byte to its latest, on its own clock."""
    started: float = 0.0
    finished: float | None = None
    done: dict[str, Any] | None = None
    sink_failed: str | None = None
    sink_err: str = ""
    """The end of its load's stderr, where its image sink failed."""
    sink_stalled: bool = False
    """Its load took no byte for its relay's `stall_s` (or, with `sink_finishing`, did not finish
    within `relay.finish_s` of its last byte): its relay ended it and relayed on."""
    sink_finishing: bool = False
    sink_at: int = 0
    """The bytes its sink had taken when it failed."""
    dropped: str | None = None
    unreachable: bool = False
    """Dropped because the controller lost it (silent, or its reach ended as an unreachable node's)."""
    stalled: bool = False
    """Dropped because it held the chain up past the stall deadline (`Chain.stall_s`)."""
    error: str | None = None
    bye: bool = False
    eof: bool = False
    exit_code: int | None = None
    resent: int = 0
    bad: int = 0
    err_tail: bytes = b""
    lock: threading.Lock = field(default_factory=threading.Lock)
    outbox: queue.Queue[bytes | None] = field(default_factory=queue.Queue)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def over(self) -> bool:
        return self.bye or self.dropped is not None or self.eof

    skipped: bool = False
    role: str | None = None
    """Its place in the chain: `head`, `relay`, `tail` (the last it had, for one dropped), or None."""

    def rate(self) -> float | None:
        """Bytes per second it received, its first verified byte to its last (its own clock)."""
        return self.got / self.span if self.got and self.span > 0 else None

    def said(self) -> str:
        """Its relay's last words: its own error, else its stderr's last line, with the exit code."""
        if self.error:
            return self.error
        lines = [ln.strip() for ln in self.err_tail.decode("utf-8", "replace").splitlines() if ln.strip()]
        code = f" (exit {self.exit_code})" if self.exit_code is not None else ""
        return (lines[-1] if lines else "its relay ended without a word") + code


@dataclass(frozen=True)
class View:
    """One member's progress, for the live display."""

    node: str
    role: str | None
    got: int
    total: int
    bytes_per_s: float | None
    state: str


@dataclass(frozen=True)
class Leg:
    """One node's part in a chain transfer: what `--json` says of it."""

    role: str | None
    received: int
    """Bytes it received and verified (the stream: its files and their digests, or the archive)."""
    seconds: float
    """From the moment it was told to take part to its copy verified (or now)."""
    bytes_per_s: float | None
    """What it received per second, its first byte to its last."""

    def to_json(self) -> dict[str, Any]:
        rate = round(self.bytes_per_s) if self.bytes_per_s else None
        return {"role": self.role, "received_bytes": self.received, "bytes_per_s": rate}


@dataclass(frozen=True)
class ChainSummary:
    """The chain as a whole: its order at the start and at the end, the stream's size, what
    happened to it (drops, cuts, moves, resent chunks), and the hop that set its pace."""

    first: Chains
    last: Chains
    bytes: int
    notes: tuple[str, ...]
    limited_by: tuple[str, str, float] | None
    start_s: float = 0.0
    """Seconds the relays took to start and say what their nodes hold (one login per node)."""

    def to_json(self) -> dict[str, Any]:
        hop = self.limited_by
        return {
            "order": [list(c) for c in self.first],
            "final_order": [list(c) for c in self.last],
            "bytes": self.bytes,
            "start_s": round(self.start_s, 3),
            "notes": list(self.notes),
            "limited_by": {"from": hop[0] or None, "to": hop[1], "bytes_per_s": round(hop[2])} if hop else None,
        }


def short_of_room(rooms: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a node has no room for what it would receive (each of `rooms`: a `path`, its `free`
    bytes and the bytes it `need`s; entries of one `dev` add up), or None."""
    need: dict[Any, int] = {}
    first: dict[Any, Mapping[str, Any]] = {}
    for room in rooms:
        key = room.get("dev", room.get("path"))
        need[key] = need.get(key, 0) + _int(room.get("need"))
        first.setdefault(key, room)
    for key, want in need.items():
        free = _int(first[key].get("free"))
        if want > free:
            return f"no room: needs {want / 1e6:.1f} MB on {first[key].get('path')}, {free / 1e6:.1f} MB free there"
    return None


Watch = Callable[[Sequence[View]], None]
"""watch(views): every member's progress, a few times a second while the chain runs."""


class Chain:
    """The relays on `nodes`, one transfer. `start` starts them and returns what each node said it
    holds (or why it could not say); `run` carries the stream through `chains` and returns when
    every member is done or dropped; `close` ends whatever still runs (always: `with Chain(...)`)."""

    def __init__(
        self,
        cluster: Cluster,
        nodes: Sequence[Node],
        config: Mapping[str, Any],
        watch: Watch | None = None,
        clock: Callable[[], float] = time.monotonic,
        stall_s: float = STALL_S,
    ) -> None:
        self.cluster = cluster
        self.clock = clock
        self.stall_s = stall_s + (SINK_GRACE_S if config.get("stall_s") is not None else 0.0)
        """How long nothing may move anywhere before the member holding the chain up is dropped."""
        self.watch = watch
        self.secret = secrets.token_bytes(32)
        self.tid = secrets.token_hex(8)
        self.config = dict(config)
        self.members = {n.name: Member(n, i, cluster[n.name]) for i, n in enumerate(nodes)}
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.cv = threading.Condition()
        self.chains: Chains = ()
        self.total = 0
        self.fed: dict[str, int] = {}
        self.feeders: dict[str, int] = {}
        """Each member the controller feeds, and the generation of its feeder (0: stopped)."""
        self.generation = 0
        self.notes: list[str] = []
        """What happened to the chain, in words, in order (drops, cuts, moves, resends)."""
        self.strangers = 0
        self.failure: BaseException | None = None
        self.moved = False
        self.threads: list[threading.Thread] = []
        self.start_s = 0.0
        """Seconds from starting the relays to the last one saying what its node holds."""

    # ------------------------------------------------------------------ start

    def start(self) -> dict[str, Member]:
        """Start every relay and wait until each says what its node holds (`ready`), fails, or
        `START_S` passes. Returns every member; `ready` None where it did not say (`said()`)."""
        text = node_program("relay").encode()
        for m in self.members.values():
            argv = [m.node.python, "-S", "-c", FROM_STDIN_OPEN, "orch-relay", self.tid]  # stdlib only: no site
            try:
                m.proc = m.transport.spawn(argv)
            except OSError as exc:
                m.error = f"the reach could not start here: {exc}"
                m.eof = True
                continue
            m.started = m.heard = self.clock()
            cfg = {
                **self.config,
                "tid": self.tid,
                "secret": self.secret.hex(),
                "index": m.index,
                "addr": m.node.addr,
                "window": WINDOW,
                "heartbeat_s": HEARTBEAT_S,
                "silence_s": RELAY_SILENCE_S,
            }
            m.outbox.put(str(len(text)).encode() + b"\n" + text + relay.ctrl_frame(cfg))
            for target in (self._reader, self._errors, self._writer):
                thread = threading.Thread(target=target, args=(m,), daemon=True, name=f"orch-chain-{m.name}")
                thread.start()
                self.threads.append(thread)
        began = self.clock()
        log.debug("chain %s: %d relays started", self.tid, len(self.members))
        deadline = began + START_S
        while any(m.ready is None and not m.eof for m in self.members.values()) and self.clock() < deadline:
            self._drain(0.2)
        self.start_s = self.clock() - began
        log.debug("chain %s: every relay answered in %.2f s", self.tid, self.start_s)
        for m in self.members.values():
            if m.ready is None and not m.eof:
                m.error = f"its relay said nothing in {START_S:.0f} s"
        return self.members

    def unreached(self, m: Member) -> TransportError | None:
        """The transport's own error when the reach never got into the node (exit 255 over SSH)."""
        if m.exit_code is None:
            return None
        return m.transport.unreached(m.exit_code, m.err_tail.decode("utf-8", "replace"))

    def _reader(self, m: Member) -> None:
        assert m.proc is not None and m.proc.stdout is not None
        noise = 0
        for line in iter(lambda: m.proc.stdout.readline(MAX_LINE), b""):  # type: ignore[union-attr]
            if not line.startswith(relay.EVENT.encode()):
                noise += 1
                if noise > NOISE_LINES:
                    self.events.put((m.name, {"ev": "error", "why": "its output is not a relay's"}))
                    break
                continue
            try:
                event = json.loads(line[len(relay.EVENT) :])
            except ValueError:
                event = None
            if not isinstance(event, dict) or not isinstance(event.get("ev"), str):
                self.events.put((m.name, {"ev": "error", "why": "an event that is not of a relay's shape"}))
                break
            self.events.put((m.name, event))
        m.exit_code = m.proc.wait()  # bounded: its stdout ended (or `close` ends it)
        m.transport.children.forget(m.proc)
        self.events.put((m.name, {"ev": "eof"}))

    def _errors(self, m: Member) -> None:
        assert m.proc is not None and m.proc.stderr is not None
        for line in iter(m.proc.stderr.readline, b""):
            m.err_tail = (m.err_tail + line[:2000])[-4000:]

    def _writer(self, m: Member) -> None:
        """Commands to the member, in order, never blocking the controller's loop."""
        assert m.proc is not None and m.proc.stdin is not None
        while True:
            data = m.outbox.get()
            if data is None:
                break
            if not self._write(m, data):
                break
        try:
            m.proc.stdin.close()
        except OSError:
            pass

    def _write(self, m: Member, data: bytes) -> bool:
        assert m.proc is not None and m.proc.stdin is not None
        try:
            with m.lock:
                m.proc.stdin.write(data)
                m.proc.stdin.flush()
        except (OSError, ValueError):
            return False
        return True

    def tell(self, m: Member, message: Mapping[str, Any]) -> None:
        m.outbox.put(relay.ctrl_frame(dict(message)))

    def skip(self, name: str) -> None:
        """This node takes no part: its relay exits."""
        m = self.members[name]
        m.skipped = True
        self.tell(m, {"op": "skip"})
        m.outbox.put(None)

    # ------------------------------------------------------------------ run

    def run(self, chains: Sequence[Sequence[str]], source: Source, go: Mapping[str, Mapping[str, Any]]) -> None:
        """Carry `source` through `chains` (every member's `go` message beside it: what it writes);
        the members of `go` outside `chains` get no data (`total` 0: they only finish what they
        hold). Returns when every one of them is done or dropped."""
        live = [tuple(n for n in c if not self.members[n].over) for c in chains]  # one gone since its `ready`
        self.chains = self.first = tuple(c for c in live if c)
        self._roles()
        self.total = source.total
        self.source = source
        now = self.clock()
        for name, message in go.items():
            m = self.members[name]
            member = role(self.chains, name) is not None
            nxt = self._next(name)
            after = None
            if nxt is not None:
                succ = self.members[nxt]
                after = {"host": succ.node.addr, "port": succ.port, "index": succ.index}
            self.tell(m, {"op": "go", **message, "total": self.total if member else 0, "next": after})
            m.heard = m.started = now
        for chain in self.chains:
            self._feed(chain[0])
        try:
            self._loop(set(go))
        finally:
            with self.cv:
                self.feeders.clear()
                self.cv.notify_all()
            log.debug("chain %s: every member done or dropped %.2f s after the go", self.tid, self.clock() - now)

    def _next(self, name: str) -> str | None:
        for chain in self.chains:
            if name in chain:
                i = chain.index(name)
                return chain[i + 1] if i + 1 < len(chain) else None
        return None

    def _loop(self, names: set[str]) -> None:
        last_ping = last_watch = self.clock()
        still = self.clock()
        stall_mark = self._progress()
        blameless = False
        while True:
            self._drain(0.2)
            if self.failure is not None:
                raise self.failure
            now = self.clock()
            if all(self.members[n].over for n in names):
                return
            if now - last_ping >= PING_S:
                for n in names:
                    if not self.members[n].over:
                        self.tell(self.members[n], {"op": "ping"})
                last_ping = now
            live = {n: self.members[n] for n in names if not self.members[n].over}
            seen = {n: Seen(m.got, m.sent, m.wait, now - m.heard) for n, m in live.items()}
            for name, why in judge_silent(seen, SILENT_S):
                self.drop(name, why, unreachable=True)
            mark = self._progress()
            if mark != stall_mark:
                stall_mark, still, blameless = mark, now, False
            elif now - still >= self.stall_s and any(m.got < self.total for n, m in live.items() if self._member(n)):
                members = {n: s for n, s in seen.items() if self._member(n)}
                culprit = judge_stall(self.chains, members, self.fed, self.total)
                if culprit is not None:
                    self.drop(*culprit, stalled=True)
                elif blameless:  # a second time with no one to blame: the rest cannot finish
                    for n in members:
                        self.drop(n, f"the chain stalled: nothing moved for {2 * self.stall_s:.0f} s", stalled=True)
                else:
                    self.note(f"nothing moved for {self.stall_s:.0f} s, and no member holds the chain up")
                blameless = culprit is None and not blameless
                still = now
            self._reorder(now)
            if self.watch is not None and now - last_watch >= 0.25:
                self.watch(self.views())
                last_watch = now

    def _member(self, name: str) -> bool:
        return role(self.chains, name) is not None

    def _progress(self) -> tuple[int, ...]:
        return tuple(m.got for m in self.members.values())

    def _drain(self, timeout: float) -> None:
        try:
            name, event = self.events.get(timeout=timeout)
        except queue.Empty:
            return
        self._event(self.members[name], event)
        while True:
            try:
                name, event = self.events.get_nowait()
            except queue.Empty:
                return
            self._event(self.members[name], event)

    def _event(self, m: Member, ev: dict[str, Any]) -> None:
        kind = ev["ev"]
        now = self.clock()
        if kind == "eof":
            m.eof = True
            if m.ready is not None and not (m.bye or m.skipped or m.dropped):
                refused = self.unreached(m)
                if refused is not None:
                    self.drop(m.name, f"lost: {refused.message.removeprefix(m.name + ': ')}", unreachable=True)
                else:
                    self.drop(m.name, f"its relay ended: {m.said()}")
            return
        m.heard = now
        if kind == "ready":
            m.ready, m.port = ev, int(ev.get("port") or 0)
            log.debug(
                "chain %s: %s ready %.2f s after its spawn (its relay began at %.2f s, scanned in %.2f s)",
                self.tid,
                m.name,
                now - m.started,
                _float(ev.get("began")) - m.started,
                _float(ev.get("t")) - _float(ev.get("began")),
            )
        elif kind == "at":
            got = _int(ev.get("got"))
            m.got, m.sunk, m.sent, m.low = got, _int(ev.get("sunk")), _int(ev.get("sent")), _int(ev.get("low"))
            m.wait = str(ev.get("wait") or "")
            m.span = _float(ev.get("span"))
            t = _float(ev.get("t"))
            if not m.samples or t > m.samples[-1][0]:
                m.samples.append((t, got))
            with self.cv:
                self.cv.notify_all()
        elif kind == "done":
            m.done, m.finished = ev, now
            log.debug("chain %s: %s verified its copy %.2f s after its go", self.tid, m.name, now - m.started)
        elif kind == "sinkfail":
            m.sink_failed = str(ev.get("why") or "its copy failed")
            m.sink_err = str(ev.get("err") or "")
            m.sink_stalled = ev.get("stalled") is True
            m.sink_at = _int(ev.get("at"))
            m.sink_finishing = ev.get("finishing") is True
            if m.sink_stalled and m.sink_finishing:
                self.note(f"{m.name}'s load took every byte and did not finish: its relay ended it")
            elif m.sink_stalled:
                self.note(f"{m.name}'s load took no byte at byte {m.sink_at}: its relay ended it and relays on")
        elif kind == "bye":
            m.bye = True
            log.debug("chain %s: %s done %.2f s after its go", self.tid, m.name, now - m.started)
        elif kind == "bad":
            m.bad += 1
            self.note(f"{m.name} refused a chunk at byte {_int(ev.get('at'))} ({ev.get('why')}): sent again")
        elif kind == "resend":
            m.resent += 1
        elif kind == "stranger":
            self.strangers += 1
            self.note(f"{m.name} refused a connection from {ev.get('peer')}: {ev.get('why')}")
        elif kind == "downfail":
            target = next((x for x in self.members.values() if x.index == _int(ev.get("to"), -1)), None)
            if target is not None and self._next(m.name) == target.name and not target.over:
                self.note(f"{m.name} could not reach {target.name} ({ev.get('why')}): this machine feeds it")
                self.moved = True
                self._apply(*cut(self.chains, m.name, target.name))
        elif kind == "error":
            m.error = str(ev.get("why") or "")

    def note(self, text: str) -> None:
        log.info("chain: %s", text)
        self.notes.append(text)

    # ------------------------------------------------------------------ mending

    def drop(self, name: str, why: str, unreachable: bool = False, stalled: bool = False) -> None:
        """`name` leaves the chain, named with why: its relay is ended, its successor resumes.
        `unreachable`: the controller lost it; `stalled`: it held the chain up past `stall_s`."""
        m = self.members[name]
        if m.dropped is not None or m.bye:
            return
        m.dropped, m.unreachable, m.stalled = why, unreachable, stalled
        self.moved = True  # the rates since include the wait for the mend: no longer the first chunks
        at = f" at byte {m.got} of {self.total}" if self.total else ""
        self.note(f"{name} dropped{at}: {why}")
        m.outbox.put(relay.ctrl_frame({"op": "abort", "why": why}))
        m.outbox.put(None)
        if m.proc is not None:
            m.transport.children.end(m.proc)
        with self.cv:
            self.feeders.pop(name, None)
            self.cv.notify_all()
        if self._member(name):
            self._apply(*splice(self.chains, name))

    def _roles(self) -> None:
        for name, m in self.members.items():
            now = role(self.chains, name)
            if now is not None:
                m.role = now

    def _apply(self, chains: Chains, actions: Sequence[Action]) -> None:
        self.chains = chains
        self._roles()
        for a in actions:
            m = self.members[a.node]
            if a.op == "tail":
                self.tell(m, {"op": "tail"})
            elif a.op == "next" and a.to is not None:
                succ = self.members[a.to]
                self.tell(m, {"op": "next", "host": succ.node.addr, "port": succ.port, "index": succ.index})
                self.note(f"{a.node} now forwards to {a.to}, which resumes at byte {succ.got}")
            elif a.op == "feed":
                self._feed(a.node)
                self.note(f"this machine now feeds {a.node}, from byte {m.got}")

    def _reorder(self, now: float) -> None:
        """Once: the member clearly slower than the one before it, on the first chunks, moves last
        (never after a drop or a cut: the rates then hold the wait for it)."""
        if self.moved:
            return
        if max((m.span for m in self.members.values()), default=0.0) < MEASURE_S:
            return
        rates = {n: m.rate() for n, m in self.members.items() if self._member(n)}  # each its average so far
        got = {n: m.got for n, m in self.members.items()}
        slow = bottleneck(self.chains, rates, self.total, got)
        if slow is None:
            return
        self.moved = True
        r = rates[slow] or 0
        self.note(f"{slow} received at {r / 1e6:.1f} MB/s, slower than the node before it: moved to the end")
        self._apply(*move_last(self.chains, slow))

    # ------------------------------------------------------------------ feeding

    def _feed(self, name: str) -> None:
        """Feed `name` from the offset it has verified, in a thread of its own."""
        m = self.members[name]
        with self.cv:
            self.generation += 1
            self.feeders[name] = gen = self.generation
        thread = threading.Thread(target=self._feeder, args=(m, gen), daemon=True, name=f"orch-feed-{name}")
        thread.start()
        self.threads.append(thread)

    def _feeder(self, m: Member, gen: int) -> None:
        offset = m.got
        try:
            while offset < self.total:
                with self.cv:
                    while self.feeders.get(m.name) == gen and offset - m.low > WINDOW - CHUNK:
                        self.cv.wait(0.5)
                    if self.feeders.get(m.name) != gen:
                        return
                data = self.source.read(offset, min(CHUNK, self.total - offset))
                m.outbox.put(relay.data_frame(self.secret, self.tid.encode(), offset, data))
                offset += len(data)
                with self.cv:
                    self.fed[m.name] = offset
        except OrchError as exc:
            self.failure = exc
        except OSError as exc:
            self.failure = OrchError(f"reading what the chain sends failed here: {exc}")

    # ------------------------------------------------------------------ the end

    def views(self) -> list[View]:
        out = []
        for m in self.members.values():
            r = rate(m.samples, 1.0)
            state = (
                "dropped"
                if m.dropped
                else "failed"
                if m.sink_failed
                else "verified"
                if m.done
                else "receiving"
                if m.got < self.total
                else "verifying"
            )
            out.append(View(m.name, role(self.chains, m.name), m.got, self.total, r, state))
        return out

    def leg(self, name: str) -> Leg:
        """`name`'s part in the transfer."""
        m = self.members[name]
        end = m.finished if m.finished is not None else self.clock()
        return Leg(m.role, m.got, max(0.0, end - m.started) if m.started else 0.0, m.rate())

    def summary(self) -> ChainSummary:
        rates = {n: r for n, m in self.members.items() if (r := m.rate()) is not None and m.dropped is None}
        hop = limiting_hop(self.chains, rates)
        return ChainSummary(self.first, self.chains, self.total, tuple(self.notes), hop, self.start_s)

    def close(self) -> None:
        """End every relay still running (abort: each removes what it had not finished)."""
        with self.cv:
            self.feeders.clear()
            self.cv.notify_all()
        for m in self.members.values():
            if m.proc is None:
                continue
            if not m.over:
                m.outbox.put(relay.ctrl_frame({"op": "abort", "why": "the controller is done"}))
            m.outbox.put(None)
        deadline = self.clock() + 5
        for m in self.members.values():
            if m.proc is not None and m.proc.poll() is None:
                try:
                    m.proc.wait(max(0.1, deadline - self.clock()))
                except subprocess.TimeoutExpired:
                    m.transport.children.end(m.proc)
        for thread in self.threads:
            thread.join(5)
        log.debug("chain %s: every relay ended", self.tid)

    def __enter__(self) -> Chain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _int(value: object, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _float(value: object) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else 0.0  # type: ignore[arg-type]
