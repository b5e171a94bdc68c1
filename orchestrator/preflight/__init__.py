"""`orch check`: gather every node's facts with one probe each, judge them, report.

- `facts.py`        runs `node/probe.py` on every node (two phases, one SSH exec per node) → `NodeFacts`
- `shapes.py`       the probe's answer held to its shape, key by key (what is malformed is dropped, named):
                    the machinery, the probe's own frame, the whole assembled from the checks' parts
- `parsers.py`      what real tools print (nvidia-smi, sysfs, chronyc), parsed into typed facts
- `jobargs.py`      which job arguments name files it reads or folders it writes
- `jobcheck.py`     the job's own check the probe runs (`python -m trainer --check`), as a finding
- `cudacompat.py`   GPU architectures against torch's kernels, the driver torch's CUDA needs
- `controller_clock.py` the controller's own offset to the NTP server
- `results.py`      `NodeFacts` (what a check reads), `CheckResult`, `Findings` and the majority rule
- `checks/`         a module per check: a pure function of (inventory, facts of every node) → a
                    result per node, with the measured value, what was seen and a hint that fixes
                    it, and the shape of the facts it reads (`FACTS`); `CHECKS`, `FACTS_SHAPE`
- `fabric/`         the fabric check: its job, launched through the run package → `FabricFacts`;
                    its verdict; its parsers (NCCL's log) and arithmetic (busbw)
- `runner.py`       `run_preflight` → `CheckReport`; saving it where `orch up` and `orch logs` read it

A new check: its module in `checks/` (registered in `CHECKS`, its `FACTS` in `FACTS_SHAPE`), its
name in `contract.CHECK_NAMES`, its row in docs/checks.md; a fact the probe does not gather yet
goes in `node/probe.py` (stdlib only), its shape beside the check that reads it.
"""
