"""The node log reader: streams a run's `node.log` on this node from a byte offset, as frames.

Runs on the node (`python -c`, built by `orchestrator.node.program("reader", (*AGENT_MODULES, "agent"))`), stdlib
only, any Python >= 3.8. The controller's side (reading the frames, the local copy, reconnects)
is `orchestrator.logs.fetch`.

    argv: RUN_DIR OFFSET POLL_S ONCE REPORT NONCE [LAUNCH|- [LEASE]]

With LAUNCH (the run's launch nonce), a run directory another launch claimed (another
controller's run of the same id) sends nothing but its first line and `E - <node time>`: none of
its lines are this run's. With LEASE=1 (started by `python -c FROM_STDIN_OPEN`: stdin stays
open), every line on stdin renews the run's lease (`renew`).

Its output starts with `ORCH-LOG-READER <NONCE>`, the session's nonce the controller chose: what a
node's login shell prints before it (a banner, `~/.bashrc` noise) can never be taken for a frame,
whatever it says. Then frames on stdout, each a header line:

    D <n>\\n + n bytes          the log's bytes from where the last frame ended (n <= 65536)
    H <state> <node time>      a heartbeat while idle: the log had nothing more at that time
    S <json>                   with REPORT=1: the node's status, whenever it changes (one line)
    E <state> <node time>      the end: state.json is final (or ONCE) and the log is drained

`<state>` is state.json's `state` (a lower-case word), `-` when there is none, `unknown` when it
is not a word. An idle poll's heartbeat lets the
other nodes' lines out before the watermark, shows a dead connection, and makes this reader die
(broken pipe) within a poll of the controller going away, so no reader outlives its follower.
The status (`S`) is what `orch up`'s supervisor judges: the fields of `agent.py status` that
change, with liveness judged by the agent's own functions, so a healthy run needs no status polls.
Order within a poll: the state is read first, then the log is drained, then S, then E/H: a
final S or an E means every line written before the state was final has been sent.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

from . import agent

HELLO = b"ORCH-LOG-READER"
"""The first line's word, before the nonce."""
CHUNK = 1 << 16
"""The most bytes of one D frame."""
_WORD = re.compile(r"[a-z][a-z_-]{0,31}")


def status(state: dict) -> dict:
    """What the reader reports of state.json: the agent's status fields that change, and,
    while the run is not final, whether the agent (and, without it, the job) is alive."""
    out = {key: state.get(key) for key in agent.STATUS_KEYS}
    out["exists"] = bool(state)
    if out["state"] not in agent.FINAL_STATES:
        out["agent_alive"] = agent.agent_alive(state)
        if not out["agent_alive"]:  # listing /proc costs: only once the agent is gone
            out["job_alive"] = agent.job_alive(state)
    return out


def state_word(state: dict) -> str:
    """state.json's state as the frames carry it: one lower-case word, `-` without a state.json."""
    name = state.get("state")
    if not state or name is None:
        return "-"
    return name if isinstance(name, str) and _WORD.fullmatch(name) else "unknown"


def stream(run_dir: str, offset: int, poll: float, once: bool, report: bool, nonce: str = "") -> None:
    out = sys.stdout.buffer
    out.write(HELLO + b" " + nonce.encode("ascii", "replace") + b"\n")
    log, state_path = os.path.join(run_dir, agent.LOG), os.path.join(run_dir, agent.STATE)
    fh, told = None, None
    while True:
        state = agent.read_json(state_path)
        name = state_word(state)
        if fh is None:
            try:
                fh = open(log, "rb")  # noqa: SIM115 - held across polls, for as long as the stream
                fh.seek(offset)
            except OSError:
                fh = None
        sent, t = False, time.time()  # every line stamped before t is in the file now, or being written
        while fh is not None:
            data = fh.read(CHUNK)
            if not data:
                break
            out.write(b"D %d\n" % len(data) + data)
            sent = True
        if report:
            now = status(state)
            if now.get("agent_alive") is False and agent.read_json(state_path) != state:
                # the agent ended while the log drained (a long drain: a slow link, a burst of
                # output): judged on the state read before, it would look vanished. Read again.
                out.flush()
                continue
            if now != told:
                told = now
                out.write(b"S " + json.dumps(dict(now, now=time.time())).encode() + b"\n")
                sent = True
        if once or name in agent.FINAL_STATES:
            out.write(b"E %s %.6f\n" % (name.encode(), t))
            out.flush()
            return
        if not sent:
            out.write(b"H %s %.6f\n" % (name.encode(), time.time()))
        out.flush()
        time.sleep(poll)


def renew(run_dir: str) -> None:
    """The lease: each line the controller sends on stdin touches `lease` in the run directory
    (never creating it: only the agent of an attached run does). Bytes that arrive prove the
    controller still reaches this node; when they stop (a cut link, a dead controller), the agent
    stops the job once the lease runs out (`agent.Monitor`)."""
    path = os.path.join(run_dir, agent.LEASE)
    for _line in iter(sys.stdin.buffer.readline, b""):
        try:
            os.utime(path, follow_symlinks=False)
        except (OSError, NotImplementedError):
            pass


def main(argv: list) -> int:
    run_dir = os.path.expanduser(argv[1])
    nonce = "".join(argv[6:7])
    launch = argv[7] if len(argv) > 7 and argv[7] != "-" else ""
    lease = argv[8:9] == ["1"]
    if lease:
        import threading

        threading.Thread(target=renew, args=(run_dir,), daemon=True).start()
    code = 1
    try:
        if agent.foreign(run_dir, launch or None):  # another launch's run of this id: none of its lines
            sys.stdout.buffer.write(HELLO + b" " + nonce.encode("ascii", "replace") + b"\n")
            sys.stdout.buffer.write(b"E - %.6f\n" % time.time())
        else:
            stream(run_dir, int(argv[2]), float(argv[3]), argv[4] == "1", argv[5:6] == ["1"], nonce)
        code = 0
    finally:
        if lease:
            # the renewing thread holds stdin's lock while it waits for a line: an interpreter
            # shutdown would wait for it (until the controller hangs up); this reader is done
            try:
                sys.stdout.flush()
            except OSError:
                pass
            os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
