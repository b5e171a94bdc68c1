"""Jobs orch runs on the nodes under torchrun, through the same launch path as `orch up`.

Unlike the programs one level up (stdlib only, any Python >= 3.8), a job here imports torch: it
runs in the job's own environment (`job.python`), where torch is what the training needs anyway.
Each job is one file, shipped by source into the node's run directory next to the agent and run
as torchrun's script; it imports nothing of orch, and `tests/unit/test_node.py` holds it to
"stdlib and torch only, Python 3.8 syntax". The controller may import a job's module for its
constants and pure helpers: torch is imported inside the job's functions, never at the top.

- `allreduce.py` the `fabric` check's job: an all_reduce size sweep and pairwise node-to-node rates.
"""
