"""Which directories a node program may trust: the one definition of it, on the node and on the controller.

Shipped beside `agent.py` (a module of the agent, `node.AGENT_MODULES`) and bundled into the
probe, so the preflight judges a run root by the rules the agent will apply to the run directory
under it. Stdlib only, Python >= 3.8, imports nothing of orch.

A directory this user trusts is a directory (not a link), this user's, and writable by no one
else; every directory above it is this user's or root's and not writable by others unless sticky
(like /tmp), as OpenSSH's StrictModes asks of ~/.ssh. Whoever can write or rename a directory
could choose what is read from it: state.json names what `agent.py stop` signals, launch.json
what `start` runs.
"""

from __future__ import annotations

import os
import stat


class UntrustedDir(Exception):
    """The run directory is not this user's alone: nothing it says is acted on."""


def own_problem(path: str) -> str | None:
    """Why `path` (which exists) cannot be trusted as this user's own directory, or None."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory (a link or a file): refusing to use it"
    me = os.geteuid()
    if st.st_uid != me:
        return f"{path} belongs to uid {st.st_uid}, not to this user ({me}): refusing to use it"
    if st.st_mode & 0o022:
        return (
            f"{path} is writable by others than its owner (mode {stat.S_IMODE(st.st_mode):04o}): "
            f"refusing to use it; chmod go-w {path}"
        )
    return None


def above_problem(path: str, what: str = "the run directory") -> str | None:
    """Why a directory above `what` (the nearest one of `path` and its ancestors that exists, and
    every one above that) could be changed by someone else, or None. A directory not there yet is
    made by this user with mode 0700 (the agent's boot), so it is nothing to judge."""
    path = os.path.abspath(path)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    me = os.geteuid()
    while True:
        st = os.stat(path)
        if st.st_uid not in (me, 0) or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
            return (
                f"{path}, above {what}, can be changed by others (uid {st.st_uid}, "
                f"mode {stat.S_IMODE(st.st_mode):04o}): refusing to use it; chmod go-w {path} "
                "or set job.run_root elsewhere"
            )
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def check_run_dir(path: str) -> None:
    """Refuse a run directory that only this user may trust (`own_problem`, and `above_problem` for
    every directory above it). A directory not there is nothing to trust: start creates it, status
    and stop find nothing. Raises UntrustedDir."""
    path = os.path.abspath(path)
    try:
        problem = own_problem(path)
    except FileNotFoundError:
        return
    problem = problem or above_problem(os.path.dirname(path))
    if problem:
        raise UntrustedDir(problem)


def run_root_problem(run_root: str) -> str | None:
    """Why a run directory under `run_root` (`<run_root>/<run-id>/<node>`, made with mode 0700
    where missing) would be refused by `check_run_dir`, or None: the preflight's question."""
    try:
        return above_problem(run_root)
    except OSError as exc:
        return f"{run_root}: {exc.strerror or exc}"
