"""A small disk to fill up (a tmpfs; root only), for the tests of a full run root."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(where: Path, size: str = "4m") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` (root only), unmounted however the test ends."""
    where.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Write a file on `disk` until it is full; the file, to free the space again."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 65536)
    with contextlib.suppress(OSError), open(filler, "ab", buffering=0) as fh:
        while True:
            fh.write(b"\0")
    return filler
