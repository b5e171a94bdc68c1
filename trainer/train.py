"""Entry point torchrun starts on every node: parse, check, join the group, train, leave.

Like torchtitan's train.py, this file only wires the pieces together. Every input problem becomes
one line on stderr (``[rank R] error: ...``) and exit code 2 on every rank; anything else is a bug
and keeps its traceback, which the ``record`` decorator reports as torchrun's root cause. A rank
that fails after joining the process group aborts it (never a graceful leave, which waits for
the peers) and exits at once.

The arguments are checked against the world (``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``) before torch
is imported: a misspelled flag, a batch the ranks cannot share or a relative path fails every rank
in a fraction of a second, not after seconds of ``import torch`` (minutes from a busy network
filesystem) on each.
"""

from __future__ import annotations

import sys
from typing import NoReturn

from trainer import logs
from trainer.config import TrainConfig, check_topology, parse_config, with_world_size
from trainer.errors import TrainerError
from trainer.offline import set_offline_env
from trainer.topology import Topology


def main(argv: list[str] | None = None) -> None:
    """Run one training job as this rank; exits non-zero on a bad input."""
    set_offline_env()  # before ultralytics is imported: it reads these at import time
    topo = Topology.from_env()
    logs.set_rank(topo.rank)
    try:
        cfg = parse_config(argv)
        cfg = with_world_size(cfg, topo.world_size)  # --batch-per-device N: the global batch N x WORLD_SIZE
        check_topology(cfg, topo.world_size, topo.launched, topo.local_world_size)
    except TrainerError as e:
        refuse(e)
    # torch from here on, after the cheap refusals
    from torch.distributed.elastic.multiprocessing.errors import record

    record(train)(cfg, topo)


def train(cfg: TrainConfig, topo: Topology) -> None:
    """Pick the device, read and check every input, join the group, train, leave."""
    from trainer import dist as tdist

    try:
        try:
            device = tdist.select_device(cfg.device, topo)
        except ValueError as e:
            raise TrainerError(str(e)) from None
        from trainer.loop import fit, prepare  # heavy imports (ultralytics) after the cheap checks
        from trainer.offline import seed_font

        logs.route_library_output()
        seed_font()
        inputs = prepare(cfg, topo, device)  # every rank reads and checks every file before it waits on another
        tdist.init(topo, device, cfg.timeout_min, cfg.startup_timeout_min)
        try:
            fit(inputs)
        except BaseException as e:
            # Never a graceful leave after a failure: it waits for peers that wait for us.
            if tdist.abort() and not isinstance(e, TrainerError):
                logs.say(f"error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                         "(process group aborted; traceback follows)", sys.stderr)
            raise
        tdist.close()
        tdist.leave_last(topo)
    except TrainerError as e:
        refuse(e)


def refuse(e: TrainerError) -> NoReturn:
    """The one line of an input problem, and its exit code."""
    logs.say(f"error: {e}", sys.stderr)
    sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
