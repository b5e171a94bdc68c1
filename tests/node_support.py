"""One resolved node reached over SSH, for the transport's own tests: no inventory around it."""

from __future__ import annotations

from orchestrator.config.nodes import Node, SSHOptions


def ssh_node(name: str, host: str, ssh: SSHOptions, index: int = 0) -> Node:
    """Node `name` at `host` (its address too) with these SSH options, one process, no GPU."""
    return Node(
        name=name, host=host, addr=host, gpus=0, nproc_per_node=1, python="python3", env={}, ssh=ssh, index=index
    )
