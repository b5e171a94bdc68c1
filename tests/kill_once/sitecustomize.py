"""Testing: kill one rank with SIGKILL once, at an optimizer step, as if its process had died.

Put this directory on PYTHONPATH (Python imports `sitecustomize` at start-up) and set, in the
environment of the node whose rank is to die:

    ORCH_TEST_KILL_RANK     the global rank (torchrun's RANK) to kill
    ORCH_TEST_KILL_AT_STEP  after how many optimizer steps of that process; `build`: while it builds
                            its datasets (the trainer's `data.build_splits`), before any step
    ORCH_TEST_KILL_MARKER   a file written just before the kill; while it exists nothing is killed,
                            so the relaunch of the same command (an automatic retry) runs through
    ORCH_TEST_KILL_HOW      `kill` (default: SIGKILL) or `raise` (a RuntimeError out of the step,
                            as a bug or a CUDA error would raise it: the trainer's own handling runs),
                            or `warn` (SIGUSR2 to that rank alone, as Slurm's warning signal before a
                            time limit or a preemption: the trainer checkpoints and exits 75)

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

    _at_text = os.environ["ORCH_TEST_KILL_AT_STEP"]
    _at = int(_at_text) if _at_text != "build" else 0
    _how = os.environ.get("ORCH_TEST_KILL_HOW", "kill")
    _steps = [0]
    _DONE = {"raise": "raised", "warn": "warned"}

    def _kill_once(optimizer, args, kwargs):  # noqa: ANN001, ANN202 - torch's hook signature
        _steps[0] += 1
        if _steps[0] == _at:
            with open(os.environ["ORCH_TEST_KILL_MARKER"], "w") as fh:
                fh.write(f"rank {os.environ['RANK']} {_DONE.get(_how, 'killed')} after optimizer step {_at}\n")
            if _how == "warn":
                print(
                    f"[test] rank {os.environ['RANK']}: SIGUSR2 after optimizer step {_at}", file=sys.stderr, flush=True
                )
                os.kill(os.getpid(), signal.SIGUSR2)
                return
            if _how == "raise":
                print(
                    f"[test] rank {os.environ['RANK']}: raising after optimizer step {_at}", file=sys.stderr, flush=True
                )
                raise RuntimeError(f"test: rank {os.environ['RANK']} fails after optimizer step {_at}")
            print(f"[test] rank {os.environ['RANK']}: SIGKILL after optimizer step {_at}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def _build_dies(module):  # noqa: ANN001, ANN202 - the trainer's data module, once loaded
        def dying(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            with open(os.environ["ORCH_TEST_KILL_MARKER"], "w") as fh:
                what = "raised" if _how == "raise" else "killed"
                fh.write(f"rank {os.environ['RANK']} {what} building its datasets\n")
            if _how == "raise":
                raise RuntimeError(f"test: rank {os.environ['RANK']} fails building its datasets")
            print(f"[test] rank {os.environ['RANK']}: SIGKILL building its datasets", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

        module.build_splits = dying

    if _at_text == "build":
        import importlib.abc
        import importlib.util

        class _PatchData(importlib.abc.MetaPathFinder):
            """Patch trainer.data right after it is loaded (the loop calls it through the module)."""

            def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201, ARG002
                if name != "trainer.data":
                    return None
                sys.meta_path.remove(self)
                spec = importlib.util.find_spec(name)
                load = spec.loader.exec_module

                def exec_module(module):  # noqa: ANN001, ANN202
                    load(module)
                    _build_dies(module)

                spec.loader.exec_module = exec_module
                return spec

        sys.meta_path.insert(0, _PatchData())
    else:
        register_optimizer_step_post_hook(_kill_once)
