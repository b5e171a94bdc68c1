"""The run's stored copies of the node logs, read back and merged: what `orch logs` prints of
a run and what `<run dir>/merged.log` holds.

Plain text of everything (`orch logs RUN > file`, merged.log) goes through the C merge
(`_fastmerge.c`, built by setup.py where a compiler is) or, without it, the Python block merge
(`merge.merge_plain`): the same bytes. Filters, `--json` and colours take the general path:
a LogLine per line and the k-way merge.

The copies (`nodes/<node>.log`) keep every byte as the node wrote it. The controller's own lines
(a straggler named by an attached `orch up`) are in `controller.log`, node.log's format stamped on
the reference clock, merged after the nodes as a node called `orch` (`merge_sources`). merged.log holds what
`orch logs RUN` prints: each line's text `printable` (control characters escaped), so that
`cat merged.log` on a terminal is as safe as `orch logs`; `orch logs --raw` prints the texts as
written instead (and leaves merged.log as it is).

Reading needs no disk: a copy the controller's disk refused is read to where it ends and the rest
from the node (`Rest`), and a merged.log the disk refuses is said once and left as it was
(`MergedCopy`) while the lines go on.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..config.inventory import Inventory
from ..config.plan import world_size as planned_world_size
from ..node.agent import OWN
from ..node.telemetry import PREFIX
from ..run.straggler import Window
from ..store import RunDir, recorded_world_size
from ..store import warn as store_warn
from .fetch import NodeSource
from .lines import LogLine, format_ts, parse_node_line, read_node_lines
from .merge import PlainNode, merge, merge_plain
from .telemetry import Ignored, Sample, read_record
from .trainer import TIMING_MARK, Timing


@dataclass(frozen=True)
class Rest:
    """What a node's copy lacks where the controller's disk refused it (`fetch.CopyNotWritten`):
    the copy is read to byte `held`, then `more()`, the node's log from there."""

    held: int
    more: Callable[[], Iterable[bytes]]


def copy_lines(src: NodeSource, rest: Rest | None = None) -> Iterator[LogLine]:
    """Parse a node's local copy (and its `rest`, from the node), streaming."""
    if rest is not None:
        return read_node_lines(_text_lines(copy_bytes(src, 1 << 16, rest)), src.node, src.node_rank, src.base_rank)
    if not src.copy.exists():
        return iter(())
    return _copy_lines(src)


def _copy_lines(src: NodeSource) -> Iterator[LogLine]:
    with open(src.copy, encoding="utf-8", errors="replace", newline="\n") as fh:
        yield from read_node_lines(fh, src.node, src.node_rank, src.base_rank)


def _text_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Bytes in pieces as the lines a file opened with `newline="\n"` yields (decoded as `copy_lines` decodes)."""
    part = b""
    for chunk in chunks:
        *whole, part = (part + chunk).split(b"\n")
        for line in whole:
            yield (line + b"\n").decode("utf-8", "replace")
    if part:
        yield part.decode("utf-8", "replace")


def copy_bytes(src: NodeSource, size: int, rest: Rest | None = None) -> Iterator[bytes]:
    """A node's copy in pieces of `size` bytes (none where it is missing); with `rest`, the copy's
    first `rest.held` bytes, then the node's log from there."""
    left = None if rest is None else rest.held
    if left != 0:
        try:
            fh = open(src.copy, "rb")  # noqa: SIM115 - closed below, also when abandoned early
        except FileNotFoundError:
            fh = None
        if fh is not None:
            with fh:
                while left is None or left > 0:
                    chunk = fh.read(size if left is None else min(size, left))
                    if not chunk:
                        break
                    if left is not None:
                        left -= len(chunk)
                    yield chunk
    if rest is not None:
        yield from rest.more()


class CopyScan:
    """One node's copy read on from a byte offset to its last whole line, as a stream (a line at a
    time, whatever the copy's size): `records` yields the lines that may be telemetry or timing
    records (`telemetry.read_record` reads them), parsed, in file order; on the way it keeps the
    time of the copy's last stamped line, the offset to read on from, and the lines that match
    `keep` (the report's epoch, validation and throughput lines), as text."""

    RECORD = re.compile(re.escape(TIMING_MARK.encode()) + b"|" + re.escape(f" {OWN} {PREFIX}".encode()))
    """What a line that may be a record holds: a timing line's mark, or a telemetry line's stream and mark."""

    def __init__(self, src: NodeSource, offset: int = 0, keep: re.Pattern[bytes] | None = None) -> None:
        self.src, self.offset, self.keep = src, offset, keep
        self.last_ts: float | None = None
        self.kept: list[str] = []

    def records(self) -> Iterator[LogLine]:
        try:
            fh = open(self.src.copy, "rb")  # noqa: SIM115 - closed below, also when abandoned early
        except FileNotFoundError:
            return
        src, record, keep = self.src, self.RECORD.search, self.keep
        with fh:
            fh.seek(self.offset)
            stamped = b""
            for raw in fh:
                if raw[-1:] != b"\n":
                    break  # a torn last line: read again once it is whole
                self.offset += len(raw)
                if raw[26:27] == b"Z":
                    stamped = raw
                if keep is not None and keep.search(raw):
                    self.kept.append(raw.decode("utf-8", "replace"))
                if record(raw) is None:
                    continue
                try:  # a line without its stamp is a torn write: no rank, no stream, never a record
                    line = parse_node_line(raw.decode("utf-8", "replace"), src.node, src.node_rank, src.base_rank)
                except ValueError:
                    continue
                yield line
            if stamped:
                with contextlib.suppress(ValueError):
                    ts = parse_node_line(stamped.decode("utf-8", "replace"), src.node, src.node_rank, None).ts
                    self.last_ts = ts if self.last_ts is None else max(self.last_ts, ts)


def scan_records(
    scans: Sequence[CopyScan], offsets_ms: Mapping[str, float]
) -> Iterator[tuple[LogLine, Sample | tuple[Window, Timing] | Ignored]]:
    """Every telemetry and timing record of the copies (`Ignored` for a line that starts as one and
    is not a finite one), in the order they were written (the k-way merge on node time less each
    node's clock offset), a line at a time per copy: what `orch top` and the report feed the
    straggler detector, in memory independent of the copies' size."""
    for line in merge([scan.records() for scan in scans], offsets_ms):
        record = read_record(line, offsets_ms.get(line.node, 0.0) / 1000.0)
        if record is not None:
            yield line, record


CONTROLLER = "orch"
"""The node column of the controller's own lines in the merged log (controller.log)."""


def controller_name(nodes: Iterable[str]) -> str:
    """`orch`, or `[orch]` where a node of the inventory is called orch (a node name cannot start with `[`)."""
    return CONTROLLER if CONTROLLER not in set(nodes) else f"[{CONTROLLER}]"


def controller_source(run: RunDir, nodes: Sequence[NodeSource]) -> NodeSource:
    """The controller's lines (`<run dir>/controller.log`) as a source the merges take after the nodes."""
    return NodeSource(controller_name(s.node for s in nodes), -1, None, "", "", run.controller_log)


def merge_sources(run: RunDir, nodes: Sequence[NodeSource]) -> list[NodeSource]:
    """What the merged log merges: the nodes' copies, and controller.log when the controller wrote one."""
    out = list(nodes)
    if run.controller_log.exists():
        out.append(controller_source(run, nodes))
    return out


def controller_line(ts: float, text: str) -> str:
    """A line of controller.log: node.log's format, stream `orch`, stamped `ts` (the reference clock)."""
    return f"{format_ts(ts)} orch {text}\n"


def append_controller_line(run: RunDir, ts: float, text: str) -> None:
    """Add a line to controller.log (private, created on first use)."""
    fd = os.open(run.controller_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(controller_line(ts, text))


class ControllerTail:
    """controller.log read on from where it was last read, complete lines only: how a follower
    merges the lines an attached `orch up` in another shell adds while it follows. Lines this
    process wrote itself (`own`) are skipped: its follower merged them as it said them."""

    def __init__(self, run: RunDir, node: str) -> None:
        self.path, self.node = run.controller_log, node
        self.pos = 0
        self.own: dict[str, int] = {}

    def wrote(self, raw: str) -> None:
        """`raw` (a controller_line) was appended by this process: not to be read back."""
        self.own[raw] = self.own.get(raw, 0) + 1

    def read(self) -> list[LogLine]:
        """The complete lines added since the last read (none while the file does not exist)."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.pos)
                data = fh.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.pos += end
        raws = []
        for raw in data[:end].decode("utf-8", errors="replace").split("\n")[:-1]:
            raw += "\n"
            if self.own.get(raw):
                self.own[raw] -= 1
                continue
            raws.append(raw)
        return list(read_node_lines(raws, self.node, -1, None))


def world_size(run: RunDir, inv: Inventory) -> int:
    """The run's number of ranks (run.json, else the inventory): the width of the rank column."""
    return recorded_world_size(run.read()) or planned_world_size(inv.nodes)


def lock_merged(run: RunDir) -> IO[str] | None:
    """merged.log opened for appending and locked, or None while another orch process (an
    attached `orch up`, another `orch logs -f`) is writing it: that one keeps it whole."""
    fd = os.open(run.merged_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return os.fdopen(fd, "a", encoding="utf-8")


class MergedCopy:
    """`<run dir>/merged.log` being rewritten: what is written goes to a private temp file that
    replaces merged.log once complete (`commit`). Writing never raises: the first write the
    controller's disk refuses is said (`warn`), the temp file goes, merged.log is left as it was,
    and the rest is not written: the lines shown go on without it."""

    def __init__(self, run: RunDir, warn: Callable[[str], None], lock: IO[str], tmp: Path, fh: IO[bytes]) -> None:
        self.run, self.warn, self.lock, self.tmp = run, warn, lock, tmp
        self.fh: IO[bytes] | None = fh

    @classmethod
    def open(cls, run: RunDir, warn: Callable[[str], None]) -> MergedCopy | None:
        """merged.log to rewrite, or None: another process writes it, or it cannot be (said)."""
        try:
            lock = lock_merged(run)
        except OSError as exc:
            warn(refused_merged(run, exc))
            return None
        if lock is None:
            return None
        tmp = run.merged_log.with_name(f".merged.log.{os.getpid()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
            os.fchmod(fd, 0o600)
        except OSError as exc:
            lock.close()
            warn(refused_merged(run, exc))
            return None
        return cls(run, warn, lock, tmp, os.fdopen(fd, "wb"))

    def write(self, data: str | bytes) -> None:
        if self.fh is None:
            return
        try:
            self.fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        except OSError as exc:
            self._refused(exc)

    def commit(self) -> None:
        """merged.log replaced by what was written (unless a write was refused)."""
        if self.fh is None:
            return
        try:
            self.fh.close()
            os.replace(self.tmp, self.run.merged_log)
        except OSError as exc:
            self._refused(exc)
        self.fh = None

    def close(self) -> None:
        """The temp file gone (unless committed) and merged.log's lock released."""
        if self.fh is not None:
            with contextlib.suppress(OSError):
                self.fh.close()
            self.fh = None
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)
        self.lock.close()

    def _refused(self, exc: OSError) -> None:
        self.warn(refused_merged(self.run, exc))
        fh, self.fh = self.fh, None
        with contextlib.suppress(OSError):
            if fh is not None:
                fh.close()  # what is buffered is lost with the file: the file goes anyway
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)


def refused_merged(run: RunDir, exc: OSError) -> str:
    """What is said when the controller's disk refuses merged.log."""
    return (
        f"cannot write {run.merged_log}: {exc.strerror or exc}; the log goes on without it "
        "(merged.log is left as it was; `orch logs` writes it again once it can)"
    )


@contextlib.contextmanager
def merged_log_writer(run: RunDir, warn: Callable[[str], None] = store_warn) -> Iterator[MergedCopy | None]:
    """`<run dir>/merged.log`, rewritten atomically (private) once the writing completes
    (`MergedCopy`); None (left alone) while a follower in another process is appending to it,
    or where the controller's disk refuses it (said through `warn`)."""
    copy = MergedCopy.open(run, warn)
    try:
        yield copy
        if copy is not None:
            copy.commit()
    finally:
        if copy is not None:
            copy.close()


def write_merged_log(
    run: RunDir,
    sources: list[NodeSource],
    offsets_ms: Mapping[str, float],
    widths: tuple[int, int],
    warn: Callable[[str], None] = store_warn,
    rests: Mapping[str, Rest] | None = None,
) -> None:
    """`<run dir>/merged.log`: every node's copy (with its `rests`), merged, as plain text."""
    with merged_log_writer(run, warn) as merged:
        if merged is None:
            return
        for chunk in plain_merged_bytes(sources, offsets_ms, widths, rests=rests):
            merged.write(chunk)
            if merged.fh is None:
                return


BLOCK_BYTES = 4 << 20
"""Bytes of node logs the plain merge reads at once, split between the nodes (at least 32 KiB
each). Rendered lines, keys and the batch take a few times that in memory."""


def block_size(nodes: int) -> int:
    """Bytes each node's copy is read in by the plain merges (Python and C): BLOCK_BYTES split."""
    return max(32 << 10, BLOCK_BYTES // max(1, nodes))


def copy_blocks(src: NodeSource, size: int, rest: Rest | None = None) -> Iterator[str]:
    """A node's local copy (and its `rest`, from the node) in blocks of whole lines (about `size`
    bytes each), decoded as `copy_lines` decodes it; a torn last line gets its newline."""
    tail = b""
    for chunk in copy_bytes(src, size, rest):
        buf = tail + chunk if tail else chunk
        cut = buf.rfind(b"\n") + 1
        tail = buf[cut:]
        if cut:
            yield buf[:cut].decode("utf-8", "replace")
    if tail:
        yield (tail + b"\n").decode("utf-8", "replace")


def plain_merged(
    sources: list[NodeSource],
    offsets_ms: Mapping[str, float],
    widths: tuple[int, int],
    raw: bool = False,
    rests: Mapping[str, Rest] | None = None,
) -> Iterator[str]:
    """Every node's copy (with its `rests`), merged, as chunks of plain `TIME NODE RANK TEXT` lines
    (the fast path for what `format_line(merge(...))` prints when nothing is filtered); `raw`:
    texts as written."""
    size = block_size(len(sources))
    rests = rests or {}
    return merge_plain(
        [copy_blocks(s, size, rests.get(s.node)) for s in sources],
        [PlainNode(s.node, s.base_rank, offsets_ms.get(s.node, 0.0)) for s in sources],
        widths,
        raw,
    )


try:  # the C merge, when the install could build it (setup.py); else the Python one, same bytes
    from . import _fastmerge
except ImportError:  # pragma: no cover - a machine without a C compiler
    _fastmerge = None  # type: ignore[assignment, unused-ignore]


def fast_merge_available() -> bool:
    """Whether `plain_merged_bytes` runs the C merge (ORCH_PURE_PYTHON=1 turns it off)."""
    return _fastmerge is not None and not os.environ.get("ORCH_PURE_PYTHON")


def plain_merged_bytes(
    sources: list[NodeSource],
    offsets_ms: Mapping[str, float],
    widths: tuple[int, int],
    raw: bool = False,
    rests: Mapping[str, Rest] | None = None,
) -> Iterator[bytes]:
    """`plain_merged` as UTF-8 chunks of whole lines: the same bytes, by the C merge when it is
    built (several times faster; the same block of memory per node), else (or where a copy has a
    rest to read from its node: the C merge reads files) the Python one."""
    if not fast_merge_available() or rests:
        for text in plain_merged(sources, offsets_ms, widths, raw, rests):
            yield text.encode("utf-8")
        return
    with contextlib.ExitStack() as stack:
        present, handles = [], []
        for s in sources:
            try:
                handles.append(stack.enter_context(open(s.copy, "rb")))
            except FileNotFoundError:  # never fetched: no lines, as copy_blocks
                continue
            present.append(s)
        yield from _fastmerge.PlainMerge(
            handles,
            [f" {s.node.ljust(widths[0])} ".encode() for s in present],
            [s.base_rank for s in present],
            [offsets_ms.get(s.node, 0.0) for s in present],
            widths[1],
            float_keys=any(offsets_ms.get(s.node, 0.0) for s in sources),
            block=block_size(len(sources)),
            raw=raw,
        )


def binary(out: IO[str]) -> IO[bytes] | None:
    """The byte stream under a UTF-8 text stream (flushed), to write merged bytes to as they
    are; None when there is none (a test's StringIO) or it encodes otherwise."""
    raw = getattr(out, "buffer", None)
    if raw is None or (getattr(out, "encoding", None) or "").lower().replace("-", "") != "utf8":
        return None
    out.flush()
    return raw


def write_chunk(chunk: bytes, out: IO[str], raw: IO[bytes] | None) -> None:
    if raw is not None:
        raw.write(chunk)
    else:
        out.write(chunk.decode("utf-8"))
