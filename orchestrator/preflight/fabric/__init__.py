"""The `fabric` check: a short torchrun job across every node, and its verdict.

- `job.py`      launches the job (`node/jobs/allreduce.py`) through the run package, follows it,
                reads every node's log back (`agent.py collect`) → `FabricFacts`
- `judge.py`    its verdict (`check_fabric`, one row per node) and the report's `fabric_summary`
- `nccl_log.py` NCCL_DEBUG=INFO lines → the network, the HCAs and the transport of every connection
- `busbw.py`    nccl-tests' arithmetic (algbw, busbw) and table; the pairwise rates' summary

`preflight/runner.py` runs it after the probe, when asked; `preflight/checks/` judges it with
`judge.check_fabric` like any other check. The parsers are pure modules here, not of the logs package.
"""
