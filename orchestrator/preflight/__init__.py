"""`orch check`: gather every node's facts with one probe each, judge them, report.

- `facts.py`  runs `node/probe.py` on every node (two phases, one SSH exec per node) and parses
              what real tools print (nvidia-smi, sysfs, chronyc) into typed facts
- `checks.py` one pure function per check: (inventory, facts of every node) → a result per node,
              with the measured value, what was seen and a hint that fixes it
- `report.py` `run_preflight` → `CheckReport`; saving it where `orch up` and `orch logs` read it

A new check: its facts in `node/probe.py` (stdlib only) and `facts.py`, its function in
`checks.py` (registered in `CHECKS`), its name in `contract.CHECK_NAMES`, its row in README.md
and docs/checks.md.
"""
