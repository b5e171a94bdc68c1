"""Shared helpers for the trainer tests: datasets, free ports, torchrun runs, a network block.

Run as a script (``python tests/trainer_helpers.py ARGS``, also under torchrun) it installs the
network block in the process and then runs ``trainer.train.main(ARGS)``: any attempt to reach a
non-loopback address raises and is appended to ``$TRAINER_NET_LOG``.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
LOOPBACK = {"127.0.0.1", "::1", "localhost", "0.0.0.0", "", None}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_dataset(root: Path, images: int = 24, classes: int = 3, imgsz: int = 64, segments: bool = False) -> Path:
    """A synthetic YOLO dataset under ``root``; returns its absolute data YAML."""
    sys.path.insert(0, str(REPO))
    from trainer.synth import write_dataset

    return write_dataset(root, images=images, classes=classes, imgsz=imgsz, segments=segments)


@dataclass
class Result:
    """What a trainer run left behind."""

    returncode: int
    stdout: str
    stderr: str

    def rank_lines(self, stream: str = "stdout") -> list[str]:
        """Lines the trainer printed (those with the rank prefix)."""
        return [ln for ln in getattr(self, stream).splitlines() if ln.startswith("[rank ")]

    def explain(self) -> str:
        """Both streams, for assertion messages."""
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-6000:]}\n--- stderr\n{self.stderr[-6000:]}"


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a child: repo importable, one thread per rank (2 cores here); the trainer sets its own offline switches."""
    e = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    e.update(extra or {})
    return e


def run_trainer(args: list[str], nproc: int = 0, timeout: float = 300, blocked_net_log: Path | None = None,
                cwd: Path | None = None) -> Result:
    """Run the trainer: plain ``python -m trainer`` (nproc 0) or torchrun with ``nproc`` ranks.

    With ``blocked_net_log`` the run goes through this file as a script, so every rank runs
    with the network blocked in-process and attempts are logged there.
    """
    entry = [str(Path(__file__).resolve())] if blocked_net_log else ["-m", "trainer"]
    if nproc:
        cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
               "--master-port", str(free_port()), *entry, *args]
    else:
        cmd = [PYTHON, *entry, *args]
    extra = {"TRAINER_NET_LOG": str(blocked_net_log)} if blocked_net_log else {}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(extra), cwd=cwd or REPO)
    return Result(p.returncode, p.stdout, p.stderr)


def read_results(run_dir: Path) -> list[dict[str, float]]:
    """results.csv rows as floats."""
    with open(run_dir / "results.csv") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def read_debug(debug_dir: Path, world_size: int) -> list[dict[str, Any]]:
    """Every rank's debug record, in rank order."""
    return [json.loads((debug_dir / f"rank{r}.json").read_text()) for r in range(world_size)]


def train_loss(row: dict[str, float]) -> float:
    """Sum of the train loss components of a results.csv row."""
    return sum(v for k, v in row.items() if k.startswith("train/"))


def _is_loopback(host: Any) -> bool:
    """Whether ``host`` (name or address) stays on this machine."""
    return host in LOOPBACK or (isinstance(host, str) and host.startswith("127."))


def install_network_block(log: Path) -> None:
    """Make every non-loopback connect or name lookup in this process raise, and log it."""

    def refuse(what: str) -> OSError:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {what}\n")
        return OSError(f"network blocked by test: {what}")

    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
            raise refuse(f"connect {address}")
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
            raise refuse(f"connect_ex {address}")
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not _is_loopback(host):
            raise refuse(f"getaddrinfo {host}")
        return real_getaddrinfo(host, *args, **kwargs)

    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
    socket.getaddrinfo = getaddrinfo


if __name__ == "__main__":
    install_network_block(Path(os.environ["TRAINER_NET_LOG"]))
    sys.path.insert(0, str(REPO))
    from trainer.train import main

    main(sys.argv[1:])
