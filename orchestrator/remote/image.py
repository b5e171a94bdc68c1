"""`orch image push`: the job's container image onto every node, without a registry.

docker and podman: the controller asks every node which image ID the name resolves to there
(`RUNTIME image inspect`), skips the nodes that already hold the controller's ID, exports the image
once (`RUNTIME save` into a private temporary file, only when some node lacks it) and streams that
file into `RUNTIME load` on each of those nodes, at most `parallel` at once, over the OpenSSH client
that reaches the node exactly as orch's transport does (`transport/ssh.openssh_argv`, as `orch sync`'s
rsync; with `transport: local`, `/bin/sh -c` here); then checks the ID the node holds after loading.
apptainer: the image is an absolute `.sif` path, compared by sha256 and copied with rsync to the same
path (as `job.sync` paths are), then compared again.

Every node's outcome is kept (`NodePush`), never stopping at the first bad node; the exit code is
the worst node's (`ImageReport.exit_code`). Nothing here reaches a network beyond the nodes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .. import waits
from ..config.inventory import Inventory
from ..config.nodes import Node
from ..errors import OrchError, UsageError
from ..transport.base import Progress, command_line
from ..transport.ssh import openssh_argv, openssh_config_file
from .rsync import SyncOptions, rsync_argv
from .sync import explain_failure

RUNTIMES = ("docker", "podman", "apptainer")
NOT_INSTALLED = "orch: {runtime} is not installed on this node"
UNREACHABLE = 255
"""The exit code of a node orch could not reach (ssh's own)."""


# ----------------------------------------------------------------------------- pure builders


def _guarded(runtime: str, script: str, *args: str) -> list[str]:
    """`/bin/sh -c SCRIPT` (any login shell passes one word alike) that first says in words when
    the runtime is missing (exit 127), as `remote/rsync.REMOTE_RSYNC` does for rsync."""
    guard = f'command -v "$0" >/dev/null 2>&1 || {{ echo "{NOT_INSTALLED.format(runtime="$0")}" >&2; exit 127; }}; '
    return ["/bin/sh", "-c", guard + script, runtime, *args]


def inspect_argv(runtime: str, image: str) -> list[str]:
    """The node's command that prints the ID `image` resolves to there; exit 0 with nothing on
    stdout when it does not hold it (apptainer: the file's sha256, nothing when it is missing)."""
    if runtime == "apptainer":
        return _guarded("sha256sum", 'test -e "$1" || exit 0; sha256sum "$1" | cut -d" " -f1', image)
    return _guarded(runtime, '"$0" image inspect --format "{{.Id}}" "$1" 2>/dev/null || true', image)


def load_argv(runtime: str, image: str) -> list[str]:
    """The node's command that loads an archive from stdin and prints the ID `image` then resolves to."""
    return _guarded(runtime, '"$0" load >&2 && "$0" image inspect --format "{{.Id}}" "$1"', image)


def save_argv(runtime: str, image: str, archive: str) -> list[str]:
    """The controller's export of `image` into the file `archive` (docker-archive: both runtimes load it)."""
    return [runtime, "save", "-o", archive, image]


def node_argv(inv: Inventory, node: Node, argv: Sequence[str]) -> list[str]:
    """What runs `argv` on `node` as a process here whose stdin reaches it: the OpenSSH client
    (the transport's reach, every hop verified) with the command as one line, or `/bin/sh -c` for
    `transport: local`."""
    line = command_line(argv)
    if inv.transport == "local":
        return ["/bin/sh", "-c", line]
    return [*openssh_argv(node.ssh, openssh_config_file(node.ssh), node.host), node.host, line]


def normal_id(text: str) -> str | None:
    """An image ID as the runtimes print it (docker `sha256:...`, podman bare hex), or None."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return None
    return lines[-1].removeprefix("sha256:")


def short_id(image_id: str | None) -> str:
    return (image_id or "-")[:12]


# ----------------------------------------------------------------------------- outcome


@dataclass(frozen=True)
class NodePush:
    """One node's outcome: `present` (already held the image, skipped), `loaded` (or `copied` for
    a .sif), or `failed` with why and the fix."""

    node: str
    action: str
    image_id: str | None
    """What the node holds after (an image ID, or a .sif's sha256); None when nothing."""
    before: str | None = None
    """What it held before (None: nothing under that name)."""
    error: str | None = None
    hint: str | None = None
    exit_code: int = 0
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "ok": self.ok,
            "action": self.action,
            "image_id": self.image_id,
            "before": self.before,
            "error": self.error,
            "hint": self.hint,
            "exit_code": self.exit_code,
            "elapsed_s": round(self.elapsed_s, 3),
        }


@dataclass(frozen=True)
class ImageReport:
    """Every selected node's outcome of one `orch image push`, in inventory order."""

    image: str
    runtime: str
    image_id: str
    """The controller's image ID (apptainer: the .sif's sha256): what every node must hold."""
    size: int
    """Bytes of the exported archive (or the .sif); 0 when no node needed it."""
    nodes: tuple[NodePush, ...]
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.nodes)

    @property
    def exit_code(self) -> int:
        """The worst node's: 0 when every node holds the image."""
        return max((n.exit_code for n in self.nodes), default=0)

    def failed(self) -> list[NodePush]:
        return [n for n in self.nodes if not n.ok]

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "runtime": self.runtime,
            "image_id": self.image_id,
            "size": self.size,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "elapsed_s": round(self.elapsed_s, 3),
            "nodes": [n.to_json() for n in self.nodes],
        }


# ----------------------------------------------------------------------------- the push


def check_image_arg(runtime: str, image: str) -> None:
    """UsageError for a runtime orch does not know, or an apptainer image that is not an absolute .sif."""
    if runtime not in RUNTIMES:
        raise UsageError(f"unknown container runtime {runtime!r}", f"use one of: {', '.join(RUNTIMES)}")
    if runtime == "apptainer" and not (image.startswith("/") and image.endswith(".sif")):
        raise UsageError(
            f"apptainer image {image!r} is not an absolute .sif path",
            "give the .sif file's absolute path, e.g. /images/yoloe.sif",
        )
    if not image or image.startswith("-"):
        raise UsageError(f"image name {image!r} is not an image", "give a name:tag or an image ID")


def local_image_id(runtime: str, image: str) -> str:
    """The controller's ID of `image` (apptainer: the .sif's sha256); OrchError when it has none."""
    if runtime == "apptainer":
        if not os.path.isfile(image):
            raise UsageError(
                f"{image} does not exist on this machine (the controller)",
                "orch image push copies the .sif from here to the same path on every node",
            )
        digest = hashlib.sha256()
        with open(image, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        return digest.hexdigest()
    if shutil.which(runtime) is None:
        raise OrchError(
            f"{runtime} is not installed on this machine (the controller): orch image push exports the image here",
            f"install {runtime}, or push from a machine that holds the image",
        )
    proc = subprocess.run(
        [runtime, "image", "inspect", "--format", "{{.Id}}", image],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    found = normal_id(proc.stdout) if proc.returncode == 0 else None
    if found is None:
        said = proc.stderr.strip().splitlines()
        raise UsageError(
            f"{runtime} on this machine (the controller) has no image {image}" + (f" ({said[-1]})" if said else ""),
            f"build or load it here first ({runtime} images lists what is here)",
        )
    return found


def push_image(
    inv: Inventory,
    nodes: Sequence[Node],
    image: str,
    runtime: str,
    *,
    parallel: int = 4,
    progress: Progress | None = None,
    tmpdir: str | None = None,
) -> ImageReport:
    """Put `image` on every node of `nodes` that does not hold the controller's ID, at most
    `parallel` at once; every node's outcome kept. Raises only for what stops every node alike
    (an unknown runtime, no such image here, the export failing). Ctrl-C stops every stream."""
    check_image_arg(runtime, image)
    started = time.monotonic()
    want = local_image_id(runtime, image)
    workers = max(1, min(parallel, inv.fanout, len(nodes) or 1))
    held = _each(nodes, workers, lambda n: _held(inv, n, runtime, image))
    todo = [n for n in nodes if not isinstance(held[n.name], NodePush) and held[n.name] != want]
    size = 0
    work = tempfile.mkdtemp(prefix="orch-image-", dir=tmpdir)
    try:
        source = image
        if todo and runtime != "apptainer":
            source = os.path.join(work, "image.tar")
            proc = subprocess.run(
                save_argv(runtime, image, source), capture_output=True, text=True, stdin=subprocess.DEVNULL
            )
            if proc.returncode != 0:
                raise OrchError(
                    f"`{runtime} save {image}` failed here (exit {proc.returncode}): {proc.stderr.strip()[-500:]}",
                    f"is there room in {work}? (set TMPDIR)",
                )
        if todo:
            size = os.path.getsize(source)
        done = [0]
        lock = threading.Lock()

        def one(node: Node) -> NodePush:
            try:
                before = held[node.name]
                if isinstance(before, NodePush):
                    return before
                if before == want:
                    return NodePush(node.name, "present", want, before)
                return _load(inv, node, runtime, image, source, want, before)
            finally:
                if progress is not None:
                    with lock:
                        done[0] += 1
                        progress("pushing", done[0], len(nodes))

        results = _each(nodes, workers, one)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ImageReport(image, runtime, want, size, tuple(results[n.name] for n in nodes), time.monotonic() - started)


_running: set[subprocess.Popen[bytes]] = set()
_running_lock = threading.Lock()


def _each(nodes: Sequence[Node], workers: int, fn: Callable[[Node], Any]) -> dict[str, Any]:
    """fn(node) for every node, `workers` at once; Ctrl-C ends every child process first."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="orch-image")
    try:
        futures = {n.name: pool.submit(fn, n) for n in nodes}
        return {name: waits.result(f) for name, f in futures.items()}
    except KeyboardInterrupt:
        with _running_lock:
            for proc in _running:
                proc.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _run(argv: Sequence[str], stdin: Any = subprocess.DEVNULL, timeout: float | None = None) -> tuple[int, str, str]:
    proc = subprocess.Popen(
        list(argv), stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "LC_ALL": "C"}
    )
    with _running_lock:
        _running.add(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return 124, out.decode("utf-8", "replace"), err.decode("utf-8", "replace") + "\n(timed out)"
    finally:
        with _running_lock:
            _running.discard(proc)
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def _failed(
    node: Node, action: str, code: int, stderr: str, runtime: str, before: str | None = None, elapsed: float = 0.0
) -> NodePush:
    """A node's failure in one line: the runtime missing there, ssh refused, or what the command said."""
    tool = "sha256sum" if runtime == "apptainer" and action == "inspect" else runtime
    if NOT_INSTALLED.format(runtime=tool) in stderr or code == 127:
        return NodePush(
            node.name,
            "failed",
            None,
            before,
            f"{tool} is not installed on this node",
            f"install {tool} there, or leave the node out (--nodes)",
            127,
            elapsed,
        )
    message, hint = explain_failure(node, code, stderr)
    message = message.replace("rsync exited", f"{action} exited", 1)
    return NodePush(
        node.name, "failed", None, before, message, hint, UNREACHABLE if code == 255 else code or 1, elapsed
    )


def _held(inv: Inventory, node: Node, runtime: str, image: str) -> str | None | NodePush:
    """What the node holds under `image` (an ID or sha256; None: nothing), or its failure."""
    code, out, err = _run(node_argv(inv, node, inspect_argv(runtime, image)), timeout=120)
    if code != 0:
        return _failed(node, "inspect", code, err, runtime)
    return normal_id(out)


def _load(inv: Inventory, node: Node, runtime: str, image: str, source: str, want: str, before: str | None) -> NodePush:
    start = time.monotonic()
    if runtime == "apptainer":
        if inv.transport == "local":
            code, err = 0, ""
        else:
            argv = rsync_argv(node, [source], SyncOptions(checksum=True), openssh_config_file(node.ssh))
            code, _, err = _run(argv)
        if code != 0:
            return _failed(node, "copy", code, err, runtime, before, time.monotonic() - start)
        after = _held(inv, node, runtime, image)
        action = "copied"
    else:
        with open(source, "rb") as archive:
            code, out, err = _run(node_argv(inv, node, load_argv(runtime, image)), stdin=archive)
        if code != 0:
            return _failed(node, "load", code, err, runtime, before, time.monotonic() - start)
        after = normal_id(out)
        action = "loaded"
    elapsed = time.monotonic() - start
    if isinstance(after, NodePush):
        return after
    if after != want:
        return NodePush(
            node.name,
            "failed",
            after,
            before,
            f"holds {short_id(after)} under {image} after the {action[:-2]}, not the controller's {short_id(want)}",
            "another image took the name meanwhile? push again",
            1,
            elapsed,
        )
    return NodePush(node.name, action, after, before, elapsed_s=elapsed)
