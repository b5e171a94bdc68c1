"""The probe's answer held to its shape: the machinery (`Opt`, `MapOf`, `ListOf`, `conform`,
`read_answer`, which keeps what conforms and names every part that does not), the probe's own
frame (`PROBE_SHAPE`, `LISTEN_SHAPE`, `REACH_SHAPE`), and `assemble`, which makes the whole
answer's shape (`checks.FACTS_SHAPE`) of the parts each check declares beside itself (`FACTS`).
A probe of another version, or one tampered with on the node, cannot crash a check: what is
malformed is dropped and the `ssh` check fails on it.
"""

from __future__ import annotations

import math
from typing import Any


class Opt:
    """A value of `shape`, or null."""

    def __init__(self, shape: Any) -> None:
        self.shape = shape


class MapOf:
    """A mapping of any string keys to values of `shape`."""

    def __init__(self, shape: Any) -> None:
        self.shape = shape


class ListOf:
    def __init__(self, shape: Any) -> None:
        self.shape = shape


NUMBER, INT = "number", "int"  # JSON numbers (finite; never a bool), integers among them
_BAD = object()
RUN = {"rc": Opt(INT), "out": str, "err": str, "error": str}
LISTEN_SHAPE = {
    "master_port": {"port": INT, "bound": bool, "error": Opt(str), "holder": Opt(str)},
    "ring": {"addr": str, "port": Opt(INT), "error": Opt(str)},
    "verbs": Opt({"port": INT, "device": str, "tool": str}),
}
REACH_SHAPE = ListOf(
    {
        "kind": str,
        "node": str,
        "addr": str,
        "port": INT,
        "device": str,
        "ok": bool,
        "ms": NUMBER,
        "error": Opt(str),
        "answered_by": str,
        "result": Opt(str),
    }
)
PROBE_SHAPE = {
    "probe": INT,
    "node": Opt(str),
    "host": str,
    "home": str,
    "time": NUMBER,
    "python": {"executable": Opt(str), "version": str},
    "env": MapOf(str),
    "inventory_env": ListOf(str),
    "timings_s": MapOf(NUMBER),
    "listen": LISTEN_SHAPE,
}
"""The probe's own frame of its answer: who answered, the job's environment it saw, and its
listeners (what `facts.py` itself reads); every other fact's shape is its check's (`checks/`)."""


def assemble(*parts: dict[str, Any]) -> dict[str, Any]:
    """One shape of the probe's whole answer from its parts, each key declared by exactly one."""
    out: dict[str, Any] = {}
    for part in parts:
        twice = sorted(set(out) & set(part))
        if twice:
            raise ValueError(f"facts declared twice: {', '.join(twice)}")
        out.update(part)
    return out


def conform(value: Any, shape: Any, where: str, problems: list[str]) -> Any:
    """`value` where it has `shape`, else _BAD (noted in `problems`): a mapping keeps its keys of
    the right shape and drops the others (keys the shape does not name are kept as they are)."""
    if isinstance(shape, Opt):
        return None if value is None else conform(value, shape.shape, where, problems)
    ok = True
    if shape in (NUMBER, INT):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ok = ok and (shape == NUMBER or isinstance(value, int))
    elif isinstance(shape, type):
        ok = type(value) is shape
    elif isinstance(shape, (dict, MapOf)):
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
    elif isinstance(shape, ListOf):
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
        got = [] if isinstance(shape, ListOf) else {}
    return got, problems


_SWEEP_ROW = {
    "size_bytes": INT,
    "count": INT,
    "type": str,
    "redop": str,
    "root": INT,
    "iters": INT,
    "time_us": NUMBER,
    "algbw_gbps": NUMBER,
    "busbw_gbps": NUMBER,
    "wrong": Opt(INT),
}
FABRIC_RESULT_SHAPE = {
    "schema": INT,
    "backend": str,
    "device": str,
    "torch": str,
    "nccl": Opt(str),
    "world_size": INT,
    "nnodes": INT,
    "nodes": ListOf({"node": INT, "host": str, "hostname": str, "ranks": ListOf(INT), "boot_id": Opt(str)}),
    "ranks": ListOf({"rank": INT, "host": str, "label": str, "node": INT, "local_rank": INT}),
    "op": str,
    "dtype": str,
    "bus_factor": NUMBER,
    "sweep": ListOf(_SWEEP_ROW),
    "skipped": ListOf({"size_bytes": INT, "reason": str}),
    "links": {
        "method": str,
        "rounds": INT,
        "passes": INT,
        "rails": INT,
        "pairs_at_once": str,
        "pairs_why": str,
        "skipped": str,
        "transfers": ListOf(
            {
                "pass": INT,
                "round": INT,
                "src_node": INT,
                "dst_node": INT,
                "rail": INT,
                "bytes": INT,
                "seconds": NUMBER,
                "gbps": NUMBER,
                "probe_gbps": NUMBER,
                "all_seconds": ListOf(NUMBER),
            }
        ),
    },
    "elapsed_s": NUMBER,
    "phase_s": MapOf(NUMBER),
}
"""What the fabric job (node/jobs/allreduce.py) prints after `ORCH_FABRIC_RESULT`, key by key."""
FABRIC_REQUIRED = ("backend", "device", "world_size", "nnodes", "nodes", "sweep")


def read_fabric_result(value: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """The fabric job's result held to its shape, whole or not at all: (the result, []) when every
    part conforms and its numbers agree (sizes and times positive, every link between nodes it
    lists), else (None, what is wrong). A node can print any line; a result that is not what
    orch's job writes fails the check instead of crashing its verdict or its table."""
    problems: list[str] = []
    got = conform(value, FABRIC_RESULT_SHAPE, "result", problems)
    if got is _BAD or problems:
        return None, problems or ["result: not an object"]
    problems += [f"result.{k}: missing" for k in FABRIC_REQUIRED if k not in got]
    if problems:
        return None, problems
    for key, needed in (
        ("nodes", ("node", "host")),
        ("sweep", ("size_bytes", "time_us", "busbw_gbps")),
        ("skipped", ("size_bytes", "reason")),
    ):
        for i, item in enumerate(got.get(key) or []):
            problems += [f"result.{key}[{i}].{k}: missing" for k in needed if k not in item]
    if problems:
        return None, problems
    ids = {n["node"] for n in got["nodes"]}
    if got["world_size"] < 1 or got["nnodes"] != len(ids) or not ids:
        problems.append(f"result: world_size {got['world_size']}, nnodes {got['nnodes']} for {len(ids)} node id(s)")
    for i, row in enumerate(got["sweep"]):
        if not (row["size_bytes"] > 0 and row["time_us"] > 0):
            problems.append(f"result.sweep[{i}]: size_bytes and time_us must be positive")
    for i, t in enumerate((got.get("links") or {}).get("transfers") or []):
        if (
            not {"src_node", "dst_node", "rail", "gbps"} <= t.keys()
            or t["src_node"] not in ids
            or t["dst_node"] not in ids
            or t["gbps"] < 0
        ):
            problems.append(f"result.links.transfers[{i}]: not a transfer between two of its nodes")
    return (None, problems) if problems else (got, [])
