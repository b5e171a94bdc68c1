"""`orch image push`: the job's container image onto every node, without a registry.

docker and podman: the controller asks every node which image ID the name resolves to there
(`RUNTIME image inspect`), skips the nodes that already hold the controller's ID, exports the image
once (`RUNTIME save` into a private temporary file, only when some node lacks it) and streams that
file into `RUNTIME load` on each of those nodes, at most `parallel` at once, through the node's
transport (`Transport.pipe`: over SSH the OpenSSH client, as `orch sync`'s rsync); then checks the ID
the node holds after loading. apptainer: the image is an absolute `.sif` path, compared by sha256 and
copied to the same path (`Transport.copy_tree`, as `job.sync` paths are; nothing to copy where the
nodes are this machine), then compared again.

By the chain (`--method`, `chain.choose`; docker and podman): a relay on every node asks its
runtime which ID it holds and how much room its store (and podman's `TMPDIR`, where `load` stages
its input) has, while this machine exports the image; the archive is then sent once, through a
chain of the nodes that lack the ID, each streaming it into its own `RUNTIME load` as it forwards
it, and the ID each then holds is checked. The runtime's argvs are its table entry's
(`config/runtimes.py`), for both ways.

A node whose load takes no byte for `stall_s` (`--stall-timeout`: a stopped load, a hung disk)
fails by that deadline, exit 124, its row saying how far it got: directly the stream to it is
ended (`Transport.pipe` with a `Fed`); by the chain its relay ends its load and relays on, so the
nodes after it complete. A load that took every byte has `relay.finish_s` to finish (the stall
deadline, plus the image written at `relay.LOAD_FLOOR_BPS`), then fails the same way. What each
node has taken is shown as it goes (`watch`, both ways).

Every node's outcome is kept (`NodePush`), never stopping at the first bad node; the exit code is
the worst node's (`ImageReport.exit_code`). Ctrl-C ends every stream (the transports' `close`).
Nothing here reaches a network beyond the nodes.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..config import runtimes
from ..config.inventory import Inventory
from ..config.nodes import Node
from ..errors import OrchError, Stalled, TransportError, UsageError
from ..node import relay
from ..shell import MISSING, Script, missing
from ..transport import Cluster, CopyFailed, Fed, Result, Transport, transport_of
from ..transport.base import Progress
from .chain import ArchiveSource, Chain, ChainSummary, Leg, Member, View, Watch, choose, rate, short_of_room

UNREACHABLE = 255
"""The exit code of a node orch could not reach (ssh's own)."""
TIMED_OUT = 124
"""The exit code of a node that did not answer in time (timeout(1)'s)."""
INSPECT_TIMEOUT_S = 120
"""The longest a node may take to say which image it holds."""
STALL_S = 30.0
"""`--stall-timeout`'s default: the longest a node's load may take no byte of the image (as long as
the copy chain's own judge of a member that holds it up waits, `chain.STALL_S`)."""
WATCH_EVERY_S = 0.25
"""How often the direct push's progress is drawn (as the chain's)."""


# ----------------------------------------------------------------------------- pure builders

RUN = Script('exec "$0" "$@"', guarded=True)
"""A runtime's argv as it is (`$0` its program, the rest its words), first saying in words when the
program is missing on the node (exit 127)."""


STAGING = Script('echo "${TMPDIR:-/var/tmp}"')
"""Where a load stages the archive it reads, for a runtime that does (podman's `image_copy_tmp_dir`:
`TMPDIR`, else /var/tmp)."""


def guarded(argv: Sequence[str]) -> list[str]:
    """`/bin/sh -c RUN PROGRAM WORDS...`: `argv` run on the node, or the missing-tool line."""
    return RUN.argv(argv[0], *argv[1:])


def inspect_argv(runtime: str, image: str) -> list[str]:
    """The node's command that prints what `image` is there (the runtime's `inspect`, read by
    `runtimes.held`: its ID, or a .sif's sha256; an error saying it is not there)."""
    return guarded(runtimes.runtime(runtime).inspect_argv(image))


def load_argv(runtime: str) -> list[str]:
    """The node's command that loads an image archive from stdin."""
    return guarded(runtimes.runtime(runtime).load)


ECHO = Script('echo "$1"')

ROOM = Script(
    'd=$("$0" "$@" | tail -n 1); case $d in /*) ;; *) exit 3;; esac; '
    'while [ ! -d "$d" ]; do d=$(dirname -- "$d"); done; echo "$d"; df -Pk -- "$d" | tail -n 1'
)
"""The direct push's look at one room (a `room_argvs` argv after it): the nearest directory that
exists where the argv says, then its filesystem's line of `df -Pk` (free KiB, mount point). The
chain's relay looks with `statvfs`."""


def room_argvs(runtime: str, image: str) -> list[tuple[str, list[str]]]:
    """The node's commands that print each directory a push writes to (what, argv): where the
    runtime stores images and where its `load` stages the archive it reads (`room_need` says how
    much each needs), or the directory of an image file."""
    rt = runtimes.runtime(runtime)
    if rt.image_file:
        return [("file", ECHO.argv("sh", os.path.dirname(image)))]
    out = [("store", guarded(rt.store))]
    if rt.tmp_copies:
        out.append(("staging", STAGING.argv("sh")))
    return out


def room_need(runtime: str, what: str, size: int) -> int:
    """Bytes a push of `size` bytes needs free in the room `what` of `room_argvs`: one copy in the
    store (or beside the image file), `Runtime.tmp_copies` where the load stages."""
    return size * (runtimes.runtime(runtime).tmp_copies if what == "staging" else 1)


def read_room(what: str, answer: Result) -> dict[str, Any] | None:
    """`ROOM`'s answer as the relay's rooms are: {what, path, free (bytes), dev}; None when the
    node could not say (the push goes on: its load then says what it lacks)."""
    lines = answer.stdout.strip().splitlines()
    fields = lines[-1].split() if len(lines) >= 2 and lines[0].startswith("/") else []
    if answer.exit_code != 0 or len(fields) < 6 or not fields[3].isdigit():
        return None
    return {"what": what, "path": lines[0], "free": int(fields[3]) * 1024, "dev": " ".join(fields[5:])}


def no_room(node: str, runtime: str, rooms: Sequence[Any], size: int, before: str | None) -> NodePush | None:
    """The node's failure when it lacks the room a push of `size` bytes needs (`short_of_room`,
    the same rule by the chain and directly), else None."""
    needs = [{**r, "need": room_need(runtime, str(r.get("what")), size)} for r in rooms if isinstance(r, dict)]
    short = short_of_room(needs)
    if short is None:
        return None
    return NodePush(node, "failed", None, before, short, "free space there, or leave the node out (--nodes)", 1)


def save_argv(runtime: str, image: str, archive: str) -> list[str]:
    """The controller's export of `image` into the file `archive` (docker-archive: both runtimes load it)."""
    return runtimes.runtime(runtime).save_argv(image, archive)


LAST_LINES = 6


def last_words(stderr: str) -> str:
    """What a node's command said last, in one line: its stderr from its last line that starts
    with `Error` (podman's load then lists each format it tried, the real cause among them) to the
    end, at most `LAST_LINES` lines, joined by ` | `. Never its first line alone: podman's is
    "Getting image source signatures". The renderer escapes it, as all node text."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    start = max((i for i, ln in enumerate(lines) if ln.lower().startswith("error")), default=0)
    text = " | ".join(lines[max(start, len(lines) - LAST_LINES) :])
    return text[-1500:] if text else "(no message)"


def short_id(image_id: str | None) -> str:
    return (image_id or "-")[:12]


def stalled_row(stall_s: float, at: int, size: int, ended: str) -> str:
    """A load that took no byte for `stall_s`, where it stopped, and what was ended (`ended`)."""
    share = f" ({100 * at // size}%)" if size else ""
    return f"load took no byte for {stall_s:.0f} s at byte {at} of {size}{share}; {ended}"


def unfinished_row(finish_s: float, size: int, ended: str) -> str:
    """A load that took every byte of `size` and had not finished `finish_s` after the last."""
    return f"load took every byte ({size}) and did not finish within {finish_s:.0f} s; {ended}"


def stalled_hint(program: str, what: str = "its load") -> str:
    """What to look at on a node whose load (or copy: `what`, by `program`) stalled, and the
    option for a slow node that works."""
    return (
        f"is {what} stopped, or its disk hung? see `ps -o pid,stat,args -C {program}` and dmesg there; "
        "a slow node that works: raise --stall-timeout"
    )


# ----------------------------------------------------------------------------- outcome


@dataclass(frozen=True)
class NodePush:
    """One node's outcome: `present` (already held the image, skipped), `loaded` (or `copied` for
    a .sif), or `failed` with why and the fix."""

    node: str
    action: str
    image_id: str | None
    """What the node holds after (an image ID, or a .sif's sha256); None when nothing."""
    before: str | None = None
    """What it held before (None: nothing under that name)."""
    error: str | None = None
    hint: str | None = None
    exit_code: int = 0
    elapsed_s: float = 0.0
    leg: Leg | None = None
    """Its part in the chain (None when pushed directly, or skipped)."""

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        leg = self.leg.to_json() if self.leg else {"role": None, "received_bytes": None, "bytes_per_s": None}
        return {
            "node": self.node,
            "ok": self.ok,
            "action": self.action,
            "image_id": self.image_id,
            "before": self.before,
            "error": self.error,
            "hint": self.hint,
            "exit_code": self.exit_code,
            "elapsed_s": round(self.elapsed_s, 3),
            **leg,
        }


@dataclass(frozen=True)
class ImageReport:
    """Every selected node's outcome of one `orch image push`, in inventory order."""

    image: str
    runtime: str
    image_id: str
    """The controller's image ID (apptainer: the .sif's sha256): what every node must hold."""
    size: int
    """Bytes of the exported archive (or the .sif); 0 when no node needed it."""
    nodes: tuple[NodePush, ...]
    elapsed_s: float = 0.0
    method: str = "direct"
    """How the image travelled: `direct` or `chain`."""
    why: str = ""
    chain: ChainSummary | None = None

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.nodes)

    @property
    def exit_code(self) -> int:
        """The worst node's: 0 when every node holds the image."""
        return max((n.exit_code for n in self.nodes), default=0)

    def failed(self) -> list[NodePush]:
        return [n for n in self.nodes if not n.ok]

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "runtime": self.runtime,
            "image_id": self.image_id,
            "size": self.size,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "elapsed_s": round(self.elapsed_s, 3),
            "method": self.method,
            "method_why": self.why,
            "chain": self.chain.to_json() if self.chain else None,
            "nodes": [n.to_json() for n in self.nodes],
        }


# ----------------------------------------------------------------------------- the push


def check_image_arg(runtime: str, image: str) -> None:
    """UsageError for a runtime orch does not know, or an image file that is not an absolute .sif."""
    rt = runtimes.TABLE.get(runtime)
    if rt is None:
        raise UsageError(f"unknown container runtime {runtime!r}", f"use one of: {', '.join(runtimes.RUNTIMES)}")
    if rt.image_file and not (image.startswith("/") and image.endswith(".sif")):
        raise UsageError(
            f"{rt.name} image {image!r} is not an absolute .sif path",
            "give the .sif file's absolute path, e.g. /images/yoloe.sif",
        )
    if not image or image.startswith("-"):
        raise UsageError(f"image name {image!r} is not an image", "give a name:tag or an image ID")


def local_image_id(runtime: str, image: str) -> str:
    """The controller's ID of `image` (a .sif's sha256), asked as the nodes are (`runtimes.held`);
    OrchError when it has none."""
    rt = runtimes.runtime(runtime)
    if shutil.which(rt.program) is None:
        raise OrchError(
            f"{rt.program} is not installed on this machine (the controller): orch image push exports the image here",
            f"install {rt.program}, or push from a machine that holds the image",
        )
    proc = subprocess.run(rt.inspect_argv(image), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    found = runtimes.held(rt, proc.returncode, proc.stdout, proc.stderr)
    if found.image_id is not None:
        return found.image_id
    if proc.returncode == 0 and found.error is not None:
        raise OrchError(f"this machine's (the controller's) {found.error}", found.fix)
    if rt.image_file:
        raise UsageError(
            f"{image} does not exist on this machine (the controller)",
            "orch image push copies the .sif from here to the same path on every node",
        )
    said = proc.stderr.strip().splitlines()
    raise UsageError(
        f"{runtime} on this machine (the controller) has no image {image}" + (f" ({said[-1]})" if said else ""),
        f"build or load it here first ({runtime} images lists what is here)",
    )


def push_image(
    inv: Inventory,
    nodes: Sequence[Node],
    image: str,
    runtime: str,
    *,
    parallel: int = 4,
    progress: Progress | None = None,
    tmpdir: str | None = None,
    method: str = "auto",
    watch: Watch | None = None,
    stall_s: float = STALL_S,
) -> ImageReport:
    """Put `image` on every node of `nodes` that does not hold the controller's ID: directly, at
    most `parallel` at once, or by the chain (`method`); every node's outcome kept. A node whose
    load takes no byte for `stall_s` fails (exit 124) and the others go on; `watch` sees what each
    took as it goes. Raises only for what stops every node alike (an unknown runtime, no such image
    here, the export failing, `--method chain` with apptainer). Ctrl-C stops every stream."""
    check_image_arg(runtime, image)
    if not (math.isfinite(stall_s) and stall_s > 0):
        raise UsageError(f"a stall deadline of {stall_s} s", "give --stall-timeout a number of seconds above 0")
    started = time.monotonic()
    want = local_image_id(runtime, image)
    rt = runtimes.runtime(runtime)
    if rt.image_file:
        if method == "chain":
            raise UsageError(
                f"orch image push --method chain: a {rt.name} image is a .sif file: orch sync carries files",
                "list the .sif in job.sync and run orch sync (it chains big files), or push with --method direct",
            )
        how, why = "direct", f"{rt.name}: the .sif is copied with rsync"
    else:
        # the exported archive is about the size of the image: its size here decides
        sized = method == "auto" and len(nodes) > 1
        how, why = choose(method, len(nodes), _image_size(rt, image) if sized else 0)
        if how == "chain" and method == "auto" and transport_of(inv).same_host:
            how, why = "direct", f"transport: {inv.transport}: the nodes are processes of this machine"
    if how == "chain":
        return _push_chain(inv, nodes, image, rt, want, started, why, watch, tmpdir, stall_s)
    workers = max(1, min(parallel, inv.fanout, len(nodes) or 1))
    with Cluster(inv) as cluster:
        asked = cluster.fan_out(lambda t: _asked(t, rt, image, want), nodes, workers=workers, interruptible=True)
        held = {n.name: _answer(n.name, asked[n.name], "inspect", runtime) for n in nodes}
        rooms = {name: got[1] for name, got in held.items() if isinstance(got, tuple)}
        held = {name: got[0] if isinstance(got, tuple) else got for name, got in held.items()}
        todo = [n for n in nodes if not isinstance(held[n.name], NodePush) and held[n.name] != want]
        size = 0
        work = tempfile.mkdtemp(prefix="orch-image-", dir=tmpdir)
        try:
            source = image
            if todo and rt.save:
                source = os.path.join(work, "image.tar")
                proc = subprocess.run(
                    rt.save_argv(image, source), capture_output=True, text=True, stdin=subprocess.DEVNULL
                )
                if proc.returncode != 0:
                    raise OrchError(
                        f"`{runtime} save {image}` failed here (exit {proc.returncode}): {proc.stderr.strip()[-500:]}",
                        f"is there room in {work}? (set TMPDIR)",
                    )
            if todo:
                size = os.path.getsize(source)
            for n in todo:  # before a byte is sent: the rule the chain keeps
                full = no_room(n.name, runtime, rooms.get(n.name, []), size, held[n.name])
                if full is not None:
                    held[n.name] = full

            shown = None
            if watch is not None and todo and not rt.image_file:  # (rsync shows no bytes)
                shown = DirectWatch(watch, size, [n.name for n in todo])

            def one(t: Transport) -> NodePush:
                before = held[t.node.name]
                if isinstance(before, NodePush):
                    return before
                if before == want:
                    return NodePush(t.node.name, "present", want, before)
                fed = Fed(stall_s, finish_s=relay.finish_s(stall_s, size))
                if shown is not None:
                    shown.feds[t.node_name] = fed
                outcome = _load(t, rt, image, source, want, before, fed, size)
                if shown is not None:
                    shown.ended[t.node_name] = "failed" if outcome.error else outcome.action
                return outcome

            try:
                pushed = cluster.fan_out(
                    one,
                    nodes,
                    workers=workers,
                    progress=progress if shown is None else None,
                    label="pushing",
                    interruptible=True,
                )
            finally:
                if shown is not None:
                    shown.stop()
        finally:
            shutil.rmtree(work, ignore_errors=True)
    results = [_answer(n.name, pushed[n.name], "load", runtime) for n in nodes]
    return ImageReport(image, runtime, want, size, tuple(results), time.monotonic() - started, why=why)


class DirectWatch:
    """The direct push's progress, as the chain's (`watch`: a `View` per node it sends to): what
    each node's stream took (its `Fed`), its rate over the last second, and its state (`waiting`
    its turn, `sending`, `loading` once every byte went, then its outcome), drawn by a thread of its
    own every `WATCH_EVERY_S` until `stop`."""

    def __init__(self, watch: Watch, size: int, names: Sequence[str]) -> None:
        self.watch = watch
        self.size = size
        self.names = list(names)
        self.feds: dict[str, Fed] = {}
        """Each node's stream, from its start (set by the thread that sends to it)."""
        self.ended: dict[str, str] = {}
        """Each node's outcome, once known."""
        self.samples: dict[str, list[tuple[float, int]]] = {name: [] for name in self.names}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._draw, daemon=True, name="orch-image-watch")
        self.thread.start()

    def views(self) -> list[View]:
        out = []
        for name in self.names:
            fed = self.feds.get(name)
            got = fed.bytes if fed is not None else 0
            samples = self.samples[name]
            samples.append((time.monotonic(), got))
            del samples[: max(0, len(samples) - 16)]
            state = self.ended.get(name) or (
                "waiting" if fed is None else "loading" if fed.ended else "stalled" if fed.stalled else "sending"
            )
            out.append(View(name, None, got, self.size, rate(samples, 1.0), state))
        return out

    def _draw(self) -> None:
        while not self.done.wait(WATCH_EVERY_S):
            self.watch(self.views())

    def stop(self) -> None:
        self.done.set()
        self.thread.join()  # bounded: it draws once more at most


def _image_size(rt: runtimes.Runtime, image: str) -> int:
    """The image's size as this machine's runtime counts it (0 when it does not say)."""
    proc = subprocess.run(rt.size_argv(image), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    said = proc.stdout.strip()
    return int(said) if proc.returncode == 0 and said.isdigit() else 0


def _push_chain(
    inv: Inventory,
    nodes: Sequence[Node],
    image: str,
    rt: runtimes.Runtime,
    want: str,
    started: float,
    why: str,
    watch: Watch | None,
    tmpdir: str | None,
    stall_s: float,
) -> ImageReport:
    """The chain: relays say which ID each node holds (and their room) while the image is exported
    here; the archive goes once through the nodes that lack the ID, each loading it as it passes.
    A relay ends a load that takes no byte for `stall_s` and relays on; the controller drops a
    member that holds the chain up as long (and `chain.SINK_GRACE_S`: the relay's word first)."""
    config = {
        "mode": "image",
        "inspect": inspect_argv(rt.name, image),
        "load": load_argv(rt.name),
        "room": room_argvs(rt.name, image),
        "stall_s": stall_s,
    }
    out: dict[str, NodePush] = {}
    work = tempfile.mkdtemp(prefix="orch-image-", dir=tmpdir)
    archive = os.path.join(work, "image.tar")
    save = subprocess.Popen(
        rt.save_argv(image, archive), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    saved: list[bytes] = []
    reader = threading.Thread(target=lambda: saved.append(save.stderr.read() if save.stderr else b""), daemon=True)
    reader.start()
    size = 0
    summary = None
    try:
        with Cluster(inv) as cluster, Chain(cluster, nodes, config, watch, stall_s=stall_s) as chain:
            members = chain.start()
            held: dict[str, str | None] = {}
            for n in nodes:
                got = _ready(n.name, members[n.name], chain, rt)
                if isinstance(got, NodePush):
                    out[n.name] = got
                elif got == want:
                    out[n.name] = NodePush(n.name, "present", want, got)
                    chain.skip(n.name)
                else:
                    held[n.name] = got
            if not held:
                save.terminate()
            code = save.wait()  # bounded: podman save ends (or was ended just above)
            reader.join(5)
            if held and code != 0:
                said = b"".join(saved).decode("utf-8", "replace").strip()
                raise OrchError(
                    f"`{rt.name} save {image}` failed here (exit {code}): {said[-500:]}",
                    f"is there room in {work}? (set TMPDIR)",
                )
            if held:
                size = os.path.getsize(archive)
            for name in list(held):
                full = no_room(name, rt.name, members[name].ready["room"], size, held[name])  # type: ignore[index]
                if full is not None:
                    out[name] = full
                    del held[name]
                    chain.skip(name)
            if held:
                source = ArchiveSource(archive)
                try:
                    chain.run([[n.name for n in nodes if n.name in held]], source, {name: {} for name in held})
                finally:
                    source.close()
                for name, before in held.items():
                    out[name] = _loaded(name, chain, before, want, image, rt)
                summary = chain.summary()
    finally:
        if save.poll() is None:
            save.kill()
            save.wait()  # bounded: SIGKILLed just above
        shutil.rmtree(work, ignore_errors=True)
    results = tuple(out[n.name] for n in nodes)
    return ImageReport(image, rt.name, want, size, results, time.monotonic() - started, "chain", why, summary)


def _ready(node: str, m: Member, chain: Chain, rt: runtimes.Runtime) -> str | None | NodePush:
    """What the node's relay said it holds (an ID, or None), or why it could not say."""
    if m.ready is None:
        refused = chain.unreached(m)
        if refused is not None:
            return _unreached(node, refused)
        return NodePush(
            node,
            "failed",
            None,
            None,
            f"the relay could not start: {m.said()}",
            f"the relay runs on the node's python ({m.node.python}): is it there? orch check names what is missing",
            1,
        )
    said = m.ready.get("held")
    if not isinstance(said, dict) or type(said.get("code")) is not int or not isinstance(m.ready.get("room"), list):
        chain.skip(node)
        return NodePush(node, "failed", None, None, "its relay's answer is not a relay's", None, 1)
    answer = Result(node, (), said["code"], str(said.get("out", "")), str(said.get("err", "")), 0.0)
    found = _inspected(node, answer, rt)
    if isinstance(found, NodePush):
        chain.skip(node)
    return found


def _loaded(node: str, chain: Chain, before: str | None, want: str, image: str, rt: runtimes.Runtime) -> NodePush:
    m = chain.members[node]
    leg = chain.leg(node)
    if m.dropped is not None:
        code = UNREACHABLE if m.unreachable else TIMED_OUT if m.stalled else 1
        return NodePush(
            node, "failed", None, before, f"dropped from the chain: {m.dropped}", None, code, leg.seconds, leg
        )
    if m.sink_failed is not None and m.sink_stalled:
        stall_s = float(chain.config["stall_s"])
        ended = "its load was ended, the chain relayed on"
        why = (
            unfinished_row(relay.finish_s(stall_s, chain.total), chain.total, ended)
            if m.sink_finishing
            else stalled_row(stall_s, m.sink_at, chain.total, ended)
        )
        return NodePush(node, "failed", None, before, why, stalled_hint(rt.load[0]), TIMED_OUT, leg.seconds, leg)
    if m.sink_failed is not None:
        why = m.sink_failed if m.sink_failed.startswith("load ") else f"load: {m.sink_failed}"
        why += f": {last_words(m.sink_err)}" if m.sink_err else ""
        return NodePush(node, "failed", None, before, why, None, 1, leg.seconds, leg)
    if m.done is None or not m.bye:
        return NodePush(
            node,
            "failed",
            None,
            before,
            f"its relay ended before the load was checked: {m.said()}",
            None,
            1,
            leg.seconds,
            leg,
        )
    said = m.done.get("held")
    if not isinstance(said, dict) or type(said.get("code")) is not int:
        return NodePush(node, "failed", None, before, "its relay's answer is not a relay's", None, 1, leg.seconds, leg)
    answer = Result(node, (), said["code"], str(said.get("out", "")), str(said.get("err", "")), 0.0)
    after = _inspected(node, answer, rt, before)
    if isinstance(after, NodePush):
        return replace(after, elapsed_s=leg.seconds, leg=leg)
    if after != want:
        return NodePush(
            node,
            "failed",
            after,
            before,
            f"holds {short_id(after)} under {image} after the load, not the controller's {short_id(want)}",
            "another image took the name meanwhile? push again",
            1,
            leg.seconds,
            leg,
        )
    return NodePush(node, "loaded", after, before, elapsed_s=leg.seconds, leg=leg)


def _answer(node: str, got: Any, action: str, runtime: str) -> Any:
    """A fan-out's answer for a node: what the call returned, or its exception as a failed NodePush."""
    if not isinstance(got, Exception):
        return got
    if isinstance(got, TransportError):
        return _unreached(node, got)
    return NodePush(node, "failed", None, None, f"{action}: {type(got).__name__}: {got}", None, 1)


def _unreached(node: str, exc: TransportError, before: str | None = None, elapsed: float = 0.0) -> NodePush:
    """A node the transport could not reach (or that outlived a timeout): exit 255, its words and fix."""
    return NodePush(node, "failed", None, before, exc.message.removeprefix(f"{node}: "), exc.hint, UNREACHABLE, elapsed)


def _failed(
    node: str, action: str, answer: Result, tool: str, before: str | None = None, elapsed: float = 0.0
) -> NodePush:
    """A node's failed command in one line: `tool` missing there, or what the command said."""
    if missing(tool, answer.stderr) or answer.exit_code == MISSING:
        return NodePush(
            node,
            "failed",
            None,
            before,
            f"{tool} is not installed on this node",
            f"install {tool} there, or leave the node out (--nodes)",
            MISSING,
            elapsed,
        )
    code = answer.exit_code
    return NodePush(
        node,
        "failed",
        None,
        before,
        f"{action} exited {code}: {last_words(answer.stderr)}",
        None,
        UNREACHABLE if code == 255 else code or 1,
        elapsed,
    )


def _asked(
    t: Transport, rt: runtimes.Runtime, image: str, want: str
) -> tuple[str | None | NodePush, list[dict[str, Any]]]:
    """What the node holds under `image` and, where it lacks `want`, the rooms the push would write
    to (`read_room`)."""
    got = _held(t, rt, image)
    rooms = []
    if not isinstance(got, NodePush) and got != want and not (rt.image_file and t.same_host):  # that is the file
        for what, argv in room_argvs(rt.name, image):
            room = read_room(what, t.run(ROOM.argv(*argv), timeout=INSPECT_TIMEOUT_S))
            if room is not None:
                rooms.append(room)
    return got, rooms


def _held(t: Transport, rt: runtimes.Runtime, image: str) -> str | None | NodePush:
    """What the node holds under `image` (an ID or sha256; None: nothing), or its failure."""
    return _inspected(t.node.name, t.run(inspect_argv(rt.name, image), timeout=INSPECT_TIMEOUT_S), rt)


def _inspected(node: str, answer: Result, rt: runtimes.Runtime, before: str | None = None) -> str | None | NodePush:
    """The node's `inspect` answer read (`runtimes.held`): the ID it holds, None, or why neither."""
    found = runtimes.held(rt, answer.exit_code, answer.stdout, answer.stderr)
    if found.error is None:
        return found.image_id
    if answer.exit_code == 0:  # it answered, and not with an ID
        return NodePush(node, "failed", None, before, f"inspect: {found.error}", found.fix, 1)
    return _failed(node, "inspect", answer, rt.program, before)


def _load(
    t: Transport,
    rt: runtimes.Runtime,
    image: str,
    source: str,
    want: str,
    before: str | None,
    fed: Fed | None = None,
    size: int = 0,
) -> NodePush:
    """The image onto one node, directly: copied (a .sif: by rsync, past `fed`'s deadline its
    `--timeout` ends it), or streamed into its load (`fed` counts what it took, and ends the stream
    past its deadline), then its ID checked."""
    node = t.node_name
    start = time.monotonic()
    try:
        if rt.image_file:
            if not t.same_host:  # else the node's path is this very file
                t.copy_tree([source], "/", checksum=True, stall_s=fed.stall_s if fed is not None else None)
            fed = None  # (rsync counts what it sends by itself)
            action = "copied"
        else:
            with open(source, "rb") as archive:
                answer = t.pipe(load_argv(rt.name), archive, fed=fed)
            if answer.exit_code != 0:
                return _failed(node, "load", answer, rt.load[0], before, time.monotonic() - start)
            action = "loaded"
        after = _held(t, rt, image)
    except Stalled as exc:
        elapsed = time.monotonic() - start
        ended = (
            "its load was ended"
            if t.close_stops_commands
            else "the stream to it was ended (not its load there: a stopped load stays as it is)"
        )
        leg = Leg(None, exc.sent, elapsed, None)
        why = (
            unfinished_row(exc.stall_s, size, ended)
            if exc.finishing
            else stalled_row(exc.stall_s, exc.sent, size, ended)
        )
        return NodePush(node, "failed", None, before, why, stalled_hint(rt.load[0]), TIMED_OUT, elapsed, leg)
    except CopyFailed as exc:
        if exc.kind == "stalled":
            hint = stalled_hint("rsync", "the rsync there")
            return NodePush(node, "failed", None, before, exc.detail, hint, TIMED_OUT, time.monotonic() - start)
        return NodePush(
            node, "failed", None, before, exc.detail, exc.hint, exc.returncode or 1, time.monotonic() - start
        )
    except TransportError as exc:
        return _unreached(node, exc, before, time.monotonic() - start)
    elapsed = time.monotonic() - start
    if isinstance(after, NodePush):
        return after
    if after != want:
        return NodePush(
            node,
            "failed",
            after,
            before,
            f"holds {short_id(after)} under {image} after the {action[:-2]}, not the controller's {short_id(want)}",
            "another image took the name meanwhile? push again",
            1,
            elapsed,
        )
    took = Leg(None, fed.bytes, elapsed, fed.bytes / elapsed if elapsed > 0 else None) if fed is not None else None
    return NodePush(node, action, after, before, elapsed_s=elapsed, leg=took)
