"""A small DDP job for the launch tests: a gloo all_reduce loop that can fail, hang or exit on cue.

Run under torchrun (it reads RANK / WORLD_SIZE / MASTER_ADDR from its environment). Every step
all-reduces `rank + 1 + step` over the world and checks the sum, printing

    [rank R] step S sum=X ok

and at the end `[rank R] done steps=N allreduce_ok=True final_sum=X expected=X`.

Faults (flags, or the environment variables in brackets, so a test can set them per node):
  --fail-rank R --fail-step S  [DDP_FAIL_RANK, DDP_FAIL_STEP]  rank R raises RuntimeError at step S
  --hang-rank R --hang-step S  [DDP_HANG_RANK, DDP_HANG_STEP]  rank R sleeps forever at step S
  --exit-rank R --exit-code C  [DDP_EXIT_RANK, DDP_EXIT_CODE]  rank R calls os._exit(C) at --fail-step
  --kill-rank R --kill-signal N [DDP_KILL_RANK, DDP_KILL_SIGNAL]  rank R sends itself signal N (9: what the
                               kernel's OOM killer sends) at --fail-step
  --break-file PATH            [DDP_BREAK_FILE]  the failing rank deletes PATH first (its node breaks too)
  --stop-file PATH             [DDP_STOP_FILE]  every rank ends after the step at which any rank sees PATH
                               (agreed through that step's all_reduce), before --steps: a test ends a
                               long run once what it waits for has happened
  --data PATH                  ignored: a path-like argument for the preflight's `job` check to compare
  --checkpoint PATH            [DDP_CHECKPOINT]  the trainer's preemption in small (trainer/preempt.py): on
                               SIGUSR2 (Slurm's warning) every rank stops after the step at which any rank
                               got it (agreed through that step's all_reduce), rank 0 writes the next step
                               to PATH, says `preempted (SIGUSR2): checkpoint PATH ...` and every rank exits
                               75; a run that finds PATH starts at that step (`resuming at step S`)
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import time

gc.disable()  # importing torch makes ~10^6 objects and no garbage: the collector's passes over them
import torch  # noqa: E402  (~10 % of a rank's start, 0.2 CPU-s, in every rank of every launch test)
import torch.distributed as dist  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402

gc.enable()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=int(env("DDP_STEPS", "20")))
    p.add_argument("--sleep", type=float, default=float(env("DDP_SLEEP", "0.2")), help="seconds between steps")
    p.add_argument("--fail-rank", type=int, default=int(env("DDP_FAIL_RANK", "-1")))
    p.add_argument("--fail-step", type=int, default=int(env("DDP_FAIL_STEP", "3")))
    p.add_argument("--hang-rank", type=int, default=int(env("DDP_HANG_RANK", "-1")))
    p.add_argument("--hang-step", type=int, default=int(env("DDP_HANG_STEP", "3")))
    p.add_argument("--exit-rank", type=int, default=int(env("DDP_EXIT_RANK", "-1")))
    p.add_argument("--exit-code", type=int, default=int(env("DDP_EXIT_CODE", "7")))
    p.add_argument("--kill-rank", type=int, default=int(env("DDP_KILL_RANK", "-1")))
    p.add_argument("--kill-signal", type=int, default=int(env("DDP_KILL_SIGNAL", "9")))
    p.add_argument("--break-file", default=env("DDP_BREAK_FILE", ""))
    p.add_argument("--stop-file", default=env("DDP_STOP_FILE", ""))
    p.add_argument("--data", help="ignored")
    p.add_argument("--checkpoint", default=env("DDP_CHECKPOINT", ""))
    return p.parse_args(argv)


def expected_sum(world: int, step: int) -> float:
    """Sum over ranks of (rank + 1 + step)."""
    return world * (world + 1) / 2 + world * step


def sleep_forever() -> None:
    """A hang the stack dumps can name: this rank never reaches the next all_reduce."""
    while True:
        time.sleep(60)


PREEMPTED_EXIT = 75
"""The trainer's exit code after its preemption checkpoint (trainer/interface.py), which orch reads."""
_warned: list[int] = []


@record
def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    first = 0
    if args.checkpoint:
        signal.signal(signal.SIGUSR2, lambda signum, _frame: _warned.append(signum))
        if os.path.exists(args.checkpoint):
            with open(args.checkpoint) as fh:
                first = int(fh.read())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"[rank {rank}] up world={world} host={os.uname().nodename} node={os.environ.get('ORCH_NODE')}", flush=True)
    if first:
        print(f"[rank {rank}] resuming at step {first}", flush=True)
    ok = True
    total = 0.0
    done = 0
    for step in range(first, args.steps):
        if rank == args.fail_rank and step == args.fail_step:
            if args.break_file:
                os.unlink(args.break_file)
            raise RuntimeError(f"injected failure on rank {rank} at step {step}")
        if rank == args.exit_rank and step == args.fail_step:
            print(f"[rank {rank}] exiting with code {args.exit_code} at step {step}", flush=True)
            os._exit(args.exit_code)
        if rank == args.kill_rank and step == args.fail_step:
            print(f"[rank {rank}] sending itself signal {args.kill_signal} at step {step}", flush=True)
            os.kill(os.getpid(), args.kill_signal)
        if rank == args.hang_rank and step == args.hang_step:
            print(f"[rank {rank}] hanging at step {step}", flush=True)
            sleep_forever()
        stop = bool(args.stop_file) and os.path.exists(args.stop_file)
        t = torch.tensor([float(rank + 1 + step), float(stop), float(bool(_warned))])
        dist.all_reduce(t)
        total = float(t[0].item())
        good = total == expected_sum(world, step)
        ok &= good
        done = step + 1
        print(f"[rank {rank}] step {step} sum={total:g} {'ok' if good else 'WRONG'}", flush=True)
        if t[2].item() > 0:
            preempted(args.checkpoint, rank, step)
        if t[1].item() > 0:
            print(f"[rank {rank}] stop file seen: ending after step {step}", flush=True)
            break
        time.sleep(args.sleep)
    expected = expected_sum(world, done - 1)
    print(f"[rank {rank}] done steps={done} allreduce_ok={ok} final_sum={total:g} expected={expected:g}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 3


def preempted(path: str, rank: int, step: int) -> None:
    """Every rank after `step`, once any rank got SIGUSR2: rank 0 writes the checkpoint, all exit 75."""
    if rank == 0:
        with open(path + ".tmp", "w") as fh:
            fh.write(str(step + 1))
        os.replace(path + ".tmp", path)
        print(f"preempted (SIGUSR2): checkpoint {path} after step {step}; --resume continues from it", flush=True)
    dist.barrier()
    leave(PREEMPTED_EXIT)


def leave(code: int) -> None:
    """End the process with ``code`` once everything printed is flushed, without the interpreter's
    teardown of torch's module graph (about 0.4 s of CPU per rank, and the suite starts hundreds of
    ranks): nothing orch observes (exit code, output, the processes gone) depends on it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main())
