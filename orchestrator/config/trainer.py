"""What orch knows of this repository's trainer (`python -m trainer`) without starting it: the
flags that name its input files and output folders, where its run keeps `weights/last.pt`, and
the global-batch rule. Defined once, in `trainer/interface.py` (stdlib only, like the log lines
`logs/trainer.py` reads); this module is the config layer's door to it.
"""

from __future__ import annotations

from trainer.interface import (
    AUTO,
    BEST,
    DEFAULT_PROJECT,
    INPUT_FLAGS,
    LAST,
    OUTPUT_FLAGS,
    batch_choices,
    batch_problem,
)

__all__ = ["AUTO", "BEST", "DEFAULT_PROJECT", "INPUT_FLAGS", "LAST", "OUTPUT_FLAGS", "batch_choices", "batch_problem"]
