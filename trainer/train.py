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
from trainer import logs, preempt
from trainer.config import parse_config
from trainer.errors import TrainerError
from trainer.offline import set_offline_env


@record
def main(argv: list[str] | None = None) -> None:
    """Run one training job as this rank; exits non-zero on a bad input."""
    set_offline_env()  # before ultralytics is imported: it reads these at import time
    preempt.install()  # a warning signal (SIGUSR2) from now on: a checkpoint at the next step, then exit
    topo = tdist.Topology.from_env()
    logs.set_rank(topo.rank)
    admitted = False
    try:
        found: list[str] = []
        cfg = parse_config(argv, problems=found)
        from trainer.loop import admit, fit  # ultralytics is imported where it is used
        from trainer.offline import seed_font

        logs.route_library_output()
        # --batch-per-device N as the global batch N x WORLD_SIZE; the arguments' rules, topology,
        # device, precision and every input file all in one refusal, on every rank before any waits
        inputs = admit(cfg, topo, found)
        admitted = True
        tdist.verdict(topo, refused=False)
        seed_font()
        cfg = inputs.cfg
        tdist.init(topo, inputs.device, cfg.timeout_min, cfg.startup_timeout_min, cfg.dist_backend)
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
    except preempt.Preempted as e:  # not an error: the checkpoint is written, --resume continues
        logs.say(str(e), sys.stderr)
        sys.exit(e.exit_code)
    except TrainerError as e:
        logs.say(f"error: {e}", sys.stderr)
        if not admitted:  # the others say theirs before torchrun stops them all
            tdist.verdict(topo, refused=True)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
