"""The Slurm test bed is a real Slurm (tests/slurm_bed.py), and what Debian's 22.05 does where a
Slurm transport depends on it: srun on every node, sbatch, salloc --no-shell with srun --overlap
steps, stdin and line streaming through srun, --kill-on-bad-exit, what a stopped srun leaves,
the warning signal of a preemption and of a time limit, requeue, a drained node, the SLURM_*
variables a step passes on to a nested srun, and srun's --cpus-per-task (SRUN_CPUS_PER_TASK)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

from tests.slurm_bed import URGENT, MakeSlurmBed, SlurmBed, hosts_file

pytestmark = pytest.mark.slurm

TRAP = """\
#!/bin/bash
# logs each signal it gets into $1 (a line: who, signal; who is $2, else its node), until TERM ends it
who=${2:-$SLURMD_NODENAME}
trap 'echo "$who USR2" >> "$1"' USR2
trap 'echo "$who TERM" >> "$1"; exit 0' TERM
echo "$who started" >> "$1"
while true; do sleep 0.1 & wait $!; done
"""
"""A task that records the signals it gets: `sleep` runs as a job of its own that the shell waits on,
so a signal that reaches the step's every process (proctrack signals them all) kills `sleep`, not
the shell's trap."""


class Lines:
    """The lines of a pipe, read on a thread, for waiting on one."""

    def __init__(self, pipe: IO[str] | None) -> None:
        assert pipe is not None
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)


def wait(bed: SlurmBed, ready: Callable[[], object], what: str, timeout: float = 30) -> None:
    bed.wait_for(ready, timeout, what)


def tasks(bed: SlurmBed, marker: str) -> list[int]:
    """The job processes whose command line names marker, but the srun that started them."""
    return [p for p in bed.job_processes(marker) if not cmdline(p).startswith(b"srun")]


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def submit(bed: SlurmBed, *argv: str) -> str:
    """`sbatch --parsable ...`: the job id."""
    return bed.run("sbatch", "--parsable", *argv).stdout.strip().split(";")[0]


def salloc(bed: SlurmBed, *argv: str) -> str:
    """`salloc --no-shell ...`: the job id, read from the one line it prints (on stderr)."""
    proc = bed.run("salloc", "--no-shell", *argv)
    assert proc.stdout == "", proc.stdout
    m = re.fullmatch(r"salloc: Granted job allocation (\d+)\n", proc.stderr)
    assert m, proc.stderr
    return m.group(1)


# ----------------------------------------------------------------------------- the bed is real


def test_srun_runs_one_task_on_each_of_the_four_nodes(slurm_bed: SlurmBed) -> None:
    out = slurm_bed.run("srun", "-N4", "--ntasks-per-node=1", "sh", "-c", "echo $SLURMD_NODENAME $SLURM_NODEID")
    assert sorted(out.stdout.splitlines()) == ["sn1 0", "sn2 1", "sn3 2", "sn4 3"]
    assert len(slurm_bed.run("srun", "-N4", "hostname").stdout.splitlines()) == 4
    hostnames = slurm_bed.run("scontrol", "show", "hostnames", "sn[1-4]").stdout.split()
    assert hostnames == ["sn1", "sn2", "sn3", "sn4"]


def test_each_netns_node_is_a_host_of_its_own_and_its_name_resolves_as_its_etc_hosts_says(
    slurm_netns_bed: SlurmBed,
) -> None:
    bed = slurm_netns_bed
    out = bed.run("srun", "-N4", "sh", "-c", 'echo "$(hostname) $SLURMD_NODENAME $(getent hosts $(hostname))"')
    rows = sorted(line.split() for line in out.stdout.splitlines())
    assert rows == [[n.name, n.name, n.addr, n.name] for n in bed.nodes]
    # Debian's own line for its hostname: node1's name is loopback on node1 and its address elsewhere
    node1, node2 = bed.nodes[0], bed.nodes[1]
    bed.set_hosts(node1.name, hosts_file(bed.nodes, me=node1.name))
    on_node1 = bed.run("srun", "-w", node1.name, "getent", "ahostsv4", node1.name).stdout.split()
    on_node2 = bed.run("srun", "-w", node2.name, "getent", "ahostsv4", node1.name).stdout.split()
    assert on_node1[0] == "127.0.1.1" and on_node2[0] == node1.addr


def test_sbatch_wrap_runs_and_the_queue_empties(slurm_bed: SlurmBed) -> None:
    job = submit(slurm_bed, "-N2", "--wrap", "srun sh -c 'echo $SLURMD_NODENAME'")
    wait(slurm_bed, lambda: job not in slurm_bed.jobs(), "the batch job gone from squeue")
    # without -o the output is slurm-<id>.out in the bed's working directory, never the repository
    assert sorted(lines_of(slurm_bed.workdir / f"slurm-{job}.out")) == ["sn1", "sn2"]
    assert not (Path.cwd() / f"slurm-{job}.out").exists()
    assert slurm_bed.job(job)["JobState"] == "COMPLETED"


def test_salloc_no_shell_holds_an_allocation_that_srun_overlap_uses_and_scancel_removes(slurm_bed: SlurmBed) -> None:
    job = salloc(slurm_bed, "-N2", "-J", "held")
    assert slurm_bed.run("squeue", "-h", "-j", job, "-o", "%T %D %N").stdout.split() == ["RUNNING", "2", "sn[1-2]"]
    step = slurm_bed.run(
        "srun", "--jobid", job, "--overlap", "--nodes=1", "--ntasks=1", "-w", "sn2", "sh", "-c", "echo $SLURMD_NODENAME"
    )
    assert step.stdout == "sn2\n"
    slurm_bed.run("scancel", job)
    wait(slurm_bed, lambda: not slurm_bed.jobs(), "the allocation gone from squeue")
    assert slurm_bed.job(job)["JobState"] == "CANCELLED"


# ----------------------------------------------------------------------------- streaming


def test_stdin_reaches_the_remote_task_line_by_line_and_its_end_ends_the_task(slurm_bed: SlurmBed) -> None:
    job = salloc(slurm_bed, "-N2")
    srun = slurm_bed.popen(
        *("srun", "--jobid", job, "--overlap", "--nodes=1", "--ntasks=1", "-w", "sn2"),
        *("sh", "-c", 'while read -r line; do echo "$SLURMD_NODENAME got $line"; done; echo "$SLURMD_NODENAME: eof"'),
        stdin=subprocess.PIPE,
    )
    assert srun.stdin is not None and srun.stdout is not None
    out = Lines(srun.stdout)
    for i in range(3):  # each answer comes back before the next line is sent: nothing waits for a buffer
        srun.stdin.write(f"line{i}\n")
        srun.stdin.flush()
        wait(slurm_bed, lambda i=i: f"sn2 got line{i}\n" in out.lines, f"the answer to line{i}")
    srun.stdin.close()
    assert srun.wait(30) == 0
    wait(slurm_bed, lambda: "sn2: eof\n" in out.lines, "the task's last line")


def test_srun_unbuffered_passes_a_line_before_its_end(slurm_bed: SlurmBed) -> None:
    """srun forwards whole lines by default; with -u/--unbuffered what the task wrote so far."""
    srun = slurm_bed.popen("srun", "-N1", "-u", "sh", "-c", "printf 'half a line'; sleep 300")
    stdout = srun.stdout
    assert stdout is not None
    got: list[str] = []
    threading.Thread(target=lambda: got.append(stdout.read(11)), daemon=True).start()
    wait(slurm_bed, lambda: got == ["half a line"], "the unfinished line")
    assert srun.poll() is None
    srun.terminate()
    srun.wait(30)


# ----------------------------------------------------------------------------- failures and stops


def test_kill_on_bad_exit_ends_every_other_task_when_one_fails(slurm_bed: SlurmBed) -> None:
    marker = "kobe-test"
    script = f'if [ "$SLURM_PROCID" = 2 ]; then exit 3; fi; sleep 300; : {marker}'
    proc = slurm_bed.run("srun", "-N4", "--kill-on-bad-exit=1", "sh", "-c", script, check=False)
    assert proc.returncode != 0
    assert "sn3: task 2: Exited with exit code 3" in proc.stderr
    wait(slurm_bed, lambda: not slurm_bed.jobs(), "the job gone")
    assert tasks(slurm_bed, marker) == []


def test_without_kill_on_bad_exit_the_other_tasks_go_on_after_one_fails(slurm_bed: SlurmBed) -> None:
    """KillOnBadExit=0, Slurm's default: the three others keep running (pitfall 5)."""
    marker = "no-kobe-test"
    script = f'if [ "$SLURM_PROCID" = 2 ]; then exit 3; fi; sleep 300; : {marker}'
    srun = slurm_bed.popen("srun", "-N4", "sh", "-c", script)
    err = Lines(srun.stderr)
    wait(slurm_bed, lambda: "task 2: Exited with exit code 3" in err.text(), "task 2's exit")
    wait(slurm_bed, lambda: len(tasks(slurm_bed, marker)) == 3, "the three other tasks")
    assert srun.poll() is None  # and srun waits for them
    srun.terminate()
    srun.wait(30)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_stopped_srun_leaves_no_task(slurm_bed: SlurmBed, how: signal.Signals) -> None:
    job = salloc(slurm_bed, "-N2")
    marker = f"stopped-srun-{how.name}"
    srun = slurm_bed.popen(
        "srun", "--jobid", job, "--overlap", "-N2", "--ntasks-per-node=1", "sh", "-c", f"sleep 300; : {marker}"
    )
    wait(slurm_bed, lambda: len(tasks(slurm_bed, marker)) == 2, "both tasks")
    srun.send_signal(how)
    srun.wait(30)
    wait(slurm_bed, lambda: not tasks(slurm_bed, marker), "no task left")
    assert slurm_bed.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING"  # the allocation stays


# ----------------------------------------------------------------------------- signals, requeue


def test_a_preempted_job_s_steps_get_its_warning_signal_at_once_and_its_batch_shell_does_not(
    slurm_bed: SlurmBed, tmp_path: Path
) -> None:
    """--signal=USR2@N without B: signals the steps; a preemption sends it at once
    (SlurmctldParameters=preempt_send_user_signal), GraceTime before the job is requeued."""
    (tmp_path / "trap.sh").write_text(TRAP)
    (tmp_path / "trap.sh").chmod(0o755)
    log = tmp_path / "signals"
    batch = f"{tmp_path / 'trap.sh'} {log} batch & srun -N2 {tmp_path / 'trap.sh'} {log}"
    job = submit(slurm_bed, "-N2", "--signal=USR2@30", "--requeue", "-o", str(tmp_path / "out"), "--wrap", batch)
    wait(slurm_bed, lambda: len(lines_of(log)) == 3, "the batch shell and both steps started")
    submit(slurm_bed, "-p", URGENT, "-N4", "--exclusive", "--wrap", "true")
    wait(slurm_bed, lambda: {"sn1 USR2", "sn2 USR2"} <= set(lines_of(log)), "USR2 in both steps")
    assert slurm_bed.job(job)["JobState"] == "RUNNING"
    assert "batch USR2" not in lines_of(log)


@pytest.mark.slow
@pytest.mark.waits
def test_a_time_limit_signals_the_steps_before_it_ends_the_job(slurm_bed: SlurmBed, tmp_path: Path) -> None:
    """-t 1 --signal=USR2@60: slurmctld looks at time limits every 30 s, so the warning comes at its
    first look (0-30 s) and the end at the first look past a minute (60-90 s)."""
    (tmp_path / "trap.sh").write_text(TRAP)
    (tmp_path / "trap.sh").chmod(0o755)
    log = tmp_path / "signals"
    job = submit(slurm_bed, "-N2", "-t", "1", "--signal=USR2@60", "--wrap", f"srun -N2 {tmp_path / 'trap.sh'} {log}")
    wait(slurm_bed, lambda: {"sn1 USR2", "sn2 USR2"} <= set(lines_of(log)), "USR2 in both steps", timeout=60)
    assert slurm_bed.job(job)["JobState"] == "RUNNING"
    # the end comes at most 90 s after the job started, so at most 90 s after the warning
    wait(slurm_bed, lambda: job not in slurm_bed.jobs(), "the job's end", timeout=120)
    state = slurm_bed.job(job)
    assert (state["JobState"], state["Reason"]) == ("TIMEOUT", "TimeLimit")
    for node in ("sn1", "sn2"):
        mine = [line for line in lines_of(log) if line.startswith(node)]
        assert mine == [f"{node} started", f"{node} USR2", f"{node} TERM"]


def test_scontrol_requeue_runs_a_batch_job_again_and_refuses_an_salloc_allocation(
    slurm_bed: SlurmBed, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    script = 'echo "restart=${SLURM_RESTART_COUNT:-none}"; sleep 300'
    job = submit(slurm_bed, "-N1", "-o", str(out), "--open-mode=append", "--wrap", script)
    wait(slurm_bed, lambda: "restart=none" in lines_of(out), "the first run")
    slurm_bed.run("scontrol", "requeue", job)
    # 22.05 holds a requeued job back (BeginTime, two minutes on): a requeue that wants it now says so
    wait(slurm_bed, lambda: slurm_bed.job(job)["JobState"] == "PENDING", "the job pending again")
    assert slurm_bed.job(job)["Reason"] == "BeginTime"
    slurm_bed.run_requeued_now(job)
    wait(slurm_bed, lambda: "restart=1" in lines_of(out), "the second run")
    assert slurm_bed.job(job)["Restarts"] == "1"
    held = salloc(slurm_bed, "-N1")
    refused = slurm_bed.run("scontrol", "requeue", held, check=False)
    assert refused.returncode != 0 and "Only batch jobs" in refused.stderr


def test_a_drained_node_is_not_allocated(slurm_bed: SlurmBed) -> None:
    slurm_bed.drain("sn2", "bed test")
    assert slurm_bed.states()["sn2"] == "drained"
    out = slurm_bed.run("srun", "-N3", "sh", "-c", "echo $SLURMD_NODENAME").stdout
    assert sorted(out.split()) == ["sn1", "sn3", "sn4"]
    job = submit(slurm_bed, "-N4", "--wrap", "true")
    # first "Resources" while the last job's nodes clean up, then the drained node
    reason = lambda: slurm_bed.run("squeue", "-h", "-j", job, "-o", "%T|%r").stdout.strip()  # noqa: E731
    wait(slurm_bed, lambda: "DRAINED" in reason(), "the drained node as the pending reason")
    assert reason().startswith("PENDING|")
    refused = slurm_bed.run("salloc", "--no-shell", "-N4", "--immediate=1", check=False)
    assert refused.returncode != 0 and "Unable to allocate resources" in refused.stderr


# ----------------------------------------------------------------------------- 22.05 facts


def test_a_nested_srun_takes_the_outer_steps_slurm_variables_unless_they_are_removed(slurm_bed: SlurmBed) -> None:
    """A one-task step's SLURM_NTASKS, SLURM_NPROCS and SLURM_JOB_NODELIST (its own node, when the
    step was started with --jobid from outside) make an srun inside it one node's (SchedMD bug
    14298); without the step's SLURM_* (SLURM_CONF kept) and with --jobid it has the allocation."""
    job = salloc(slurm_bed, "-N4")
    nested = "srun --overlap -N4 --ntasks-per-node=1 sh -c 'echo $SLURMD_NODENAME' 2>&1"
    clean = (
        'env $(env | sed -n "s/^\\(SLURM_[A-Z_0-9]*\\)=.*/-u \\1/p" | grep -v "SLURM_CONF$") '
        f"srun --jobid {job} --overlap -N4 --ntasks-per-node=1 sh -c 'echo $SLURMD_NODENAME'"
    )
    step = ("srun", "--jobid", job, "--overlap", "--nodes=1", "--ntasks=1", "-w", "sn1", "sh", "-c")
    inherited = slurm_bed.run(*step, nested, check=False).stdout
    assert "Only allocated 1 nodes" in inherited or "setting nnodes to 1" in inherited, inherited
    assert sorted(slurm_bed.run(*step, clean).stdout.split()) == ["sn1", "sn2", "sn3", "sn4"]


def test_srun_ignores_slurm_cpus_per_task_and_reads_srun_cpus_per_task(slurm_bed: SlurmBed, tmp_path: Path) -> None:
    """22.05: in an `sbatch -c2` job, a step with --exact gets one CPU per task (SLURM_CPUS_ON_NODE)
    while SLURM_CPUS_PER_TASK still says 2; SRUN_CPUS_PER_TASK or -c gives it two."""
    out = tmp_path / "out"
    show = 'echo "$1 on_node=$SLURM_CPUS_ON_NODE per_task=$SLURM_CPUS_PER_TASK"'
    script = "\n".join(
        [
            f"srun -n1 --exact sh -c '{show}' - exact",
            f"SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK srun -n1 --exact sh -c '{show}' - srun_cpus_per_task",
            f"srun -n1 --exact -c $SLURM_CPUS_PER_TASK sh -c '{show}' - c",
        ]
    )
    job = submit(slurm_bed, "-N1", "-n1", "-c2", "-o", str(out), "--wrap", script)
    wait(slurm_bed, lambda: job not in slurm_bed.jobs(), "the job's end")
    assert lines_of(out) == [
        "exact on_node=1 per_task=2",
        "srun_cpus_per_task on_node=2 per_task=2",
        "c on_node=2 per_task=2",
    ]


def cpu_count_of(allowed: str) -> int:
    """How many CPUs a Cpus_allowed_list names ("0", "0-1", "0,2-3")."""
    count = 0
    for part in allowed.split(","):
        first, _, last = part.partition("-")
        count += int(last or first) - int(first) + 1
    return count


def test_with_task_affinity_an_exact_step_is_pinned_to_one_core_unless_told_its_cpus(
    make_slurm_bed: MakeSlurmBed, tmp_path: Path
) -> None:
    """The 22.05 pitfall where it bites: with task/affinity (a real cluster's binding), a step of an
    `sbatch -c2` job that does not say -c runs on one core."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU here: a task cannot be pinned to fewer")
    bed = make_slurm_bed(n=1, task_plugin="task/affinity")
    out = tmp_path / "out"
    show = "echo \"$1 $(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)\""
    script = "\n".join(
        [
            f"srun -n1 --exact sh -c '{show}' - exact",
            f"srun -n1 --exact -c $SLURM_CPUS_PER_TASK sh -c '{show}' - c",
        ]
    )
    job = submit(bed, "-N1", "-n1", "-c2", "-o", str(out), "--wrap", script)
    wait(bed, lambda: job not in bed.jobs(), "the job's end")
    pinned = dict(line.split() for line in lines_of(out))
    assert {k: cpu_count_of(v) for k, v in pinned.items()} == {"exact": 1, "c": 2}, pinned
