"""Which directories a node program may trust: the one definition of it, on the node and on the controller.

Shipped beside `agent.py` (a module of the agent, `node.AGENT_MODULES`) and bundled into the
probe, so the preflight judges a run root by the rules the agent will apply to the run directory
under it. Stdlib only, Python >= 3.8, imports nothing of orch.

A directory this user trusts is a directory (not a link), this user's, and writable by no one
else; every directory above it is this user's or root's and not writable by others unless sticky
(like /tmp), as OpenSSH's StrictModes asks of ~/.ssh. Whoever can write or rename a directory
could choose what is read from it: state.json names what `agent.py stop` signals, launch.json
what `start` runs. The way to it is judged as the kernel walks it (`walk`): every link on the way
is this user's or root's (whoever owns a link can turn it elsewhere at any time, between a check
and a read), and the directories judged are those the links lead through, not only those named.
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


MAX_LINKS = 40
"""Links followed on one way before it is refused (Linux's own limit, ELOOP)."""


def _changeable(path: str, st: os.stat_result, what: str, me: int) -> str | None:
    """Why `path` (a directory on the way, `st` its lstat) could be changed by someone else, or None."""
    if st.st_uid not in (me, 0) or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
        return (
            f"{path}, above {what}, can be changed by others (uid {st.st_uid}, "
            f"mode {stat.S_IMODE(st.st_mode):04o}): refusing to use it; chmod go-w {path} "
            "or set job.run_root elsewhere"
        )
    return None


def walk(path: str, what: str = "the run directory", last: bool = True) -> tuple[str, str | None]:
    """`path` as the kernel finds it, and why someone else could change where it leads, or None.

    The first is os.path.realpath's answer: every link on the way followed (the part not there yet
    as written: a directory not there yet is made by this user with mode 0700, so it is nothing to
    judge). Walked a name at a time with lstat, never following a link unjudged: each link on the
    way must be this user's or root's, and each directory passed through (where the links lead,
    `/` first) this user's or root's and not writable by others unless sticky; with `last` false,
    the directory `path` leads to is not judged (the caller judges it as its own, `own_problem`)."""
    me = os.geteuid()
    todo = [name for name in reversed(os.path.abspath(path).split(os.sep)) if name]
    real, links = os.sep, 0
    problem = _changeable(real, os.lstat(real), what, me) if todo or last else None
    while todo and problem is None:
        name = todo.pop()
        if name == os.curdir:
            continue
        if name == os.pardir:
            real = os.path.dirname(real)
            continue
        here = os.path.join(real, name)
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            return os.path.normpath(os.path.join(here, *reversed(todo))), None
        except OSError as exc:
            return here, f"{here}, on the way to {what}: {exc.strerror or exc}: refusing to use it"
        if stat.S_ISLNK(st.st_mode):
            links += 1
            target = os.readlink(here)
            if st.st_uid not in (me, 0):
                return here, (
                    f"{here}, a link on the way to {what}, belongs to uid {st.st_uid}, not to this user ({me}) "
                    "or root: whoever owns it can turn it elsewhere at any time: refusing to use it; "
                    f"use {target} itself or set job.run_root elsewhere"
                )
            if links > MAX_LINKS:
                return here, f"{here}, on the way to {what}: more than {MAX_LINKS} links: refusing to use it"
            if target.startswith(os.sep):
                real = os.sep
            todo.extend(name for name in reversed(target.split(os.sep)) if name)
            continue
        real = here
        if todo or last:
            problem = _changeable(here, st, what, me)
    return real, problem


def above_problem(path: str, what: str = "the run directory") -> str | None:
    """Why a directory above `what` (`path` and every one above it, as `walk` finds them: links
    followed and judged) could be changed by someone else, or None."""
    return walk(path, what)[1]


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
