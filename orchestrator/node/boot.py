"""Boot a run on this node: write the files sent on stdin into the run directory, run the agent.

Runs on the node (`python -c`, the source of this file), stdlib only, any Python >= 3.8:

    stdin: {"agent.py": TEXT, "procs.py": TEXT, "launch.json": TEXT, ...}  (JSON, ASCII)
    argv:  RUN_DIR AGENT_ARGS...

The files are written privately (the run directory too: they can hold environment values),
each atomically, then `agent.py AGENT_ARGS` runs from RUN_DIR in this same interpreter.
Shipping and starting a node's share of a run cost one SSH exec (one login shell) instead of
one per file, and no env value ever appears on a command line.

The run directory is used only once the agent's own check says it can be trusted (this user's,
writable by no one else, nor is anything above it): the agent's text arrives first, is run from
memory for that check (the modules it imports, `procs.py`..., from the same files: `Shipped`),
and only then are the files written, each created anew (O_EXCL) and never
through a link (O_NOFOLLOW). A refusal is the agent's JSON answer, exit code 2. A launch with a
nonce (launch.json `nonce`) first claims the directory (`agent.claim`): one another launch holds
(another controller's run of the same id) is refused before anything is written, exit code 3.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import types
import typing


class Shipped(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports the modules sent on stdin (`NAME.py`) before they are written: the agent's own
    (`import procs`) come from the same files as the agent, never from the node's sys.path."""

    def __init__(self, files: dict) -> None:
        self.files = files

    def find_spec(
        self, fullname: str, path: "typing.Sequence[str] | None", target: "types.ModuleType | None" = None
    ) -> "importlib.machinery.ModuleSpec | None":
        if path is None and fullname + ".py" in self.files and fullname != "agent":
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        exec(compile(self.files[name + ".py"], name + ".py", "exec"), module.__dict__)


def write_files(run_dir: str, files: dict) -> None:
    """Every file of `files` ({name: text}) into `run_dir`, mode 0600, each atomically."""
    for name, text in files.items():
        tmp = os.path.join(run_dir, f"{name}.tmp.{os.getpid()}")
        try:
            os.unlink(tmp)  # a leftover of an earlier boot with this pid (unlink follows no link)
        except FileNotFoundError:
            pass
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        with open(os.open(tmp, flags, 0o600), "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, os.path.join(run_dir, name))


def main(argv: list) -> None:
    run_dir = os.path.abspath(os.path.expanduser(argv[1]))
    files = json.loads(sys.stdin.buffer.read().decode("ascii"))
    sys.meta_path.insert(0, Shipped(files))
    agent = types.ModuleType("agent")
    exec(compile(files["agent.py"], "agent.py", "exec"), agent.__dict__)
    login_umask = os.umask(0o077)
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    try:
        agent.check_run_dir(run_dir)
    except agent.UntrustedDir as exc:
        sys.exit(agent.emit({"state": None, "error": str(exc), "untrusted": True}, 2))
    nonce = json.loads(files.get("launch.json") or "{}").get("nonce")
    if nonce:  # nothing is written in a directory another launch holds
        refused = agent.claim(run_dir, nonce)
        if refused:
            sys.exit(agent.emit({"state": None, "reason": refused, "foreign": True}, 3))
    old = agent.read_json(os.path.join(run_dir, agent.STATE))
    if old and old.get("state") not in agent.FINAL_STATES and agent.agent_alive(old):
        sys.exit(agent.emit(dict(old, reason="already started here (agent {})".format(old.get("agent_pid"))), 3))
    write_files(run_dir, files)
    os.umask(login_umask)  # the agent hands the login's umask to the job
    os.chdir(run_dir)
    sys.argv = ["agent.py"] + argv[2:]
    sys.exit(agent.main(sys.argv[1:]))


if __name__ == "__main__":
    main(sys.argv)
