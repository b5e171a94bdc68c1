"""Ctrl-C ends the controller's waits at once, whichever of its threads the kernel hands the signal
to (orchestrator/waits.py): a signal that lands on a worker thread leaves a main thread blocked in a
lock with no timeout asleep until what it waits for ends on its own. A full suite run saw it: `orch
exec -- sleep 120` went on waiting after its SIGINT. Each case below sends SIGINT to the worker
thread itself (pthread_kill), as the kernel sometimes does, in a process of its own."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "orchestrator"

WAITING = """
import signal, sys, threading, time
main = threading.main_thread().ident
def waiting():
    frame, names = sys._current_frames()[main], []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names[0] in ("wait", "_wait_for_tstate_lock") and "start" not in names  # not Thread.start's own wait
"""
"""`waiting()`: is the main thread blocked in a wait now (where a user's Ctrl-C finds it)?"""

# Each waits for a call that signals its own thread and then blocks until released (30 s at most);
# "prompt" is printed when KeyboardInterrupt reaches the main thread while that call still blocks.
PRELUDE = (
    WAITING
    + """
released, finished = threading.Event(), threading.Event()
def blocked(*_):
    deadline = time.monotonic() + 10  # until the main thread waits in a lock (as a user's Ctrl-C finds it)
    while not waiting() and time.monotonic() < deadline:
        time.sleep(0.01)
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # delivered to this worker thread
    released.wait(30)
    finished.set()
    return "done"
from types import SimpleNamespace
NODE = SimpleNamespace(name="n0", host="localhost")
try:
    {call}
    print("finished: the wait outlived the Ctrl-C")
except KeyboardInterrupt:
    print("late: only once the call had ended" if finished.is_set() else "prompt")
    released.set()
"""
)

CALLS = {
    "the fan-out of exec, sync and image push": (
        "from orchestrator.transport import fan_out; fan_out([NODE], blocked, 1, stop=lambda: None)"
    ),
    "waits.join": (
        "from orchestrator import waits\n"
        "    t = threading.Thread(target=blocked, daemon=True); t.start(); waits.join(t)"
    ),
    "waits.wait": (
        "from orchestrator import waits\n"
        "    ev = threading.Event()\n"
        "    threading.Thread(target=lambda: (blocked(), ev.set()), daemon=True).start(); waits.wait(ev)"
    ),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_ctrl_c_delivered_to_a_worker_thread_ends_the_wait_at_once(name: str) -> None:
    script = textwrap.dedent(PRELUDE).format(call=CALLS[name])
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=90)
    assert done.stdout.strip() == "prompt", (name, done.stdout, done.stderr[-2000:])


PIPE = (
    WAITING
    + """
from orchestrator.config import inventory
from orchestrator.transport import Cluster
INV = inventory.parse("transport: local\\nnodes:\\n  - host: localhost\\n    name: n0\\n", "local.yaml")
copies = []
def push(t):
    started = time.monotonic()
    def poke():
        while not (waiting() and t.children._procs) and time.monotonic() < started + 10:  # the copy runs, main waits
            time.sleep(0.01)
        copies.extend(t.children._procs)
        signal.pthread_kill(me, signal.SIGINT)  # to the pushing thread, not the main one
    me = threading.get_ident()
    threading.Thread(target=poke, daemon=True).start()
    return t.pipe(["sleep", "30"], b"")  # the copy: ended by the Ctrl-C, or after 30 s
with Cluster(INV) as cluster:
    try:
        got = cluster.fan_out(push, interruptible=True)
        print("finished: the wait outlived the Ctrl-C", got)
    except KeyboardInterrupt:
        ended = copies and all(p.poll() is not None for p in copies)
        print("prompt" if ended else f"late: the copy still ran {copies}")
"""
)


def test_a_ctrl_c_during_a_pipe_ends_its_copy_before_it_propagates() -> None:
    """`orch image push` (and `orch sync`) end each node's copy (the process here that streams
    it) on Ctrl-C, and the interrupt propagates once they are gone: `Cluster.fan_out` with
    `interruptible` closes every transport, which ends what it runs."""
    done = subprocess.run([sys.executable, "-c", PIPE], cwd=REPO, capture_output=True, text=True, timeout=90)
    assert done.stdout.strip() == "prompt", (done.stdout, done.stderr[-2000:])


def test_the_call_s_own_exception_comes_through_as_it_is() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator import waits

    def fails() -> None:
        raise TimeoutError("the call's own")

    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(TimeoutError, match="the call's own"):
            waits.result(pool.submit(fails))
        assert waits.results([pool.submit(lambda i=i: i) for i in range(3)]) == [0, 1, 2]


# ----------------------------------------------------------------------------- held for every module

BLOCKING = {"join", "wait", "result", "acquire"}
"""Methods that block until another thread acts when called with no timeout."""


def unbounded_waits(path: Path, root: Path = REPO) -> list[str]:
    """Calls in the file that wait on another thread with no timeout, in line order, each as
    `path:line: call` with the path relative to `root`: `x.join()`, `x.wait()`, `x.acquire()`, a
    future's `x.result()` (in a module that uses concurrent.futures), and `Executor.map` (its
    results wait so), unless the line says why it is bounded (`# bounded:`)."""
    source = path.read_text()
    lines = source.splitlines()
    futures = "concurrent.futures" in source or "ThreadPoolExecutor" in source
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        attr = node.func.attr
        bare = not node.args and not node.keywords
        hit = (attr in BLOCKING - {"result"} and bare) or (attr == "result" and bare and futures)
        hit = hit or (
            attr == "map" and futures and isinstance(node.func.value, ast.Name) and "pool" in node.func.value.id
        )
        if hit and "# bounded:" not in lines[node.lineno - 1]:
            found.append((node.lineno, f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}"))
    return [hit for _, hit in sorted(found)]


def test_no_controller_module_waits_on_another_thread_without_a_timeout() -> None:
    """The node programs (orchestrator/node/) are out of scope: the agent's handlers only set a flag
    its loop polls, and the probe has no handler (the default action ends it from any thread)."""
    found = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if "node" not in path.relative_to(PACKAGE).parts[:1]
        for hit in unbounded_waits(path)
    ]
    assert found == [], "use orchestrator.waits (or say `# bounded: why` on the line):\n" + "\n".join(found)


def test_the_rule_sees_each_kind_of_wait(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import concurrent.futures\n"
        "t.join()\n"
        "ev.wait()\n"
        "f.result()\n"
        "pool.map(g, xs)\n"
        "lock.acquire()\n"
        "t.join(0.2)\n"
        "', '.join(xs)\n"
        "p.wait()  # bounded: killed just above\n"
    )
    hits = [h.split(": ", 1)[1] for h in unbounded_waits(sample, root=tmp_path)]
    assert hits == ["t.join()", "ev.wait()", "f.result()", "pool.map(g, xs)", "lock.acquire()"]
