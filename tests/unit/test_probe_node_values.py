"""The probe fills in what only the node knows (plan.NODE_VALUES) in the job's throw-away container
command, as the agent does for the launch: a real podman refused `-v {ORCH_RUN_DIR}:{ORCH_RUN_DIR}`
("invalid container path"), so the software and job checks inside a container could not run."""

from __future__ import annotations

import os

from orchestrator.config import plan
from orchestrator.node import agent, probe


def test_the_probe_fills_the_plans_node_values() -> None:
    assert probe.NODE_VALUES == plan.NODE_VALUES == agent.NODE_VALUES
    argv = [
        "podman",
        "run",
        "-v",
        "{ORCH_RUN_DIR}:{ORCH_RUN_DIR}",
        "--user",
        "{ORCH_UID}:{ORCH_GID}",
        "-v",
        "{ORCH_HOME}:{ORCH_HOME}",
        "img",
        "python3",
    ]
    filled = probe.job_python({"job_python": argv})
    run_dir = filled[3].split(":")[0]
    assert filled[3] == f"{run_dir}:{run_dir}" and os.path.isabs(run_dir) and os.path.isdir(run_dir)
    assert filled[5] == f"{os.getuid()}:{os.getgid()}"
    home = os.path.expanduser("~")
    assert filled[7] == f"{home}:{home}"
    assert probe.fill_node_values(list(argv))[3] == filled[3]  # one directory per probe
    assert probe.job_python({})[0] == probe.sys.executable
