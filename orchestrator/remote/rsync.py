"""Pure builders for `orch sync`: the rsync argv that copies `job.sync` to the same absolute paths
on a node, over the OpenSSH command that reaches the node exactly as orch's own transport does
(`transport/ssh.openssh_argv`: the one definition of how orch reaches a node), and the reading of
what rsync says it did. Golden-tested (tests/unit/test_rsync.py).

rsync copies every path in one run per node with `--relative` and `--no-implied-dirs`, so
`/data/coco` lands at `/data/coco` (never `/data/coco/coco`), missing parents are created, and the
attributes of the parents that exist (`/data`, `/home/me`) are left alone. `-a` keeps file times,
so a second run sends nothing that did not change (rsync's quick check: size and time);
`--omit-dir-times` leaves directory times alone, so files a job writes beside the synced ones
(a label cache, `__pycache__`) do not make the next sync report changed directories.
`__pycache__/` directories are excluded (`EXCLUDED`): bytecode belongs to the interpreter and the
paths of the machine that wrote it, the node writes its own, and excluded names are also safe from
`--delete` there.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..config.nodes import Node
from ..transport.ssh import openssh_argv

NOT_INSTALLED = "orch: rsync is not installed on this node"
"""What the node side prints (and exits 127) when it has no rsync: the rsync-path below says it."""

EXCLUDED = ("__pycache__/",)
"""rsync `--exclude` patterns of every sync: Python's bytecode caches, at any depth."""

REMOTE_RSYNC = (
    "/bin/sh -c 'command -v rsync >/dev/null 2>&1 || { echo \"" + NOT_INSTALLED + '" >&2; exit 127; }; '
    'exec rsync "$@"\' rsync'
)
"""`--rsync-path`: the node's login shell runs this followed by rsync's server arguments. It
names a missing rsync in words instead of leaving rsync's "connection unexpectedly closed"."""


def rsync_shell_word(arg: str) -> str:
    """One word of rsync's `-e` command: rsync splits it on spaces, and inside '…' or "…" a doubled
    quote is a literal one (no backslashes)."""
    if arg and not re.search(r"[ '\"]", arg):
        return arg
    return "'" + arg.replace("'", "''") + "'"


def remote_target(node: Node) -> str:
    """`host:/` as rsync takes it (an IPv6 address in brackets)."""
    host = f"[{node.host}]" if ":" in node.host else node.host
    return f"{host}:/"


@dataclass(frozen=True)
class SyncOptions:
    """How `orch sync` runs rsync (its flags)."""

    dry_run: bool = False
    """rsync -n: report what would change, change nothing."""
    delete: bool = False
    """Remove files on the node that are not in a synced directory on the controller."""
    checksum: bool = False
    """Compare files by checksum instead of size and time (slower: reads every file on both sides)."""


def rsync_argv(
    node: Node, paths: Sequence[str], options: SyncOptions = SyncOptions(), config_file: str | None = None
) -> list[str]:
    """The rsync command that copies `paths` (absolute, on the controller) to the same paths on `node`."""
    if not paths:
        raise ValueError("nothing to sync")
    for p in paths:
        if not p.startswith("/") or p == "/" or p.endswith("/"):
            raise ValueError(f"sync path {p!r} must be absolute, without a trailing slash, and not /")
    e = " ".join(rsync_shell_word(a) for a in openssh_argv(node.ssh, config_file, node.host))
    argv = [
        "rsync",
        "--archive",
        "--omit-dir-times",
        "--relative",
        "--no-implied-dirs",
        "--itemize-changes",
        "--stats",
        *(f"--exclude={pattern}" for pattern in EXCLUDED),
        "--rsh",
        e,
        "--rsync-path",
        REMOTE_RSYNC,
    ]
    if options.dry_run:
        argv.append("--dry-run")
    if options.delete:
        argv.append("--delete")
    if options.checksum:
        argv.append("--checksum")
    return [*argv, *paths, remote_target(node)]


# ----------------------------------------------------------------------------- what rsync said


@dataclass(frozen=True)
class Transfer:
    """What one rsync run changed (or, with --dry-run, would change) on a node."""

    files: int
    """Regular files sent (new or changed)."""
    bytes: int
    """Their total size."""
    sent: int
    """Bytes rsync sent over the connection (deltas, file list, protocol)."""
    changes: tuple[str, ...]
    """Every itemized change, `<f+++++++++ /abs/path` (sent), `*deleting /abs/path`..."""

    @property
    def deleted(self) -> int:
        """Items removed on the node (--delete)."""
        return sum(1 for c in self.changes if c.startswith("*deleting"))

    @property
    def up_to_date(self) -> bool:
        """Nothing was (or would be) sent, deleted or changed."""
        return self.files == 0 and not self.changes


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
    missing = [k for k in _STAT_KEYS if k not in stats]
    if missing:
        raise ValueError(f"rsync printed no {missing[0]!r} (--stats)")
    return Transfer(
        files=stats[_STAT_KEYS[0]], bytes=stats[_STAT_KEYS[1]], sent=stats[_STAT_KEYS[2]], changes=tuple(changes)
    )


def missing_rsync(stderr: str) -> bool:
    """The node has no rsync (our rsync-path said so)."""
    return NOT_INSTALLED in stderr
