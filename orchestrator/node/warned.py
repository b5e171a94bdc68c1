"""The job's command inside a container, where a scheduler's warning signal may come (Slurm's
`--signal=USR2@N` before a time limit or at a preemption):

    RUNTIME run ... IMAGE PYTHON -c "<this file>" -m torch.distributed.run ...

On a host, Slurm signals every process of the step: the agent and torchrun ignore the warning
(inherited), the trainer's ranks handle it. A container's processes are not the step's: the
runtime's client (docker, podman `run`, in the step) forwards what it gets to the container's
init (`--init`), which forwards it to its child alone, and that child, torchrun, would die of it
(its default action) with every rank. This program is that child: it runs the rest of its argv
with the job's interpreter, the warning ignored (inherited by torchrun and the ranks, as on a
host), and when the warning comes it sends it to every process below it (its descendants by
parentage, as Slurm's proctrack/linuxproc finds a step's), so the trainer gets it and writes its
checkpoint. The agent starts the runtime's client with the warning blocked (which keeps podman's
conmon alive through it, `agent.WARNING`) and the container inherits that: unblocked here. Every
other signal its init forwards (a stop's SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1) goes on to the
job's process; it exits as the job did (by the same signal, or its code).

Stdlib only, Python >= 3.8, Linux /proc.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

WARNING = signal.SIGUSR2
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)


def below(root: int, proc: str = "/proc") -> list[int]:
    """The pids of every process below `root` (children, theirs, ...), as /proc says now."""
    children: dict[int, list[int]] = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", "rb") as fh:
                parent = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(parent, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            out.append(pid)
            todo.append(pid)
    return out


def main(argv: list[str]) -> int:
    signal.signal(WARNING, signal.SIG_IGN)  # the job inherits it
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {WARNING})  # the agent started the runtime with it blocked
    job = subprocess.Popen([sys.executable, *argv])

    def warn(signum: int, _frame: object) -> None:
        for pid in below(os.getpid()):
            try:
                os.kill(pid, signum)
            except OSError:
                pass

    def forward(signum: int, _frame: object) -> None:
        try:
            job.send_signal(signum)
        except OSError:
            pass

    signal.signal(WARNING, warn)
    for sig in FORWARDED:
        signal.signal(sig, forward)
    code = job.wait()
    if code < 0:  # ended by a signal: end by it too, as the runtime would have seen the job end
        try:
            signal.signal(-code, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL, SIGSTOP: their action is the default
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
