"""`orch up` over `transport: local`: two nodes that are processes on this machine, real torchrun."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.disk_support import fill, small_disk
from tests.ports import job_port
from tests.procs_support import received, stranger
from tests.up_helpers import DDP_JOB, REPO, Orch, ddp_job, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def marked(run_id: str) -> list[int]:
    """Pids on this machine whose environment carries the run id (what `orch down` must leave: none)."""
    want = f"ORCH_RUN_ID={run_id}".encode()
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as fh:
                    if want in fh.read().split(b"\0"):
                        out.append(int(name))
            except OSError:
                continue
    return out


def local_inventory(tmp_path: Path, job_env: dict[str, str]) -> Path:
    """Two local nodes running tests/ddp_job.py; job.python relative to the inventory's directory."""
    inv = tmp_path / "local.yaml"
    inv.write_text(
        yaml.safe_dump(
            {
                "name": "lt",
                "transport": "local",
                "nodes": [{"host": "localhost", "name": "n0"}, {"host": "localhost", "name": "n1"}],
                "master": {"port": job_port()},
                "env": {"GLOO_SOCKET_IFNAME": "lo", **job_env},
                "job": {
                    "python": os.path.relpath(REPO / ".venv" / "bin" / "python", tmp_path)
                    if (REPO / ".venv" / "bin" / "python").exists()
                    else "python3",
                    "workdir": str(REPO),
                    "run_root": str(tmp_path / "nodes"),
                    "script": DDP_JOB,
                    "nproc_per_node": 1,
                    "stop_grace_s": 5,
                },
            }
        )
    )
    return inv


def test_two_local_nodes_succeed_then_status_and_down_and_a_recycled_pgid_is_left_alone(tmp_path: Path) -> None:
    """A run of two local nodes succeeds; status says so; down of the ended run finds nothing
    running. Then pid reuse, made to happen: each node's recorded pid and process group now name a
    stranger's process group, and `orch down` reports the strangers and signals neither."""
    inv = local_inventory(tmp_path, ddp_job(steps=4, sleep=0.1))
    orch = Orch(tmp_path / "home")
    up = orch.run("up", str(inv), "--skip-checks", timeout=180)
    assert up.returncode == 0, up.stderr
    run_id = (orch.home / "latest").read_text().strip()
    for node, rank in (("n0", 0), ("n1", 1)):
        assert any(
            node in ln and f"r{rank}" in ln and "allreduce_ok=True final_sum=9 expected=9" in ln
            for ln in up.stdout.splitlines()
        ), up.stdout[-2000:]
    # the relative job.python was resolved against the inventory's directory
    plan = json.loads((orch.run_dir(run_id) / "plan.json").read_text())
    assert all(os.path.isabs(n["argv"][0]) for n in plan["nodes"])
    state = tmp_path / "nodes" / run_id / "n1" / "state.json"
    assert json.loads(state.read_text())["state"] == "succeeded"
    assert state.stat().st_mode & 0o077 == 0
    status = orch.run("status", "--json")
    doc = json.loads(status.stdout)
    assert doc["state"] == "succeeded" and [n["exit_code"] for n in doc["nodes"]] == [0, 0]
    down = orch.run("down")
    assert down.returncode == 0 and "nothing running" in down.stderr, down.stderr
    assert json.loads(orch.run("status", "--json").stdout)["state"] == "succeeded"
    assert marked(run_id) == []

    strangers = {}
    try:
        for node in ("n0", "n1"):
            strangers[node] = stranger()  # its own process group; it keeps any signal sent to it
            path = tmp_path / "nodes" / run_id / node / "state.json"
            st = json.loads(path.read_text())
            assert st["state"] == "succeeded" and st["pgid"] and st["pgid_start"]
            st.update(pid=strangers[node].pid, pgid=strangers[node].pid, procs=[[strangers[node].pid, st["pid_start"]]])
            path.write_text(json.dumps(st))
        down = orch.run("down", run_id)
        assert down.returncode == 0, down.stderr
        for node, proc in strangers.items():
            assert received(proc.pid) == set(), f"orch down signalled {node}'s stranger (pid {proc.pid})"
            assert f"{node}: left alone 1 processes" in down.stdout + down.stderr, down.stdout + down.stderr
            assert str(proc.pid) in down.stdout + down.stderr
    finally:
        for proc in strangers.values():
            proc.kill()
            proc.wait()


def test_a_detached_run_that_fails_is_named_by_status(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path, ddp_job(steps=400, sleep=0.1, fail_rank=1, fail_step=2))
    orch = Orch(tmp_path / "home")
    up = orch.run("up", str(inv), "--skip-checks", "--detach", timeout=120)
    assert up.returncode == 0, up.stderr
    run_id = (orch.home / "latest").read_text().strip()

    def final() -> dict | None:
        doc = json.loads(orch.run("status", "--json").stdout)
        return doc if doc["state"] != "running" else None

    doc = wait_for(final, 120, "the detached run to end")
    assert doc["state"] == "failed", doc
    ff = doc["first_failure"]
    assert ff["node"] == "n1" and ff["rank"] == 1 and ff["exit_code"] == 1
    assert ff["cause"] == "RuntimeError: injected failure on rank 1 at step 2" and ff["signal"] is None
    assert any("RuntimeError: injected failure on rank 1 at step 2" in x for x in ff["excerpt"]), ff["excerpt"]
    assert orch.run("down").returncode == 0
    assert marked(run_id) == []


def node_log(tmp_path: Path, run_id: str, node: str) -> str:
    return (tmp_path / "nodes" / run_id / node / "node.log").read_text(errors="replace")


NOISE = ("SignalException", "Traceback", "death signal", "closing signal")
"""What torchrun and its ranks print when they are stopped."""


def test_a_rank_killed_by_sigkill_is_named_by_its_signal_and_the_stopped_node_is_quiet(tmp_path: Path) -> None:
    """Rank 1 (n1) is SIGKILLed as the OOM killer would; rank 0 (n0) sleeps outside any collective,
    so only orch's teardown ends it: its torchrun's SignalException stays in its log."""
    inv = local_inventory(tmp_path, ddp_job(steps=400, sleep=0.1, kill_rank=1, fail_step=2, hang_rank=0, hang_step=2))
    orch = Orch(tmp_path / "home")
    up = orch.run("up", str(inv), "--skip-checks", timeout=200)
    assert up.returncode == 1, up.stderr
    err = " ".join(up.stderr.split())
    assert (
        "first failure on n1 (node rank 1, rank 1): killed by SIGKILL hint: SIGKILL on a training node is "
        "usually the kernel's OOM killer" in err
    ), up.stderr
    assert "exit code 1)" not in err
    assert "Root Cause (first observed failure)" not in err  # torchrun's summary stays in the log
    assert err.rindex("killed by SIGKILL") > err.index("stopped every other node")  # the cause last, after the excerpt
    run_id = (orch.home / "latest").read_text().strip()
    assert re.search(r"^n0: stopped [\d.]+ s after its agent got SIGTERM \(torchrun ", up.stderr, re.M), up.stderr
    live_n0 = [ln for ln in up.stdout.splitlines() if ln.split()[1:2] == ["n0"]]
    assert live_n0 and not [ln for ln in live_n0 if any(x in ln for x in NOISE)], "n0's stop shown live"
    assert "SignalException" in node_log(tmp_path, run_id, "n0")  # ... but kept in its log
    assert "SignalException" in (orch.run_dir(run_id) / "merged.log").read_text()
    ff = json.loads(orch.run("status", "--json").stdout)["first_failure"]
    assert (ff["cause"], ff["signal"], ff["exit_code"], ff["rank"]) == ("killed by SIGKILL", "SIGKILL", 1, 1)
    assert "OOM killer" in ff["hint"]
    assert marked(run_id) == []


def test_ctrl_c_prints_one_line_per_node_not_torchruns_tracebacks(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path, ddp_job(steps=400, sleep=0.2))
    orch = Orch(tmp_path / "home")
    up = orch.start(str(inv), "--skip-checks")
    run_id = up.wait_running()
    wait_for(lambda: " step 1 " in up.out, 150, "both ranks stepping in the merged log")
    up.proc.send_signal(signal.SIGINT)
    assert up.wait(60) == 130, up.err
    out, err = up.out, up.err
    noisy = [ln for ln in (out + err).splitlines() if any(x in ln for x in NOISE)]
    assert noisy == [], "\n".join(noisy[:10])
    for node in ("n0", "n1"):
        assert len(re.findall(rf"^{node}: stopped [\d.]+ s after its agent got SIGTERM \(torchrun ", err, re.M)) == 1, (
            err
        )
        log = node_log(tmp_path, run_id, node)
        assert "agent received SIGTERM: stopping the job" in log and "SignalException" in log
    assert "interrupted: stopped every node" in err
    assert marked(run_id) == []


LONG_LINE_JOB = """\
import sys
chunk = b"x" * 65536
for _ in range(512):  # one 32 MB line, in 64 KiB writes, then its newline
    sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()
sys.stdout.buffer.write(b"\\n")
print("after the long line", flush=True)
"""


def test_a_32_mb_line_is_split_and_the_run_is_reported_as_it_ended(tmp_path: Path) -> None:
    """A job that writes one 32 MB line and exits 0 succeeded: `orch up` says so (it used to call
    the agent vanished and exit 1), the line reaches the merged log in marked 1 MiB pieces."""
    from orchestrator.node.agent import LONG_LINE_MARK

    job = tmp_path / "long_line.py"
    job.write_text(LONG_LINE_JOB)
    inv = tmp_path / "long.yaml"
    inv.write_text(
        yaml.safe_dump(
            {
                "name": "long",
                "transport": "local",
                "nodes": [{"host": "localhost", "name": "n0"}],
                "master": {"port": job_port()},
                "job": {
                    "python": str(REPO / ".venv" / "bin" / "python")
                    if (REPO / ".venv" / "bin" / "python").exists()
                    else "python3",
                    "workdir": str(tmp_path),
                    "run_root": str(tmp_path / "nodes"),
                    "script": str(job),
                    "nproc_per_node": 1,
                },
            }
        )
    )
    orch = Orch(tmp_path / "home")
    up = orch.run("up", str(inv), "--skip-checks", timeout=200)
    assert up.returncode == 0, up.stderr[-3000:]
    assert "succeeded on every node" in up.stderr and "disappeared" not in up.stderr
    pieces = [ln for ln in up.stdout.splitlines() if "xxxx" in ln]
    assert len(pieces) >= 32 and [ln.endswith(LONG_LINE_MARK) for ln in pieces] == [True] * (len(pieces) - 1) + [False]
    assert max(len(ln) for ln in pieces) < (1 << 20) + 200
    assert sum(ln.split(" ", 3)[3].removesuffix(LONG_LINE_MARK).count("x") for ln in pieces) == 32 << 20
    lines = up.stdout.splitlines()
    assert "after the long line" in lines[lines.index(pieces[-1]) + 1]
    run_id = (orch.home / "latest").read_text().strip()
    assert json.loads((orch.run_dir(run_id) / "run.json").read_text())["state"] == "succeeded"


def modes(root: Path) -> dict[str, str]:
    """`{relative path: octal mode}` of root and everything under it."""
    return {
        str(p.relative_to(root)) or ".": format(p.stat().st_mode & 0o777, "03o")
        for p in [root, *sorted(root.rglob("*"))]
        if not p.is_symlink()
    }


def test_files_are_private_whatever_the_umask_and_env_values_stay_off_screen(tmp_path: Path) -> None:
    """docs/SECURITY.md's claims, checked: every file orch writes on the controller (run.json,
    plan.json, merged.log, the node copies, the check reports, the report) is 0600 and every
    directory 0700, and on the node the agent's files and directories too, under umask 000. The
    inventory's env values reach the job but never the screen: not in `orch -v up` (every remote
    command shown), not in the report."""
    secret = "s3cr3t-token-do-not-show"
    job = tmp_path / "env_job.py"
    job.write_text("import os\nprint('token length', len(os.environ['API_TOKEN']))\n")
    inv = tmp_path / "sec.yaml"
    inv.write_text(
        yaml.safe_dump(
            {
                "name": "sec",
                "transport": "local",
                "master": {"port": job_port()},
                "nodes": [
                    {"host": "localhost", "name": "n0", "env": {"NODE_SECRET": secret + "-node"}},
                    {"host": "localhost", "name": "n1"},
                ],
                "env": {"API_TOKEN": secret, "GLOO_SOCKET_IFNAME": "lo"},
                "job": {
                    "python": str(REPO / ".venv" / "bin" / "python")
                    if (REPO / ".venv" / "bin" / "python").exists()
                    else "python3",
                    "workdir": str(tmp_path),
                    "run_root": str(tmp_path / "nodes"),
                    "script": str(job),
                    "nproc_per_node": 1,
                },
            }
        )
    )
    orch = Orch(tmp_path / "home")
    up = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, runpy, sys; os.umask(0); sys.argv[0] = 'orch'; "
            "runpy.run_module('orchestrator', run_name='__main__')",
            "-v",
            "up",
            str(inv),
        ],
        cwd=REPO,
        env=orch.env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert up.returncode == 0, up.stderr[-3000:]
    assert f"token length {len(secret)}" in up.stdout  # the job had it
    assert secret not in up.stdout + up.stderr and "$ " in up.stderr  # -v showed the remote commands, not it
    report = orch.run("report")
    assert report.returncode == 0, report.stderr
    run_id = (orch.home / "latest").read_text().strip()
    run_dir = orch.run_dir(run_id)
    assert not [p for p in (run_dir / "report").rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert secret in (run_dir / "plan.json").read_text()  # kept, in a private file, for what was launched

    home = modes(orch.home)
    for want in ("runs", f"runs/{run_id}", f"runs/{run_id}/nodes", f"runs/{run_id}/report", "checks"):
        assert home.pop(want) == "700", want
    home.pop(".")  # $ORCH_HOME itself is the user's to make (./.orch by default)
    for name in (
        "run.json",
        "plan.json",
        "merged.log",
        "check.json",
        "inventory.yaml",
        "nodes/n0.log",
        "nodes/n1.log",
        "report/index.html",
    ):
        assert f"runs/{run_id}/{name}" in home, name
    assert "checks/sec.json" in home
    assert {p: m for p, m in home.items() if m != "600"} == {}

    for node in ("n0", "n1"):
        node_dir = tmp_path / "nodes" / run_id / node
        got = modes(node_dir)
        for name in ("agent.py", "procs.py", "stacks.py", "launch.json", "node.log", "state.json"):
            assert got[name] == "600", (node, name)
        assert got["."] == got["torchrun"] == "700", node
    assert modes(tmp_path / "nodes" / run_id)["."] == "700" and modes(tmp_path / "nodes")["."] == "700"


def test_overrides_on_the_command_line_run_and_every_later_command_sees_the_run_as_it_ran(tmp_path: Path) -> None:
    """`orch up INV --exclude n1 --env K=V -- ARGS` on three local nodes: two ranks run, re-planned
    as for a two-node inventory, with the command line's args and env; run.json keeps the
    overrides, and `orch status`, `orch runs` and `orch logs` (by a prefix of the id) see two nodes."""
    inv = local_inventory(tmp_path, ddp_job(steps=6, sleep=0.05))
    doc = yaml.safe_load(inv.read_text())
    doc["nodes"].append({"host": "localhost", "name": "n2"})
    inv.write_text(yaml.safe_dump(doc))
    orch = Orch(tmp_path / "home")
    up = orch.run(
        "up",
        str(inv),
        "--skip-checks",
        "--exclude",
        "n1",
        "--env",
        "DDP_SLEEP=0.01",
        "--run-id",
        "over-1",
        "--",
        "--steps",
        "3",
        timeout=180,
    )
    assert up.returncode == 0, up.stderr
    assert sorted(ln.split()[1] for ln in up.stdout.splitlines() if "done steps=3 allreduce_ok=True" in ln) == [
        "n0",
        "n2",
    ]
    record = orch.run_json("over-1")
    assert record["overrides"] == {
        "args": ["--steps", "3"],
        "env": {"DDP_SLEEP": "0.01"},
        "include": None,
        "exclude": "n1",
        "nodes": None,
        "master": None,
    }
    plan = json.loads((orch.run_dir("over-1") / "plan.json").read_text())
    assert [(n["node"], n["node_rank"]) for n in plan["nodes"]] == [("n0", 0), ("n2", 1)]
    assert all("DDP_SLEEP" in n["env"] and n["argv"][-2:] == ["--steps", "3"] for n in plan["nodes"])
    for node in ("n0", "n2"):  # what each node was given to run (plan.json may mask env values)
        launch = json.loads((tmp_path / "nodes" / "over-1" / node / "launch.json").read_text())
        assert launch["env"]["DDP_SLEEP"] == "0.01" and launch["env"]["DDP_STEPS"] == "6"
    assert not (tmp_path / "nodes" / "over-1" / "n1").exists()
    status = json.loads(orch.run("status", "--json", "over").stdout)
    assert [n["node"] for n in status["nodes"]] == ["n0", "n2"] and status["state"] == "succeeded"
    runs = json.loads(orch.run("runs", "--json").stdout)["runs"]
    assert (runs[0]["run"], runs[0]["nodes"], runs[0]["procs"], runs[0]["state"]) == ("over-1", 2, 2, "succeeded")
    logs = orch.run("logs", "over")
    assert logs.returncode == 0 and " n1 " not in logs.stdout and " n2 " in logs.stdout


ROLE_JOB = """\
import os, sys, time, traceback
rank = int(os.environ["RANK"])
log = os.path.join(os.environ["ROLE_TEST_ROOT"], os.environ["ORCH_RUN_ID"], os.environ["ORCH_NODE"], "node.log")
def wait_log(text):
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        with open(log, errors="replace") as fh:
            if text in fh.read():
                return
        time.sleep(0.05)
    sys.exit(f"rank {rank}: no {text!r} in node.log after 90 s")
if rank == 1:
    try:
        raise RuntimeError("injected failure on rank 1")
    except RuntimeError:
        traceback.print_exc()
    sys.stderr.flush()
    wait_log("noise 29 of rank 0")  # then the exception is 30 lines above the end of the log
    sys.exit(1)
wait_log("RuntimeError: injected failure on rank 1")
for i in range(30):
    print(f"noise {i} of rank 0", flush=True)
time.sleep(120)  # the teardown ends it
"""


def test_a_torchrun_role_keeps_the_failing_workers_exception_in_the_excerpt(tmp_path: Path) -> None:
    """`--role trainer` in job.torchrun_args: torchrun writes `[trainer1]:` before rank 1's lines.
    Rank 1's exception, 30 of rank 0's lines above the end of the log, is in the failure excerpt
    (the excerpt used to look for `[default1]:` only, and dropped the blamed worker's lines)."""
    job = tmp_path / "role_job.py"
    job.write_text(ROLE_JOB)
    inv = local_inventory(tmp_path, {"ROLE_TEST_ROOT": str(tmp_path / "nodes")})
    doc = yaml.safe_load(inv.read_text())
    doc["nodes"] = doc["nodes"][:1]
    role = ["--role", "trainer"]
    doc["job"].update({"script": str(job), "nproc_per_node": 2, "telemetry_s": 0, "torchrun_args": role})
    inv.write_text(yaml.safe_dump(doc))
    orch = Orch(tmp_path / "home")
    up = orch.run("up", str(inv), "--skip-checks", timeout=200)
    assert up.returncode == 1, up.stderr[-3000:]
    run_id = (orch.home / "latest").read_text().strip()
    assert "[trainer1]:RuntimeError: injected failure on rank 1" in node_log(tmp_path, run_id, "n0")
    ff = orch.run_json(run_id)["first_failure"]
    assert (ff["node"], ff["rank"], ff["local_rank"]) == ("n0", 1, 1), ff
    assert ff["cause"] == "RuntimeError: injected failure on rank 1", ff
    assert "[trainer1]:RuntimeError: injected failure on rank 1" in ff["excerpt"], ff["excerpt"]
    assert "[trainer0]:noise 29 of rank 0" in ff["excerpt"], ff["excerpt"]
    logs = orch.run("logs", run_id, "--rank", "1", "--json")
    assert logs.returncode == 0, logs.stderr
    mine = [json.loads(ln) for ln in logs.stdout.splitlines()]
    assert {"rank": 1, "local_rank": 1, "line": "RuntimeError: injected failure on rank 1"}.items() <= next(
        d for d in mine if d["line"].startswith("RuntimeError")
    ).items(), mine


TIMING_JOB = """\
import os, sys, time
rank = int(os.environ["RANK"])
for k in range(1, 7):
    compute = 2.5 if rank == 1 else 1.0
    wall = "1e999" if rank == 1 and k == 1 else "5"  # the window that starts rank 1's slow streak
    print(f"[rank {rank}] timing epoch 1 batch {10 * k} steps 10 images 80 data_s 0.01 compute_s {compute} "
          f"wall_s {wall}", flush=True)
    time.sleep(0.5)
time.sleep(120)  # the straggler stop ends it
"""


def test_a_timing_line_that_is_not_a_finite_number_is_ignored_and_the_straggler_still_stops_the_run(
    tmp_path: Path,
) -> None:
    """Under `straggler.action: stop`, rank 1 prints `wall_s 1e999` in the first window of its slow
    streak: the line used to take log streaming and then `orch up` down (OverflowError, run.json
    `stopped` with no first failure, every later `orch top` exit 1). Now it is ignored and
    counted, the straggler is named from the windows that are records and stops the run."""
    job = tmp_path / "timing_job.py"
    job.write_text(TIMING_JOB)
    inv = local_inventory(tmp_path, {})
    doc = yaml.safe_load(inv.read_text())
    doc["job"].update(
        {"script": str(job), "telemetry_s": 0, "straggler": {"share": 0.8, "windows": 2, "action": "stop"}}
    )
    inv.write_text(yaml.safe_dump(doc))
    orch = Orch(tmp_path / "home")
    up = orch.run("up", str(inv), "--skip-checks", timeout=200)
    assert "internal error" not in up.stderr and "log streaming stopped" not in up.stderr, up.stderr[-3000:]
    assert up.returncode == 1, up.stderr[-3000:]
    run_id = (orch.home / "latest").read_text().strip()
    run = orch.run_json(run_id)
    assert run["state"] == "failed" and run["first_failure"]["node"] == "n1", run
    assert run["first_failure"]["reason"].startswith("straggler: rank 1 on n1 at 0.70× the median")
    top = orch.run("top", run_id, "--json")
    assert top.returncode == 0, top.stderr
    assert json.loads(top.stdout)["ignored_lines"] == 1
    assert [s["rank"] for s in json.loads(top.stdout)["stragglers"]] == [1]
    assert orch.run("report", run_id).returncode == 0
    assert "1 line of the node logs ignored" in (orch.run_dir(run_id) / "report" / "index.html").read_text()


def test_the_quickstart_runs_under_umask_002(tmp_path: Path) -> None:
    """Ubuntu's umask for ordinary accounts (002), a first run ever: $ORCH_HOME and the run root
    under it (the default ~/.orch/nodes) are made private, so the agent trusts its run directory
    and the run succeeds (it used to refuse `.orch, above the run directory`)."""
    home = tmp_path / "user" / ".orch"
    inv = local_inventory(tmp_path, ddp_job(steps=2, sleep=0.0))
    doc = yaml.safe_load(inv.read_text())
    doc["job"]["run_root"] = str(home / "nodes")
    inv.write_text(yaml.safe_dump(doc))
    orch = Orch(home)
    up = subprocess.run(
        [sys.executable, "-m", "orchestrator", "up", str(inv), "--skip-checks"],
        cwd=REPO,
        env=orch.env,
        capture_output=True,
        text=True,
        timeout=180,
        preexec_fn=lambda: os.umask(0o002),
    )
    assert up.returncode == 0, up.stderr[-3000:]
    run_id = (home / "latest").read_text().strip()
    for d in (home.parent, home, home / "runs", home / "nodes", home / "nodes" / run_id / "n0"):
        assert d.stat().st_mode & 0o077 == 0, (d, oct(d.stat().st_mode))


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs: needs root")
def test_orch_down_stops_a_run_whose_run_root_is_full_and_says_so(tmp_path: Path) -> None:
    """The nodes' run root fills up under a detached run: `orch down` still stops every process
    of it (it signals first and needs no disk), exits 0 and says which node's run root is full."""
    with small_disk(tmp_path / "disk", "16m") as disk:
        inv = local_inventory(tmp_path, ddp_job(steps=100000, sleep=0.2))
        doc = yaml.safe_load(inv.read_text())
        doc["job"]["run_root"] = str(disk)
        inv.write_text(yaml.safe_dump(doc))
        orch = Orch(tmp_path / "home")
        up = orch.run("up", str(inv), "--skip-checks", "--detach", timeout=120)
        assert up.returncode == 0, up.stderr
        run_id = (orch.home / "latest").read_text().strip()
        filler = fill(disk)
        try:

            def met() -> bool:  # the agent said so, or died of it
                state = (disk / run_id / "n0" / "state.json").read_text()
                return "is full" in state or not Path(f"/proc/{json.loads(state)['agent_pid']}").exists()

            wait_for(met, 30, "the agent to meet the full disk")
            down = orch.run("down", timeout=120)
            said = down.stdout + down.stderr
            assert down.returncode == 0, said
            assert f"n0: run_root {disk} is full" in said and f"n1: run_root {disk} is full" in said, said
            assert marked(run_id) == []
        finally:
            filler.unlink()
            orch.run("down", timeout=120)


def test_a_run_root_the_agent_refuses_names_why_and_no_stop_left_unconfirmed(tmp_path: Path) -> None:
    """Without the preflight (--skip-checks), a run root under a directory its group can write:
    each node's agent refuses its run directory, says why, and, having started nothing there,
    leaves no "could not confirm the stop" behind."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    inv = local_inventory(tmp_path, ddp_job(steps=2, sleep=0.0))
    doc = yaml.safe_load(inv.read_text())
    doc["job"]["run_root"] = str(shared / "nodes")
    inv.write_text(yaml.safe_dump(doc))
    up = Orch(tmp_path / "home").run("up", str(inv), "--skip-checks", timeout=120)
    said = up.stdout + up.stderr
    assert up.returncode != 0 and f"{shared}, above the run directory, can be changed by others" in said, said
    assert "could not confirm" not in said, said


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs: needs root")
def test_an_attached_run_says_which_nodes_run_root_is_full_and_goes_on(tmp_path: Path) -> None:
    """The run root fills up under an attached `orch up`: it says `node N: run_root DIR is full`
    (once per node) and supervises on (the agents survive the full disk); `orch down` then ends
    it as any run (130)."""
    with small_disk(tmp_path / "disk", "16m") as disk:
        inv = local_inventory(tmp_path, ddp_job(steps=100000, sleep=0.2))
        doc = yaml.safe_load(inv.read_text())
        doc["job"]["run_root"] = str(disk)
        inv.write_text(yaml.safe_dump(doc))
        orch = Orch(tmp_path / "home")
        up = orch.start(str(inv), "--skip-checks")
        filler = None
        try:
            run_id = up.wait_running()
            filler = fill(disk)
            wait_for(
                lambda: f"node n0: run_root {disk} is full" in up.err or up.proc.poll() is not None,
                60,
                "orch up to say the run root is full",
            )
            assert f"node n0: run_root {disk} is full" in up.err, up.err
            assert up.proc.poll() is None and orch.run_json(run_id).get("state") == "running", up.err
            assert up.err.count(f"node n0: run_root {disk} is full") == 1, up.err
            assert orch.run("down", timeout=120).returncode == 0
            assert up.wait(120) == 130, up.err
        finally:
            if filler is not None:
                filler.unlink()
            if up.proc.poll() is None:
                up.proc.send_signal(signal.SIGINT)
                up.proc.wait(60)


def test_a_run_whose_controller_was_killed_says_why_it_stopped_in_status_and_runs(tmp_path: Path) -> None:
    """Issue 54.8: `orch up` killed -9 mid-run. Each node's lease runs out and its agent stops the
    job, saying why in state.json. `orch status` brings that reason into the record: each node's
    (`reason`) and the run's (the first node's, named), in the JSON, the table and run.json; `orch
    runs` then shows the run's wall time (from its creation to its last node's end, as the report
    counts it) and the reason."""
    from tests.up_helpers import node_state

    inv = local_inventory(tmp_path, ddp_job(steps=100000, sleep=0.2))
    orch = Orch(tmp_path / "home", env={"ORCH_UNREACHABLE_GRACE_S": "1"})  # the lease: 3 x 1 s
    up = orch.start(str(inv), "--skip-checks")
    try:
        run_id = up.wait_running()
        up.proc.kill()  # SIGKILL: no teardown, nothing recorded
        up.proc.wait(30)
        states = wait_for(
            lambda: (
                all(node_state(tmp_path / "nodes", run_id, n).get("lease_expired") for n in ("n0", "n1"))
                and {n: node_state(tmp_path / "nodes", run_id, n) for n in ("n0", "n1")}
            ),
            60,
            "each node's lease to run out",
        )
        assert orch.run_json(run_id)["state"] == "running"  # what the killed controller left
        res = orch.run("status", "--json", timeout=60)
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert doc["state"] == "stopped"
        for node in doc["nodes"]:
            assert node["reason"] == states[node["node"]]["reason"], node
            assert "the controller (orch up) was not heard from for" in node["reason"], node
        assert doc["reason"] == f"n0: {states['n0']['reason']}"
        recorded = orch.run_json(run_id)
        assert recorded["reason"] == doc["reason"] and recorded["state"] == "stopped"
        assert [n["reason"] for n in recorded["nodes"]] == [states["n0"]["reason"], states["n1"]["reason"]]
        table = orch.run("status", timeout=60)
        assert f"stopped: n0: {states['n0']['reason']}" in " ".join(table.stdout.split()), table.stdout
        runs = json.loads(orch.run("runs", "--json", timeout=60).stdout)["runs"][0]
        wall = max(s["finished_at"] for s in states.values()) - recorded["created"]
        assert runs["run"] == run_id and runs["wall_s"] == round(wall, 1) and runs["wall_s"] > 0, runs
        assert runs["reason"] == doc["reason"], runs
        listed = " ".join(orch.run("runs", timeout=60).stdout.split())
        assert "n0: the controller (orch up) was not" in listed, listed
    finally:
        if up.proc.poll() is None:
            up.proc.kill()
        orch.run("down", timeout=120)
