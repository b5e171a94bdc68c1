"""Testing: make one node's input pipeline slow, as a slow disk or too few loader workers would.

Put this directory on PYTHONPATH (Python imports `sitecustomize` at start-up) and set, in the
environment of the node whose data is to be slow, `ORCH_TEST_SLOW_DATA_S`: every batch a rank of
that node takes from its data loader comes that many seconds late (the loader's own `next`, so
the trainer's data wait sees it, in the process with `--workers 0` or in a worker process).
Every other process (torchrun, the probe) only reads the environment.
"""

import os

if os.environ.get("ORCH_TEST_SLOW_DATA_S") and os.environ.get("RANK") is not None:
    import time

    from torch.utils.data import dataloader

    _delay = float(os.environ["ORCH_TEST_SLOW_DATA_S"])
    _next = dataloader._BaseDataLoaderIter.__next__

    def _slow_next(self):  # noqa: ANN001, ANN202 - the iterator protocol
        time.sleep(_delay)  # the slow part of this pipeline, not a synchronisation
        return _next(self)

    dataloader._BaseDataLoaderIter.__next__ = _slow_next
