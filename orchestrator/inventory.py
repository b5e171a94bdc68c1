"""Inventory: YAML → validated, frozen dataclasses. Pure: no connection is ever made here.

Two stages. The schema (`_Schema` classes; pydantic, `extra="forbid"`, wherever a value is not
plainly of its declared type) catches wrong types and unknown keys; the resolution expands host ranges (ClusterShell's NodeSet: `gpu[01-04]`, `10.0.0.[10-13]`), merges
defaults into nodes and checks what needs the whole cluster (duplicates, the master, rendezvous).
Every problem becomes an `InventoryIssue` with file, line and key; all are reported at once.
"""

from __future__ import annotations

import copy
import difflib
import functools
import os
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Literal,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

from . import yamlines
from .contract import CHECK_NAMES
from .errors import InventoryError, InventoryIssue

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HOST = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]*$")
HOST_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\[\],-]*$")
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
# A host or name NodeSet would give back unchanged (no range, list, group or IPv6 colon): it is
# taken as it is, and ClusterShell (~8 ms to import) is loaded only for the others.
PLAIN_HOST = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
# What would change meaning if a value ever met a shell. Values are quoted once in the transport
# anyway; refusing these in the inventory catches copy-paste accidents before anything runs.
SHELL_UNSAFE = ("\n", "\r", "\x00", "`", "$(", "${", ";", "&", "|", "<", ">")
DEFAULT_RUN_ROOT = "~/.orch/nodes"

Scalar = str | int | float | bool


# ----------------------------------------------------------------------------- schema (raw)


_FIELDS: dict[type, dict[str, Any]] = {}
_PYDANTIC: dict[type, Any] = {}


def fields_of(schema: type[_Schema]) -> dict[str, Any]:
    """{key: declared type} of a schema class, base class keys first (as pydantic orders them)."""
    if schema not in _FIELDS:
        hints = get_type_hints(schema)
        own: dict[str, Any] = {}
        for klass in reversed(schema.__mro__):
            for name in getattr(klass, "__annotations__", {}):
                if name in hints and get_origin(hints[name]) is not ClassVar:
                    own[name] = hints[name]
        _FIELDS[schema] = own
    return _FIELDS[schema]


class _Schema:
    """One mapping of the inventory file: its keys are the class annotations, its defaults the
    class attributes (no attribute: the key is required). Unknown keys are refused.

    One schema, two validators. `_plain` takes YAML as people write it (every value already of its
    declared type) without importing pydantic (a tenth of a second of `orch check`'s start-up);
    anything else (a value to coerce, like `port: "22"`, or an error) goes to the pydantic model
    built from the same class (`pydantic_model`), which decides and words every message."""

    def __init__(self, **values: Any) -> None:
        for name in fields_of(type(self)):
            value = values[name] if name in values else getattr(type(self), name)
            setattr(self, name, copy.copy(value) if isinstance(value, (dict, list)) else value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in fields_of(type(self)))})"


class SSHModel(_Schema):
    user: str | None = None
    port: int | None = None
    identity: str | None = None
    known_hosts: str | None = None
    host_key_policy: Literal["strict", "accept-new"] | None = None
    connect_timeout: float | None = None
    gateway: str | None = None
    ssh_config: str | None = None


class NodeModel(SSHModel):
    host: str
    name: str | None = None
    addr: str | None = None
    gpus: int | None = None
    nproc_per_node: int | None = None
    python: str | None = None
    env: dict[str, Scalar | None] = {}
    ssh: SSHModel | None = None


class MasterModel(_Schema):
    node: str | None = None
    port: int = 29500


class ClockModel(_Schema):
    ntp_server: str | None = None
    max_offset_ms: float = 50.0


class RdmaModel(_Schema):
    devices: list[str] = []


class SSHCheckModel(_Schema):
    warn_ms: float = 1000.0


class ChecksModel(_Schema):
    clock: ClockModel = ClockModel()
    timezone: str | None = None
    rdma: RdmaModel = RdmaModel()
    ssh: SSHCheckModel = SSHCheckModel()
    skip: list[str] = []


class JobModel(_Schema):
    workdir: str | None = None
    python: str = "python3"
    nproc_per_node: int | None = None
    rdzv: Literal["static", "c10d"] = "static"
    max_restarts: int = 0
    module: str | None = None
    script: str | None = None
    args: dict[str, Any] | list[Scalar] = {}
    torchrun_args: list[str] = []
    run_root: str = DEFAULT_RUN_ROOT
    stop_grace_s: float = 10.0


class InventoryModel(_Schema):
    name: str | None = None
    transport: Literal["ssh", "local"] = "ssh"
    ssh: SSHModel = SSHModel()
    nodes: list[NodeModel]
    master: MasterModel = MasterModel()
    env: dict[str, Scalar | None] = {}
    checks: ChecksModel = ChecksModel()
    job: JobModel = JobModel()
    fanout: int = 32


class _NotPlain(Exception):
    """A value `_plain` does not take as it is: pydantic decides (a coercion or an error)."""


def _plain(tp: Any, value: Any) -> Any:
    """`value` validated against `tp` when it already has that type exactly, as pydantic's lax mode
    returns it then (an int where a float is declared becomes that float); else _NotPlain."""
    if tp is Any:
        return value
    if isinstance(tp, type) and issubclass(tp, _Schema):
        if type(value) is not dict:
            raise _NotPlain
        declared = fields_of(tp)
        if any(key not in declared for key in value):
            raise _NotPlain
        if any(not hasattr(tp, name) and name not in value for name in declared):
            raise _NotPlain  # a required key is missing
        return tp(**{key: _plain(declared[key], v) for key, v in value.items()})
    if tp is float:
        if type(value) is float:
            return value
        if type(value) is int:
            return float(value)
        raise _NotPlain
    if tp in (str, int, bool):
        if type(value) is tp:
            return value
        raise _NotPlain
    if tp is type(None):
        if value is None:
            return None
        raise _NotPlain
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        if any(type(value) is type(a) and value == a for a in args):
            return value
        raise _NotPlain
    if origin is list:
        if type(value) is not list:
            raise _NotPlain
        return [_plain(args[0], v) for v in value]
    if origin is dict:
        if type(value) is not dict or any(type(k) is not str for k in value):
            raise _NotPlain
        return {k: _plain(args[1], v) for k, v in value.items()}
    if origin is Union or origin is types.UnionType:
        for member in args:  # the member whose type the value has (pydantic's smart union)
            try:
                return _plain(member, value)
            except _NotPlain:
                continue
    raise _NotPlain


def _pydantic_type(tp: Any) -> Any:
    """`tp` with every schema class replaced by its pydantic model."""
    if isinstance(tp, type) and issubclass(tp, _Schema):
        return pydantic_model(tp)
    origin, args = get_origin(tp), get_args(tp)
    if origin is list:
        return list[_pydantic_type(args[0])]  # type: ignore[misc]
    if origin is dict:
        return dict[args[0], _pydantic_type(args[1])]  # type: ignore[misc,valid-type]
    if origin is Union or origin is types.UnionType:
        return functools.reduce(lambda a, b: a | b, [_pydantic_type(a) for a in args])
    return tp


def pydantic_model(schema: type[_Schema]) -> type[BaseModel]:
    """The pydantic model of a schema class (strict=False: lax coercion; unknown keys forbidden)."""
    if schema in _PYDANTIC:
        return _PYDANTIC[schema]
    from pydantic import BaseModel, ConfigDict, create_model

    class _Model(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    definitions: dict[str, Any] = {}
    for name, tp in fields_of(schema).items():
        if not hasattr(schema, name):
            definitions[name] = (_pydantic_type(tp), ...)
            continue
        default = getattr(schema, name)
        if isinstance(default, _Schema):  # schema defaults are default-constructed
            default = pydantic_model(type(default))()
        definitions[name] = (_pydantic_type(tp), default)
    model: type[BaseModel] = create_model(schema.__name__, __base__=_Model, **definitions)
    _PYDANTIC[schema] = model
    return model


# ----------------------------------------------------------------------------- resolved (frozen)


@dataclass(frozen=True)
class SSHOptions:
    """How to reach one node over SSH (inventory `ssh:` defaults merged with the node's own)."""

    user: str | None = None
    port: int = 22
    identity: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    host_key_policy: str = "strict"
    connect_timeout: float = 10.0
    gateway: str | None = None
    ssh_config: str | None = "~/.ssh/config"


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


@dataclass(frozen=True)
class ClockCheck:
    ntp_server: str | None
    max_offset_ms: float


@dataclass(frozen=True)
class Checks:
    clock: ClockCheck
    timezone: str | None
    rdma_devices: tuple[str, ...]
    ssh_warn_ms: float
    skip: tuple[str, ...]


@dataclass(frozen=True)
class Job:
    """What runs on every node: `python -m torch.distributed.run ... (-m module | script) args`."""

    workdir: str | None
    python: str
    rdzv: str
    max_restarts: int
    module: str | None
    script: str | None
    args: tuple[str, ...]
    """The job's argv after the module/script, rendered from the YAML mapping or list."""
    raw_args: Mapping[str, Any]
    """The YAML mapping as written (empty when `args` was a list), for checks on paths and batch."""
    torchrun_args: tuple[str, ...]
    run_root: str
    stop_grace_s: float


@dataclass(frozen=True)
class Inventory:
    """A validated cluster description. Build it with `load()` or `parse()`."""

    path: str
    name: str
    transport: str
    nodes: tuple[Node, ...]
    """In node-rank order: the master first, then the others in file order."""
    master: Node
    master_port: int
    env: Mapping[str, str]
    checks: Checks
    job: Job
    fanout: int
    source: str = field(default="", repr=False)
    """The YAML text, kept for the run's snapshot."""

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if name in (n.name, n.host):
                return n
        raise KeyError(name)


# ----------------------------------------------------------------------------- loading


def load(path: str | os.PathLike[str]) -> Inventory:
    """Read and validate an inventory file. Raises InventoryError (exit 2) listing every problem."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise InventoryError([InventoryIssue(f"cannot read inventory: {exc.strerror}", path)]) from None
    return parse(text, path)


def parse(text: str, path: str = "<inventory>") -> Inventory:
    """Validate inventory YAML text; `path` is only used in messages and the snapshot."""
    try:
        data, lines = yamlines.load(text)
    except yamlines.YamlError as exc:
        raise InventoryError([InventoryIssue(exc.message, path, exc.line, exc.key)]) from None
    if not isinstance(data, dict):
        raise InventoryError(
            [InventoryIssue("the inventory must be a YAML mapping with at least `nodes:`", path, 1)]
        )
    if not data.get("nodes"):
        line = lines.get(("nodes",), 1)
        msg = "`nodes` is missing" if "nodes" not in data else "`nodes` is empty"
        issues = [InventoryIssue(f"{msg}: list at least one node (- host: ...)", path, line, "nodes")]
        try:  # still report unknown keys: `nodez:` is the likely reason `nodes` is missing
            validate({**data, "nodes": [{"host": "placeholder"}]}, path, lines)
        except InventoryError as exc:
            issues = exc.issues + issues
        raise InventoryError(issues)
    return _Resolver(validate(data, path, lines), path, lines, text).resolve()


def validate(data: dict[str, Any], path: str = "<inventory>",
             lines: dict[yamlines.Path, int] | None = None) -> Any:
    """The schema's verdict on the YAML data: an InventoryModel (or its pydantic model, which has
    the same attributes, when a value had to be coerced); InventoryError with every problem."""
    try:
        return _plain(InventoryModel, data)
    except _NotPlain:
        pass
    from pydantic import ValidationError

    try:
        return pydantic_model(InventoryModel).model_validate(data)
    except ValidationError as exc:
        raise InventoryError(_schema_issues(exc, path, lines or {})) from None


def _schema_issues(exc: ValidationError, path: str, lines: dict[yamlines.Path, int]) -> list[InventoryIssue]:
    issues = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p in _UNION_TAGS)))
        key = yamlines.dotted(loc)
        line = yamlines.line_of(lines, loc)
        if err["type"] == "extra_forbidden":
            bad = str(loc[-1])
            allowed = _allowed_keys(loc[:-1])
            msg = f"unknown key '{bad}'{_suggest(bad, allowed)}"
        elif err["type"] == "missing":
            msg = f"required key '{loc[-1]}' is missing"
            line = yamlines.line_of(lines, loc[:-1])
        else:
            msg = f"{err['msg'].removeprefix('Value error, ')} (got {err.get('input')!r})"
        issues.append(InventoryIssue(msg, path, line, key))
    # pydantic reports one error per union member for scalar unions; keep the first per key
    seen: set[tuple[int | None, str | None]] = set()
    unique = []
    for i in issues:
        if (i.line, i.key) not in seen:
            seen.add((i.line, i.key))
            unique.append(i)
    return unique


_UNION_TAGS = {"str", "int", "float", "bool", "none", "list[union[str,int,float,bool]]", "dict[str,any]"}


def _is_schema(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, _Schema)


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys the schema accepts at `loc` (for did-you-mean)."""
    model: Any = InventoryModel
    for part in loc:
        if isinstance(part, int):
            continue
        if not _is_schema(model) or part not in fields_of(model):
            return []
        model = _unwrap(fields_of(model)[part])
    return list(fields_of(model)) if _is_schema(model) else []


def _unwrap(annotation: Any) -> Any:
    origin = get_origin(annotation)
    if origin in (list, tuple):
        return _unwrap(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        for arg in get_args(annotation):
            if _is_schema(arg):
                return arg
    return annotation


def _suggest(word: str, choices: Any) -> str:
    choices = list(choices)
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not close:  # `ntp` for `ntp_server`: a prefix is as good a hint as a typo
        close = [c for c in choices if len(word) >= 3 and (c.startswith(word) or word.startswith(c))][:1]
    return f" (did you mean '{close[0]}'?)" if close else ""


def _env_value(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return "" if v is None else str(v)


def render_args(args: Mapping[str, Any] | list[Any]) -> tuple[str, ...]:
    """`{model: x, amp: true, lr: 0.01, off: false}` → `--model x --amp --lr 0.01`. Lists pass as is."""
    if isinstance(args, list):
        return tuple(_env_value(a) for a in args)
    out: list[str] = []
    for key, value in args.items():
        if value is None or value is False:
            continue
        out.append(f"--{key}")
        if value is True:
            continue
        if isinstance(value, list):
            out.extend(_env_value(v) for v in value)
        else:
            out.append(_env_value(value))
    return tuple(out)


class _Resolver:
    """Turns the schema model into an Inventory, collecting every cross-field problem."""

    def __init__(self, model: Any, path: str, lines: dict[yamlines.Path, int], text: str):
        self.m = model
        self.path = path
        self.lines = lines
        self.text = text
        self.issues: list[InventoryIssue] = []

    def issue(self, msg: str, *loc: str | int) -> None:
        self.issues.append(InventoryIssue(msg, self.path, yamlines.line_of(self.lines, loc), yamlines.dotted(loc)))

    def resolve(self) -> Inventory:
        m = self.m
        env = self.env_map(m.env, ("env",))
        nodes = self.nodes(env)
        checks = self.checks()
        job = self.job()
        if not 1 <= m.master.port <= 65535:
            self.issue(f"port {m.master.port} is out of range 1-65535", "master", "port")
        if m.fanout < 1:
            self.issue(f"fanout must be at least 1, got {m.fanout}", "fanout")
        master = self.master(nodes)
        self.rendezvous(nodes, job)
        if self.issues:
            raise InventoryError(self.issues)
        assert master is not None
        ordered = (master,) + tuple(n for n in nodes if n is not master)
        name = m.name or os.path.splitext(os.path.basename(self.path))[0] or "cluster"
        if not NODE_NAME.match(name):
            raise InventoryError([InventoryIssue(f"cluster name {name!r} may only use letters, digits, '_', '.', '-'", self.path, self.lines.get(("name",)), "name")])
        return Inventory(
            path=self.path, name=name, transport=m.transport, nodes=ordered, master=master,
            master_port=m.master.port, env=MappingProxyType(env), checks=checks, job=job,
            fanout=m.fanout, source=self.text,
        )

    # -- pieces

    def local_path(self, value: str) -> str:
        """With `transport: local`, a relative path (`../.venv/bin/python`, `..`) means relative to
        the inventory file, so a checked-in inventory works from any clone; a bare command name
        (`python3`) is left for PATH. Over SSH paths are the node's and stay as written."""
        if (self.m.transport != "local" or os.path.isabs(value) or value.startswith("~")
                or ("/" not in value and value not in (".", ".."))):
            return value
        return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(self.path)), value))

    def env_map(self, raw: Mapping[str, Any], loc: tuple[str | int, ...]) -> dict[str, str]:
        out = {}
        for key, value in raw.items():
            if not ENV_NAME.match(key):
                self.issue(f"'{key}' is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)", *loc, key)
                continue
            text = _env_value(value)
            self.safe(text, f"value of {key}", *loc, key)
            out[key] = text
        return out

    def safe(self, text: str | None, what: str, *loc: str | int) -> None:
        if text is None:
            return
        bad = [c for c in SHELL_UNSAFE if c in text]
        if bad:
            shown = ", ".join(repr(c) for c in bad)
            self.issue(f"{what} contains {shown}, which would need a shell to be safe: {text!r}", *loc)

    def ssh_options(self, node: NodeModel, i: int) -> SSHOptions:
        merged: dict[str, Any] = {}
        for layer in (self.m.ssh, node.ssh, node):
            if layer is None:
                continue
            for key in fields_of(SSHModel):
                value = getattr(layer, key)
                if value is not None:
                    merged[key] = value
        opts = SSHOptions(**merged)
        if not 1 <= opts.port <= 65535:
            self.issue(f"port {opts.port} is out of range 1-65535", "nodes", i, "port")
        if opts.connect_timeout <= 0:
            self.issue("connect_timeout must be positive", "nodes", i, "connect_timeout")
        for key in ("user", "identity", "known_hosts", "gateway", "ssh_config"):
            self.safe(getattr(opts, key), key, "nodes", i, key)
        return opts

    def expand(self, pattern: str, i: int, key: str) -> list[str]:
        if not HOST_PATTERN.match(pattern):
            self.issue(f"{key} {pattern!r} has characters a host name cannot have", "nodes", i, key)
            return []
        if PLAIN_HOST.match(pattern):
            return [pattern]
        from ClusterShell.NodeSet import NodeSet, NodeSetException

        try:
            return list(NodeSet(pattern))
        except NodeSetException as exc:
            self.issue(f"bad range in {key} {pattern!r}: {exc}", "nodes", i, key)
            return []

    def nodes(self, env: dict[str, str]) -> list[Node]:
        out: list[Node] = []
        seen_names: dict[str, int] = {}
        seen_hosts: dict[tuple[str, int], int] = {}
        for i, nm in enumerate(self.m.nodes):
            hosts = self.expand(nm.host, i, "host")
            names = self.expand(nm.name, i, "name") if nm.name else hosts
            addrs = self.expand(nm.addr, i, "addr") if nm.addr else hosts
            if not hosts:
                continue
            if len(hosts) == 1 and len(names) > 1:  # `host: localhost, name: node[0-1]`: one host, many nodes
                hosts = hosts * len(names)
            if len(addrs) == 1 and len(hosts) > 1 and not nm.addr:
                addrs = addrs * len(hosts)
            for key, values in (("name", names), ("addr", addrs)):
                if len(values) != len(hosts):
                    self.issue(
                        f"host expands to {len(hosts)} nodes but {key} to {len(values)}: "
                        f"give {key} a range of the same length, or omit it", "nodes", i, key)
                    names = addrs = hosts
            for key, value in (("gpus", nm.gpus), ("nproc_per_node", nm.nproc_per_node)):
                if value is not None and value < 1:
                    self.issue(f"{key} must be a positive integer, got {value}", "nodes", i, key)
            node_env = dict(env)
            node_env.update(self.env_map(nm.env, ("nodes", i, "env")))
            python = self.local_path(nm.python or self.m.job.python)
            self.safe(python, "python", "nodes", i, "python")
            nproc = nm.nproc_per_node or self.m.job.nproc_per_node or (nm.gpus if nm.gpus and nm.gpus > 0 else 1)
            if nm.gpus is not None and nm.gpus > 0 and nproc > nm.gpus:
                where = ("nodes", i, "nproc_per_node") if nm.nproc_per_node else ("job", "nproc_per_node")
                self.issue(f"nproc_per_node {nproc} is larger than the {nm.gpus} gpus of nodes[{i}] ({nm.host}): "
                           f"a process needs its own GPU", *where)
            ssh = self.ssh_options(nm, i)
            for host, name, addr in zip(hosts, names, addrs):
                if not NODE_NAME.match(name):
                    self.issue(f"node name {name!r} may only use letters, digits, '_', '.', ':', '-'", "nodes", i, "name")
                if name in seen_names:
                    self.issue(f"duplicate node '{name}' (also nodes[{seen_names[name]}]): every node must be listed once",
                               "nodes", i, "name" if nm.name else "host")
                    continue
                hk = (host, ssh.port)
                if self.m.transport == "ssh" and hk in seen_hosts:
                    self.issue(f"duplicate node: {host}:{ssh.port} is already nodes[{seen_hosts[hk]}]", "nodes", i, "host")
                    continue
                seen_names[name] = i
                seen_hosts[hk] = i
                out.append(Node(
                    name=name, host=host, addr=addr, gpus=nm.gpus, nproc_per_node=nproc, python=python,
                    env=MappingProxyType(node_env), ssh=ssh, index=len(out),
                ))
        return out

    def master(self, nodes: list[Node]) -> Node | None:
        if not nodes:
            return None
        wanted = self.m.master.node
        if wanted is None:
            return nodes[0]
        for n in nodes:
            if wanted in (n.name, n.host):
                return n
        names = [n.name for n in nodes]
        self.issue(f"master '{wanted}' is not one of the nodes{_suggest(wanted, names)}: "
                   f"nodes are {', '.join(names[:8])}{'...' if len(names) > 8 else ''}", "master", "node")
        return None

    def checks(self) -> Checks:
        c = self.m.checks
        if c.clock.max_offset_ms <= 0:
            self.issue("max_offset_ms must be positive", "checks", "clock", "max_offset_ms")
        server = c.clock.ntp_server
        if server is not None:
            host, _, port = server.rpartition(":") if server.count(":") == 1 else (server, "", "")
            if not HOST.match(host or server) or (port and not (port.isdigit() and 1 <= int(port) <= 65535)):
                self.issue(f"ntp_server {server!r} must be host or host:port", "checks", "clock", "ntp_server")
        for i, name in enumerate(c.skip):
            if name not in CHECK_NAMES:
                self.issue(f"unknown check '{name}'{_suggest(name, CHECK_NAMES)}; checks are {', '.join(CHECK_NAMES)}",
                           "checks", "skip", i)
        for i, dev in enumerate(c.rdma.devices):
            if not re.match(r"^[A-Za-z0-9_.-]+$", dev):
                self.issue(f"bad RDMA device name {dev!r}", "checks", "rdma", "devices", i)
        self.safe(c.timezone, "timezone", "checks", "timezone")
        return Checks(
            clock=ClockCheck(server, c.clock.max_offset_ms), timezone=c.timezone,
            rdma_devices=tuple(c.rdma.devices), ssh_warn_ms=c.ssh.warn_ms, skip=tuple(c.skip),
        )

    def job(self) -> Job:
        j = self.m.job
        if j.module and j.script:
            self.issue("give either `module` or `script`, not both", "job", "script")
        if j.max_restarts < 0:
            self.issue("max_restarts must be 0 or more", "job", "max_restarts")
        if j.nproc_per_node is not None and j.nproc_per_node < 1:
            self.issue(f"nproc_per_node must be a positive integer, got {j.nproc_per_node}", "job", "nproc_per_node")
        if j.stop_grace_s <= 0:
            self.issue("stop_grace_s must be positive", "job", "stop_grace_s")
        for key in ("workdir", "python", "module", "script", "run_root"):
            self.safe(getattr(j, key), key, "job", key)
        if j.module and not re.match(r"^[A-Za-z_][A-Za-z0-9_.]*$", j.module):
            self.issue(f"module {j.module!r} is not a Python module name", "job", "module")
        args = render_args(j.args)
        if isinstance(j.args, dict):
            for key, value in j.args.items():
                if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", key):
                    self.issue(f"argument name {key!r} is not a plain flag name", "job", "args", key)
                for v in value if isinstance(value, list) else [value]:
                    self.safe(_env_value(v), f"argument {key}", "job", "args", key)
        else:
            for i, v in enumerate(args):
                self.safe(v, "argument", "job", "args", i)
        for i, v in enumerate(j.torchrun_args):
            self.safe(v, "torchrun argument", "job", "torchrun_args", i)
        return Job(
            workdir=self.local_path(j.workdir) if j.workdir else None, python=self.local_path(j.python), rdzv=j.rdzv, max_restarts=j.max_restarts,
            module=j.module if (j.module or j.script) else "trainer", script=j.script, args=args,
            raw_args=MappingProxyType(dict(j.args) if isinstance(j.args, dict) else {}),
            torchrun_args=tuple(j.torchrun_args), run_root=j.run_root, stop_grace_s=j.stop_grace_s,
        )

    def rendezvous(self, nodes: list[Node], job: Job) -> None:
        nprocs = {n.nproc_per_node for n in nodes}
        if job.rdzv == "static" and len(nprocs) > 1:
            detail = ", ".join(f"{n.name}={n.nproc_per_node}" for n in nodes)
            self.issue(f"nodes run different numbers of processes ({detail}); static rendezvous needs the same "
                       f"nproc_per_node everywhere: set job.rdzv: c10d", "job", "rdzv")
