"""Boot a run on this node: write the files sent on stdin into the run directory, run the agent.

Runs on the node (`python -c`, the source of this file), stdlib only, any Python >= 3.8:

    stdin: {"agent.py": TEXT, "launch.json": TEXT, ...}  (JSON, ASCII)
    argv:  RUN_DIR AGENT_ARGS...

The files are written privately (the run directory too: they can hold environment values),
each atomically, then `agent.py AGENT_ARGS` runs from RUN_DIR in this same interpreter.
Shipping and starting a node's share of a run cost one SSH exec (one login shell) instead of
one per file, and no env value ever appears on a command line.
"""

import json
import os
import runpy
import sys


def write_files(run_dir: str, files: dict) -> None:
    """Every file of `files` ({name: text}) into `run_dir`, mode 0600, each atomically."""
    os.makedirs(run_dir, exist_ok=True)
    for name, text in files.items():
        tmp = os.path.join(run_dir, f"{name}.tmp.{os.getpid()}")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, os.path.join(run_dir, name))


def main(argv: list) -> None:
    run_dir = os.path.expanduser(argv[1])
    login_umask = os.umask(0o077)
    write_files(run_dir, json.loads(sys.stdin.buffer.read().decode("ascii")))
    os.umask(login_umask)  # the agent hands the login's umask to the job
    os.chdir(run_dir)
    sys.argv = ["agent.py"] + argv[2:]
    runpy.run_path("agent.py", run_name="__main__")


if __name__ == "__main__":
    main(sys.argv)
