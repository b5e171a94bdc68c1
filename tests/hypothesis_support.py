"""How many examples a property test draws: its own count, or ORCH_HYPOTHESIS_EXAMPLES when set.

`make test-fast` (the inner loop) sets 50, so the pure tier stays under a minute; `make test` and
CI leave it unset and draw each test's full count. Set it higher to search harder."""

from __future__ import annotations

import os


def examples(default: int) -> int:
    value = os.environ.get("ORCH_HYPOTHESIS_EXAMPLES")
    return int(value) if value else default
