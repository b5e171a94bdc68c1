"""The probe's answer held to its shape: what `node/probe.py` writes, key by key (`FACTS_SHAPE`,
`LISTEN_SHAPE`, `REACH_SHAPE`), and `read_answer`, which keeps what conforms and names every part
that does not. A probe of another version, or one tampered with on the node, cannot crash a check:
what is malformed is dropped and the `ssh` check fails on it.
"""

from __future__ import annotations

import math
from typing import Any


class _Opt:
    """A value of `shape`, or null."""

    def __init__(self, shape: Any) -> None:
        self.shape = shape


class _MapOf:
    """A mapping of any string keys to values of `shape`."""

    def __init__(self, shape: Any) -> None:
        self.shape = shape


class _ListOf:
    def __init__(self, shape: Any) -> None:
        self.shape = shape


NUMBER, INT = "number", "int"  # JSON numbers (finite; never a bool), integers among them
_BAD = object()
_RUN = {"rc": _Opt(INT), "out": str, "err": str, "error": str}
_FILE = {"path": str, "exists": bool, "is_file": bool, "is_dir": bool, "size": INT, "sha256": str,
         "text": _Opt(str), "error": str, "output": bool, "writable": bool, "ancestor": str,
         "ancestor_is_dir": bool, "ancestor_writable": bool}
LISTEN_SHAPE = {"master_port": {"port": INT, "bound": bool, "error": _Opt(str), "holder": _Opt(str)},
                "ring": {"addr": str, "port": _Opt(INT), "error": _Opt(str)},
                "verbs": _Opt({"port": INT, "device": str, "tool": str})}
REACH_SHAPE = _ListOf({"kind": str, "node": str, "addr": str, "port": INT, "device": str, "ok": bool, "ms": NUMBER,
                       "error": _Opt(str), "answered_by": str, "result": _Opt(str)})
FACTS_SHAPE = {
    "probe": INT, "node": _Opt(str), "host": str, "home": str, "time": NUMBER,
    "python": {"executable": _Opt(str), "version": str},
    "env": _MapOf(str), "inventory_env": _ListOf(str),
    "tz": {"TZ": _Opt(str), "localtime": _Opt(str), "etc_timezone": _Opt(str), "abbr": _Opt(str),
           "utcoffset": _Opt(str)},
    "ifaces": _ListOf({"name": str, "up": bool, "ipv4": _ListOf(str)}),
    "ib": {"root": str, "source": str, "tools": _MapOf(_Opt(str)), "error": str,
           "devices": _MapOf({"hca_type": _Opt(str), "fw_ver": _Opt(str), "board_id": _Opt(str),
                              "ports": _MapOf({k: _Opt(str) for k in ("state", "phys_state", "rate", "link_layer")})})},
    "gpus": {"source": str, "query": _RUN, "table": _RUN, "error": str},
    "software": {k: _Opt(str) for k in ("python", "executable", "torch", "cuda", "nccl", "source", "ultralytics",
                                        "error", "torch_error", "nccl_error")},
    "ntp": _Opt({"server": str, "method": str, "samples": INT, "errors": _ListOf(str), "offset_ms": NUMBER,
                 "delay_ms": NUMBER, "stratum": INT, "error": str}),
    "chrony": _Opt(_RUN),
    "torch_cuda": _Opt({"torch": _Opt(str), "cuda": _Opt(str), "arch_list": _ListOf(str),
                        "releases": _MapOf(_ListOf(INT)), "error": str}),
    "job_check": _Opt({"kind": str, "rc": _Opt(INT), "out": str, "err": str, "seconds": NUMBER, "error": str}),
    "paths": _MapOf(_FILE), "workdir": _Opt(_FILE), "timings_s": _MapOf(NUMBER), "listen": LISTEN_SHAPE,
}
"""What the probe (node/probe.py) answers, key by key: what the checks may rely on."""


def conform(value: Any, shape: Any, where: str, problems: list[str]) -> Any:
    """`value` where it has `shape`, else _BAD (noted in `problems`): a mapping keeps its keys of
    the right shape and drops the others (keys the shape does not name are kept as they are)."""
    if isinstance(shape, _Opt):
        return None if value is None else conform(value, shape.shape, where, problems)
    ok = True
    if shape in (NUMBER, INT):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ok = ok and (shape == NUMBER or isinstance(value, int))
    elif isinstance(shape, type):
        ok = type(value) is shape
    elif isinstance(shape, (dict, _MapOf)):
        if not isinstance(value, dict):
            ok = False
        else:
            out = {}
            for key, item in value.items():
                sub = shape.get(key, Any) if isinstance(shape, dict) else shape.shape
                got = item if sub is Any else conform(item, sub, f"{where}.{key}", problems)
                if got is not _BAD:
                    out[key] = got
            return out
    elif isinstance(shape, _ListOf):
        if not isinstance(value, list):
            ok = False
        else:
            items = (conform(item, shape.shape, f"{where}[{i}]", problems) for i, item in enumerate(value))
            return [item for item in items if item is not _BAD]
    if not ok:
        problems.append(f"{where}: {type(value).__name__} {str(value)[:40]!r}")
        return _BAD
    return value


def read_answer(value: Any, shape: Any, what: str) -> tuple[Any, list[str]]:
    """A tagged answer of the probe held to its shape: (what conforms, every part that did not)."""
    problems: list[str] = []
    got = conform(value, shape, what, problems)
    if got is _BAD:
        got = [] if isinstance(shape, _ListOf) else {}
    return got, problems
