"""Entry point torchrun starts on every node: parse, check, join the group, train, leave.

Like torchtitan's train.py, this file only wires the pieces together. Every input problem becomes
one line on stderr (``[rank R] error: ...``) and exit code 2 on every rank; anything else is a bug
and keeps its traceback, which the ``record`` decorator reports as torchrun's root cause. A rank
that fails after joining the process group aborts it (never a graceful leave, which waits for
the peers) and exits at once.
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.errors import record

from trainer import dist as tdist
from trainer import logs
from trainer.config import parse_config
from trainer.errors import TrainerError
from trainer.offline import set_offline_env


@record
def main(argv: list[str] | None = None) -> None:
    """Run one training job as this rank; exits non-zero on a bad input."""
    set_offline_env()  # before ultralytics is imported: it reads these at import time
    topo = tdist.Topology.from_env()
    logs.set_rank(topo.rank)
    try:
        found: list[str] = []
        cfg = parse_config(argv, problems=found)
        # --batch-per-device N as the global batch N x WORLD_SIZE; the arguments' rules, topology,
        # device and precision problems all in one refusal
        cfg, device = tdist.start_device(cfg, topo, found=found)
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
                logs.say(
                    f"error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                    "(process group aborted; traceback follows)",
                    sys.stderr,
                )
            raise
        tdist.close()
        tdist.leave_last(topo)
    except TrainerError as e:
        logs.say(f"error: {e}", sys.stderr)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
