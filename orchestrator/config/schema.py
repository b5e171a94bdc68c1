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
import reprlib
import types
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


class FabricCheckModel(_Schema):
    enabled: bool = True
    max_bytes: int | str = "256M"
    min_busbw_gbps: float | None = None
    share: float = 0.7
    timeout_s: float = 180.0
    budget_s: float = 30.0


class ChecksModel(_Schema):
    clock: ClockModel = ClockModel()
    timezone: str | None = None
    rdma: RdmaModel = RdmaModel()
    ssh: SSHCheckModel = SSHCheckModel()
    skip: list[str] = []
    fabric: bool | FabricCheckModel = False


class StragglerModel(_Schema):
    share: float = 0.8
    windows: int = 3
    action: Literal["warn", "stop"] = "warn"


class ContainerModel(_Schema):
    runtime: str
    image: str
    python: str = "python3"
    workdir: str | None = None
    mounts: list[str] = []
    options: list[str] = []
    user: str = "host"
    pull: Literal["missing", "never"] = "never"


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
    stall_timeout_s: float = 600.0
    on_stall: Literal["warn", "stop"] = "stop"
    retries: int = 0
    sync: list[str] = []
    telemetry_s: float = 10.0
    straggler: StragglerModel = StragglerModel()
    container: ContainerModel | None = None


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
    spare: list[NodeModel] = []


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
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p in _UNION_TAGS
                                                                         or p in _model_names())))
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
    # pydantic reports one error per union member for scalar unions; keep the first per key
    seen: set[tuple[int | None, str | None]] = set()
    unique = []
    for i in issues:
        if (i.line, i.key) not in seen:
            seen.add((i.line, i.key))
            unique.append(i)
    return unique


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
