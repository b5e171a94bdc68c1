"""Test helpers for `orch logs`: runs with node directories in layout B, written live by writer
processes that stamp lines like the node agent does (UTC µs), at a rate of our choosing."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config.inventory import Inventory, load
from orchestrator.logs.lines import format_line, read_node_lines
from orchestrator.logs.merge import PlainNode, merge
from orchestrator.node import FROM_STDIN, FROM_STDIN_OPEN
from orchestrator.store import RunDir, RunStore, remote_dir

# Writes COUNT worker lines `[default<lr>]:[rank <r>] <node> seq=<i>` (every 7th without the
# trainer prefix, every 5th torn in two writes, like a pipe delivering half a line), then an
# agent line and a final state.json, atomically, after the log: the order the agent keeps.
WRITER = r"""
import datetime, json, os, sys, time
d, node = sys.argv[1], sys.argv[2]
count, interval, base, nproc = int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
state = sys.argv[7] if len(sys.argv) > 7 else "succeeded"
os.makedirs(d, exist_ok=True)
def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
def save(s):
    with open(os.path.join(d, "state.json.tmp"), "w") as f:
        json.dump({"node": node, "state": s}, f)
    os.replace(os.path.join(d, "state.json.tmp"), os.path.join(d, "state.json"))
save("running")
fd = os.open(os.path.join(d, "node.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
os.write(fd, ("%s orch started %s\n" % (now(), node)).encode())
for i in range(count):
    lr = i % nproc
    prefix = "" if i % 7 == 3 else "[rank %d] " % (base + lr)
    line = ("%s out [default%d]:%s%s seq=%d\n" % (now(), lr, prefix, node, i)).encode()
    if i % 5 == 2:
        os.write(fd, line[:20]); time.sleep(min(interval, 0.05)); os.write(fd, line[20:])
    else:
        os.write(fd, line)
    time.sleep(interval)
os.write(fd, ("%s orch torchrun exited with code 0: %s\n" % (now(), state)).encode())
os.close(fd)
save(state)
"""


def make_run(
    tmp: Path,
    names: Sequence[str],
    *,
    transport: str = "local",
    nproc: int = 2,
    inventory_text: str | None = None,
    run_id: str = "r1",
) -> tuple[Inventory, RunDir]:
    """An inventory (local transport by default) and a run created in $ORCH_HOME."""
    if inventory_text is None:
        doc = {
            "name": "logs",
            "transport": transport,
            "nodes": [{"host": n, "gpus": nproc} for n in names],
            "job": {"python": sys.executable, "run_root": str(tmp / "noderuns")},
        }
        inventory_text = yaml.safe_dump(doc, sort_keys=False)
    path = tmp / "inventory.yaml"
    path.write_text(inventory_text)
    inv = load(path)
    run = RunStore().create(inv, run_id)
    return inv, run


def start_writer(
    inv: Inventory, run: RunDir, node: str, count: int, interval: float, state: str = "succeeded"
) -> subprocess.Popen[bytes]:
    """A process appending `count` lines to that node's node.log, one every `interval` s."""
    n = inv.node(node)
    base = sum(m.nproc_per_node for m in inv.nodes if m.index < n.index)
    d = os.path.expanduser(remote_dir(inv, n, run.run_id))
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, d, node, str(count), str(interval), str(base), str(n.nproc_per_node), state]
    )


def seqs_by_node(texts: Sequence[tuple[str, str]]) -> dict[str, list[int]]:
    """{node: [seq, ...]} from (node, text) pairs of worker lines, in output order."""
    out: dict[str, list[int]] = {}
    for node, text in texts:
        if " seq=" in text:
            out.setdefault(node, []).append(int(text.rsplit("seq=", 1)[1]))
    return out


def write_state(inv: Inventory, run: RunDir, node: str, state: str) -> None:
    d = Path(os.path.expanduser(remote_dir(inv, inv.node(node), run.run_id)))
    d.mkdir(parents=True, exist_ok=True)
    (d / "state.json").write_text(json.dumps({"state": state}))


def late_inversions(out: Sequence[tuple[float, Any]], hold_s: float) -> tuple[list[str], int]:
    """Check the live-merge promise on (emitted wall time, LogLine) pairs.

    A line may come out after a later-stamped line of another node only if it reached the
    controller too late to be ordered: more than `hold_s` (the heartbeat margin, itself below
    the watermark) after it was stamped — a starved node or a slow link. Within one node the
    file order is kept by design. Returns the inversions that break the promise (described)
    and the number of cross-node inversions in all."""
    bad, inversions = [], 0
    best: dict[str, tuple[tuple[float, int], Any]] = {}  # per node: highest key emitted so far
    for emitted, line in out:
        key = (line.ts, line.node_rank)
        later = [(k, ln) for node, (k, ln) in best.items() if node != line.node and k > key]
        if later:
            inversions += 1
            if emitted - line.ts < hold_s:
                k, other = max(later, key=lambda e: e[0])
                bad.append(
                    f"{line.node} {line.text!r} stamped {line.ts:.6f} came out {emitted - line.ts:.3f} s "
                    f"later, after {other.node} {other.text!r} stamped {other.ts:.6f}"
                )
        if line.node not in best or key > best[line.node][0]:
            best[line.node] = (key, line)
    return bad, inversions


def reader_pids(node_dir: str) -> list[int]:
    """Pids of the log readers streaming that node directory (matched on their argv)."""
    out = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (FROM_STDIN.encode() in argv or FROM_STDIN_OPEN.encode() in argv) and node_dir.encode() in argv:
            out.append(int(entry))
    return out


def general_merge(texts: list[str], nodes: list[PlainNode], widths: tuple[int, int], raw: bool = False) -> str:
    """The reference for the fast plain merges: what `orch logs` printed before any of them
    existed (parse every line into a LogLine, k-way merge, `format_line`)."""
    streams = [
        read_node_lines(io.StringIO(t, newline="\n"), n.node, i, n.base_rank)
        for i, (t, n) in enumerate(zip(texts, nodes))
    ]
    offsets = {n.node: n.offset_ms for n in nodes}
    return "".join(
        format_line(ln, False, node_width=widths[0], rank_width=widths[1], raw=raw) + "\n"
        for ln in merge(streams, offsets)
    )
