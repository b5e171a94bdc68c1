"""Check fan-out: `orch check` against pdsh and a serial ssh loop, on N real sshd nodes (loopback).

Sides, run alternately in one invocation for N in {1, 4, 16, 32}:
- `orch check` (every check) and `orch check --only ssh,clock,timezone`, as the CLI a user runs;
- `pdsh` (Debian's package, fanout 32 as orch) running a bare `date`, and running the equivalent
  probe commands (clock, zone, NCCL env, interfaces, python and torch versions) over OpenSSH;
- a serial `ssh` loop running `date` (how the field guide's launch script reaches its nodes).
Goals: full `orch check` at N = 32 no slower than pdsh's bare `date`; orch(32) / orch(1) <= 3.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import REPO, side_by_side, write

sys.path.insert(0, str(REPO))

ORCH = [sys.executable, "-m", "orchestrator"]
# The facts of a full `orch check`, gathered the cheapest way a shell one-liner can (versions from
# package metadata, as orch's probe does, not `import torch`).
PROBE_EQUIVALENT = ("date +%s.%N; date '+%Z %z'; cat /etc/timezone 2>/dev/null; env | grep -E '^(NCCL|GLOO|TORCH_NCCL)_';"
                    " ip -4 -o addr show; ls /sys/class/infiniband 2>/dev/null; nvidia-smi -L 2>/dev/null;"
                    f" {sys.executable} -c 'import sys, importlib.metadata as m; "
                    "print(sys.version, m.version(\"torch\"), m.version(\"ultralytics\"))'")


def ssh_config(cluster: Any, path: Path) -> Path:
    """An OpenSSH client config naming every test node, for pdsh and the ssh loop."""
    lines = []
    for n in cluster.nodes:
        lines += [f"Host {n.name}", f"  HostName {n.host}", f"  Port {n.port}", "  User root",
                  f"  IdentityFile {cluster.client_key}", f"  UserKnownHostsFile {cluster.known_hosts}",
                  "  StrictHostKeyChecking yes", "  BatchMode yes", "  LogLevel ERROR", ""]
    path.write_text("\n".join(lines))
    return path


def run(argv: list[str], env: dict[str, str] | None = None) -> None:
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, timeout=300, check=False)


def measure(n: int, keys: Any, reps: int, workdir: Path) -> dict[str, Any]:
    from tests.cluster import TestCluster

    with TestCluster(keys, n=n, mode="loopback", root=workdir / f"n{n}") as cluster:
        inv = cluster.write_inventory(job={"workdir": "/tmp", "nproc_per_node": 1})
        cfg = ssh_config(cluster, workdir / f"ssh_config_{n}")
        hosts = ",".join(node.name for node in cluster.nodes)
        env = {**os.environ, "PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS": f"-F {cfg} %h",
               "ORCH_HOME": str(workdir / "orch-home")}
        sides = {
            "orch_check_full": lambda: run([*ORCH, "check", str(inv), "--json"], env),
            "orch_check_ssh_clock_tz": lambda: run([*ORCH, "check", str(inv), "--json", "--only", "ssh,clock,timezone"], env),
            "pdsh_date": lambda: run(["pdsh", "-f", "32", "-w", hosts, "date"], env),
            "pdsh_probe_equivalent": lambda: run(["pdsh", "-f", "32", "-w", hosts, PROBE_EQUIVALENT], env),
            "ssh_loop_date": lambda: run(["sh", "-c", f"for h in {' '.join(x.name for x in cluster.nodes)}; "
                                                      f"do ssh -F {cfg} $h date; done"], env),
        }
        return side_by_side(sides, reps=reps, warmup=1)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="1,4,16,32")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="N in {1, 4}, one repetition")
    args = ap.parse_args(argv)
    if shutil.which("pdsh") is None:
        raise SystemExit("check_fanout: pdsh is not installed (apt-get install pdsh)")
    sizes = [1, 4] if args.quick else [int(s) for s in args.sizes.split(",")]
    reps = 1 if args.quick else args.reps
    from tests.cluster import KeyStore

    by_n: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        keys = KeyStore(Path(tmp) / "keys")
        for n in sizes:
            by_n[n] = measure(n, keys, reps, Path(tmp))
            print(f"check_fanout N={n:3d}: " + "  ".join(f"{k} {v['median_s']:.2f}s" for k, v in by_n[n].items()),
                  flush=True)
    big, one = max(sizes), min(sizes)
    full_big = by_n[big]["orch_check_full"]["median_s"]
    pdsh_big = by_n[big]["pdsh_date"]["median_s"]
    growth = full_big / by_n[one]["orch_check_full"]["median_s"]
    summary = [
        {"what": f"orch check (all checks) vs pdsh date, N={big}", "orch": full_big, "peer": pdsh_big,
         "ratio": full_big / pdsh_big, "goal": "<= 1.0", "met": full_big <= pdsh_big},
        {"what": f"orch check (all checks) vs pdsh running the equivalent probe commands, N={big}",
         "orch": full_big, "peer": by_n[big]["pdsh_probe_equivalent"]["median_s"],
         "ratio": full_big / by_n[big]["pdsh_probe_equivalent"]["median_s"], "goal": "report", "met": None},
        {"what": f"orch check --only ssh,clock,timezone vs pdsh date, N={big}",
         "orch": by_n[big]["orch_check_ssh_clock_tz"]["median_s"], "peer": pdsh_big,
         "ratio": by_n[big]["orch_check_ssh_clock_tz"]["median_s"] / pdsh_big, "goal": "report", "met": None},
        {"what": f"orch check vs serial ssh loop, N={big}", "orch": full_big,
         "peer": by_n[big]["ssh_loop_date"]["median_s"], "ratio": full_big / by_n[big]["ssh_loop_date"]["median_s"],
         "goal": "report", "met": None},
        {"what": f"orch check N={big} / N={one}", "orch": full_big, "peer": by_n[one]["orch_check_full"]["median_s"],
         "ratio": growth, "goal": "<= 3", "met": growth <= 3},
    ]
    result = {"sizes": sizes, "reps": reps, "by_n": {str(k): v for k, v in by_n.items()}, "summary": summary}
    write("check_fanout", result)
    return result


if __name__ == "__main__":
    main()
