"""The inventory's schema: every key, its type and default, and the two validators of YAML data.

One schema, two validators. Each mapping of the file is a `_Schema` class: its keys are the class
annotations, its defaults the class attributes (no attribute: the key is required), and unknown
keys are refused. `_plain` takes YAML as people write it (every value already of its declared
type) without importing pydantic (a tenth of a second of `orch check`'s start-up); anything else
(a value to coerce, like `port: "22"`, or an error) goes to the pydantic model built from the same
class (`pydantic_model`, `extra="forbid"`), which decides and words every message. Every problem
becomes an `InventoryIssue` with file, line and key. Cross-field rules (ranges, duplicates, the
master) are `inventory.py`'s.
"""

from __future__ import annotations

import copy
import difflib
import functools
import math
import reprlib
import types
from collections.abc import Mapping
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

from ..errors import InventoryError, InventoryIssue
from . import yamlines

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

DEFAULT_RUN_ROOT = "~/.orch/nodes"

Scalar = str | int | float | bool

SSH_UNSET: dict[str, Any] = {
    "port": 22,
    "known_hosts": "~/.ssh/known_hosts",
    "host_key_policy": "strict",
    "connect_timeout": 10.0,
    "ssh_config": "~/.ssh/config",
}
"""What an SSH key left unset both in `ssh:` and on the node means (`nodes.SSHOptions` starts from
these): the schema's own default of those keys is None, "not given here", so a node inherits
`ssh:`'s value."""


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


def field_docs(schema: type[_Schema]) -> dict[str, str]:
    """{key: the docstring under it} of a schema class, its base classes' keys included: what each
    key means, as docs/inventory.md shows it (read from the source, so only the docs and the tests
    pay for it, not the start-up)."""
    import ast
    import inspect

    docs: dict[str, str] = {}
    for klass in reversed(schema.__mro__):
        if klass is _Schema or not (isinstance(klass, type) and issubclass(klass, _Schema)):
            continue
        body = ast.parse(inspect.getsource(klass)).body[0]
        assert isinstance(body, ast.ClassDef)
        for stmt, nxt in zip(body.body, body.body[1:]):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def default_of(path: str) -> Any:
    """The schema's default of a dotted key (`job.stall_timeout_s` → 600.0): what the CLI's help
    says a flag falls back to. KeyError for a key that is not in the schema or has no default."""
    model: Any = InventoryModel
    *parents, last = path.split(".")
    for part in parents:
        model = _unwrap(fields_of(model)[part])
    if last not in fields_of(model) or not hasattr(model, last):
        raise KeyError(path)
    return getattr(model, last)


def yaml_text(value: Any) -> str:
    """A default as an inventory would spell it: `600`, `0.7`, `true`, `stop`, `[]`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, dict)) and not value:
        return "[]" if isinstance(value, list) else "{}"
    return str(value)


class _Schema:
    """One mapping of the inventory file: its keys are the class annotations, its defaults the
    class attributes (no attribute: the key is required), what each means the docstring under it.
    Unknown keys are refused.

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
    """`ssh:`: how every node is reached; every node may override any of them, directly or in its own `ssh:`."""

    user: str | None = None
    """remote account; unset: from `~/.ssh/config`, else your login"""
    port: int | None = None
    """sshd port"""
    identity: str | None = None
    """private key file; unset: the agent's keys and `~/.ssh/config`'s"""
    known_hosts: str | None = None
    """where host keys are verified (and recorded with `accept-new`); a key on an `@revoked` line is refused for
    every host, `@cert-authority` lines are not used (orch does not verify host certificates)"""
    host_key_policy: Literal["strict", "accept-new"] | None = None
    """`strict`: an unknown or changed key is an error · `accept-new`: record unknown keys, refuse changed ones.
    There is no option that skips verification"""
    connect_timeout: float | None = None
    """seconds to reach a node (the TCP connect and the server's banner, as OpenSSH's `ConnectTimeout`)
    before it counts as unreachable; authentication then gets at least 30 s (a loaded node is slow
    there, not unreachable)"""
    gateway: str | None = None
    """jump host (a host name, address or `~/.ssh/config` alias: letters, digits, `_ . : -`, not starting with
    `-`), reached with the node's user and port and verified like a node; unset: none"""
    ssh_config: str | None = None
    """OpenSSH client config to read host aliases, users and keys from"""


class NodeModel(SSHModel):
    """`nodes[]` (and `spare[]`): one entry per node, or per range of nodes."""

    host: str
    """SSH address: name, IP or `~/.ssh/config` alias; a range (`gpu[01-04]`, `10.0.0.[10-13]`) expands to one
    node per value, in ascending order"""
    name: str | None = None
    """display name, unique; may be a range of the same length as `host`; unset: `host`"""
    addr: str | None = None
    """data-plane address: rendezvous (`--master-addr`) and reachability checks; may be a range; unset: `host`"""
    gpus: int | None = None
    """GPUs on the node; unset for CPU-only nodes (the `gpus` check is then `skip`)"""
    nproc_per_node: int | None = None
    """processes torchrun starts on the node, at most `gpus`; unset: `job.nproc_per_node`, else `gpus`, else 1"""
    python: str | None = None
    """interpreter on this node; unset: `job.python`"""
    env: dict[str, Scalar | None] = {}
    """overrides of the top-level `env` on this node"""
    ssh: SSHModel | None = None
    """the same SSH overrides as a mapping"""


class MasterModel(_Schema):
    """`master:`: node rank 0 and the rendezvous."""

    node: str | None = None
    """name or host of node rank 0; unset: the first node (with `transport: slurm`: the allocation's first)"""
    port: int = 29500
    """rendezvous port (`--master-port`)"""


class ClockModel(_Schema):
    ntp_server: str | None = None
    """`host` or `host:port`; every node measures its offset to it (SNTP). Unset: offsets are estimated against
    the controller over SSH"""
    max_offset_ms: float = 50.0
    """`fail` above this offset, `warn` above half of it"""


class RdmaModel(_Schema):
    devices: list[str] = []
    """HCAs (e.g. `[mlx5_0]`) that must exist with an ACTIVE, LinkUp port; empty: RDMA not required"""


class SSHCheckModel(_Schema):
    warn_ms: float = 1000.0
    """the `ssh` check warns when connect + round trip exceeds this"""


class FabricCheckModel(_Schema):
    enabled: bool = True
    """in a mapping: run it with every `orch check` and `orch up`; `false` keeps the settings for
    `orch check --only fabric` / `orch up --fabric`"""
    max_bytes: int | str = "256M"
    """the largest all_reduce of the size sweep (1 MiB, ×4, up to this): bytes, or `K`/`M`/`G` (powers of 1024,
    as nccl-tests' `-e`)"""
    min_busbw_gbps: float | None = None
    """`fail` when busbw (GB/s, nccl-tests' definition) at the largest size is below this; on the slow nodes
    when some are named, else cluster-wide; unset: no floor"""
    share: float = 0.7
    """`warn` on a node whose best pair sends or receives below this share of the median node, and on a link
    below this share of what both its ends reach"""
    timeout_s: float = 180.0
    """the job must end within this (else every node is stopped and the check fails); a collective also gives
    up after it"""
    budget_s: float = 30.0
    """sweep sizes that would end the sweep after this many seconds are left out (and listed): a slow link
    cannot stretch the job without bound"""


class ChecksModel(_Schema):
    """`checks:`: what `orch check` expects."""

    clock: ClockModel = ClockModel()
    """the `clock` check"""
    timezone: str | None = None
    """the zone every node must be in (e.g. `Asia/Shanghai`); unset: the nodes must simply agree"""
    rdma: RdmaModel = RdmaModel()
    """the `rdma` check"""
    ssh: SSHCheckModel = SSHCheckModel()
    """the `ssh` check"""
    skip: list[str] = []
    """names of the checks to skip"""
    fabric: bool | FabricCheckModel = False
    """the opt-in `fabric` check (a short all_reduce job on every node): `true` runs it with every `orch check`
    and `orch up` of this inventory; a mapping of the settings below does too, unless it says `enabled: false`.
    Without it the check runs only with `orch check --only fabric` or `orch up --fabric`"""


class StragglerModel(_Schema):
    share: float = 0.8
    """a rank is slow when its time per step outside collectives (data wait, forward and loss) is above the
    median rank's divided by this (0.8: 1.25 x the median); between 0 and 1"""
    windows: int = 3
    """for this many consecutive timing windows (the trainer's `--log-every` steps) before it is named: one
    `straggler:` line in the log, `orch status`, `orch top`, the report"""
    action: Literal["warn", "stop"] = "warn"
    """`warn`: name it and keep running · `stop`: also fail the run naming that node (exit 1), so `retries`
    with a `spare` relaunch without it"""


class ContainerModel(_Schema):
    runtime: str
    """`docker`, `podman` or `apptainer`: the job (torchrun and its ranks, the job's check, the fabric job) runs
    in this runtime's container on every node; orch's own node programs (agent, probe, log reader) still run as
    `python` on the host"""
    image: str
    """a `name:tag` or an image ID (apptainer: an absolute `.sif` path; never starting with `-`); the launch
    runs the image ID the preflight resolved, the same on every node"""
    python: str = "python3"
    """the job's interpreter inside the image, e.g. `/opt/conda/envs/yoloe/bin/python`"""
    workdir: str | None = None
    """the working directory inside the container (absolute); unset: `job.workdir`"""
    mounts: list[str] = []
    """`HOST[:CONTAINER[:ro]]` each (a path alone: the same path); absolute, each container path once, never
    over the run directory (`run_root`), `job.workdir` or `/etc/passwd`/`/etc/group`, which orch mounts itself.
    `job.args` paths are the container's: the checks look for each on the host where its mount puts it, and
    an output (the trainer's run directory) under no mount fails (deleted with the container)"""
    options: list[str] = []
    """extra runtime flags, appended last (before the image) and shown by `orch up --dry-run`, e.g.
    `[--shm-size=32g]` (then no `--ipc host`); read as the runtime reads them (`-itd`, `-d=true`, `--rm=False`,
    `-u0`, `-ie NAME=V`) and refused where they contradict what orch sets: detach, `--rm` false, `--network`
    other than host, `--name`, `--user`, `--gpus`/`--device nvidia.com/gpu` when nodes have `gpus`,
    `--env`/`--env-file` (values go in `env:`), `orch.*` labels or `--label-file`, `--pull`, the workdir; a word
    that is no flag"""
    user: str = "host"
    """`host`: the SSH user's uid:gid, with the host's `/etc/passwd` and `/etc/group` read-only and a tmpfs HOME
    (files the job writes are the user's, not root's) · `root` · `UID:GID` (torchrun's own logs then stay in the
    container: the run directory stays the SSH user's); apptainer: `host` only"""
    pull: Literal["missing", "never"] = "never"
    """`missing`: the preflight may pull an image a node lacks · `never`: the runtime is told so (`--pull
    never`), and a node without the image fails the `container` check"""


class JobModel(_Schema):
    """`job:`: what runs on every node."""

    workdir: str | None = None
    """`cd` here on every node before starting torchrun; unset: the login's home"""
    python: str = "python3"
    """interpreter for the probe, the node agent and torchrun (absolute path recommended)"""
    nproc_per_node: int | None = None
    """processes per node; unset: each node's `gpus`, else 1"""
    rdzv: Literal["static", "c10d"] = "static"
    """`static`: node ranks from the inventory order · `c10d`: torch assigns them (required when nodes run
    different numbers of processes)"""
    max_restarts: int = 0
    """torchrun `--max-restarts`; 0 = fail fast"""
    module: str | None = None
    """`python -m MODULE` on every rank; unset (and no `script`): `trainer`"""
    script: str | None = None
    """a script path instead of `module`"""
    args: dict[str, Any] | list[Scalar] = {}
    """a mapping becomes `--key value` (`true` → bare `--key`, `null` → left out (the job's default), a list →
    `--key a b`; `false` → the trainer's own word for off, `--amp off`, `--plots false`, and refused
    (file:line:key) for a trainer flag without an off, such as `resume`, and for any other `module`/`script`,
    which orch cannot know the spelling of: write the word it takes, or `null`); a list is passed as is"""
    torchrun_args: list[str] = []
    """extra torchrun flags, e.g. `[--monitor-interval=1]`; the flags orch sets from the inventory (`--nnodes`,
    `--nproc-per-node`, `--node-rank`, `--master-addr`/`-port`, `--rdzv-backend`/`-endpoint`/`-id`, `--standalone`,
    `--max-restarts`, `--tee`, `--log-dir`) are refused, and so is a `--role` with a digit or other than letters,
    `_` and `-` (orch reads the role back from torchrun's `[<role><local rank>]:` prefix)"""
    run_root: str = DEFAULT_RUN_ROOT
    """where each node keeps its run directories (`<run_root>/<run-id>/<node>/`): agent, node log, state"""
    stop_grace_s: float = 10.0
    """seconds between SIGTERM and SIGKILL when a run is stopped"""
    stall_timeout_s: float = 600.0
    """the hang watchdog of an attached `orch up`: when no rank writes a line for this long, every rank's stack
    is taken (`orch stacks`) into the run directory and shown; `0` turns it off. Must exceed the longest silent
    phase of the job (validation, checkpointing, the first step); `orch up --stall-timeout` overrides it"""
    on_stall: Literal["warn", "stop"] = "stop"
    """what a hang does: `stop` tears the run down (exit 1, the rank whose stack differs named as the first
    failure; a retry follows when `retries` allow) · `warn` only reports it, once per silence"""
    retries: int = 0
    """after a failure that is not a preflight failure (a rank or node failed, a node could not start, a hang
    was stopped), tear down, run the preflight again and relaunch the same run id, up to this many times; the
    trainer (`module: trainer`) gets `--resume` once its master holds `weights/last.pt`. `orch up --retries`
    overrides it; a detached run is never retried"""
    sync: list[str] = []
    """files and directories on the controller that `orch sync` copies to the same absolute path on every node
    (rsync over SSH with the `ssh` settings, only what changed); `orch up` runs it before its preflight when the
    list is not empty. Absolute paths only, none inside another; a directory `/srv/yolo` lands at `/srv/yolo`.
    The `job` check then compares each synced file (size, sha256) and finds each synced directory on every
    node"""
    telemetry_s: float = 10.0
    """every this many seconds each node agent samples its GPUs (`nvidia-smi`: utilisation, memory,
    temperature, power, SM clock, throttle reasons), the node's CPU and memory and each rank's CPU and RSS, and
    writes them as a `telemetry` line of the node log (what `orch top` shows); `0` turns it off; under 1 s is
    refused"""
    straggler: StragglerModel = StragglerModel()
    """when a rank is called slow, and what that does"""
    container: ContainerModel | None = None
    """the image the job runs in on every node; unset: the job runs as `python` on the host"""


class SlurmModel(_Schema):
    """`slurm:` (with `transport: slurm`): the allocation the nodes come from. Outside one, `orch up` and
    `orch check` ask for it with `sbatch` (a batch job that holds it, so that `scontrol requeue` works) and
    give it back (`scancel`) when they end; inside one (`SLURM_JOB_ID` set: under `salloc`, in your own
    `sbatch` script) they use its nodes and never cancel it."""

    nodes: int | None = None
    """`-N`: how many nodes to allocate; node ranks follow the allocation's order, its first node is the master
    (unless `master.node`). Unset inside an existing allocation (all of its nodes); given there, it must match"""
    partition: str | None = None
    """`-p`: the partition; unset: the cluster's default. Inside an allocation, it must be the allocation's"""
    time: str | None = None
    """`-t`: the allocation's time limit (`90`, `4:00:00`, `2-00:00:00`); unset: the partition's default. A run
    that reaches it ends saying so, after the warning signal (`USR2`, 120 s before) let the trainer checkpoint"""
    gpus_per_node: int | None = None
    """`--gpus-per-node`: GPUs on every node (each node's `gpus`), also asked for by every step; unset on CPU
    partitions"""
    options: list[str] = []
    """more `sbatch` flags, e.g. `[--exclusive, --account=lab, --qos=high]`, shown by `orch up --dry-run`.
    Without a CPU flag (`--exclusive`, `-c`/`--cpus-per-task`, `--cpus-per-gpu`, `--mincpus`) orch adds
    `--exclusive`: a step gets the node's allocated CPUs, and Slurm allocates one per node by default.
    `--signal=USR2@SECONDS` moves the warning. Refused where orch sets the value or it breaks the run:
    `-N`, `-p`, `-t`, `--gpus-per-node` (their keys), `-n`/`--ntasks*` (one torchrun per node),
    `--gpus`/`--gpus-per-task` (per job, per rank), `--export`, `--wrap`, `-o`/`-e`, `--parsable`, `-W`,
    `--signal` of another signal or with `B:`"""


SAME_HOST: Mapping[str, bool] = types.MappingProxyType({"ssh": False, "local": True, "slurm": False})
"""Per `transport`: whether its nodes are processes on this machine, so that a relative path in the
inventory means the inventory file's, and nodes need not have hosts of their own. The transport's
class says it (`Transport.same_host`, transport/__init__.py `TRANSPORTS`), but the inventory is read
before any transport exists and config/ sits below transport/: the reader takes it from here, and
tests/unit/test_transport_registry.py holds the two equal."""
ALLOCATED: Mapping[str, bool] = types.MappingProxyType({"ssh": False, "local": False, "slurm": True})
"""Per `transport`: whether its nodes come from an allocation (`slurm:`) rather than a `nodes:` list
(`Transport.allocates`, held equal to this by the same test)."""


class InventoryModel(_Schema):
    """The inventory file."""

    name: str | None = None
    """cluster name; names runs (`<date>-<time>-<name>`); unset: the file's name"""
    transport: Literal["ssh", "local", "slurm"] = "ssh"
    """`ssh`: reach every node with SSH · `local`: nodes are processes on this machine · `slurm`: the nodes are
    a Slurm allocation (`slurm:`), reached with `srun` steps; no `nodes:` list"""
    ssh: SSHModel = SSHModel()
    """SSH settings for every node"""
    nodes: list[NodeModel] = []
    """the nodes, in node-rank order (the master is moved first); required, except with `transport: slurm`"""
    slurm: SlurmModel | None = None
    """with `transport: slurm`: the allocation"""
    master: MasterModel = MasterModel()
    """node rank 0 and the rendezvous port"""
    env: dict[str, Scalar | None] = {}
    """environment of the job on every node (NCCL_*, GLOO_*, TORCH_* ...)"""
    checks: ChecksModel = ChecksModel()
    """what `orch check` expects"""
    job: JobModel = JobModel()
    """what runs on every node"""
    fanout: int = 32
    """how many nodes are contacted at once"""
    spare: list[NodeModel] = []
    """spare nodes, written like `nodes` entries (ranges too): never launched, until a node fails the preflight
    of an automatic retry (`job.retries`); the first healthy spare then takes its place and the ranks are
    planned again. Same `nproc_per_node` as the nodes under `rdzv: static`; no spare may also be a node"""


class _NotPlain(Exception):
    """A value `_plain` does not take as it is: pydantic decides (a coercion or an error)."""


def _plain(tp: Any, value: Any) -> Any:
    """`value` validated against `tp` when it already has that type exactly, as pydantic's lax mode
    returns it then (an int where a float is declared becomes that float); else _NotPlain."""
    if tp is Any:
        if not all_finite(value):
            raise _NotPlain
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
        if type(value) is float and math.isfinite(value):
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


def all_finite(value: Any) -> bool:
    """No float in `value` (a scalar, or lists and mappings of them) is NaN or infinite: `.nan`,
    `.inf` and `1e999` are not a duration, a size or a setting anyone means."""
    if type(value) is float:
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(all_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(all_finite(v) for v in value)
    return True


def _finite_anywhere(value: Any) -> Any:
    if not all_finite(value):
        raise ValueError("Input should be a finite number")
    return value


def _pydantic_type(tp: Any) -> Any:
    """`tp` with every schema class replaced by its pydantic model, and every number finite
    (pydantic's float takes NaN and infinities; a free value of type Any is held to the same)."""
    if isinstance(tp, type) and issubclass(tp, _Schema):
        return pydantic_model(tp)
    if tp is float:
        from pydantic import FiniteFloat

        return FiniteFloat
    if tp is Any:
        from typing import Annotated

        from pydantic import AfterValidator

        return Annotated[Any, AfterValidator(_finite_anywhere)]
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


def validate(data: dict[str, Any], path: str = "<inventory>", lines: dict[yamlines.Path, int] | None = None) -> Any:
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
        loc = tuple(
            p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p in _UNION_TAGS or p in _model_names()))
        )
        key = yamlines.dotted(loc)
        line = yamlines.line_of(lines, loc)
        if err["type"] == "extra_forbidden":
            bad = str(loc[-1])
            allowed = _allowed_keys(loc[:-1])
            msg = f"unknown key {bad!r}{suggest(bad, allowed)}"
        elif err["type"] == "missing":
            msg = f"required key '{loc[-1]}' is missing"
            line = yamlines.line_of(lines, loc[:-1])
        else:
            msg = f"{err['msg'].removeprefix('Value error, ')} (got {shown(err.get('input'))})"
        issues.append(InventoryIssue(msg, path, line, key))
    # pydantic reports one error per union member for scalar unions; keep the first per key (a
    # value that is not finite: that one), and none for a key whose member (`job.args.lr0`) has one
    keys = {i.key for i in issues if i.key}
    unique: dict[tuple[int | None, str | None], InventoryIssue] = {}
    for i in issues:
        if i.key is not None and any(k.startswith((i.key + ".", i.key + "[")) for k in keys):
            continue
        if (i.line, i.key) not in unique or ("finite" in i.message and "finite" not in unique[i.line, i.key].message):
            unique[i.line, i.key] = i
    return list(unique.values())


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 120
_SHOWN.maxlist = _SHOWN.maxdict = _SHOWN.maxtuple = 8
_SHOWN.maxlevel = 3


def shown(value: Any) -> str:
    """A value as an error quotes it: its repr, cut short (`...`) when long or deep, so one bad
    value is one readable line."""
    return _SHOWN.repr(value)


_UNION_TAGS = {"str", "int", "float", "bool", "none", "list[union[str,int,float,bool]]", "dict[str,any]"}


def _model_names() -> set[str]:
    """The names pydantic puts in an error's location for a union member that is a schema
    (`checks.fabric.FabricCheckModel.share`): not keys of the file."""
    return {klass.__name__ for klass in _PYDANTIC}


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


def suggest(word: str, choices: Any) -> str:
    choices = list(choices)
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not close:  # `ntp` for `ntp_server`: a prefix is as good a hint as a typo
        close = [c for c in choices if len(word) >= 3 and (c.startswith(word) or word.startswith(c))][:1]
    return f" (did you mean '{close[0]}'?)" if close else ""
