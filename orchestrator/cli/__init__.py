"""`orch`, the command line: the only package that prints, and the one that picks exit codes.

`commands.py` parses (click) and calls the library; `render/` shows what it returns; `ui.py`
is the console (colour only on a terminal, never with NO_COLOR); `complete.py` completes values
in the shell (run ids, node names, check names, inventory files).
"""

from .commands import cli, main

__all__ = ["cli", "main"]
