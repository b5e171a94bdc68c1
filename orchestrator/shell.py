"""The shell orch runs on a node, written once.

Every program orch hands a node's `/bin/sh` is a `Script`: constant text, with every value it
needs passed as a positional parameter (`/bin/sh -c TEXT NAME VALUE...`: `$0` is NAME, `$1`... the
values), never written into the text; so a run id, a nonce, an image name, a path or a python can
never be parsed as shell, whatever it holds. A guarded script first says in words when its tool
(`$0`) is missing on the node, and exits 127 (`NOT_INSTALLED`: the one spelling of that guard).

tests/unit/test_shell_scripts.py finds every module-level `Script` of the package and runs `sh -n`
on it, so a script is checked the day it is written.
"""

from __future__ import annotations

from dataclasses import dataclass

NOT_INSTALLED = "orch: {tool} is not installed on this node"
"""What a guarded script prints on stderr (and exits `MISSING`) when its tool is not on the node's PATH."""
MISSING = 127
"""The exit code of a missing tool (the shell's own for a command not found)."""
_GUARD = 'command -v "$0" >/dev/null 2>&1 || { echo "' + NOT_INSTALLED.format(tool="$0") + '" >&2; exit 127; }; '


@dataclass(frozen=True)
class Script:
    """One program for a node's `/bin/sh`; values reach it as positional parameters only."""

    body: str
    guarded: bool = False
    """`$0` is a tool the script runs: a node without it gets `NOT_INSTALLED` and exit 127 first."""

    @property
    def text(self) -> str:
        """The program as `/bin/sh -c` takes it (the guard, then the body)."""
        return (_GUARD if self.guarded else "") + self.body

    def argv(self, name: str, *values: str) -> list[str]:
        """`/bin/sh -c TEXT NAME VALUE...`: `$0` is `name` (the tool of a guarded script), `$1`...
        the values, each reaching the script as it is."""
        return ["/bin/sh", "-c", self.text, name, *values]


def missing(tool: str, stderr: str) -> bool:
    """Whether a guarded script said that `tool` is not installed on the node."""
    return NOT_INSTALLED.format(tool=tool) in stderr
