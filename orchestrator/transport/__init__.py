"""How orch reaches a node: run a command, stream one, write a file; over SSH or locally.

The only package that imports paramiko or fabric, and the one definition of how a node is reached:
its sessions here, and the OpenSSH client argv (`ssh.openssh_argv`) over which `orch sync` starts
rsync.

- `base.py`     Transport, Process, Result; `command_line` (argv → one shell line, quoted once);
                `fan_out` → GroupResult (every node's answer, `.succeeded` / `.failed`); `Progress`,
                the one type of a progress callback
- `local.py`    nodes that are processes on this machine (`transport: local`)
- `ssh.py`      one SSH connection per node: Fabric where an ssh config applies, else paramiko
- `hostkeys.py` known_hosts verification (strict / accept-new), parsed once per process

A new transport: a `Transport` subclass in its own module, chosen in `open_transport` below.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from ..config.inventory import Inventory
from ..config.nodes import Node
from .base import (
    GroupResult,
    Process,
    Progress,
    Result,
    Transport,
    command_line,
    fan_out,
    shell_path,
)
from .local import LocalTransport
from .ssh import SSHTransport

__all__ = [
    "Cluster",
    "GroupResult",
    "LocalTransport",
    "Process",
    "Progress",
    "Result",
    "SSHTransport",
    "Transport",
    "command_line",
    "fan_out",
    "open_transport",
    "shell_path",
]

T = TypeVar("T")


def open_transport(inv: Inventory, node: Node) -> Transport:
    """The transport the inventory asks for, not yet connected."""
    return LocalTransport(node) if inv.transport == "local" else SSHTransport(node)


class Cluster:
    """One transport per node of an inventory, opened lazily, closed together."""

    def __init__(self, inv: Inventory) -> None:
        self.inv = inv
        self.transports = {n.name: open_transport(inv, n) for n in inv.nodes}

    def __getitem__(self, name: str) -> Transport:
        return self.transports[name]

    def fan_out(self, fn: Callable[[Transport], T], nodes: Sequence[Node] | None = None) -> GroupResult[T]:
        """fn(transport) on every node (or the given ones) in parallel, bounded by `fanout`."""
        return fan_out(
            list(nodes if nodes is not None else self.inv.nodes), lambda n: fn(self.transports[n.name]), self.inv.fanout
        )

    def close(self) -> None:
        fan_out(list(self.inv.nodes), lambda n: self.transports[n.name].close(), self.inv.fanout)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
