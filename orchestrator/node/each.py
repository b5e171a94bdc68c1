"""The task of a step that runs on every node at once (a Slurm launch step): run this node's own
call, among the calls every task receives.

Runs on the node (`python -c`, the source of this file), stdlib only, any Python >= 3.8:

    stdin: {"<node>": {"argv": [...], "stdin": TEXT}, ...}  (JSON, ASCII; the same on every node)
    argv:  VARIABLE  (the environment variable that names this node: SLURMD_NODENAME)

It execs this node's `argv` with that call's `stdin` as its standard input (a temporary file:
a pipe could not hold the run's files before the program reads them), so the program (boot.py,
then the agent) is the step's task itself. A node without a call says so on stderr, exit 2.
"""

import json
import os
import sys
import tempfile


def main(argv: list) -> None:
    calls = json.loads(sys.stdin.buffer.read().decode("ascii"))
    me = os.environ.get(argv[1], "")
    mine = calls.get(me)
    if mine is None:
        sys.stderr.write("no call for node {!r} ({}); calls for {}\n".format(me, argv[1], ", ".join(sorted(calls))))
        sys.exit(2)
    with tempfile.TemporaryFile() as feed:
        feed.write(mine["stdin"].encode("ascii"))
        feed.seek(0)
        os.dup2(feed.fileno(), 0)  # the file stays open as stdin once this handle is closed
    os.execvp(mine["argv"][0], mine["argv"])


if __name__ == "__main__":
    main(sys.argv)
