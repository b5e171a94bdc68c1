"""The walk of an inventory through `orch up` (`up:inv`): which functions of orch read the
`Inventory`, and in which order, during one whole `orch up`.

Every read of an attribute of the Inventory or of any of its parts (`PARTS`: the job, its
container and mounts, the checks, the straggler settings, every node and its SSH options; the
master is a node) is recorded by patching those classes' `__getattribute__` for the duration,
and attributed to the reading function: `module:qualname` of the calling frame, orchestrator/'s
own code only (a dataclass's generated `__init__`/`__eq__`, the standard library, the tests are
not stops).

- a **stop** is a distinct reading function (a comprehension or a lambda is part of the function
  it is written in);
- a **room** is a stop's module;
- walking the stops in the order of their first read, a **climb** is a step into a room that was
  visited already and left before (plan → container → plan: one climb, back into plan).

Few stops in few rooms, few climbs: the inventory is read where it is turned into what the rest
uses (the plan, the job's environment, the checks), not asked again everywhere.

`python -m tests.walk OUT.json INVENTORY` runs `orch up` of INVENTORY in this process (the library's
`up`, from the inventory as loaded) and writes the walk to OUT.json; `tests/integration/test_walk.py`
holds orch to its budget.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE = str(Path(__file__).resolve().parents[1] / "orchestrator") + os.sep


def parts() -> tuple[type, ...]:
    """The classes an Inventory is made of (read at call time: orch is imported by then)."""
    from orchestrator.config import container, inventory, nodes

    return (
        inventory.Inventory,
        inventory.Job,
        inventory.Checks,
        inventory.ClockCheck,
        inventory.FabricCheck,
        inventory.Straggler,
        container.Container,
        container.Mount,
        nodes.Node,
        nodes.SSHOptions,
    )


@dataclass(frozen=True)
class Walk:
    """The stops of one walk, in the order of their first read."""

    stops: tuple[str, ...]

    @property
    def rooms(self) -> tuple[str, ...]:
        """The modules visited, in order of the first visit."""
        return tuple(dict.fromkeys(room(s) for s in self.stops))

    @property
    def path(self) -> list[str]:
        """The rooms in walking order, one entry per stay (consecutive stops in one room are one)."""
        out: list[str] = []
        for s in self.stops:
            if not out or out[-1] != room(s):
                out.append(room(s))
        return out

    @property
    def climbs(self) -> list[tuple[str, str]]:
        """(from, to) for every step into a room that was visited and left before."""
        path, out = self.path, []
        for i in range(1, len(path)):
            if path[i] in path[:i]:
                out.append((path[i - 1], path[i]))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "stops": len(self.stops),
            "rooms": len(self.rooms),
            "climbs": len(self.climbs),
            "walk": list(self.stops),
            "climbed": [f"{a} -> {b}" for a, b in self.climbs],
        }


def room(stop: str) -> str:
    return stop.split(":", 1)[0]


def function(qualname: str) -> str:
    """The function a code object is part of: a comprehension's or a lambda's is the function it
    is written in (`plan.make_plan.<locals>.<listcomp>` is `plan.make_plan`)."""
    while ".<locals>.<" in qualname:
        qualname = qualname.rsplit(".<locals>.<", 1)[0]
    return qualname


@contextmanager
def recording(classes: Sequence[type] | None = None) -> Iterator[list[str]]:
    """Record, while inside, every function of orchestrator/ that reads an attribute of an
    instance of `classes` (default: `parts()`), once, in order of its first read."""
    classes = tuple(classes) if classes is not None else parts()
    seen: dict[str, None] = {}
    lock = threading.Lock()
    saved = {cls: cls.__dict__.get("__getattribute__") for cls in classes}

    def reading(self: Any, name: str) -> Any:
        frame = sys._getframe(1)
        code = frame.f_code
        if code.co_filename.startswith(PACKAGE):
            module = code.co_filename[len(PACKAGE) : -3].replace(os.sep, ".")
            stop = f"{module}:{function(code.co_qualname)}"
            if stop not in seen:
                with lock:
                    seen.setdefault(stop, None)
        return object.__getattribute__(self, name)

    for cls in classes:
        cls.__getattribute__ = reading  # type: ignore[method-assign]
    stops: list[str] = []
    try:
        yield stops
    finally:
        for cls, before in saved.items():
            if before is None:
                del cls.__getattribute__
            else:
                cls.__getattribute__ = before  # type: ignore[method-assign]
        stops.extend(seen)


def walk_of_up(path: str, **options: Any) -> tuple[Walk, str]:
    """`orch up` of the inventory file `path` through the library (`up.up`, with `options`), the
    inventory loaded first and the walk recorded from then on: (the walk, how the up ended)."""
    from orchestrator.config.inventory import load
    from orchestrator.up import up

    inv = load(path)
    with recording() as stops:
        outcome = up(inv, **options)
    failed = [f"{r.check} {r.node}: {r.detail}" for r in outcome.preflight.failed()] if outcome.preflight else []
    return Walk(tuple(stops)), "; ".join([str(outcome.result), *failed])


if __name__ == "__main__":
    got, result = walk_of_up(sys.argv[2])
    Path(sys.argv[1]).write_text(json.dumps({**got.to_json(), "result": result}, indent=1) + "\n")
