"""Testing: kill one rank with SIGKILL once, at an optimizer step, as if its process had died.

Put this directory on PYTHONPATH (Python imports `sitecustomize` at start-up) and set, in the
environment of the node whose rank is to die:

    ORCH_TEST_KILL_RANK     the global rank (torchrun's RANK) to kill
    ORCH_TEST_KILL_AT_STEP  after how many optimizer steps of that process
    ORCH_TEST_KILL_MARKER   a file written just before the kill; while it exists nothing is killed,
                            so the relaunch of the same command (an automatic retry) runs through
    ORCH_TEST_KILL_HOW      `kill` (default: SIGKILL) or `raise` (a RuntimeError out of the step,
                            as a bug or a CUDA error would raise it: the trainer's own handling runs)

Every other process (torchrun, other ranks, the preflight's probe) only reads the environment.
"""

import os

if (
    os.environ.get("ORCH_TEST_KILL_AT_STEP")
    and os.environ.get("RANK") is not None
    and os.environ.get("RANK") == os.environ.get("ORCH_TEST_KILL_RANK")
    and not os.path.exists(os.environ.get("ORCH_TEST_KILL_MARKER", "/nonexistent"))
):
    import signal
    import sys

    from torch.optim.optimizer import register_optimizer_step_post_hook

    _at = int(os.environ["ORCH_TEST_KILL_AT_STEP"])
    _how = os.environ.get("ORCH_TEST_KILL_HOW", "kill")
    _steps = [0]

    def _kill_once(optimizer, args, kwargs):  # noqa: ANN001, ANN202 - torch's hook signature
        _steps[0] += 1
        if _steps[0] == _at:
            with open(os.environ["ORCH_TEST_KILL_MARKER"], "w") as fh:
                fh.write(
                    f"rank {os.environ['RANK']} {'raised' if _how == 'raise' else 'killed'}"
                    f" after optimizer step {_at}\n"
                )
            if _how == "raise":
                print(
                    f"[test] rank {os.environ['RANK']}: raising after optimizer step {_at}", file=sys.stderr, flush=True
                )
                raise RuntimeError(f"test: rank {os.environ['RANK']} fails after optimizer step {_at}")
            print(f"[test] rank {os.environ['RANK']}: SIGKILL after optimizer step {_at}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    register_optimizer_step_post_hook(_kill_once)
