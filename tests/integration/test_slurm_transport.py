"""`transport: slurm`'s verbs against a real Slurm (the loopback bed, tests/slurm_bed.py): an
allocation held as `orch up` holds it, every command an srun step on one node: argv and env byte
for byte, exit codes, timeouts, a stream that ends with its step, `pipe` and the tar `copy_tree`,
the warning signal ignored by the step's command, an outer step's SLURM_* kept out (bug 14298),
and a node of an allocation that has ended as one that is gone."""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.config import inventory
from orchestrator.errors import RemoteCommandFailed, TransportError
from orchestrator.transport import Cluster, SlurmTransport
from orchestrator.transport.allocation import SlurmHold
from tests.slurm_bed import SlurmBed

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]

ECHO = [sys.executable, "-c", "import json,os,sys; print(json.dumps([sys.argv[1:], os.environ.get('X')]))"]


@pytest.fixture
def held(slurm_bed: SlurmBed, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[SlurmHold]:
    """Two nodes held as `orch up` holds them (sbatch), given back at the end."""
    for key, value in slurm_bed.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    path = tmp_path / "t.yaml"
    path.write_text(f"name: t\ntransport: slurm\nslurm: {{nodes: 2}}\njob: {{python: {sys.executable}}}\n")
    hold = SlurmTransport.hold(inventory.load(path))
    assert isinstance(hold, SlurmHold)
    try:
        yield hold
    finally:
        hold.release()


def test_argv_and_env_arrive_byte_for_byte_and_a_failure_is_a_value(held: SlurmHold) -> None:
    inv = held.inventory
    assert [n.name for n in inv.nodes] == ["sn1", "sn2"] and {n.addr for n in inv.nodes} == {"localhost"}
    with Cluster(inv) as cluster:
        odd = ["a b", "$(id)", "'q'", 'd"q', "x;y", "ünï", "--flag=1", ""]
        r = cluster["sn2"].run([*ECHO, *odd], env={"X": "v'1 $HOME"}).check()
        assert json.loads(r.stdout) == [odd, "v'1 $HOME"]
        bad = cluster["sn1"].run(["sh", "-c", "echo oops >&2; exit 3"])
        assert (bad.ok, bad.exit_code, bad.stderr.strip()) == (False, 3, "oops")
        with pytest.raises(RemoteCommandFailed, match="exited 3"):
            bad.check()
        home = cluster["sn1"].run(["pwd"]).check().stdout.strip()
        assert home == os.path.expanduser("~")  # a step starts at home, as an SSH login does
        with pytest.raises(TransportError) as info:
            cluster["sn2"].run(["sleep", "30"], timeout=1)
        assert info.value.kind == "timeout"


def test_the_step_is_on_its_node_with_the_allocations_cpus_and_no_outer_steps_variables(
    held: SlurmHold, monkeypatch: pytest.MonkeyPatch
) -> None:
    """orch run from a one-task step of another allocation: its SLURM_NTASKS/SLURM_JOB_NODELIST would
    shrink every step (SchedMD bug 14298); orch's steps say their job, nodes and CPUs themselves."""
    outer = {"SLURM_JOB_ID": "999", "SLURM_NTASKS": "1", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "sn4"}
    for key, value in outer.items():
        monkeypatch.setenv(key, value)
    cpus = held.alloc.cpus["sn2"]
    with Cluster(held.inventory) as cluster:
        said = cluster["sn2"].run(["sh", "-c", "echo $SLURMD_NODENAME $SLURM_JOB_ID $SLURM_CPUS_ON_NODE"]).check()
    assert said.stdout.split() == ["sn2", held.alloc.job_id, str(cpus)]


def test_a_stream_ends_with_its_step_and_the_warning_signal_does_not_end_it(
    held: SlurmHold, slurm_bed: SlurmBed
) -> None:
    marker = f"orch-stream-{uuid.uuid4().hex[:8]}"
    with Cluster(held.inventory) as cluster:
        p = cluster["sn1"].popen(["sh", "-c", f"echo {marker}; while true; do sleep 0.1; echo tick; done"])
        assert next(p.lines()).strip() == marker.encode()
        slurm_bed.run("scancel", "--signal=USR2", held.alloc.job_id)  # every step's every process
        assert [next(p.lines()) for _ in range(3)] == [b"tick\n"] * 3 and p.poll() is None
        assert slurm_bed.job_processes(marker)
        p.close()
        slurm_bed.wait_for(lambda: not slurm_bed.job_processes(marker), 15, "the stream's step gone")


def test_pipe_and_the_tar_copy_reach_the_node(held: SlurmHold, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f.txt").write_text("hello\n")
    dest = tmp_path / "dest"
    with Cluster(held.inventory) as cluster:
        t = cluster["sn2"]
        got = t.pipe(["python3", "-c", "import sys; print(len(sys.stdin.buffer.read()))"], b"x" * 3_000_000)
        assert (got.exit_code, got.stdout) == (0, "3000000\n")
        sent = t.copy_tree([str(src)], str(dest))
        assert sent.files == 1 and (dest / str(src).lstrip("/") / "sub" / "f.txt").read_text() == "hello\n"


def test_a_node_of_an_allocation_that_has_ended_is_gone_in_sruns_words(held: SlurmHold) -> None:
    """Not unreachable: Slurm ended every process of the allocation (a stop there has nothing left)."""
    inv = held.inventory
    held.release()
    with Cluster(inv) as cluster, pytest.raises(TransportError) as info:
        cluster["sn1"].run(["true"])
    assert info.value.kind == "gone" and "the allocation has ended (srun: " in str(info.value)
