"""A node of the inventory: its type (`Node`, `SSHOptions`), the names it may have, and how the
entries of `nodes:` (and `spare:`) expand into nodes: host/name/addr ranges (ClusterShell's
NodeSet: `gpu[01-04]`, `10.0.0.[10-13]`) expanded in step, each entry's settings given to every
node it names, no node twice. Pure; problems go to the resolver's list with the entry's line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from .schema import SAME_HOST, SSH_UNSET, NodeModel, SSHModel, fields_of

HOST = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]*\Z")
HOST_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\[\],-]*\Z")
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*\Z")
GATEWAY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]*\Z")
"""What `gateway` may be: a host name, an IPv4 or IPv6 address, or an ssh config alias. Never a
word starting with `-`, which ssh (the gateway is the last word of its ProxyCommand) would take
for an option (`-oProxyCommand=...` runs a command on the controller)."""
NAME_MAX = 100


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a node, a cluster or a run, or None. Each becomes a directory or file
    name (on every node, in $ORCH_HOME) and a column of every log line: no '/', no '..', nothing
    a terminal or a shell would act on, and short enough for any filesystem."""
    if not NODE_NAME.match(name):
        return "may only use letters, digits, '_', '.', ':' and '-', and must start with a letter or digit"
    if len(name) > NAME_MAX:
        return f"is {len(name)} characters long, more than {NAME_MAX}"
    return None


MAX_NODES = 10_000
"""The most nodes one range may name: a typo (`gpu[0-99999999]`) is refused, not expanded."""
# A host or name NodeSet would give back unchanged (no range, list, group or IPv6 colon): it is
# taken as it is, and ClusterShell (~8 ms to import) is loaded only for the others.
PLAIN_HOST = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")


# ----------------------------------------------------------------------------- resolved (frozen)


@dataclass(frozen=True)
class SSHOptions:
    """How to reach one node over SSH (inventory `ssh:` defaults merged with the node's own)."""

    user: str | None = None
    port: int = SSH_UNSET["port"]
    identity: str | None = None
    known_hosts: str = SSH_UNSET["known_hosts"]
    host_key_policy: str = SSH_UNSET["host_key_policy"]
    connect_timeout: float = SSH_UNSET["connect_timeout"]
    gateway: str | None = None
    ssh_config: str | None = SSH_UNSET["ssh_config"]
    port_given: bool = False
    """Whether the inventory wrote `port` (in `ssh:` or on the node). Port 22 left unsaid lets an ssh
    config's `Port` for the host apply, as `ssh alias` would; a port written down always wins."""

    @property
    def chosen_port(self) -> int | None:
        """The port to connect to whatever an ssh config says, or None where the config's `Port`
        for the host may apply (22 left unsaid). Both ways of reaching a node (paramiko, OpenSSH's
        argv) read it."""
        return self.port if self.port_given or self.port != 22 else None


@dataclass(frozen=True)
class Node:
    """One server of the cluster, after range expansion and defaults."""

    name: str
    """Display name, unique; also names the node's run directory."""
    host: str
    """SSH address: name, IP or ~/.ssh/config alias."""
    addr: str
    """Data-plane address used for rendezvous (the master's) and reachability checks."""
    gpus: int | None
    """GPUs the node is declared to have; None for CPU-only nodes (GPU checks are skipped)."""
    nproc_per_node: int
    """Worker processes torchrun starts here."""
    python: str
    """Interpreter for the probe, the agent and torchrun on this node."""
    env: Mapping[str, str]
    """The job's environment on this node: inventory `env` overlaid with the node's `env`."""
    ssh: SSHOptions
    index: int
    """Position in the inventory after expansion (0-based)."""


def range_size(pattern: str) -> int:
    """How many names a host pattern can name at most (`h[1-4,7]x[1-2]`: 10): each bracket's
    ranges counted and multiplied, comma-separated patterns added. 0-padding and steps aside,
    what NodeSet will expand; an upper bound otherwise."""
    total, depth, part = 0, 0, ""
    for ch in pattern + ",":
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            size = 1
            for group in re.findall(r"\[([^\]]*)\]", part):
                count = 0
                for item in group.split(","):
                    bounds = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?(?:/\s*(\d+)\s*)?", item)
                    if bounds is None:
                        count += 1
                        continue
                    lo, hi, step = int(bounds[1]), int(bounds[2] or bounds[1]), int(bounds[3] or 1)
                    count += max(0, hi - lo) // max(1, step) + 1
                size *= count
            total += size
            part = ""
        else:
            part += ch
    return total


class Resolver(Protocol):
    """What node expansion needs of the inventory's resolver (`inventory._Resolver`)."""

    m: Any

    def issue(self, msg: str, *loc: str | int) -> None: ...

    def env_map(self, raw: Mapping[str, Any], loc: tuple[str | int, ...]) -> dict[str, str]: ...

    def local_path(self, value: str) -> str: ...

    def safe(self, text: str | None, what: str, *loc: str | int) -> None: ...


class NodeExpander:
    """`nodes:` → Nodes: each entry's host/name/addr ranges expanded in step, the entry's settings
    (processes, python, env, SSH options) given to every node it names, and no node twice.
    Problems go to the resolver's list, with the entry's line."""

    def __init__(self, resolver: Resolver) -> None:
        self.r = resolver
        self.m = resolver.m
        self.section = "nodes"
        # shared by `nodes:` and `spare:`: a spare may not be a node as well
        self.seen_names: dict[str, str] = {}
        self.seen_hosts: dict[tuple[str, int], str] = {}
        self.reported: set[tuple[str | int, ...]] = set()  # where a bad value shared by many nodes was named

    def nodes(self, env: dict[str, str], section: str = "nodes") -> list[Node]:
        """The nodes of `section` (`nodes`, or `spare`: the same entries, launched only to
        replace a node), no name or host twice across both."""
        self.section = section
        out: list[Node] = []
        seen_names, seen_hosts = self.seen_names, self.seen_hosts
        for i, nm in enumerate(getattr(self.m, section)):
            triples = self.expand_entry(nm, i)
            if not triples:
                continue
            shared = self.settings(nm, i, env)
            for host, name, addr in triples:
                problem = name_problem(name)
                if problem:
                    self.r.issue(f"node name {name!r} {problem}", self.section, i, "name")
                if name in seen_names:
                    self.r.issue(
                        f"duplicate node '{name}' (also {seen_names[name]}): every node must be listed once",
                        self.section,
                        i,
                        "name" if nm.name else "host",
                    )
                    continue
                hk = (host, shared["ssh"].port)
                if not SAME_HOST[self.m.transport] and hk in seen_hosts:  # one machine: hosts are labels
                    self.r.issue(f"duplicate node: {host}:{hk[1]} is already {seen_hosts[hk]}", self.section, i, "host")
                    continue
                seen_names[name] = seen_hosts[hk] = f"{self.section}[{i}]"
                out.append(Node(name=name, host=host, addr=addr, index=len(out), **shared))
        return out

    def settings(self, nm: NodeModel, i: int, env: dict[str, str]) -> dict[str, Any]:
        """What every node of one `nodes[i]` entry shares: GPUs, processes, python, env, SSH options."""
        for key, value in (("gpus", nm.gpus), ("nproc_per_node", nm.nproc_per_node)):
            if value is not None and value < 1:
                self.r.issue(f"{key} must be a positive integer, got {value}", self.section, i, key)
        node_env = dict(env)
        node_env.update(self.r.env_map(nm.env, (self.section, i, "env")))
        python = self.r.local_path(nm.python or self.m.job.python)
        self.r.safe(python, "python", self.section, i, "python")
        nproc = nm.nproc_per_node or self.m.job.nproc_per_node or (nm.gpus if nm.gpus and nm.gpus > 0 else 1)
        if nm.gpus is not None and nm.gpus > 0 and nproc > nm.gpus:
            where = (self.section, i, "nproc_per_node") if nm.nproc_per_node else ("job", "nproc_per_node")
            self.r.issue(
                f"nproc_per_node {nproc} is larger than the {nm.gpus} gpus of {self.section}[{i}] ({nm.host}): "
                f"a process needs its own GPU",
                *where,
            )
        return {
            "gpus": nm.gpus,
            "nproc_per_node": nproc,
            "python": python,
            "env": MappingProxyType(node_env),
            "ssh": self.ssh_options(nm, i),
        }

    def expand_entry(self, nm: NodeModel, i: int) -> list[tuple[str, str, str]]:
        """(host, name, addr) of every node the entry names: its ranges expanded in step."""
        hosts = self.expand(nm.host, i, "host")
        names = self.expand(nm.name, i, "name") if nm.name else hosts
        addrs = self.expand(nm.addr, i, "addr") if nm.addr else hosts
        if not hosts:
            return []
        if len(hosts) == 1 and len(names) > 1:  # `host: localhost, name: node[0-1]`: one host, many nodes
            hosts = hosts * len(names)
        if len(addrs) == 1 and len(hosts) > 1 and not nm.addr:
            addrs = addrs * len(hosts)
        for key, values in (("name", names), ("addr", addrs)):
            if len(values) != len(hosts):
                self.r.issue(
                    f"host expands to {len(hosts)} nodes but {key} to {len(values)}: "
                    f"give {key} a range of the same length, or omit it",
                    self.section,
                    i,
                    key,
                )
                names = addrs = hosts
        return list(zip(hosts, names, addrs))

    def expand(self, pattern: str, i: int, key: str) -> list[str]:
        if not HOST_PATTERN.match(pattern):
            self.r.issue(f"{key} {pattern!r} has characters a host name cannot have", self.section, i, key)
            return []
        if PLAIN_HOST.match(pattern):
            return [pattern]
        from ClusterShell.NodeSet import NodeSet, NodeSetException

        size = range_size(pattern)
        if size > MAX_NODES:  # counted from the text: ClusterShell would build every name first
            self.r.issue(
                f"{key} {pattern!r} expands to {size} nodes, more than {MAX_NODES}: is the range right?",
                "nodes",
                i,
                key,
            )
            return []
        try:
            return list(NodeSet(pattern))
        except NodeSetException as exc:
            self.r.issue(f"bad range in {key} {pattern!r}: {exc}", self.section, i, key)
            return []

    def ssh_options(self, node: NodeModel, i: int) -> SSHOptions:
        """The inventory's `ssh:` defaults, then the entry's `ssh:`, then its own keys."""
        merged: dict[str, Any] = {}
        for layer in (self.m.ssh, node.ssh, node):
            if layer is None:
                continue
            for key in fields_of(SSHModel):
                value = getattr(layer, key)
                if value is not None:
                    merged[key] = value
        opts = SSHOptions(**merged, port_given="port" in merged)
        if not 1 <= opts.port <= 65535:
            self.r.issue(f"port {opts.port} is out of range 1-65535", self.section, i, "port")
        if opts.connect_timeout <= 0:
            self.r.issue("connect_timeout must be positive", self.section, i, "connect_timeout")
        for key in ("user", "identity", "known_hosts", "gateway", "ssh_config"):
            self.r.safe(getattr(opts, key), key, self.section, i, key)
        if opts.gateway is not None and not GATEWAY.match(opts.gateway):
            origin: tuple[str | int, ...] = (self.section, i)  # where the value was written: the entry, or ssh:
            if node.gateway is None:
                origin = (self.section, i, "ssh") if node.ssh is not None and node.ssh.gateway is not None else ("ssh",)
            if origin + ("gateway",) not in self.reported:
                self.reported.add(origin + ("gateway",))
                why = ": it starts with '-', which ssh would take for an option" if opts.gateway.startswith("-") else ""
                self.r.issue(
                    f"gateway {opts.gateway!r} is not a host name, address or ssh config alias{why}", *origin, "gateway"
                )
        return opts
