"""Copying trees to a node, the pure parts: what `Transport.copy_tree` runs and what it reads back.

`copy_tree(sources, dest)` puts each absolute source at `dest` + its own path on the node
(`/data/coco` with `dest` `/` lands at `/data/coco`, never `/data/coco/coco`): rsync's `--relative`.
Two ways, one result (`Transfer`, rsync's itemized changes and statistics):

- rsync (`rsync_argv`), where the transport has a reach rsync can use (the OpenSSH client for
  `transport: ssh`, this machine for `transport: local`). `--relative --no-implied-dirs` create
  missing parents and leave the attributes of those that exist (`/data`, `/home/me`) alone; `-a`
  keeps file times, so a second run sends nothing that did not change (rsync's quick check: size
  and time); `--omit-dir-times` leaves directory times alone, so what a job writes beside the
  synced files (a label cache, `__pycache__`) does not make the next sync report changed
  directories. `EXCLUDED`: Python's bytecode caches belong to the interpreter and the paths of the
  machine that wrote them; excluded names are also safe from `--delete` there.
- a tar stream into the node's tar (`tar_argv`, `UNTAR`), over the transport's `pipe`: the
  fallback of any transport without an rsync reach. It has no quick check (every file is sent, and
  said so: `<f?????????`) and cannot delete (refused, `CopyFailed`).

Golden-tested (tests/unit/test_rsync.py, tests/unit/test_copy_tree.py).
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from .. import shell
from ..errors import TransportError
from ..shell import MISSING, Script, missing

EXCLUDED = ("__pycache__/",)
RSYNC_TIMED_OUT = 30
"""rsync's exit code when its `--timeout` passed with no data moved (`stall_s`: a stopped rsync on
the node, a hung disk)."""
"""rsync `--exclude` patterns of every copy: Python's bytecode caches, at any depth."""

RSYNC_SERVER = Script('exec "$0" "$@"', guarded=True)
"""The node's side of rsync: the server, after the guard that names a missing rsync in words
instead of leaving rsync's "connection unexpectedly closed"."""
REMOTE_RSYNC = shlex.join(RSYNC_SERVER.argv("rsync"))
"""`--rsync-path`: the node's login shell runs it followed by rsync's server arguments (`"$@"`)."""
NOT_INSTALLED = shell.NOT_INSTALLED.format(tool="rsync")
"""What the node side prints (and exits 127) when it has no rsync."""

UNTAR = Script('mkdir -p -- "$1" && exec "$0" -x -p -f - -C "$1"', guarded=True)
"""The node's side of the tar fallback: the archive on stdin unpacked under `$1`, modes kept."""


class CopyFailed(TransportError):
    """A copy to a node failed: `returncode` is the copying tool's exit code (rsync's, or the node's
    tar's), `detail` the one line that says why, without the node's name."""

    def __init__(self, node: str, exit_code: int, detail: str, hint: str | None = None, kind: str = "error") -> None:
        super().__init__(node, kind, detail, hint)
        self.returncode = exit_code
        self.detail = detail


@dataclass(frozen=True)
class Transfer:
    """What one copy changed (or, with dry_run, would change) on a node."""

    files: int
    """Regular files sent (new or changed)."""
    bytes: int
    """Their total size."""
    sent: int
    """Bytes sent over the connection (deltas, file list, protocol; the tar stream)."""
    changes: tuple[str, ...]
    """Every itemized change, `<f+++++++++ /abs/path` (sent), `*deleting /abs/path`..."""

    @property
    def deleted(self) -> int:
        """Items removed on the node (delete)."""
        return sum(1 for c in self.changes if c.startswith("*deleting"))

    @property
    def up_to_date(self) -> bool:
        """Nothing was (or would be) sent, deleted or changed."""
        return self.files == 0 and not self.changes


def check_sources(sources: Sequence[str]) -> None:
    """ValueError unless every source is absolute, without a trailing slash, and not `/`: each
    lands at its own path under the destination, and only such a path says which."""
    if not sources:
        raise ValueError("nothing to copy")
    for p in sources:
        if not p.startswith("/") or p == "/" or p.endswith("/"):
            raise ValueError(f"copy source {p!r} must be absolute, without a trailing slash, and not /")


# ----------------------------------------------------------------------------- rsync


def rsync_shell_word(arg: str) -> str:
    """One word of rsync's `-e` command: rsync splits it on spaces, and inside '…' or "…" a doubled
    quote is a literal one (no backslashes)."""
    if arg and not re.search(r"[ '\"]", arg):
        return arg
    return "'" + arg.replace("'", "''") + "'"


def rsync_argv(
    sources: Sequence[str],
    target: str,
    *,
    rsh: Sequence[str] | None = None,
    delete: bool = False,
    dry_run: bool = False,
    checksum: bool = False,
    stall_s: float | None = None,
) -> list[str]:
    """The rsync command that copies `sources` under `target` (`host:/dest/` through `rsh`, the
    remote shell's argv, with `REMOTE_RSYNC` on the node; or a directory of this machine); with
    `stall_s`, its `--timeout` (whole seconds, up): it exits `RSYNC_TIMED_OUT` when no data moved."""
    check_sources(sources)
    argv = [
        "rsync",
        "--archive",
        "--omit-dir-times",
        "--relative",
        "--no-implied-dirs",
        "--itemize-changes",
        "--stats",
        *(f"--exclude={pattern}" for pattern in EXCLUDED),
    ]
    if rsh is not None:
        argv += ["--rsh", " ".join(rsync_shell_word(a) for a in rsh), "--rsync-path", REMOTE_RSYNC]
    if dry_run:
        argv.append("--dry-run")
    if delete:
        argv.append("--delete")
    if checksum:
        argv.append("--checksum")
    if stall_s is not None:
        argv.append(f"--timeout={math.ceil(stall_s)}")
    return [*argv, *sources, target]


def stalled_copy(node: str, code: int, stall_s: float, tool: str) -> CopyFailed:
    """A copy whose `tool` moved no byte for `stall_s`, ended here (kind `stalled`)."""
    return CopyFailed(node, code, f"{tool} moved no byte for {stall_s:.0f} s: the copy was ended here", kind="stalled")


_ITEM = re.compile(r"^(?:[<>ch.][fdLDS][.+?a-z]{9,}|\*deleting) +(.*)$")
_STAT_KEYS = ("Number of regular files transferred", "Total transferred file size", "Total bytes sent")
_STAT = re.compile(rf"^({'|'.join(_STAT_KEYS)}): ([\d,.]+)", re.M)


def parse_output(text: str) -> Transfer:
    """rsync's `--itemize-changes --stats` output (LC_ALL=C) → Transfer. Names are printed relative
    to `/` under --relative: they come back absolute. ValueError when the statistics are missing
    (an rsync that printed none must not read as "nothing changed")."""
    changes = []
    for line in text.splitlines():
        m = _ITEM.match(line)
        if m:
            changes.append(f"{line.split(' ', 1)[0]} /{m.group(1).lstrip('/')}")
    stats = {k: int(v.replace(",", "").replace(".", "")) for k, v in _STAT.findall(text)}
    absent = [k for k in _STAT_KEYS if k not in stats]
    if absent:
        raise ValueError(f"rsync printed no {absent[0]!r} (--stats)")
    return Transfer(
        files=stats[_STAT_KEYS[0]], bytes=stats[_STAT_KEYS[1]], sent=stats[_STAT_KEYS[2]], changes=tuple(changes)
    )


_RSYNC_NOISE = (
    "rsync: connection unexpectedly closed",
    "rsync error:",
    "rsync: [sender] write error",
    "rsync: [Receiver] write error",
)

Unreached = Callable[[str], "TransportError | None"]
"""unreached(stderr): the transport's own words for a node its reach could not get into, or None."""


def rsync_failed(node: str, code: int, stderr: str, unreached: Unreached) -> CopyFailed:
    """One line (and a hint) for a failed rsync: rsync missing on the node, the reach refused
    (the transport's words for it), or what rsync itself said, without its generic trailer lines."""
    if missing("rsync", stderr):
        return CopyFailed(
            node,
            code,
            "rsync is not installed on this node",
            "install it there: apt-get install rsync (dnf install rsync), e.g. orch exec -- 'apt-get install -y rsync'",
        )
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    said = [ln for ln in lines if not ln.startswith(_RSYNC_NOISE)] or lines
    refused = unreached("\n".join(ln for ln in said if not ln.startswith("rsync")))  # rsync's own: "rsync: ..."
    if refused is not None:
        return CopyFailed(node, code, refused.message.removeprefix(f"{node}: "), refused.hint, refused.kind)
    return CopyFailed(node, code, "rsync exited " + said_in_one_line(code, said))


def said_in_one_line(code: int, lines: Sequence[str]) -> str:
    """`CODE: the first line (+N more lines)`: what a failed command said, in one line."""
    detail = lines[0] if lines else "(no message)"
    more = f" (+{len(lines) - 1} more lines)" if len(lines) > 1 else ""
    return f"{code}: {detail}{more}"


# ----------------------------------------------------------------------------- the tar fallback


def tar_argv(sources: Sequence[str]) -> list[str]:
    """This machine's tar writing `sources` to stdout, each under its own path (relative to `/`,
    unpacked under the destination), bytecode caches left out as rsync leaves them."""
    check_sources(sources)
    return ["tar", "-c", "-f", "-", "-C", "/", *(f"--exclude={p.rstrip('/')}" for p in EXCLUDED), "--"] + [
        p.lstrip("/") for p in sources
    ]


def tree_files(sources: Sequence[str]) -> Iterator[tuple[str, int]]:
    """(absolute path, size) of every regular file the tar fallback sends, in a stable order:
    what it itemizes, as rsync's `Number of regular files transferred` counts them."""
    skipped = {p.rstrip("/") for p in EXCLUDED}
    for src in sources:
        if os.path.isfile(src) and not os.path.islink(src):
            yield src, os.path.getsize(src)
            continue
        for root, dirs, files in os.walk(src):
            dirs[:] = sorted(d for d in dirs if d not in skipped)
            for name in sorted(files):
                path = os.path.join(root, name)
                if os.path.isfile(path) and not os.path.islink(path):
                    yield path, os.path.getsize(path)


def untar_failed(node: str, code: int, stderr: str) -> CopyFailed:
    """The node's tar failed (or is missing)."""
    if missing("tar", stderr) or code == MISSING:
        return CopyFailed(node, MISSING, "tar is not installed on this node", "install tar there")
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return CopyFailed(node, code, "tar exited " + said_in_one_line(code, lines))
