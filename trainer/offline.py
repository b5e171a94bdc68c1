"""Keep ultralytics off the network: environment switches and a pre-seeded font.

Must run before the first ``import ultralytics``: ultralytics reads these variables at import
time (``is_online()`` DNS probe, analytics, auto-install of missing packages).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

OFFLINE_ENV = {
    "YOLO_OFFLINE": "1",  # disables the DNS probe in is_online() and the analytics events
    "YOLO_AUTOINSTALL": "False",  # never pip-install a missing requirement at run time
    "YOLO_VERBOSE": "False",  # no tqdm bars or banners: the trainer prints its own, rank-prefixed lines
}


def set_offline_env() -> None:
    """Set ultralytics' offline switches unless the caller set them explicitly."""
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)


def seed_font() -> Path | None:
    """Put a real TTF at ``<YOLO config dir>/Arial.ttf`` so ``check_font`` never downloads one.

    ``check_font`` (called by ``check_det_dataset`` and by every plot) is not gated by
    YOLO_OFFLINE: it issues ``requests.head`` unless the file exists in the config dir. We copy
    matplotlib's bundled DejaVuSans, which plots fine under the Arial name.

    Returns:
        The font path, or None if matplotlib's font is not available.
    """
    from matplotlib import get_data_path
    from ultralytics.utils import USER_CONFIG_DIR

    source = Path(get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    if not source.exists():
        return None
    for name in ("Arial.ttf", "Arial.Unicode.ttf"):
        target = Path(USER_CONFIG_DIR) / name
        if not target.exists():
            # Copy then rename: several ranks on one node may seed the same directory at once.
            tmp = target.with_name(f".{name}.{os.getpid()}.tmp")
            shutil.copyfile(source, tmp)
            os.replace(tmp, target)
    return Path(USER_CONFIG_DIR) / "Arial.ttf"
