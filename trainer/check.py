"""``python -m trainer --check ARGS``: everything a start refuses, refused now, without training.

The same functions a start runs, in the same order, up to the process group: ``parse_config``,
``check_topology`` (the world from torchrun's environment: ``WORLD_SIZE``, ``RANK``,
``LOCAL_WORLD_SIZE``), the device this rank would pick (``dist.pick_device``, without making it
current), ``loop.prepare`` (the data YAML and its train/val paths, ``--weights`` loaded as an
ultralytics checkpoint, the architecture against ``--model``, ``--task``, ``--text-embeddings``,
precision, ``--sync-bn``, ultralytics' own check of its settings; a segment or OBB model against the
first label files of each split: boxes only are refused) and, on rank 0, ``loop.decide_run``
(the run directory: ``--out`` that already holds a run, ``--resume`` and the checkpoint it
continues, read and checked). A refusal is the message the start would print.

Not done, so not verified: no process group, no model built (a ``--freeze`` naming a layer the
model lacks), no dataset built (label files, images), no GPU touched (``orch check``'s `gpus`
check compares nvidia-smi, CUDA_VISIBLE_DEVICES and ``--device`` on every node), nothing written.

The answer is one JSON line on stdout (anything else printed meanwhile goes to stderr):
``{"trainer_check": 1, "ok": true, ...}``, exit 0; or ``{"trainer_check": 1, "ok": false,
"error": MESSAGE, "stage": ...}``, exit 2. orch's preflight runs it on the master (and on every
node when the inputs are node-local copies) with the job's python, workdir and environment.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any

from trainer.config import parse_config
from trainer.errors import TrainerError
from trainer.offline import set_offline_env

SCHEMA = 1
VERIFIED = ("arguments", "topology", "device", "data", "weights", "model", "settings", "run directory")
NOT_VERIFIED = ("model build (--freeze layer names)", "datasets (label files, images)", "process group", "GPU memory")


def check(argv: list[str]) -> dict[str, Any]:
    """The answer for these arguments as this rank (from the environment) would start them.

    Raises:
        TrainerError: what the start would refuse, with its message; `.stage` says where.
    """
    stage = "arguments"
    try:
        found: list[str] = []
        cfg = parse_config([a for a in argv if a != "--check"], usage_errors=True, problems=found)
        stage = "topology"
        from trainer import dist as tdist  # torch: after argparse's refusals
        from trainer.loop import admit, decide_run

        topo = tdist.Topology.from_env()
        # the arguments' rules, topology, device, precision and the inputs: all at once
        inputs = admit(cfg, topo, found, select=False)
        cfg, device = inputs.cfg, inputs.device
        answer: dict[str, Any] = {
            "rank": topo.rank,
            "world_size": topo.world_size,
            "local_world_size": topo.local_world_size,
            "launched": topo.launched,
            "device": str(device),
            "amp": inputs.amp,
            "model": inputs.arch.name,
            "task": inputs.arch.task,
            "yoloe": inputs.arch.yoloe,
            "weights": cfg.weights,
            "data": cfg.data,
            "classes": len(inputs.data["names"]),
            "batch": cfg.batch,
            "epochs": cfg.epochs,
            "device_ids": list(cfg.device_ids) if cfg.device_ids is not None else None,
        }
        if topo.is_main:
            stage = "run directory"
            out, resume = decide_run(inputs.cfg)  # the model's task places the run directory
            answer.update(
                out=str(out.absolute()), resume=cfg.resume, resume_epoch=resume.get("epoch") if resume else None
            )
    except TrainerError as e:
        if not hasattr(e, "stage"):
            e.stage = stage  # type: ignore[attr-defined]
        raise
    return {
        "trainer_check": SCHEMA,
        "ok": True,
        **answer,
        "verified": list(VERIFIED),
        "not_verified": list(NOT_VERIFIED),
    }


def main(argv: list[str] | None = None) -> int:
    """Answer on stdout (one JSON line); 0 accepted, 2 refused. Anything unexpected keeps its
    traceback (exit 1), as a start's would."""
    args = list(sys.argv[1:] if argv is None else argv)
    set_offline_env()  # before ultralytics is imported: it reads these at import time
    out = sys.stdout
    code = 0
    with contextlib.redirect_stdout(sys.stderr):  # library chatter never mixes into the answer
        try:
            answer = check(args)
        except TrainerError as e:
            answer = {"trainer_check": SCHEMA, "ok": False, "error": str(e), "stage": getattr(e, "stage", None)}
            code = e.exit_code
    out.write(json.dumps(answer) + "\n")
    out.flush()
    return code
