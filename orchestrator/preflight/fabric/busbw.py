"""The fabric check's arithmetic: nccl-tests' bandwidths and table, a parser of nccl-tests'
own output, and the per-node and per-link rates of the job's pairwise transfers. Pure.

Definitions (nccl-tests doc/PERFORMANCE.md): ``algbw = size / time`` and ``busbw = algbw * factor``
where the factor makes the number comparable to the hardware's link speed regardless of the
rank count; for all_reduce it is ``2 * (n - 1) / n``. GB/s means 1e9 bytes per second.

The job (`orchestrator/node/jobs/allreduce.py`) measures; the controller renders and judges what it
measured with these functions, using the thresholds of the inventory (`checks.fabric`).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...node.jobs import allreduce as job

# Bus bandwidth factors per collective, as nccl-tests applies them (n = number of ranks).
_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}


def bus_factor(n: int, op: str = "all_reduce") -> float:
    """The factor that turns algbw into busbw for `op` over `n` ranks."""
    if n < 1:
        raise ValueError(f"rank count must be >= 1, not {n}")
    try:
        return _FACTORS[op](n)
    except KeyError:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(sorted(_FACTORS))}") from None


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 B/s): bytes of the buffer over the time of one op."""
    if seconds <= 0:
        raise ValueError(f"time must be > 0, not {seconds}")
    return size_bytes / seconds / 1e9


def busbw_gbps(size_bytes: int, seconds: float, n: int, op: str = "all_reduce") -> float:
    """Bus bandwidth in GB/s: algbw times the collective's factor for `n` ranks."""
    return algbw_gbps(size_bytes, seconds) * bus_factor(n, op)


# ----------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Measure:
    """One of the two column groups (out-of-place, in-place) of an nccl-tests row."""

    time_us: float
    algbw: float  # GB/s
    busbw: float  # GB/s
    wrong: int | None  # None where nccl-tests printed N/A (validation off)


@dataclass(frozen=True)
class Row:
    """One size of an nccl-tests run (or of ours: then only `inplace` is set)."""

    size: int  # bytes
    count: int  # elements
    type: str  # "float"
    redop: str  # "sum"
    root: int  # -1 for rootless collectives
    out_of_place: Measure | None
    inplace: Measure | None


_HEAD_NAMES = ("size", "count", "type", "redop", "root")
_HEAD_UNITS = ("(B)", "(elements)", "", "", "")
_GROUP_NAMES = ("time", "algbw", "busbw", "#wrong")
_GROUP_UNITS = ("(us)", "(GB/s)", "(GB/s)", "")
# nccl-tests centres each group title over its 32 columns exactly like this (trailing blanks too).
_GROUP_TITLES = {"out-of-place": " " * 11 + "out-of-place" + " " * 9, "in-place": " " * 14 + "in-place" + " " * 10}


def _time_str(time_us: float) -> str:
    # nccl-tests: fewer decimals as the number grows, so the column stays 7 wide.
    if time_us >= 10000.0:
        return f"{time_us:7.0f}"
    if time_us >= 100.0:
        return f"{time_us:7.1f}"
    return f"{time_us:7.2f}"


def format_header(groups: Sequence[str] = ("in-place",)) -> list[str]:
    """nccl-tests' three header lines, for the given column groups (``out-of-place``, ``in-place``)."""
    head = "# {:>10s}  {:>12s}  {:>8s}  {:>6s}  {:>6s}"
    titles = head.format("", "", "", "", "") + "".join(_GROUP_TITLES[g] for g in groups)
    names = head.format(*_HEAD_NAMES) + "".join("  {:>7s}  {:>6s}  {:>6s} {:>6s}".format(*_GROUP_NAMES) for _ in groups)
    units = head.format(*_HEAD_UNITS) + "".join(
        "  {:>7s}  {:>6s}  {:>6s}  {:>5s}".format(*_GROUP_UNITS) for _ in groups
    )
    return [titles, names, units]


def _measure_str(m: Measure) -> str:
    wrong = "N/A" if m.wrong is None else str(m.wrong)
    return f"  {_time_str(m.time_us)}  {m.algbw:6.2f}  {m.busbw:6.2f}  {wrong:>5s}"


def format_row(row: Row) -> str:
    """One nccl-tests data line (the groups that are set, out-of-place first)."""
    text = f"{row.size:12d}  {row.count:12d}  {row.type:>8s}  {row.redop:>6s}  {row.root:6d}"
    for m in (row.out_of_place, row.inplace):
        if m is not None:
            text += _measure_str(m)
    return text


def format_table(rows: Sequence[Row], title: Sequence[str] = ()) -> str:
    """A table like all_reduce_perf's: optional ``# ...`` title lines, the header, the rows and
    ``# Avg bus bandwidth``."""
    groups = [
        g
        for g, present in (
            ("out-of-place", any(r.out_of_place for r in rows)),
            ("in-place", any(r.inplace for r in rows)),
        )
        if present
    ] or ["in-place"]
    lines = [f"# {t}" if not t.startswith("#") else t for t in title]
    lines += ["#", *format_header(groups)]
    lines += [format_row(r) for r in rows]
    lines.append(f"# Avg bus bandwidth    : {avg_busbw(rows):.3f} ")
    lines.append("#")
    return "\n".join(lines)


def avg_busbw(rows: Iterable[Row]) -> float:
    """nccl-tests' ``Avg bus bandwidth``: the mean busbw over every printed measurement."""
    values = [m.busbw for r in rows for m in (r.out_of_place, r.inplace) if m is not None]
    return sum(values) / len(values) if values else 0.0


def row_from_seconds(
    size: int,
    seconds: float,
    n: int,
    wrong: int | None = 0,
    op: str = "all_reduce",
    dtype: str = "float",
    itemsize: int = 4,
    redop: str = "sum",
    root: int = -1,
) -> Row:
    """The in-place row for one measured size (seconds per op, the max over ranks)."""
    alg = algbw_gbps(size, seconds)
    m = Measure(time_us=seconds * 1e6, algbw=alg, busbw=alg * bus_factor(n, op), wrong=wrong)
    return Row(size=size, count=size // itemsize, type=dtype, redop=redop, root=root, out_of_place=None, inplace=m)


def sweep_table(result: Mapping[str, Any]) -> str:
    """The job's result (the ORCH_FABRIC_RESULT JSON) as an all_reduce_perf-style table."""
    n = int(result["world_size"])
    rows = [
        row_from_seconds(int(s["size_bytes"]), float(s["time_us"]) / 1e6, n, s.get("wrong")) for s in result["sweep"]
    ]
    title = f"all_reduce in place, {result['backend']} on {result['device']}, {n} ranks on {result['nnodes']} node(s)"
    return format_table(rows, [title])


# ----------------------------------------------------------------------------- parsing nccl-tests output


@dataclass(frozen=True)
class NcclTestsRun:
    """What an nccl-tests binary printed: the ranks, the rows, and its own average."""

    nranks: int  # "#  Rank  N ..." lines under "# Using devices"
    hosts: tuple[str, ...]  # distinct hosts of those lines, in order
    rows: tuple[Row, ...]
    avg_busbw: float | None  # "# Avg bus bandwidth : X"


_RANK_LINE = re.compile(r"^#\s+Rank\s+\d+\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(?P<host>\S+)\s+device")
_AVG_LINE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(?P<v>[0-9.]+)")


def _measure(fields: Sequence[str]) -> Measure:
    time_us, alg, bus, wrong = fields
    return Measure(float(time_us), float(alg), float(bus), None if wrong == "N/A" else int(wrong))


def parse_nccl_tests(text: str) -> NcclTestsRun:
    """Parse the stdout of all_reduce_perf (or any nccl-tests *_perf binary).

    Raises ValueError naming the line for a data line that does not have 9 or 13 columns.
    """
    hosts: list[str] = []
    nranks = 0
    rows: list[Row] = []
    avg: float | None = None
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _RANK_LINE.match(line)
        if m:
            nranks += 1
            if m["host"] not in hosts:
                hosts.append(m["host"])
            continue
        m = _AVG_LINE.match(line)
        if m:
            avg = float(m["v"])
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        f = line.split()
        if not f[0].isdigit():
            continue  # an NCCL INFO line or other interleaved output
        if len(f) not in (9, 13):
            raise ValueError(f"line {lineno}: expected 9 or 13 columns, got {len(f)}: {line.strip()!r}")
        groups = [_measure(f[5:9])] + ([_measure(f[9:13])] if len(f) == 13 else [])
        rows.append(
            Row(
                size=int(f[0]),
                count=int(f[1]),
                type=f[2],
                redop=f[3],
                root=int(f[4]),
                out_of_place=groups[0] if len(groups) == 2 else None,
                inplace=groups[-1],
            )
        )
    return NcclTestsRun(nranks=nranks, hosts=tuple(hosts), rows=tuple(rows), avg_busbw=avg)


# ----------------------------------------------------------------------------- nodes and links


def best_passes(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per (src_node, dst_node, rail): the pass with the highest rate."""
    best: dict[tuple[int, int, int], dict[str, Any]] = {}
    for r in records:
        key = (int(r["src_node"]), int(r["dst_node"]), int(r["rail"]))
        if key not in best or float(r["gbps"]) > float(best[key]["gbps"]):
            best[key] = dict(r)
    return [best[k] for k in sorted(best)]


def link_summary(records: Sequence[dict[str, Any]], nodes: Sequence[int], share: float) -> dict[str, Any]:
    """Per-node send/recv rates and the slow nodes and links, from the receivers' records.

    `records` hold src_node, dst_node, rail and gbps (every transfer, or `best_passes` of them: a
    direction's rate is each rail's best, summed over rails). The verdict is the job's own
    `link_verdict` (node/jobs/allreduce.py), the rule it also picks what to measure again by: a
    node's capacity is its best pair, slow below share x the median node; a link is slow below
    share x what both its ends reach elsewhere.
    """
    pair = job.pair_rates(records)
    caps, slow_nodes, slow_links = job.link_verdict(pair, nodes, share)
    outgoing = {n: [v for (s, _), v in pair.items() if s == n] for n in nodes}
    incoming = {n: [v for (_, d), v in pair.items() if d == n] for n in nodes}
    per_node = [
        {
            "node": n,
            "send_gbps": caps["send"].get(n),
            "recv_gbps": caps["recv"].get(n),
            "send_median_gbps": statistics.median(outgoing[n]) if outgoing[n] else None,
            "recv_median_gbps": statistics.median(incoming[n]) if incoming[n] else None,
        }
        for n in nodes
    ]
    return {
        "pairs": [{"src_node": s, "dst_node": d, "gbps": v} for (s, d), v in sorted(pair.items())],
        "per_node": per_node,
        "slow_nodes": slow_nodes,
        "slow_links": slow_links,
        "share": share,
    }
