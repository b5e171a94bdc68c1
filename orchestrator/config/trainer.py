"""What orch knows of this repository's trainer (`python -m trainer`) without starting it: the
flags that name its input files and output folders, where its run keeps `weights/last.pt`, the
global-batch rule, the small per-rank batch warning and how `--device` names GPUs. Defined once, in
`trainer/interface.py` (stdlib only, like the log lines
`logs/trainer.py` reads); this module is the config layer's door to it.
"""

from __future__ import annotations

from trainer.interface import (
    AUTO,
    BEST,
    DEFAULT_PROJECT,
    INPUT_FLAGS,
    LAST,
    OFF_WORD,
    OUTPUT_FLAGS,
    PREEMPTED_EXIT,
    SAME_SETTING,
    batch_choices,
    batch_problem,
    file_setting,
    is_builtin_model,
    override_args,
    parse_device,
    replaced,
    setting_name,
    setting_value,
    settings_of,
    small_batch_warning,
    value_setting,
)

__all__ = [
    "AUTO",
    "BEST",
    "DEFAULT_PROJECT",
    "INPUT_FLAGS",
    "LAST",
    "OFF_WORD",
    "OUTPUT_FLAGS",
    "PREEMPTED_EXIT",
    "SAME_SETTING",
    "batch_choices",
    "batch_problem",
    "file_setting",
    "is_builtin_model",
    "override_args",
    "parse_device",
    "replaced",
    "setting_name",
    "setting_value",
    "settings_of",
    "small_batch_warning",
    "value_setting",
]
