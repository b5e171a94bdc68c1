"""What `orch logs` shows of a run: its stored copies merged (filtered, or as plain text exactly
as merged.log holds them), or the run followed live. The CLI prints what this yields; the copies
and merged.log in the run directory are brought up to date on the way, where the controller's
disk lets them: what it refuses is said (`RunLogs.warn`), and the lines go on (a copy's missing
part read from its node).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field

from ..config.inventory import Inventory
from ..errors import OrchError
from ..run.supervise import run_state
from ..store import RunDir, RunStore, clock_offsets, clock_reference
from ..store import warn as store_warn
from ..transport import Cluster, GroupResult
from .fetch import CopyNotWritten, NodeSource, fetch_all, node_log_from, node_sources
from .filters import LineFilter, apply, compile_grep, last_n, parse_nodes, parse_ranks, parse_since
from .follow import Follower
from .lines import LogLine, column_widths, format_line
from .merge import merge
from .stored import (
    Rest,
    copy_lines,
    merge_sources,
    merged_log_writer,
    plain_merged_bytes,
    world_size,
    write_merged_log,
)

REORDER_MS = 1.0
"""Clock offsets that differ by less than this between a run's nodes reorder no lines in a way that
means anything: the difference is within what one offset measurement can tell (half an SSH round
trip, an NTP exchange). `orch logs` still orders by them, but says so only from this spread on
(or with -v)."""


@dataclass
class RunLogs:
    """One run's logs on the controller: its nodes in node-rank order, the clock offsets lines are
    ordered by (empty: none known, or --no-skew-correct), the columns' widths."""

    run: RunDir
    inv: Inventory
    sources: list[NodeSource]
    offsets_ms: dict[str, float]
    offsets_origin: str | None
    """The saved check report the offsets come from."""
    widths: tuple[int, int]
    offset_reference: str | None = None
    """What the offsets are against: an NTP server, or the controller (its own clock unmeasured)."""
    controller_offset_ms: float | None = None
    """How far the controller's clock was off the NTP server when the offsets were measured."""
    warn: Callable[[str], None] = store_warn
    """Says what the controller's disk refused (a copy, merged.log) while the lines go on."""
    rests: dict[str, Rest] = field(default_factory=dict)
    """After `fetch`: the nodes whose copy the controller's disk refused, and where their rest is read from."""

    @classmethod
    def open(
        cls, run_id: str | None, skew_correct: bool | None = None, warn: Callable[[str], None] = store_warn
    ) -> RunLogs:
        """The named run, else the latest; UsageError (exit 2) when there is none. `warn`: how
        what the controller's disk refuses is said."""
        run = RunStore().get(run_id)
        inv = run.inventory()
        sources = node_sources(run, inv)
        offsets, origin = clock_offsets(run, inv.name)
        if skew_correct is False or not any(offsets.values()):
            offsets, origin = {}, None
        reference, controller = clock_reference(run, inv.name) if offsets else (None, None)
        return cls(
            run,
            inv,
            sources,
            offsets,
            origin,
            column_widths([s.node for s in merge_sources(run, sources)], world_size(run, inv)),
            reference,
            controller,
            warn,
        )

    @property
    def merged(self) -> list[NodeSource]:
        """What the merged log merges: the nodes' copies, then the controller's own lines (controller.log)."""
        return merge_sources(self.run, self.sources)

    @property
    def offsets_spread_ms(self) -> float:
        """How far apart the nodes' clock offsets are (ms; a node without one counts 0): what can
        reorder lines between nodes. 0.0 without offsets."""
        if not self.offsets_ms:
            return 0.0
        values = [self.offsets_ms.get(s.node, 0.0) for s in self.sources] or [0.0]
        return max(values) - min(values)

    @property
    def reorders(self) -> bool:
        """Do the offsets change the order of lines enough to say so (`REORDER_MS`)?"""
        return self.offsets_spread_ms >= REORDER_MS

    def line_filter(
        self,
        node: str | None = None,
        rank: str | None = None,
        grep: str | None = None,
        since: str | None = None,
        metrics: bool = True,
    ) -> LineFilter:
        """`--node/--rank/--grep/--since/--no-telemetry` parsed; UsageError naming what is wrong with one."""
        return LineFilter(
            nodes=parse_nodes(node, [s.node for s in self.sources]) if node else None,
            ranks=parse_ranks(rank) if rank else None,
            pattern=compile_grep(grep) if grep else None,
            since=parse_since(since) if since else None,
            offsets_ms=self.offsets_ms,
            metrics=metrics,
        )

    def cluster(self) -> Cluster:
        return Cluster(self.inv)

    def fetch(self, cluster: Cluster) -> GroupResult[str]:
        """Bring every node's copy up to date: each node's state, or why it could not be read
        (the copy fetched earlier is then what is shown). A copy the controller's disk refuses is
        said (`warn`) and left out of the answer: what it lacks is read from its node as the log
        is shown (`rests`)."""
        result = fetch_all(self.run, self.inv, cluster, self.sources)
        by_name = {s.node: s for s in self.sources}
        for node, exc in result.failed.items():
            if isinstance(exc, CopyNotWritten):
                self.warn(f"{node}: {exc}; the rest is read from the node as it is shown")
                self.rests[node] = Rest(exc.held, self._more(cluster, by_name[node], exc.held))
        return GroupResult({n: v for n, v in result.items() if not isinstance(v, CopyNotWritten)})

    def _more(self, cluster: Cluster, src: NodeSource, held: int) -> Callable[[], Iterable[bytes]]:
        """The node's log from `held` on, as it is shown; a stream that breaks is said, and ends that node's lines."""

        def more() -> Iterator[bytes]:
            try:
                yield from node_log_from(cluster[src.node], src, held)
            except (OrchError, OSError) as exc:
                self.warn(f"{src.node}: its log past byte {held} could not be read from the node: {exc}")

        return more

    def plain(self, raw: bool = False) -> Iterator[bytes]:
        """Every line of every copy, merged, as plain text in chunks of UTF-8 bytes: what
        merged.log holds, and it is rewritten in the same pass. `raw`: each line's text as the
        node wrote it, control characters and all (merged.log is left as it is)."""
        if raw:
            yield from plain_merged_bytes(self.merged, self.offsets_ms, self.widths, raw=True, rests=self.rests)
            return
        with merged_log_writer(self.run, self.warn) as merged:
            for chunk in plain_merged_bytes(self.merged, self.offsets_ms, self.widths, rests=self.rests):
                yield chunk
                if merged is not None:
                    merged.write(chunk)

    def lines(self, keep: LineFilter, tail: int | None = None) -> Iterator[LogLine]:
        """The copies' lines that `keep` keeps (the last `tail` of each node), merged. merged.log
        is rewritten too: in the same pass when nothing is left out, else once they are out."""
        streams: list[Iterator[LogLine]] = [
            copy_lines(s, self.rests.get(s.node)) for s in self.merged if keep.wants_node(s.node)
        ]
        if not keep.empty:
            streams = apply(streams, keep)
        if tail is not None:
            streams = [last_n(s, tail) for s in streams]
        if keep.empty and tail is None:
            with merged_log_writer(self.run, self.warn) as merged:
                for line in merge(streams, self.offsets_ms):
                    if merged is not None:
                        merged.write(
                            format_line(line, False, node_width=self.widths[0], rank_width=self.widths[1]) + "\n"
                        )
                    yield line
            return
        yield from merge(streams, self.offsets_ms)
        write_merged_log(self.run, self.merged, self.offsets_ms, self.widths, self.warn, self.rests)

    def follow(
        self, cluster: Cluster, *, watermark: float, from_start: bool, on_event: Callable[[str, str], None]
    ) -> Generator[LogLine, None, None]:
        """Every node live, in order, until the run ends and every log is drained. Close the
        generator to stop (it stops the readers on every node at once)."""
        follower = Follower(
            self.run,
            self.inv,
            cluster,
            watermark=watermark,
            offsets_ms=self.offsets_ms,
            from_start=from_start,
            on_event=on_event,
        )
        self.node_states = lambda: [st.remote_state for st in follower.nodes]
        return follower.lines()

    node_states: Callable[[], list[str]] | None = None
    """After `follow`: each node's state as its reader last said it ("-": no state.json)."""

    def state(self) -> str:
        """The run's state: run.json's once final, else what the followed nodes' final states make
        it (a detached run's run.json says `running` until someone asks its nodes)."""
        recorded = self.run.read().get("state")
        if self.node_states is None:
            return str(recorded or "unknown")
        return str(run_state(self.node_states(), recorded))
