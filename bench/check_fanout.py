"""Check fan-out: `orch check` and `orch exec` against pdsh and a serial ssh loop, on N real sshd
nodes (loopback).

Sides, run alternately in one invocation for N in {1, 4, 16, 32}:
- `orch check` (every check) and `orch check --only ssh,clock,timezone`, as the CLI a user runs;
- `orch exec -- date`: the same command as pdsh's, through orch's transport, output live as `node: line`, as
  pdsh prints it;
- `pdsh` (Debian's package, fanout 32 as orch) running a bare `date`, and running the equivalent
  probe commands (clock, zone, NCCL env, interfaces, python and torch versions) over OpenSSH;
- a serial `ssh` loop running `date` (how the field guide's launch script reaches its nodes);
- the floor of any one-command-per-node design on orch's own transport: Python start, inventory,
  SSH connect and one `true` per node (`--floor INVENTORY`, run as its own process like orch).
Then one in-process `orch check` per N, timed phase by phase (connect, command sent, facts and
clock ping back, reachability, close), with the controller's CPU and, where cgroup v1 cpuacct is
writable (root), the CPU every node spent (sshd, login shell, probe) — on a machine whose cores
the nodes share, that CPU is the wall time.
Goals: full `orch check` at N = 32 no slower than pdsh's bare `date`; orch(32) / orch(1) <= 3;
`orch exec -- date` at N = 32 no slower than `pdsh date`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, side_by_side, write

sys.path.insert(0, str(REPO))

ORCH = [sys.executable, "-m", "orchestrator"]
SIDES = (
    "orch_check_full",
    "orch_check_ssh_clock_tz",
    "orch_exec_date",
    "pdsh_date",
    "pdsh_probe_equivalent",
    "ssh_loop_date",
    "orch_transport_true",
)
# The facts of a full `orch check`, gathered the cheapest way a shell one-liner can (versions from
# package metadata, as orch's probe does, not `import torch`).
PROBE_EQUIVALENT = (
    "date +%s.%N; date '+%Z %z'; cat /etc/timezone 2>/dev/null; env | grep -E '^(NCCL|GLOO|TORCH_NCCL)_';"
    " ip -4 -o addr show; ls /sys/class/infiniband 2>/dev/null; nvidia-smi -L 2>/dev/null;"
    f" {sys.executable} -c 'import sys, importlib.metadata as m; "
    'print(sys.version, m.version("torch"), m.version("ultralytics"))\''
)


def ssh_config(cluster: Any, path: Path) -> Path:
    """An OpenSSH client config naming every test node, for pdsh and the ssh loop."""
    lines = []
    for n in cluster.nodes:
        lines += [
            f"Host {n.name}",
            f"  HostName {n.host}",
            f"  Port {n.port}",
            "  User root",
            f"  IdentityFile {cluster.client_key}",
            f"  UserKnownHostsFile {cluster.known_hosts}",
            "  StrictHostKeyChecking yes",
            "  BatchMode yes",
            "  LogLevel ERROR",
            "",
        ]
    path.write_text("\n".join(lines))
    return path


def run(argv: list[str], env: dict[str, str] | None = None) -> None:
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, timeout=300, check=False)


def exec_answers(inv: Path, n: int, env: dict[str, str]) -> None:
    """`orch exec -- date` must reach every node, or its time means nothing."""
    proc = subprocess.run(
        [*ORCH, "exec", str(inv), "--json", "--", "date"], env=env, capture_output=True, text=True, timeout=300
    )
    nodes = json.loads(proc.stdout)["nodes"] if proc.stdout else []
    ok = [x for x in nodes if x["exit_code"] == 0 and x["stdout"].strip()]
    if proc.returncode != 0 or len(ok) != n:
        raise SystemExit(
            f"check_fanout: orch exec -- date answered on {len(ok)} of {n} nodes "
            f"(exit {proc.returncode}): {proc.stderr[-500:]}"
        )


def floor(inventory: str) -> None:
    """Python start, inventory, connect and one `true` per node over orch's transport, in parallel."""
    from orchestrator.config.inventory import load
    from orchestrator.transport import Cluster

    inv = load(inventory)
    with Cluster(inv) as cluster:
        done = cluster.fan_out(lambda t: t.run(["true"]).check())
    bad = [f"{k}: {v}" for k, v in done.failed.items()]
    if bad:
        raise SystemExit("floor: " + "; ".join(bad))


class NodeCpu:
    """CPU seconds of every process the test nodes' sshd start (cgroup v1 cpuacct), when writable."""

    ROOT = Path("/sys/fs/cgroup/cpuacct")

    def __init__(self, cluster: Any) -> None:
        self.path: Path | None = self.ROOT / f"orch-bench-{os.getpid()}"
        try:
            self.path.mkdir(exist_ok=True)
            for node in cluster.nodes:
                (self.path / "cgroup.procs").write_text(str(node.sshd.pid))
        except (OSError, AttributeError):
            self.path = None

    def seconds(self) -> float | None:
        return int((self.path / "cpuacct.usage").read_text()) / 1e9 if self.path else None

    def remove(self) -> None:
        """Move the node processes back to the root group and remove ours."""
        if self.path is None:
            return
        try:
            for pid in (self.path / "cgroup.procs").read_text().split():
                try:
                    (self.ROOT / "cgroup.procs").write_text(pid)
                except OSError:  # exited meanwhile
                    pass
            self.path.rmdir()
        except OSError:
            pass


def phases(inv_path: Path, node_cpu: NodeCpu, reps: int) -> dict[str, Any]:
    """One in-process `orch check` (all checks) per rep, timed phase by phase; medians."""
    from orchestrator.config.inventory import load
    from orchestrator.contract import CHECK_NAMES
    from orchestrator.preflight import checks, facts
    from orchestrator.transport import Cluster

    rows: list[dict[str, float | None]] = []
    for _ in range(reps):
        inv = load(inv_path)
        marks: dict[str, list[float]] = {"probed": [], "reach": []}

        def progress(label: str, done: int, total: int, marks: dict[str, list[float]] = marks) -> None:
            now = time.perf_counter()
            if label.startswith("probed "):
                marks["probed"].append(now)
            elif label == "testing reachability":
                marks["reach"].append(now)

        cpu0, node0 = resource.getrusage(resource.RUSAGE_SELF), node_cpu.seconds()
        t0 = time.perf_counter()
        cluster = Cluster(inv)
        got = facts.collect(inv, cluster, list(CHECK_NAMES), progress)
        t_collect = time.perf_counter()
        cluster.close()
        t_close = time.perf_counter()
        checks.run_checks(inv, got, list(CHECK_NAMES))
        t_checks = time.perf_counter()
        cpu1, node1 = resource.getrusage(resource.RUSAGE_SELF), node_cpu.seconds()
        ok = [nf for nf in got.values() if nf.ok]
        probed = sorted(marks["probed"])
        reach = sorted(marks["reach"])
        rows.append(
            {
                "connect_ms_median": statistics.median(nf.connect_ms or 0 for nf in ok) if ok else None,
                "first_node_probed_s": probed[0] - t0 if probed else None,
                "median_node_probed_s": statistics.median(probed) - t0 if probed else None,
                "all_nodes_probed_s": probed[-1] - t0 if probed else None,
                "reachability_s": reach[-1] - reach[0] if reach else 0.0,
                "collect_s": t_collect - t0,
                "close_s": t_close - t_collect,
                "checks_s": t_checks - t_close,
                "ping_rtt_ms_median": statistics.median(nf.rtt_ms or 0 for nf in ok) if ok else None,
                "controller_cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
                "node_cpu_s": None if node0 is None or node1 is None else node1 - node0,
                "nodes_ok": len(ok),
            }
        )
    medians: dict[str, Any] = {}
    for key in rows[0]:
        values = [r[key] for r in rows if r[key] is not None]
        medians[key] = statistics.median(values) if values else None
    return medians


def startup() -> dict[str, float]:
    """What the controller's start-up costs: Python plus every module `orch check --json` imports (paramiko
    as the transport imports it; a plainly typed inventory, no ssh config file and --json in a pipe need
    no pydantic, Fabric or rich), the checks included although they are imported while the nodes are probed."""
    argv = [
        sys.executable,
        "-c",
        "import orchestrator.cli, orchestrator.preflight.runner, orchestrator.preflight.checks; "
        "from orchestrator.transport.ssh import _paramiko; _paramiko()",
    ]
    walls, cpus = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=REPO)
        _, _, usage = os.wait4(proc.pid, 0)
        walls.append(time.perf_counter() - t0)
        cpus.append(usage.ru_utime + usage.ru_stime)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus)}


def measure(n: int, keys: Any, reps: int, workdir: Path, only: set[str] | None = None) -> dict[str, Any]:
    from tests.cluster import TestCluster

    with TestCluster(keys, n=n, mode="loopback", root=workdir / f"n{n}") as cluster:
        inv = cluster.write_inventory(job={"workdir": "/tmp", "nproc_per_node": 1})
        cfg = ssh_config(cluster, workdir / f"ssh_config_{n}")
        hosts = ",".join(node.name for node in cluster.nodes)
        env = {
            **os.environ,
            "PDSH_RCMD_TYPE": "ssh",
            "PDSH_SSH_ARGS": f"-F {cfg} %h",
            "ORCH_HOME": str(workdir / "orch-home"),
        }
        sides = {
            "orch_check_full": lambda: run([*ORCH, "check", str(inv), "--json"], env),
            "orch_check_ssh_clock_tz": lambda: run(
                [*ORCH, "check", str(inv), "--json", "--only", "ssh,clock,timezone"], env
            ),
            "orch_exec_date": lambda: run([*ORCH, "exec", str(inv), "--", "date"], env),
            "pdsh_date": lambda: run(["pdsh", "-f", "32", "-w", hosts, "date"], env),
            "pdsh_probe_equivalent": lambda: run(["pdsh", "-f", "32", "-w", hosts, PROBE_EQUIVALENT], env),
            "ssh_loop_date": lambda: run(
                ["sh", "-c", f"for h in {' '.join(x.name for x in cluster.nodes)}; do ssh -F {cfg} $h date; done"], env
            ),
            "orch_transport_true": lambda: run([sys.executable, "-m", "bench.check_fanout", "--floor", str(inv)], env),
        }
        if only is not None:
            sides = {k: v for k, v in sides.items() if k in only}
        if "orch_exec_date" in sides:
            exec_answers(inv, n, env)
        node_cpu = NodeCpu(cluster)
        try:
            cpu: dict[str, float | None] = {}
            for name, fn in sides.items():  # node CPU of one run of each side (after the warm-up below)
                fn()
                before = node_cpu.seconds()
                fn()
                after = node_cpu.seconds()
                cpu[name] = None if before is None or after is None else after - before
            out = side_by_side(sides, reps=reps, warmup=0)
            for name, row in out.items():
                row["node_cpu_s"] = cpu[name]
            if only is None or "phases" in only:
                out["phases"] = phases(inv, node_cpu, reps)
        finally:
            node_cpu.remove()
        return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="1,4,16,32")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="N in {1, 4}, one repetition")
    ap.add_argument("--floor", metavar="INVENTORY", help="only connect and run `true` on every node (a side)")
    ap.add_argument(
        "--sides",
        help=f"only these sides (comma separated: {', '.join(SIDES)}, phases); "
        "prints the numbers and writes no result file",
    )
    args = ap.parse_args(argv)
    if args.floor:
        floor(args.floor)
        return {}
    only = None
    if args.sides:
        only = {s.strip() for s in args.sides.split(",") if s.strip()}
        unknown = only - {*SIDES, "phases"}
        if unknown:
            raise SystemExit(f"check_fanout: unknown side(s) {', '.join(sorted(unknown))}")
    if shutil.which("pdsh") is None:
        raise SystemExit("check_fanout: pdsh is not installed (apt-get install pdsh)")
    sizes = [1, 4] if args.quick else [int(s) for s in args.sizes.split(",")]
    reps = 1 if args.quick else args.reps
    from tests.cluster import KeyStore

    by_n: dict[int, dict[str, Any]] = {}
    controller_startup = startup()
    print(
        f"check_fanout controller startup (imports): {controller_startup['wall_s']:.2f}s wall, "
        f"{controller_startup['cpu_s']:.2f}s CPU",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        keys = KeyStore(Path(tmp) / "keys")
        for n in sizes:
            by_n[n] = measure(n, keys, reps, Path(tmp), only)
            print(
                f"check_fanout N={n:3d}: "
                + "  ".join(
                    f"{k} {v['median_s']:.2f}s"
                    + (f" (nodes {v['node_cpu_s']:.2f} CPU-s)" if v.get("node_cpu_s") else "")
                    for k, v in by_n[n].items()
                    if k != "phases"
                ),
                flush=True,
            )
            if "orch_check_full" in by_n[n] and "pdsh_date" in by_n[n]:
                ratios = [
                    a / b for a, b in zip(by_n[n]["orch_check_full"]["samples_s"], by_n[n]["pdsh_date"]["samples_s"])
                ]
                print(
                    f"check_fanout N={n:3d}: orch_check_full / pdsh_date"
                    f" {by_n[n]['orch_check_full']['median_s'] / by_n[n]['pdsh_date']['median_s']:.3f}"
                    f" (per round: {' '.join(f'{r:.2f}' for r in ratios)})",
                    flush=True,
                )
            if "orch_exec_date" in by_n[n] and "pdsh_date" in by_n[n]:
                ratios = [
                    a / b for a, b in zip(by_n[n]["orch_exec_date"]["samples_s"], by_n[n]["pdsh_date"]["samples_s"])
                ]
                print(
                    f"check_fanout N={n:3d}: orch_exec_date / pdsh_date"
                    f" {by_n[n]['orch_exec_date']['median_s'] / by_n[n]['pdsh_date']['median_s']:.3f}"
                    f" (per round: {' '.join(f'{r:.2f}' for r in ratios)})",
                    flush=True,
                )
            if "phases" in by_n[n]:
                print(
                    f"check_fanout N={n:3d} phases: "
                    + "  ".join(f"{k} {v:.3g}" for k, v in by_n[n]["phases"].items() if v is not None),
                    flush=True,
                )
    if only is not None:
        return {
            "sizes": sizes,
            "reps": reps,
            "controller_startup": controller_startup,
            "by_n": {str(k): v for k, v in by_n.items()},
        }
    big, one = max(sizes), min(sizes)
    full_big = by_n[big]["orch_check_full"]["median_s"]
    pdsh_big = by_n[big]["pdsh_date"]["median_s"]
    growth = full_big / by_n[one]["orch_check_full"]["median_s"]
    summary = [
        {
            "what": f"orch check (all checks) vs pdsh date, N={big}",
            "orch": full_big,
            "peer": pdsh_big,
            "ratio": full_big / pdsh_big,
            "goal": "<= 1.0",
            "met": full_big <= pdsh_big,
        },
        {
            "what": f"orch check (all checks) vs pdsh running the equivalent probe commands, N={big}",
            "orch": full_big,
            "peer": by_n[big]["pdsh_probe_equivalent"]["median_s"],
            "ratio": full_big / by_n[big]["pdsh_probe_equivalent"]["median_s"],
            "goal": "report",
            "met": None,
        },
        {
            "what": f"orch check --only ssh,clock,timezone vs pdsh date, N={big}",
            "orch": by_n[big]["orch_check_ssh_clock_tz"]["median_s"],
            "peer": pdsh_big,
            "ratio": by_n[big]["orch_check_ssh_clock_tz"]["median_s"] / pdsh_big,
            "goal": "report",
            "met": None,
        },
        {
            "what": f"orch check vs serial ssh loop, N={big}",
            "orch": full_big,
            "peer": by_n[big]["ssh_loop_date"]["median_s"],
            "ratio": full_big / by_n[big]["ssh_loop_date"]["median_s"],
            "goal": "report",
            "met": None,
        },
        {
            "what": f"orch check N={big} / N={one}",
            "orch": full_big,
            "peer": by_n[one]["orch_check_full"]["median_s"],
            "ratio": growth,
            "goal": "<= 3",
            "met": growth <= 3,
        },
    ]
    exec_big = by_n[big]["orch_exec_date"]["median_s"]
    summary.append(
        {
            "what": f"orch exec -- date vs pdsh date, N={big}",
            "orch": exec_big,
            "peer": pdsh_big,
            "ratio": exec_big / pdsh_big,
            "goal": "<= 1.0",
            "met": exec_big <= pdsh_big,
        }
    )
    floor_big = by_n[big]["orch_transport_true"]["median_s"]
    floor_growth = floor_big / by_n[one]["orch_transport_true"]["median_s"]
    pdsh_growth = pdsh_big / by_n[one]["pdsh_date"]["median_s"]
    summary += [
        {
            "what": f"orch check vs its floor (connect + one `true` per node on orch's transport), N={big}",
            "orch": full_big,
            "peer": floor_big,
            "ratio": full_big / floor_big,
            "goal": "report",
            "met": None,
        },
        {
            "what": f"floor N={big} / N={one} (connect + one `true` per node on orch's transport)",
            "orch": floor_big,
            "peer": by_n[one]["orch_transport_true"]["median_s"],
            "ratio": floor_growth,
            "goal": "report",
            "met": None,
        },
        {
            "what": f"pdsh date N={big} / N={one}",
            "orch": pdsh_big,
            "peer": by_n[one]["pdsh_date"]["median_s"],
            "ratio": pdsh_growth,
            "goal": "report",
            "met": None,
        },
    ]
    result = {
        "sizes": sizes,
        "reps": reps,
        "controller_startup": controller_startup,
        "by_n": {str(k): v for k, v in by_n.items()},
        "summary": summary,
    }
    write("check_fanout", result)
    return result


if __name__ == "__main__":
    main()
