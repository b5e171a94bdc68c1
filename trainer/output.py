"""The run directory, as ``yolo train`` (ultralytics 8.4) lays it out: ``runs/<task>/train``
(``train2``, ``train3``... when it exists; an absolute ``--project`` holds the run itself),
``weights/{last,best}.pt``, ``results.csv``, ``args.yaml`` (which ``yolo cfg=`` accepts)
and TensorBoard scalars."""

from __future__ import annotations

import csv
import os
from dataclasses import asdict, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from trainer.config import TrainConfig
from trainer.errors import TrainerError
from trainer.interface import AUTO, LAST
from trainer.logs import say


def numbered(base: Path) -> Path:
    """``base`` if it does not exist, else the first free ``base2``, ``base3``... (ultralytics' increment_path)."""
    if not base.exists():
        return base
    n = 2
    while base.with_name(f"{base.name}{n}").exists():
        n += 1
    return base.with_name(f"{base.name}{n}")


def latest_run(project: Path) -> Path | None:
    """The run under ``project`` whose weights/last.pt was written last."""
    found = sorted(project.glob(f"*/{LAST}"), key=lambda p: p.stat().st_mtime)
    return found[-1].parent.parent if found else None


RUN_ID_FILE = ".orch-run-id"
"""In a run directory made under ``orch up``: the orch run id that trains in it (rank 0 writes it
when it opens the directory), so a retry with ``--resume auto`` finds its own directory even when
it was numbered (``r1`` existed: ``r12``)."""


def mark_run(out: Path) -> None:
    """Record the orch run id (``ORCH_RUN_ID``) that trains in ``out``; nothing outside orch."""
    run_id = os.environ.get("ORCH_RUN_ID")
    if run_id:
        (out / RUN_ID_FILE).write_text(run_id + "\n")


def own_run(project: Path, name: str, run_id: str) -> Path | None:
    """The directory ``name``, ``name2``, ``name3``... under ``project`` that orch run ``run_id``
    trains in (its ``RUN_ID_FILE``), or None."""
    import re

    if not project.is_dir():
        return None
    numbered_name = re.compile(re.escape(name) + r"\d*")
    for d in sorted(project.iterdir()):
        mark = d / RUN_ID_FILE
        if numbered_name.fullmatch(d.name) and mark.is_file() and mark.read_text().strip() == run_id:
            return d
    return None


def project_dir(cfg: TrainConfig) -> Path:
    """Where run directories are made, ultralytics 8.4's ``get_save_dir`` rule: an absolute
    ``--project`` as it is, else ``runs/<task>/<project>`` (the task: ``cfg.task``, the model's
    once ``prepare`` has read it; detect before)."""
    from trainer.interface import DEFAULT_PROJECT

    if cfg.project and Path(cfg.project).is_absolute():
        return Path(cfg.project)
    return Path(DEFAULT_PROJECT) / (cfg.task or "detect") / cfg.project


def resolve_auto(cfg: TrainConfig) -> tuple[Path, Path | None] | None:
    """``--resume auto`` (what ``orch up`` passes to a retry): this run's own directory and its
    last.pt when it wrote one; the directory alone when it has none yet (the run starts over in
    it); None when there is no such directory (the run starts as without ``--resume``).

    This run's directory: ``--out``; else, under ``orch up``, the directory under PROJECT named
    NAME (or NAME2, NAME3...) that records this run id; else PROJECT/NAME."""
    if cfg.out:
        out = Path(cfg.out)
    else:
        run_id = os.environ.get("ORCH_RUN_ID")
        base = project_dir(cfg) / cfg.name
        found = own_run(project_dir(cfg), cfg.name, run_id) if run_id else (base if base.is_dir() else None)
        if found is None:
            return None
        out = found
    return out, (out / LAST if (out / LAST).is_file() else None)


def resolve(cfg: TrainConfig) -> tuple[Path, Path | None]:
    """The run directory and, with ``--resume``, the checkpoint to continue from (decided on rank 0).

    ``--out`` is used as is. Otherwise PROJECT/NAME, numbered when it exists (``exist_ok`` reuses
    it); a bare ``--resume`` continues PROJECT/NAME when a name was given (``--name``, or the run
    id under ``orch up``), else the run under PROJECT whose last.pt is the newest (as ``yolo
    train resume``); ``--resume PATH`` continues in PATH's run directory.

    ``--resume auto`` is ``resolve_auto``: this run's own last.pt if it has one, else a fresh start
    in the same directory.

    Raises:
        TrainerError: the directory already holds a run and ``--resume`` was not given, or there is
            nothing to resume.
    """
    if cfg.resume == AUTO:
        found = resolve_auto(cfg)
        if found is not None:
            return found
        cfg = replace(cfg, resume=None)
    if cfg.out:
        out = Path(cfg.out)
        if cfg.resume is None and (out / LAST).exists():
            raise TrainerError(f"--out {cfg.out} already holds a run ({LAST}): add --resume, or pick another --out")
        if cfg.resume is None:
            return out, None
        return out, Path(cfg.resume) if cfg.resume else out / LAST
    base = project_dir(cfg) / cfg.name
    if cfg.resume == "" and cfg.name != TrainConfig.name:
        # A named run (by --name, or by orch up's run id, whose retries pass a bare --resume):
        # that run, never another one under the project that happens to be newer. A new `orch up`
        # (a new run id) with `resume: true` continues the newest run, as documented.
        if (base / LAST).exists():
            return base, base / LAST
        if cfg.name != os.environ.get("ORCH_RUN_ID"):
            raise TrainerError(
                f"--resume: {base.absolute()} has no {LAST}; give --resume PATH, or the --name of a run that has one"
            )
    if cfg.resume == "":
        run = latest_run(project_dir(cfg))
        if run is None:
            raise TrainerError(
                f"--resume: no run with {LAST} under {project_dir(cfg).absolute()}; "
                "give --resume PATH or the run's --out"
            )
        return run, run / LAST
    if cfg.resume:
        path = Path(cfg.resume)
        return (path.parent.parent if path.parent.name == "weights" else numbered(base)), path
    if cfg.exist_ok or cfg.name == os.environ.get("ORCH_RUN_ID"):
        # orch up's run id names one directory per run: a retry relaunched before the first
        # checkpoint starts again in it (numbering would move it away from where orch looks).
        if (base / LAST).exists():
            raise TrainerError(f"{base} already holds a run ({LAST}): add --resume, or pick another --name")
        return base, None
    return numbered(base), None


def ultralytics_device(cfg: TrainConfig) -> str:
    """``device`` as ultralytics writes it (``0,1``, ``cpu``, or empty for auto)."""
    if cfg.device_ids is not None:
        return ",".join(map(str, cfg.device_ids))
    return {"auto": "", "cuda": "0"}.get(cfg.device, cfg.device)


def write_args(out: Path, cfg: TrainConfig, hyp: SimpleNamespace) -> None:
    """``args.yaml``: ultralytics' settings as used (only its own keys, so ``yolo cfg=args.yaml``
    accepts it), and ``trainer.yaml``: this trainer's whole configuration."""
    from ultralytics.utils import DEFAULT_CFG_KEYS

    out.mkdir(parents=True, exist_ok=True)
    args = {k: v for k, v in vars(hyp).items() if k in DEFAULT_CFG_KEYS}
    (out / "args.yaml").write_text(yaml.safe_dump(args, sort_keys=False))
    doc = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()}
    (out / "trainer.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def append_results(path: Path, epoch: int, elapsed: float, row: dict[str, float]) -> None:
    """Append one row to results.csv with ultralytics' column names (header on first write)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    header = ["epoch", "time", *row]
    if not new:  # the columns are the first row's: a later row is written in their order, never shifted
        with open(path, newline="") as f:
            header = next(csv.reader(f), header)
    values = {"epoch": str(epoch + 1), "time": f"{elapsed:.6g}", **{k: f"{float(v):.6g}" for k, v in row.items()}}
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(header)
        w.writerow([values.get(k, "") for k in header])


class Scalars:
    """TensorBoard scalars in the run directory, as ``yolo train`` writes them when tensorboard is
    installed (rank 0 only; a no-op without tensorboard)."""

    def __init__(self, out: Path) -> None:
        self.writer: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            say("note: tensorboard is not installed: no TensorBoard scalars (pip install tensorboard)")
            return
        self.writer = SummaryWriter(str(out))

    def add(self, values: dict[str, float], step: int) -> None:
        """One point per scalar at ``step`` (the 1-based epoch)."""
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(key, float(value), step)
            self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        if self.writer is not None:
            self.writer.close()
