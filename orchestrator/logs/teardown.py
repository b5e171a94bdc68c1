"""What the nodes print while a run is being stopped, kept out of `orch up`'s live log.

When orch stops a run (Ctrl-C, SIGTERM, the teardown after a first failure, a hang), every node's
torchrun answers its SIGTERM with warnings and a `SignalException` traceback, and its ranks with
theirs; ranks on nodes the stop has not reached yet lose their peers and print a traceback too:
tens of lines per node that say nothing but "stopped", and that bury the first failure. The node
agent writes one line (`agent.STOPPING`) just before it signals the job, so the first such line
in the merged log marks the start of the teardown: what any node prints after it is the stop's
doing. `QuietStop` holds those lines back from the live view (they stay in the node logs and
merged.log, which the follower writes) and turns each node's end into one event, `NodeStopped`,
when the agent's last line (`agent.EXITED`) says how torchrun ended. What a node printed before
the teardown began, the first failure included, is shown as it came. Pure: fed the merged lines
in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..node.agent import EXITED_LINE, STARTING_LINE, STOPPING_PREFIX
from .lines import LogLine


@dataclass(frozen=True)
class NodeStopped:
    """How one node ended while the run was being stopped, as its log tells it."""

    node: str
    received: str | None
    """What its agent was sent (`SIGTERM`), from its stop line; None: it ended before the stop reached it."""
    held: int
    """Lines the node printed during the teardown, kept out of the live view."""
    exit_code: int | None = None
    """torchrun's exit code (negative: the signal that ended it); None when its end was not seen."""
    exit_signal: str | None = None
    seconds: float | None = None
    """From its stop line to torchrun's end, on the node's clock."""


@dataclass
class _Node:
    stop: LogLine | None = None
    held: int = 0
    ended: bool = False


class QuietStop:
    """Feed it every merged line in order: a line to show, a node's end to announce, or None."""

    def __init__(self) -> None:
        self.began: LogLine | None = None
        """The first stop line: the teardown began there."""
        self.nodes: dict[str, _Node] = {}

    def feed(self, line: LogLine) -> LogLine | NodeStopped | None:
        if line.stream == "orch" and STARTING_LINE.match(line.text):
            # a launch (a retry's, after the last attempt's teardown): its lines are news again
            self.began = None
            self.nodes.clear()
            return line
        if line.stream == "orch" and line.text.startswith(STOPPING_PREFIX):
            self.began = self.began or line
            node = self.nodes.setdefault(line.node, _Node())
            node.stop = node.stop or line
            return None
        if self.began is None:
            return line
        node = self.nodes.setdefault(line.node, _Node())
        end = EXITED_LINE.match(line.text) if line.stream == "orch" and not node.ended else None
        if end is None:
            node.held += 1
            return None
        node.ended = True
        return NodeStopped(
            line.node,
            _received(node.stop),
            node.held,
            int(end.group(1)),
            end.group(2),
            None if node.stop is None else round(line.ts - node.stop.ts, 1),
        )

    def pending(self) -> Iterator[NodeStopped]:
        """The nodes the teardown reached whose end the log has not shown (yet)."""
        for name, node in self.nodes.items():
            if not node.ended:
                yield NodeStopped(name, _received(node.stop), node.held)
                node.ended = True


def _received(stop: LogLine | None) -> str | None:
    return None if stop is None else stop.text[len(STOPPING_PREFIX) :].split(":", 1)[0].strip()
