"""`orch sync`: copy `job.sync` to the same absolute paths on every node, through each node's transport.

Two ways (`--method`, `SyncOptions.method`; `auto` chooses with `chain.choose`):
- direct: one `copy_tree` per node (every path in it: over SSH one rsync, see `transport/copy.py`),
  at most `inventory.fanout` at once: the controller's link carries one copy per node.
- chain (`chain.py`): a relay on every node says which files it lacks by rsync's rule (size and
  modification time, or `--checksum`) and how much room it has; the files some node lacks are
  sent once, through a chain of those nodes, each writing what it lacks (a temporary name, renamed
  once its sha256 is the controller's) and forwarding the rest.

Each node's outcome is collected: what changed, or why it failed (rsync missing there,
unreachable, host key refused, no room, dropped from the chain, a file it could not write), never
stopping at the first bad node. Where the nodes are processes on this machine (`transport:
local`, `same_host`) they read the controller's own files: nothing is copied, and the report says so.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..config.inventory import Inventory
from ..config.nodes import Node
from ..config.trainer import DEFAULT_PROJECT, OUTPUT_FLAGS
from ..errors import UsageError
from ..node import relay
from ..run.resume import is_trainer
from ..transport import Cluster, CopyFailed, Transfer, Transport, transport_of
from ..transport.base import Progress
from ..transport.copy import EXCLUDED
from .chain import Chain, ChainSummary, FileSource, Leg, Watch, choose, short_of_room


@dataclass(frozen=True)
class SyncOptions:
    """How `orch sync` copies (its flags)."""

    dry_run: bool = False
    """Report what would change, change nothing."""
    delete: bool = False
    """Remove files on the node that are not in a synced directory on the controller."""
    checksum: bool = False
    """Compare files by checksum instead of size and time (slower: reads every file on both sides)."""
    method: str = "auto"
    """`direct` (rsync to each node), `chain` (one copy from here, relayed node to node), or `auto`."""


@dataclass(frozen=True)
class NodeSync:
    """One node's outcome: what rsync changed there, or why it could not."""

    node: str
    transfer: Transfer | None
    error: str | None = None
    hint: str | None = None
    exit_code: int | None = None
    """rsync's exit code (0 when it succeeded; None when it did not run)."""
    elapsed_s: float = 0.0
    leg: Leg | None = None
    """Its part in the chain (None when copied directly)."""

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        t = self.transfer
        leg = self.leg.to_json() if self.leg else {"role": None, "received_bytes": None, "bytes_per_s": None}
        return {
            "node": self.node,
            "ok": self.ok,
            "files": t.files if t else None,
            "bytes": t.bytes if t else None,
            "sent": t.sent if t else None,
            "changes": list(t.changes) if t else [],
            "error": self.error,
            "hint": self.hint,
            "rsync_exit_code": self.exit_code,
            "elapsed_s": round(self.elapsed_s, 3),
            **leg,
        }


@dataclass(frozen=True)
class SyncReport:
    """Every selected node's outcome of one `orch sync`, in inventory order."""

    paths: tuple[str, ...]
    options: SyncOptions
    nodes: tuple[NodeSync, ...]
    skipped: str | None = None
    """Why nothing was copied to any node (`transport: local`); None when rsync ran."""
    method: str = "direct"
    """How the files travelled: `direct` or `chain`."""
    why: str = ""
    """Why that method (`chain.choose`)."""
    chain: ChainSummary | None = None

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.nodes)

    def failed(self) -> list[NodeSync]:
        return [n for n in self.nodes if not n.ok]

    def to_json(self) -> dict[str, Any]:
        return {
            "paths": list(self.paths),
            "dry_run": self.options.dry_run,
            "delete": self.options.delete,
            "ok": self.ok,
            "skipped": self.skipped,
            "method": self.method,
            "method_why": self.why,
            "chain": self.chain.to_json() if self.chain else None,
            "nodes": [n.to_json() for n in self.nodes],
        }


def sources(inv: Inventory) -> tuple[str, ...]:
    """`job.sync`, each path checked to exist here (the controller) and not to be a symbolic link;
    UsageError otherwise. rsync would copy a listed link as a link: the node's real directory at
    that path would be replaced by it (and, with --delete, emptied first)."""
    if not inv.job.sync:
        raise UsageError(
            f"{inv.path}: job.sync is empty: nothing to sync",
            "list the files and directories to copy to every node: job: {sync: [/abs/code, /abs/data.yaml]}",
        )
    for i, path in enumerate(inv.job.sync):
        if os.path.islink(path):
            target = os.readlink(path)
            real = os.path.realpath(path)
            raise UsageError(
                f"{inv.path}: job.sync[{i}]: {path} is a symbolic link (to {target}) on this machine: "
                "rsync would put the link itself on every node, in place of what is there",
                f"list what it points to instead ({real}), or make {path} a real directory or file",
            )
        if not os.path.exists(path):
            raise UsageError(
                f"{inv.path}: job.sync[{i}]: {path} does not exist on this machine (the controller)",
                "orch sync copies paths from here to the same paths on every node",
            )
    return inv.job.sync


def kept_dirs(inv: Inventory) -> list[tuple[str, str]]:
    """The directories the job's run writes on the nodes, as (what, absolute path): `job.run_root`
    and the trainer's output folders (its OUTPUT_FLAGS in `job.args`; for the trainer, `runs`, under
    which it makes `runs/<task>/...` unless `--out` or an absolute `--project` say otherwise: a
    relative `--project` lies under `runs/<task>/` too), a relative one under `job.workdir`. A `~` is
    expanded with this machine's home, as for the node's same account."""
    job = inv.job
    out = [("job.run_root", job.run_root)]
    given = {key.replace("-", "_"): value for key, value in job.raw_args.items() if isinstance(value, str) and value}
    flags = _flags(job.args)
    for flag in OUTPUT_FLAGS:
        value = given.get(flag) or flags.get(flag)
        if value and flag == "project" and is_trainer(job) and not value.startswith(("/", "~")):
            value = DEFAULT_PROJECT  # the trainer puts a relative project under runs/<task>/
        if value:
            out.append((f"the job's --{flag.replace('_', '-')}", value))
    if is_trainer(job) and not ({"out", "project"} & ({*given, *flags})):
        out.append(("the trainer's default output folder", DEFAULT_PROJECT))
    resolved = []
    for what, path in out:
        if not path.startswith(("/", "~")):
            path = posixpath.join(job.workdir or "~", path)
            what += " (under job.workdir)" if job.workdir else " (under the login's home)"
        resolved.append((what, posixpath.normpath(os.path.expanduser(path))))
    return resolved


def _flags(args: Sequence[str]) -> dict[str, str]:
    """`--flag value` and `--flag=value` of an argv (the job's args given as a list), by flag name."""
    out: dict[str, str] = {}
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, eq, value = arg[2:].partition("=")
        if not eq and i + 1 < len(args) and not args[i + 1].startswith("-"):
            value = args[i + 1]
        if value:
            out[name.replace("-", "_")] = value
    return out


def refuse_delete_over_output(inv: Inventory, paths: Sequence[str]) -> None:
    """--delete removes on the nodes what a synced directory there holds and the controller's does
    not: everything a run wrote inside it. UsageError when a directory the run writes (`kept_dirs`)
    lies inside a synced directory, or holds one."""
    for i, path in enumerate(paths):
        if not os.path.isdir(path):
            continue
        for what, kept in kept_dirs(inv):
            if kept == path or kept.startswith(path + "/") or path.startswith(kept + "/"):
                raise UsageError(
                    f"{inv.path}: orch sync --delete: job.sync[{i}] {path} holds {what} {kept}: --delete would "
                    "remove on every node what the job wrote there (checkpoints, logs)",
                    "sync without --delete, or write the output outside the synced directories "
                    "(e.g. job.args.project: /data/runs), or sync the subdirectories that hold code only",
                )


def sync_nodes(
    inv: Inventory,
    nodes: Sequence[Node],
    options: SyncOptions = SyncOptions(),
    progress: Progress | None = None,
    watch: Watch | None = None,
) -> SyncReport:
    """Copy `job.sync` to every node of `nodes`, directly (at most `inv.fanout` at once) or by the
    chain (`options.method`); every outcome kept. Raises (UsageError/OrchError) only for what stops
    every node alike: no or missing sources, no rsync or ssh here, `--method chain` with `--delete`.
    Ctrl-C stops every copy before it propagates. `watch`: the chain's progress."""
    paths = sources(inv)
    if options.delete:
        refuse_delete_over_output(inv, paths)
    if options.method == "chain" and options.delete:
        raise UsageError(
            "orch sync --method chain --delete: the chain adds and replaces files, it never deletes",
            "sync with --method direct (rsync) to delete, or without --delete",
        )
    kind = transport_of(inv)
    if kind.same_host:
        return SyncReport(
            paths,
            options,
            tuple(NodeSync(n.name, Transfer(0, 0, 0, ())) for n in nodes),
            skipped=f"transport: {kind.name}: every node reads this machine's files, nothing to copy",
        )
    entries = manifest(paths, options.checksum and options.method != "direct")
    payload = sum(e["s"] for e in entries if e["t"] == "f")
    method, why = choose(options.method, len(nodes), payload)
    if options.method == "auto" and (options.delete or options.dry_run):
        method, why = "direct", "--delete and --dry-run are rsync's"
    if method == "chain":
        if options.checksum and options.method == "auto":
            entries = manifest(paths, True)
        return _sync_chain(inv, nodes, paths, entries, options, why, watch)
    kind.require_copy_tools("orch sync")
    with Cluster(inv) as cluster:
        got = cluster.fan_out(
            lambda t: _sync_one(t, paths, options), nodes, progress=progress, label="syncing", interruptible=True
        )
    return SyncReport(paths, options, tuple(_outcome(n.name, got[n.name]) for n in nodes), why=why)


def manifest(paths: Sequence[str], checksum: bool = False) -> list[dict[str, Any]]:
    """What rsync -a copies of `paths`, for the relays: each directory (`t` d, its mode `m`),
    regular file (f: size `s`, mode, modification time `mt` in ns, with `checksum` its sha256 `h`)
    and symbolic link (l: its target `l`), at its absolute path `p`; `EXCLUDED` left out, other
    kinds of file (devices, sockets) skipped as rsync skips them without root."""
    skipped = {p.rstrip("/") for p in EXCLUDED}
    out: list[dict[str, Any]] = []

    def add(path: str) -> bool:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            out.append({"p": path, "t": "l", "l": os.readlink(path)})
        elif stat.S_ISDIR(st.st_mode):
            out.append({"p": path, "t": "d", "m": stat.S_IMODE(st.st_mode)})
            return True
        elif stat.S_ISREG(st.st_mode):
            entry = {"p": path, "t": "f", "s": st.st_size, "m": stat.S_IMODE(st.st_mode), "mt": st.st_mtime_ns}
            if checksum:
                entry["h"] = _sha256(path)
            out.append(entry)
        return False

    for src in paths:
        if not add(src):
            continue
        for root, dirs, files in os.walk(src):
            keep = []
            for d in sorted(dirs):
                if d in skipped:
                    continue
                if add(os.path.join(root, d)):
                    keep.append(d)
            dirs[:] = keep
            for name in sorted(files):
                add(os.path.join(root, name))
    return out


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sync_chain(
    inv: Inventory,
    nodes: Sequence[Node],
    paths: tuple[str, ...],
    entries: list[dict[str, Any]],
    options: SyncOptions,
    why: str,
    watch: Watch | None,
) -> SyncReport:
    """The chain: every node's relay says what it lacks, the union is sent once through the nodes
    that lack something (inventory order), each writing its own part."""
    config = {"mode": "files", "manifest": entries, "checksum": options.checksum}
    out: dict[str, NodeSync] = {}
    with Cluster(inv) as cluster, Chain(cluster, nodes, config, watch) as chain:
        members = chain.start()
        needs: dict[str, list[int]] = {}
        for n in nodes:
            m = members[n.name]
            if m.ready is None:
                refused = chain.unreached(m)
                if refused is not None:
                    out[n.name] = NodeSync(n.name, None, refused.message.removeprefix(f"{n.name}: "), refused.hint)
                else:
                    out[n.name] = NodeSync(n.name, None, f"the relay could not start: {m.said()}", _relay_hint(n))
                continue
            try:
                need = relay.expand(m.ready.get("need", []), len(entries))
                relay.expand(m.ready.get("fresh", []), len(entries))
                short = short_of_room(_rooms(m.ready.get("room")))
            except ValueError as exc:
                out[n.name] = NodeSync(n.name, None, f"its relay's answer is not a relay's: {exc}")
                chain.skip(n.name)
                continue
            if short is not None:
                out[n.name] = NodeSync(n.name, None, short, "free space there, or leave the node out (--nodes)")
                chain.skip(n.name)
                continue
            needs[n.name] = need
            if options.dry_run:
                out[n.name] = NodeSync(n.name, _transfer(entries, need, m.ready, 0), exit_code=0)
                chain.skip(n.name)
        order = [n.name for n in nodes if needs.get(n.name)]
        if not options.dry_run and needs:
            union = sorted(set().union(*needs.values()))
            go = {name: {"send": relay.ranges(union), "want": relay.ranges(need)} for name, need in needs.items()}
            source = FileSource([(entries[i]["p"], entries[i]["s"]) for i in union])
            try:
                chain.run([order], source, go)
            finally:
                source.close()
            for name, need in needs.items():
                out[name] = _chained(name, chain, entries, need)
        summary = chain.summary() if order and not options.dry_run else None
    return SyncReport(paths, options, tuple(out[n.name] for n in nodes), method="chain", why=why, chain=summary)


def _rooms(rooms: object) -> list[dict[str, Any]]:
    """A relay's `room` answer held to its shape (ValueError otherwise)."""
    if not isinstance(rooms, list) or not all(isinstance(r, dict) for r in rooms):
        raise ValueError("its room is not a list of objects")
    return rooms


def _relay_hint(node: Node) -> str:
    return f"the relay runs on the node's python ({node.python}): is it there? orch check names what is missing"


def _transfer(entries: list[dict[str, Any]], need: list[int], ready: dict[str, Any], received: int) -> Transfer:
    """What the chain changed on a node, itemized as rsync itemizes what it sends (`<f+++++++++`
    a file it lacked, `<f.st......` one that differed)."""
    fresh = set(relay.expand(ready.get("fresh", []), len(entries)))
    changes = tuple(f"<f{'+++++++++' if i in fresh else '.st......'} {entries[i]['p']}" for i in need)
    return Transfer(len(need), sum(entries[i]["s"] for i in need), received, changes)


def _chained(name: str, chain: Chain, entries: list[dict[str, Any]], need: list[int]) -> NodeSync:
    m = chain.members[name]
    leg = chain.leg(name)
    assert m.ready is not None
    if m.dropped is not None:
        return NodeSync(name, None, f"dropped from the chain: {m.dropped}", None, None, leg.seconds, leg)
    if m.sink_failed is not None:
        return NodeSync(name, None, f"could not write what it received: {m.sink_failed}", None, None, leg.seconds, leg)
    if m.done is None or not m.bye:
        return NodeSync(
            name, None, f"its relay ended before its copy was verified: {m.said()}", None, None, leg.seconds, leg
        )
    return NodeSync(name, _transfer(entries, need, m.ready, m.got), exit_code=0, elapsed_s=leg.seconds, leg=leg)


def _sync_one(t: Transport, paths: Sequence[str], options: SyncOptions) -> NodeSync:
    start = time.monotonic()
    try:
        transfer = t.copy_tree(paths, "/", dry_run=options.dry_run, delete=options.delete, checksum=options.checksum)
    except CopyFailed as exc:
        return NodeSync(t.node.name, None, exc.detail, exc.hint, exc.returncode, time.monotonic() - start)
    return NodeSync(t.node.name, transfer, exit_code=0, elapsed_s=time.monotonic() - start)


def _outcome(node: str, got: NodeSync | Exception) -> NodeSync:
    if isinstance(got, NodeSync):
        return got
    return NodeSync(node, None, str(got).removeprefix(f"{node}: "), getattr(got, "hint", None))
