"""Benchmarks: orch against its peers, side by side in one invocation, reported as ratios.

Never run by `make test`; `make bench` runs them all and writes `bench/results/*.json`,
`bench/results/summary.md` and `bench/results/summary.png`.
"""
