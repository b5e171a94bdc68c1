"""The node probe with real processes of this machine: `import torch` in a child (what the fast,
file-reading path must agree with) and the verbs ring test against a stand-in ibv_rc_pingpong
server that starts late."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.node import probe

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "probe"


def test_software_versions_from_files_match_what_import_torch_reports() -> None:
    """The fast path (torch/version.py + the NCCL wheel, read in the probe's own process) must tell
    exactly what `import torch` tells (the child the probe falls back to)."""
    import json
    import os
    import subprocess
    import sys

    def child(**env: str) -> dict:
        out = subprocess.run(
            [sys.executable, "-c", probe.SOFTWARE_CODE],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=120,
            check=True,
        ).stdout
        return json.loads(out.strip().splitlines()[-1])

    fast, imported = probe.gather_software({}), child()
    assert (fast["source"], imported["source"]) == ("files", "import")
    for key in ("torch", "cuda", "nccl", "ultralytics", "python", "executable"):
        assert fast[key] == imported[key], key
    assert fast["torch"]
    # ORCH_PROBE_IMPORT_TORCH forces the child
    forced = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys; from orchestrator.node import probe; print(json.dumps(probe.gather_software({})))",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "ORCH_PROBE_IMPORT_TORCH": "1"},
        timeout=120,
        check=True,
    ).stdout
    assert json.loads(forced)["source"] == "import"


@pytest.mark.waits  # mostly waits: runs beside the slow tests (tests/conftest.py)
def test_the_verbs_client_waits_for_a_server_that_is_still_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The successor's ibv_rc_pingpong server may not listen yet when the client starts (a loaded
    node, a slow device open): "Couldn't connect" is retried until the deadline, not a failed link."""
    import socket
    import subprocess
    import threading
    import time

    monkeypatch.setenv("ORCH_PROBE_FIXTURES", str(FIX / "verbs"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = threading.Event()

    def serve_late() -> None:
        time.sleep(1.5)
        tool = probe.tool_path("ibv_rc_pingpong")
        assert tool is not None
        proc = subprocess.Popen(
            probe.verbs_argv(tool, "mlx5_0", port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        started.set()
        try:
            proc.wait(30)
        finally:
            proc.kill()

    server = threading.Thread(target=serve_late, daemon=True)
    server.start()
    out = probe.verbs_ping({"kind": "verbs", "addr": "127.0.0.1", "port": port, "device": "mlx5_0"}, 15)
    assert started.is_set()
    assert out["ok"] is True and "bytes in" in out["result"] and out["error"] is None, out
    server.join(30)


def test_software_facts_see_the_packages_the_inventorys_pythonpath_brings(tmp_path: Path) -> None:
    """The probe read versions from its own sys.path, made from the login environment before the
    job's env (with an inventory's PYTHONPATH) reached it: a torch that only PYTHONPATH brings was
    missed (or one PYTHONPATH shadows was reported). The job's interpreter is who decides."""
    import json
    import os
    import subprocess
    import sys

    fake = tmp_path / "extra" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "version.py").write_text("__version__ = '9.9.9+shadow'\ncuda: Optional[str] = None\n")
    code = (
        "import json, sys; from orchestrator.node import probe; probe.apply_env(json.loads(sys.argv[1])); "
        "print(json.dumps(probe.gather_software({})))"
    )
    repo = str(Path(__file__).resolve().parents[2])

    def software(env: dict[str, str]) -> dict:
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(env)],
            capture_output=True,
            text=True,
            cwd=repo,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
            timeout=60,
            check=True,
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert software({"PYTHONPATH": str(tmp_path / "extra")})["torch"] == "9.9.9+shadow"
    assert software({"OTHER": "1"})["torch"] != "9.9.9+shadow"
