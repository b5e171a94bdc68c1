"""What the user wrote, validated before anything connects: the inventory and the launch plan.

Pure: nothing here opens a connection or starts a process.

- `yamlines.py`  YAML with the line of every key, duplicate keys refused
- `schema.py`    every key of the inventory, its type, default and meaning (the docstring under it);
                 the plain and pydantic validators
- `reference.py` docs/inventory.md's key tables, generated from the schema
- `nodes.py`     a `Node` (and its `SSHOptions`), the names it may have, and how `nodes:` entries
                 expand into nodes (host/name/addr ranges in step)
- `inventory.py` the frozen `Inventory`: defaults merged, cross-field rules, every problem at once
- `nodeset.py`   node sets on the command line (`--nodes gpu[01-04]`) and folded back for output
- `overrides.py` what the command line changes for one run (`--include/--exclude/--nodes/--master`,
                 `--env`, args after `--`), recorded in run.json and applied again when it is read back
- `plan.py`      node ranks, world size, each node's exact torchrun argv and environment;
                 `job_command`, the one builder of how a node runs the job, asking its environment
- `jobenv.py`    the job's environment on one node (`JobEnv`: the bare host or a container), built
                 once from the inventory and the preflight's pins: its command, stop hook, sweep
- `runtimes.py`  the container runtimes, one table entry of capabilities each (no other module
                 names one); which image a machine holds, read once
- `container.py` `job.container`: its settings and rules, the container's name and labels
- `torchrun.py`  what `job.torchrun_args` may say: torchrun's flags orch sets from the inventory
                 refused, a `--role` the agent can read back
- `trainer.py`   what orch knows of the trainer's command line (from `trainer/interface.py`)
"""
