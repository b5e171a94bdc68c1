"""A launched run: the node agents' client, its record, supervision, and `orch status` / `down`.

- `agents.py`    ship, start, ask and stop the node agent on every node; `NodeStatus` is what
                 an agent says of its node
- `records.py`   run.json's per-node records, updated from several threads
- `cause.py`     pure: a failure's cause line and hint, read from its node's log (torchrun's Root
                 Cause summary, the blamed rank's traceback, CUDA/NCCL lines, the signal)
- `supervise.py` the run's state machine: judge every node, fail fast, teardown in `finally`;
                 node states pushed on the log streams, polled only when a stream goes silent;
                 `Tunables`, supervision's settings from the environment
- `control.py`   `orch status` (StatusReport) and `orch down` (DownReport) of a launched run
- `history.py`   `orch runs` (RunsReport), from run.json alone
- `stacks.py`    `orch stacks`: every rank's py-spy dump (the agent's `stacks`), parsed and grouped
- `watchdog.py`  the hang watchdog: no rank wrote a line for `job.stall_timeout_s`; a hang as a
                 Failure; `HangWatch`, the supervisor's hook that takes the stacks and stops or warns
- `straggler.py` pure: the straggler detector, window by window, and `StragglerWatch`, the
                 supervisor's hook; `replay` over a stored log
- `resume.py`    a retry of the trainer: `--resume auto` (the trainer finds its own last.pt)

`orchestrator/up.py` composes these with the preflight and the log streams into `orch up`.
"""
