"""The fabric job's pure helpers (orchestrator/node/jobs/allreduce.py): sizes, arguments, the pair
schedule, the gloo interface guard. Its runs under torchrun: tests/integration/test_fabric_job_torchrun.py."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.node.jobs import allreduce as job

MB = 1 << 20


def test_sweep_sizes() -> None:
    assert job.sweep_sizes(MB, 256 * MB) == [MB, 4 * MB, 16 * MB, 64 * MB, 256 * MB]
    assert job.sweep_sizes(MB, 64_000_000) == [MB, 4 * MB, 16 * MB]  # 64 MiB > 64e6
    assert job.sweep_sizes(MB, 8_000_000) == [MB, 4 * MB]
    assert job.sweep_sizes(1000, 1000) == [1000]
    with pytest.raises(ValueError, match="bad sweep"):
        job.sweep_sizes(MB, MB - 1)


@pytest.mark.parametrize(
    ("text", "value"),
    [("1048576", MB), ("1M", MB), ("64M", 64 * MB), ("1G", 1 << 30), ("512k", 512 << 10), ("0.5M", MB // 2)],
)
def test_parse_size(text: str, value: int) -> None:
    assert job.parse_size(text) == value


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in (
        (["--max-bytes", "lots"], "not a size: 'lots'"),
        (["--min-bytes", "4M", "--max-bytes", "1M"], "--max-bytes 1048576 is below --min-bytes 4194304"),
        (["--link-passes", "0"], "--link-passes, --link-reps and --link-trials must be at least 1"),
        (["--recheck-passes", "-1"], "--recheck-passes at least 0"),
    ):
        with pytest.raises(SystemExit) as exc:
            job.parse_args(argv)
        assert exc.value.code == 2
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("n", range(2, 10))
def test_round_robin_pairs_every_node_pair_once_in_disjoint_rounds(n: int) -> None:
    rounds = job.round_robin(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    seen = [pair for r in rounds for pair in r]
    assert sorted(seen) == sorted(itertools.combinations(range(n), 2))
    for r in rounds:
        nodes = [x for pair in r for x in pair]
        assert len(nodes) == len(set(nodes))  # nobody is in two pairs of one round
    assert job.round_robin(1) == []


def test_gloo_interface_problem_is_caught_before_a_100_s_connect_timeout() -> None:
    remote = {"GROUP_WORLD_SIZE": "4", "MASTER_ADDR": "198.18.5.1"}
    problem = job.gloo_interface_problem("no-such-host.invalid", remote)
    assert problem is not None
    assert "hostname 'no-such-host.invalid' resolves to nothing" in problem and "GLOO_SOCKET_IFNAME" in problem
    assert "localhost" in (job.gloo_interface_problem("localhost", remote) or "")
    assert job.gloo_interface_problem("no-such-host.invalid", {**remote, "GLOO_SOCKET_IFNAME": "eth0"}) is None
    assert job.gloo_interface_problem("no-such-host.invalid", {**remote, "MASTER_ADDR": "127.0.0.1"}) is None
    assert job.gloo_interface_problem("no-such-host.invalid", {**remote, "GROUP_WORLD_SIZE": "1"}) is None
