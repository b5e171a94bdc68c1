"""How orch reaches a node, every way: run a command, stream one, pipe a byte stream into one,
copy a tree; over SSH or locally.

The only package that imports paramiko or fabric, the one definition of how a node is reached,
and the only one that asks which transport an inventory names: everything else asks the transport
(`same_host`, `target`, its verbs). Transports are found by name in `TRANSPORTS`, as ClusterShell
finds its workers (`WORKER_CLASS`) and Invoke its runners.

- `base.py`     Transport (`run`, `run_shell`, `popen`, `pipe`, `copy_tree`; `name`, `same_host`),
                Process, Result, Children (what a transport runs on this machine, ended by `close`);
                `command_line` (argv → one shell line, quoted once); `fan_out` → GroupResult (every
                node's answer, `.succeeded` / `.failed`; progress; Ctrl-C that ends what is in
                flight); `Progress`, the one type of a progress callback
- `copy.py`     what `copy_tree` runs and reads back: rsync's argv and itemized report (`Transfer`),
                the tar fallback, `CopyFailed`
- `local.py`    nodes that are processes on this machine (`transport: local`)
- `slurm.py`    nodes of a Slurm allocation, each command an `srun` step (`step_argv`); the node
                agents held by one step on every node (`launch`)
- `allocation.py` the Slurm allocation (`SlurmHold`): asked for with sbatch, waited on, given back
- `ssh.py`      one SSH connection per node: Fabric where an ssh config applies, else paramiko; the
                OpenSSH client (`openssh_argv`) for `pipe` and rsync
- `hostkeys.py` known_hosts verification (strict / accept-new), parsed once per process

A new transport: a `Transport` subclass in its own module, registered in `TRANSPORTS` below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from ..config.inventory import Inventory
from ..config.nodes import Node
from .base import (
    Fed,
    GroupResult,
    Hold,
    Process,
    Progress,
    Result,
    Transport,
    command_line,
    fan_out,
    shell_path,
)
from .copy import CopyFailed, Transfer
from .local import LocalTransport
from .slurm import SlurmTransport
from .ssh import SSHTransport

__all__ = [
    "TRANSPORTS",
    "Cluster",
    "CopyFailed",
    "Fed",
    "GroupResult",
    "Hold",
    "LocalTransport",
    "Process",
    "Progress",
    "Result",
    "SSHTransport",
    "SlurmTransport",
    "Transfer",
    "Transport",
    "command_line",
    "fan_out",
    "open_transport",
    "shell_path",
    "transport_of",
]

T = TypeVar("T")

TRANSPORTS: dict[str, type[Transport]] = {t.name: t for t in (SSHTransport, LocalTransport, SlurmTransport)}
"""Every transport, by the name an inventory's `transport:` gives it (the schema's literal, its
`SAME_HOST` and `ALLOCATED` are held to this by tests/unit/test_transport_registry.py)."""


def transport_of(inv: Inventory) -> type[Transport]:
    """The transport class the inventory names: what it is (`same_host`, `target`) before any node is reached."""
    return TRANSPORTS[inv.transport]


def open_transport(inv: Inventory, node: Node) -> Transport:
    """The transport the inventory asks for, not yet connected."""
    return transport_of(inv).open(inv, node)


class Cluster:
    """One transport per node of an inventory, opened lazily, closed together."""

    def __init__(self, inv: Inventory) -> None:
        self.inv = inv
        self.kind = transport_of(inv)
        self.transports = {n.name: self.kind.open(inv, n) for n in inv.nodes}
        self.fanout = inv.fanout
        """How many nodes are asked at once (the inventory's `fanout`)."""

    def __getitem__(self, name: str) -> Transport:
        return self.transports[name]

    def fan_out(
        self,
        fn: Callable[[Transport], T],
        nodes: Sequence[Node] | None = None,
        *,
        workers: int | None = None,
        progress: Progress | None = None,
        label: str = "",
        interruptible: bool = False,
    ) -> GroupResult[T]:
        """fn(transport) on every node (or the given ones) in parallel, at most `workers` (else
        `fanout`) at once; `progress(label, done, total)` as they answer. `interruptible`: Ctrl-C
        closes every transport, which ends what they run, and propagates at once (`fan_out`)."""
        return fan_out(
            list(nodes if nodes is not None else self.inv.nodes),
            lambda n: fn(self.transports[n.name]),
            workers or self.fanout,
            progress=progress,
            label=label,
            stop=self.close if interruptible else None,
        )

    def launch(
        self,
        calls: Mapping[str, tuple[list[str], bytes]],
        *,
        timeout: float,
        log_path: Path | None = None,
        detached: bool = False,
    ) -> GroupResult[Result]:
        """Each node's call (argv, stdin) run on it at once (`Transport.launch`: the node agents'
        start), every answer collected."""
        jobs = {name: (t, *calls[name]) for name, t in self.transports.items() if name in calls}
        return self.kind.launch(
            jobs,
            timeout=timeout,
            workers=self.fanout,
            log_path=log_path,
            detached=detached,
        )

    def close(self) -> None:
        fan_out(list(self.inv.nodes), lambda n: self.transports[n.name].close(), self.fanout)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
