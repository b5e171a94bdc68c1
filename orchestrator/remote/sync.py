"""`orch sync`: copy `job.sync` to the same absolute paths on every node with rsync over SSH.

One rsync per node (every path in it, see `rsync.rsync_argv`), at most `inventory.fanout` at once,
each node's outcome collected: what changed, or why it failed (rsync missing there, unreachable,
host key refused, a file it could not write), never stopping at the first bad node. With
`transport: local` the nodes are processes on this machine and read the controller's own files:
nothing is copied, and the report says so.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .. import waits
from ..config.inventory import Inventory
from ..config.nodes import Node
from ..config.trainer import DEFAULT_PROJECT, OUTPUT_FLAGS
from ..errors import OrchError, UsageError
from ..run.resume import is_trainer
from ..transport.base import Progress
from ..transport.ssh import openssh_config_file
from .rsync import SyncOptions, Transfer, missing_rsync, parse_output, rsync_argv


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

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        t = self.transfer
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
        }


@dataclass(frozen=True)
class SyncReport:
    """Every selected node's outcome of one `orch sync`, in inventory order."""

    paths: tuple[str, ...]
    options: SyncOptions
    nodes: tuple[NodeSync, ...]
    skipped: str | None = None
    """Why nothing was copied to any node (`transport: local`); None when rsync ran."""

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


def require_local_tools() -> None:
    """rsync and ssh on the controller, or one line saying which is missing."""
    for tool, package in (("rsync", "rsync"), ("ssh", "openssh-client")):
        if shutil.which(tool) is None:
            raise OrchError(
                f"{tool} is not installed on this machine (the controller): orch sync needs it",
                f"apt-get install {package} (dnf install {package.replace('openssh-client', 'openssh-clients')})",
            )


def sync_nodes(
    inv: Inventory, nodes: Sequence[Node], options: SyncOptions = SyncOptions(), progress: Progress | None = None
) -> SyncReport:
    """rsync `job.sync` to every node of `nodes`, at most `inv.fanout` at once; every outcome kept.
    Raises (UsageError/OrchError) only for what stops every node alike: no or missing sources, no
    rsync or ssh here. Ctrl-C stops every rsync before it propagates."""
    paths = sources(inv)
    if options.delete:
        refuse_delete_over_output(inv, paths)
    if inv.transport == "local":
        return SyncReport(
            paths,
            options,
            tuple(NodeSync(n.name, Transfer(0, 0, 0, ())) for n in nodes),
            skipped="transport: local: every node reads this machine's files, nothing to copy",
        )
    require_local_tools()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    lock = threading.Lock()
    done = [0]
    interrupted = threading.Event()

    def one(node: Node) -> NodeSync:
        try:
            return _sync_one(node, paths, options, procs, lock, interrupted)
        finally:
            if progress is not None:
                with lock:
                    done[0] += 1
                    progress("syncing", done[0], len(nodes))

    pool = ThreadPoolExecutor(max_workers=max(1, min(inv.fanout, len(nodes))), thread_name_prefix="orch-sync")
    try:
        futures = [pool.submit(one, n) for n in nodes]
        results = tuple(waits.results(futures))
    except KeyboardInterrupt:
        interrupted.set()
        with lock:
            for proc in procs.values():
                proc.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return SyncReport(paths, options, results)


def _sync_one(
    node: Node,
    paths: Sequence[str],
    options: SyncOptions,
    procs: dict[str, subprocess.Popen[bytes]],
    lock: threading.Lock,
    interrupted: threading.Event,
) -> NodeSync:
    argv = rsync_argv(node, paths, options, openssh_config_file(node.ssh))
    start = time.monotonic()
    with lock:
        if interrupted.is_set():
            return NodeSync(node.name, None, "interrupted before it started")
        proc = procs[node.name] = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "LC_ALL": "C"},
        )
    out, err = proc.communicate()
    elapsed = time.monotonic() - start
    stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    if proc.returncode != 0:
        message, hint = explain_failure(node, proc.returncode, stderr)
        return NodeSync(node.name, None, message, hint, proc.returncode, elapsed)
    try:
        transfer = parse_output(stdout)
    except ValueError as exc:
        return NodeSync(
            node.name, None, f"rsync succeeded but its report could not be read: {exc}", None, proc.returncode, elapsed
        )
    return NodeSync(node.name, transfer, exit_code=0, elapsed_s=elapsed)


# What OpenSSH prints when it cannot get in (checked in this order): the message orch says for
# it (in the words the transport uses for the same failure), and what fixes it.
_SSH_FAILURES = (
    (
        "has changed and you have requested strict checking",
        "host key of {host} CHANGED: known_hosts has another key for {name}",
        "if the node was reinstalled: ssh-keygen -R '{name}' -f {known_hosts}, then add the new key; "
        "otherwise treat it as an attack",
    ),
    (
        "host key is known for",
        "host key of {name} is not in {known_hosts}",
        "verify it, then: ssh-keyscan -p {port} {host} >> {known_hosts} (or set ssh.host_key_policy: accept-new)",
    ),
    (
        "Host key verification failed",
        "host key of {name} could not be verified against {known_hosts}",
        "verify it, then: ssh-keyscan -p {port} {host} >> {known_hosts}",
    ),
    (
        "Permission denied",
        "authentication refused for {target}",
        "check the key (ssh.identity) and that it is in the node's ~/.ssh/authorized_keys",
    ),
    ("Connection refused", "connection to {target} refused", "is sshd running on that port? (systemctl status ssh)"),
    (
        "timed out",
        "{target} did not answer",
        "is the node up and the port open? check firewalls and ssh.connect_timeout",
    ),
    ("Could not resolve hostname", "cannot resolve {host}", "check the node's host in the inventory"),
)
_RSYNC_NOISE = (
    "rsync: connection unexpectedly closed",
    "rsync error:",
    "rsync: [sender] write error",
    "rsync: [Receiver] write error",
)


def explain_failure(node: Node, code: int, stderr: str) -> tuple[str, str | None]:
    """One line (and a hint) for a failed rsync: rsync missing on the node, ssh refused, or what
    rsync itself said, without its generic trailer lines."""
    if missing_rsync(stderr):
        return (
            "rsync is not installed on this node",
            "install it there: apt-get install rsync (dnf install rsync), e.g. orch exec -- 'apt-get install -y rsync'",
        )
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    said = [ln for ln in lines if not ln.startswith(_RSYNC_NOISE)] or lines
    opts = node.ssh
    where = {
        "host": node.host,
        "port": opts.port,
        "known_hosts": opts.known_hosts,
        "name": node.host if opts.port == 22 else f"[{node.host}]:{opts.port}",
        "target": f"{opts.user + '@' if opts.user else ''}{node.host}:{opts.port}",
    }
    from_ssh = [ln for ln in said if not ln.startswith("rsync")]  # rsync's own say "rsync: ..." / "rsync error"
    for needle, message, hint in _SSH_FAILURES:
        line = next((ln for ln in from_ssh if needle in ln), None)
        if line is not None:
            return f"ssh: {message.format(**where)} ({line.rstrip('.')})", hint.format(**where)
    detail = said[0] if said else "(no message)"
    more = f" (+{len(said) - 1} more lines)" if len(said) > 1 else ""
    return f"rsync exited {code}: {detail}{more}", None
