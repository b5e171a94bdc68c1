"""`transport: slurm`, what needs no Slurm: the lines orch runs (golden, per release where Slurm
changed under them), the environment they run in, the allocation's keys and rules, and what
`scontrol` says read back. The same verbs against a real Slurm: tests/integration/test_slurm_up.py."""

from __future__ import annotations

import time

import pytest

from orchestrator.config import inventory
from orchestrator.config.inventory import Allocation, with_allocation
from orchestrator.config.plan import job_command, torchrun_argv
from orchestrator.errors import InventoryError, OrchError
from orchestrator.node import unpacking
from orchestrator.transport import allocation
from orchestrator.transport.allocation import (
    STEP_PREFIX,
    Version,
    client_env,
    count_cpus,
    ended_words,
    ending,
    sbatch_argv,
    step_argv,
    step_env,
)
from orchestrator.transport.slurm import srun_failure

V20_02, V20_11, V22_05, V23_02, V23_11 = (
    Version(20, 2),
    Version(20, 11),
    Version(22, 5),
    Version(23, 2),
    Version(23, 11),
)


def slurm(text: str = "slurm: {nodes: 4}\n") -> inventory.Inventory:
    return inventory.parse("name: lab\ntransport: slurm\n" + text, "lab.yaml")


# ----------------------------------------------------------------------------- the lines (golden)

STEP_2211 = [
    "srun",
    "--jobid=12",
    "--overlap",
    "--nodes=2",
    "--ntasks-per-node=1",
    "--cpus-per-task=8",
    "--kill-on-bad-exit=1",
    "--nodelist=gpu1,gpu2",
    "--gpus-per-node=4",
    "--unbuffered",
    "--quiet",
]


@pytest.mark.parametrize("v", [V20_11, V22_05, V23_02, V23_11], ids=str)
def test_every_step_says_its_job_nodes_cpus_and_fails_fast_on_every_release_with_overlap(v: Version) -> None:
    assert step_argv(v, "12", ["gpu1", "gpu2"], 8, 4) == STEP_2211


def test_before_20_11_steps_share_cpus_and_srun_knows_no_overlap() -> None:
    assert step_argv(V20_02, "12", ["gpu1", "gpu2"], 8, 4) == [a for a in STEP_2211 if a != "--overlap"]


def test_the_launch_step_takes_the_nodes_memory_and_labels_its_lines() -> None:
    assert step_argv(V22_05, "3", ["sn1"], 2, None, label=True, whole=True) == [
        "srun",
        "--jobid=3",
        "--overlap",
        "--nodes=1",
        "--ntasks-per-node=1",
        "--cpus-per-task=2",
        "--kill-on-bad-exit=1",
        "--nodelist=sn1",
        "--mem=0",
        "--unbuffered",
        "--quiet",
        "--label",
    ]


OUTER = {
    "PATH": "/usr/bin",
    "SLURM_CONF": "/etc/slurm/bed.conf",
    "SLURM_JOB_ID": "9",
    "SLURM_NTASKS": "1",
    "SLURM_NPROCS": "1",
    "SLURM_JOB_NODELIST": "sn1",
    "SLURM_CPUS_PER_TASK": "4",
    "SRUN_CPUS_PER_TASK": "4",
    "SALLOC_PARTITION": "x",
    "SBATCH_EXCLUSIVE": "1",
}


def test_no_variable_of_an_outer_step_reaches_srun_but_the_clusters_config() -> None:
    """SchedMD bug 14298: a 1-task step's SLURM_NTASKS makes `srun -N4` run on one node; an outer
    SRUN_/SALLOC_/SBATCH_ variable is an option nobody wrote on this line."""
    assert client_env(OUTER) == {"PATH": "/usr/bin", "SLURM_CONF": "/etc/slurm/bed.conf"}


@pytest.mark.parametrize(
    ("v", "extra"),
    [(V20_11, {}), (V22_05, {"SRUN_CPUS_PER_TASK": "8"}), (V23_02, {"SRUN_CPUS_PER_TASK": "8"}), (V23_11, {})],
    ids=str,
)
def test_releases_that_ignore_slurm_cpus_per_task_get_the_steps_cpus_as_srun_cpus_per_task(
    v: Version, extra: dict[str, str]
) -> None:
    """22.05 to 23.02: a job's own srun reads SRUN_CPUS_PER_TASK, not SLURM_CPUS_PER_TASK (each of
    its tasks would get one CPU); 23.11 went back."""
    assert step_env(v, 8, OUTER) == {"PATH": "/usr/bin", "SLURM_CONF": "/etc/slurm/bed.conf", **extra}


def test_the_releases_are_read_as_srun_prints_them() -> None:
    assert Version.parse("slurm-wlm 22.05.8\n") == V22_05 and str(V22_05) == "22.05"
    assert Version.parse("slurm 23.11.4") == V23_11 > V23_02
    assert (V20_02.overlap, V20_11.overlap) == (False, True)
    assert [v.reads_cpus_per_task for v in (V20_11, V22_05, V23_02, V23_11)] == [True, False, False, True]


def test_a_steps_shell_ignores_the_warning_signal_and_starts_at_home() -> None:
    assert STEP_PREFIX == "trap '' USR2; cd \"$HOME\" 2>/dev/null || cd /; "


def test_sbatch_holds_whole_nodes_with_the_warning_signal_and_requeue() -> None:
    assert sbatch_argv(slurm().slurm, "lab") == [  # type: ignore[arg-type]
        "sbatch",
        "--parsable",
        "--job-name=orch-lab",
        "--nodes=4",
        "--exclusive",
        "--signal=USR2@120",
        "--requeue",
        "--output=/dev/null",
        "--chdir=/",
        "--wrap",
        "exec sleep infinity",
    ]


def test_the_users_keys_and_options_go_on_the_sbatch_line_and_replace_orchs_defaults() -> None:
    inv = slurm(
        "slurm:\n  nodes: 2\n  partition: gpu\n  time: '72:00:00'\n  gpus_per_node: 8\n"
        "  options: [--cpus-per-task=32, --signal=USR2@600, -Jmine, --account=lab]\n"
    )
    assert inv.slurm is not None
    assert sbatch_argv(inv.slurm, "lab") == [
        "sbatch",
        "--parsable",
        "--nodes=2",
        "--partition=gpu",
        "--time=72:00:00",
        "--gpus-per-node=8",
        "--requeue",
        "--output=/dev/null",
        "--chdir=/",
        "--cpus-per-task=32",
        "--signal=USR2@600",
        "-Jmine",
        "--account=lab",
        "--wrap",
        "exec sleep infinity",
    ]


def test_no_allocation_is_asked_for_without_a_node_count() -> None:
    inv = slurm("slurm: {partition: gpu}\n")
    with pytest.raises(OrchError, match="slurm.nodes is not set and no allocation holds this process"):
        sbatch_argv(inv.slurm, "lab")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- keys and rules


@pytest.mark.parametrize(
    ("option", "why"),
    [
        ("--ntasks-per-node=8", "one torchrun per node"),
        ("-n8", "one torchrun per node"),
        ("--gpus=8", "per job, not per node"),
        ("--gpus-per-task=1", "no peer-to-peer"),
        ("--export=NONE", "would drop the rest"),
        ("--signal=B:USR2@60", "B: would signal only the holding batch script"),
        ("--signal=USR1@60", "must be USR2"),
        ("-N2", "slurm.nodes"),
        ("--time=10", "slurm.time"),
        ("exclusive", "starts with -"),
    ],
)
def test_an_option_that_breaks_the_run_or_says_a_key_twice_is_refused_with_why(option: str, why: str) -> None:
    with pytest.raises(InventoryError, match=why) as info:
        slurm(f"slurm:\n  nodes: 2\n  options: [{option}]\n")
    assert "lab.yaml:5: [slurm.options[0]]" in str(info.value)


def test_a_slurm_inventory_has_no_nodes_until_its_allocation_is_known() -> None:
    inv = slurm()
    assert inv.nodes == () and inv.slurm is not None and inv.slurm.nodes == 4
    with pytest.raises(OrchError, match="the nodes come from a Slurm allocation"):
        _ = inv.master


ALLOC = Allocation(
    "12", ("sn1", "sn2", "sn3"), {"sn1": "node-a", "sn2": "node-b"}, {"sn1": 8, "sn2": 8, "sn3": 8}, True
)


def test_the_allocations_order_is_the_node_rank_order_and_its_hostnames_the_addresses() -> None:
    inv = with_allocation(slurm("slurm: {nodes: 3, gpus_per_node: 2}\nenv: {NCCL_DEBUG: INFO}\n"), ALLOC)
    assert [n.name for n in inv.nodes] == ["sn1", "sn2", "sn3"] and inv.master.name == "sn1"
    assert [n.addr for n in inv.nodes] == ["node-a", "node-b", "sn3"]  # sn3: Slurm said no hostname
    assert {(n.gpus, n.nproc_per_node, n.env["NCCL_DEBUG"]) for n in inv.nodes} == {(2, 2, "INFO")}
    assert inv.allocation is ALLOC


def test_master_node_moves_that_node_first_and_must_be_allocated() -> None:
    inv = with_allocation(slurm("slurm: {nodes: 3}\nmaster: {node: sn2}\n"), ALLOC)
    assert [n.name for n in inv.nodes] == ["sn2", "sn1", "sn3"]
    with pytest.raises(OrchError, match="master.node gpu9 is not a node of Slurm job 12"):
        with_allocation(slurm("slurm: {nodes: 3}\nmaster: {node: gpu9}\n"), ALLOC)


def test_a_node_count_the_allocation_does_not_have_is_refused() -> None:
    with pytest.raises(OrchError, match="slurm.nodes is 4, but Slurm job 12 holds 3 node"):
        with_allocation(slurm(), ALLOC)


def test_the_allocation_survives_run_json() -> None:
    assert Allocation.from_json(ALLOC.to_json()) == ALLOC


CONTAINER = "job: {container: {runtime: RUNTIME, image: img:1, python: /opt/py/bin/python}}\n"


@pytest.mark.parametrize("runtime", ["podman", "docker", "apptainer"])
def test_in_a_container_the_job_and_the_probe_run_under_warned_where_a_warning_signal_may_come(runtime: str) -> None:
    """The runtime's client forwards Slurm's warning into the container, to torchrun alone, which
    would die of it: `node/warned.py` runs the job with it ignored and passes it on to the ranks."""
    job = CONTAINER.replace("RUNTIME", runtime).replace("img:1", "/img/one.sif" if runtime == "apptainer" else "img:1")
    inv = with_allocation(slurm("slurm: {nodes: 3}\n" + job), ALLOC)
    node = inv.nodes[0]
    warned = ["/opt/py/bin/python", "-c", unpacking("warned")]
    argv = torchrun_argv(inv, node, 0, "r1", "n1")
    at = argv.index("/opt/py/bin/python")
    assert argv[at : at + 5] == [*warned, "-m", "torch.distributed.run"]
    assert job_command(inv, node, [], run_id="r1", role="probe")[-3:] == warned  # the probe appends its -c
    ssh = inventory.parse("name: lab\nnodes: [{host: 10.0.0.1}]\n" + job, "lab.yaml")
    argv = torchrun_argv(ssh, ssh.nodes[0], 0, "r1", "n1")
    at = argv.index("/opt/py/bin/python")
    assert argv[at : at + 3] == ["/opt/py/bin/python", "-m", "torch.distributed.run"]  # no warning over SSH


# ----------------------------------------------------------------------------- what Slurm says, read back


def test_srun_that_never_ran_the_step_is_an_unreached_node_and_a_commands_exit_1_is_not() -> None:
    busy = "srun: error: Unable to create step for job 7: More processors requested than permitted"
    err = srun_failure("sn2", 1, busy)
    assert err is not None and err.kind == "unreachable" and "More processors requested" in str(err)
    ended = "srun: error: Unable to confirm allocation for job 7: Invalid job id specified\nsrun: Check SLURM_JOB_ID"
    err = srun_failure("sn2", 1, ended)
    assert err is not None and err.kind == "gone" and "the allocation has ended" in str(err)
    assert srun_failure("sn2", 1, "grep: nothing found\n") is None
    assert srun_failure("sn2", 0, ended) is None


def test_cpu_ids_count_as_scontrol_lists_them() -> None:
    assert [count_cpus(x) for x in ("0", "0-1", "0-3,8,10-11")] == [1, 2, 7]


def test_why_an_allocation_went_away_is_said_in_words() -> None:
    assert "reached its time limit (00:01:00)" in str(
        ended_words({"JobState": "TIMEOUT", "TimeLimit": "00:01:00"}, "4", 0)
    )
    assert "was requeued" in str(ended_words({"JobState": "PENDING", "Restarts": "1"}, "4", 0))
    assert (
        ended_words({"JobState": "RUNNING", "Restarts": "0", "EndTime": "Unknown", "PreemptTime": "None"}, "4", 0)
        is None
    )
    assert ended_words(None, "4", 0) == "Slurm job 4 is gone"
    fields = {"JobId": "4", "JobState": "RUNNING", "PreemptTime": "2026-12-07T03:41:47", "EndTime": "Unknown"}
    assert ending(fields) == "Slurm job 4 is being preempted"
    near = {"JobId": "4", "PreemptTime": "None", "EndTime": "2026-12-07T03:41:47", "TimeLimit": "00:05:00"}
    end = time.mktime(time.strptime(near["EndTime"], "%Y-%m-%dT%H:%M:%S"))
    assert "reaches its time limit (00:05:00)" in str(ending(near, now=end - 100))
    assert ending(near, now=end - 3600) is None


# ----------------------------------------------------------------------------- a retry's allocation


class FakeSlurm:
    """`scontrol show job` answers in turn (the last one repeated), and what `renew` asked of Slurm."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *answers: dict[str, str] | None) -> None:
        self.answers = list(answers)
        self.did: list[str] = []
        m = allocation
        monkeypatch.setattr(m, "job_fields", self.fields)
        monkeypatch.setattr(m, "wait_running", lambda job, say=None, sleep=None: self.did.append(f"wait {job}"))
        monkeypatch.setattr(m, "cancel", lambda job, wait=0: self.did.append(f"cancel {job}"))
        monkeypatch.setattr(m, "submit", lambda inv: self.did.append("submit") or "13")
        monkeypatch.setattr(m, "read_allocation", lambda job, created: Allocation(job, ("sn1", "sn2"), {}, {}, created))
        monkeypatch.setattr(m, "SETTLE_POLL_S", 0)

    def fields(self, job: str) -> dict[str, str] | None:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def job(state: str, restarts: int = 0, reason: str = "None", preempted: str = "None") -> dict[str, str]:
    return {"JobId": "12", "JobState": state, "Reason": reason, "Restarts": str(restarts), "PreemptTime": preempted}


def test_a_retry_waits_through_a_requeue_s_completing_and_runs_in_the_requeued_allocation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`scontrol requeue` (or a preemption's) shows the job COMPLETING, its Restarts counted, for as
    long as its nodes' cleanup takes, then PENDING (BeginTime): the retry waits for it to run again,
    never asks for a second allocation beside it."""
    running = job("RUNNING")
    slurm = FakeSlurm(
        monkeypatch,
        running,  # SlurmHold() reads Restarts
        job("RUNNING", preempted="2026-01-01T00:00:00"),
        job("COMPLETING", 1),
        job("COMPLETING", 1),
        job("PENDING", 1, "BeginTime"),
        running,
    )
    hold = allocation.SlurmHold(slurm_inv(), Allocation("12", ("sn1", "sn2"), {}, {}, True))
    inv = hold.renew()
    assert slurm.did == ["wait 12"] and inv.allocation is not None and inv.allocation.job_id == "12"


def test_a_retry_after_the_allocation_ended_cancels_it_whatever_its_state_and_asks_for_a_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slurm = FakeSlurm(monkeypatch, job("RUNNING"), job("COMPLETING", 0, "TimeLimit"), job("TIMEOUT", 0, "TimeLimit"))
    hold = allocation.SlurmHold(slurm_inv(), Allocation("12", ("sn1", "sn2"), {}, {}, True))
    inv = hold.renew()
    assert slurm.did == ["cancel 12", "submit", "wait 13"]
    assert inv.allocation is not None and inv.allocation.job_id == "13"


@pytest.mark.parametrize(
    ("settled", "words"),
    [
        (job("TIMEOUT", 0, "TimeLimit"), "Slurm job 12 reached its time limit"),
        (job("CANCELLED"), "Slurm job 12 ended: CANCELLED"),
        (job("PENDING", 1, "BeginTime"), "Slurm job 12 was requeued"),
    ],
    ids=["time-limit", "cancelled", "requeued"],
)
def test_why_the_allocation_ended_is_read_once_its_nodes_are_cleaned_up(
    monkeypatch: pytest.MonkeyPatch, settled: dict[str, str], words: str
) -> None:
    """A node's step fails the moment Slurm ends the allocation, while the job is still COMPLETING
    (its state says nothing of why yet): the words wait for the state it settles in."""
    restarts = int(settled["Restarts"])
    slurm = FakeSlurm(monkeypatch, job("RUNNING"), job("COMPLETING", restarts), job("COMPLETING", restarts), settled)
    hold = allocation.SlurmHold(slurm_inv(), Allocation("12", ("sn1", "sn2"), {}, {}, True))
    said = hold.ended()
    assert str(said).startswith(words) and slurm.did == [], said  # only read, nothing asked of Slurm


def slurm_inv() -> inventory.Inventory:
    return slurm("slurm: {nodes: 2}\n")
