"""`orch logs`, and the merged log `orch up` prints: every node's `node.log`, brought to the
controller and merged by the time each line was written on its node.

- `lines.py`     a node log line: parse, timestamps, format (`TIME NODE RANK TEXT`, JSON)
- `trainer.py`   what orch reads of the trainer's lines: rank prefix, throughput, saved paths
- `progress.py`  where a trainer run is, from rank 0's lines (`orch status`, the report's phases)
- `telemetry.py` the agents' telemetry lines and the ranks' timing lines read back
- `filters.py`   `--node/--rank/--grep/--since/--tail`
- `merge.py`     the k-way merge, the live merge with its watermark, the plain block merge
                 (and `_fastmerge.c`, the same block merge in C)
- `fetch.py`     the node's reader and its frames; the local copies, resumed by byte offset
- `stored.py`    the copies read back and merged; merged.log
- `follow.py`    following live: a stream per node, released in order within a watermark
- `view.py`      what `orch logs` shows of a run (the CLI prints it)
- `teardown.py`  what the nodes print once the run is being stopped, held out of `orch up`'s live view
"""
