"""`python -c TEXT MODULE` (the `job` check of a module job, run by the job's own python in its
workdir and environment): whether `python -m MODULE` would find MODULE there, without running it.
Prints one JSON line: {"module", "found", "origin"} or, when looking raised, {"error"}.

Stdlib only, Python >= 3.8, imports nothing of orch: it runs wherever the job runs (its container
included), sent as its text (`node.script`)."""

from __future__ import annotations

import importlib.util
import json
import sys
from typing import Any


def find(name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"module": name, "found": False}
    try:
        spec = importlib.util.find_spec(name)
        out["found"] = spec is not None
        out["origin"] = getattr(spec, "origin", None) if spec is not None else None
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


if __name__ == "__main__":
    print(json.dumps(find(sys.argv[1])))
