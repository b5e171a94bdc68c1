"""Why the first failing rank ended, in one line, and what usually fixes it.

`orch up`'s outcome, `orch status`, the report and their JSON (`first_failure.cause`, `.hint`,
`.signal`) show this line above the failure's excerpt, instead of torchrun's `exited with code 1`.
It is read from the failing node's log, most trusted first:

1. torchrun's failure summary (`Root Cause (first observed failure)`): which rank, its exit code
   or the signal that killed it, and (when the job's entry point is wrapped in torch's `@record`)
   the traceback of the exception that ended it;
2. that rank's own last lines (the worker field, torchrun's `--tee` prefix `[default<local rank>]:`, says whose): the
   exception line of its last Python traceback, argparse's `error:` line, a C++ `terminate called
   after throwing ... what():` pair, a CUDA or NCCL error line;
3. torchrun's own lines when it blames no rank (it crashed, or never started one: a rendezvous
   error), or the signal that killed torchrun itself.

Only what the node printed before its agent was told to stop counts (`agent.STOPPING`): after that
line, tracebacks are the stop's doing, and a node stopped from outside keeps its reason.

A rank killed by a signal is named by the signal (`killed by SIGKILL`), never by torchrun's exit
code, with who usually sends it. Pure: tested on recorded node logs (tests/fixtures/nodelog).
"""

from __future__ import annotations

import re
import signal as _signal
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from ..node.agent import STOPPING_PREFIX, STREAMS, WORKER_FIELD

ROOT_CAUSE = "Root Cause (first observed failure):"
RANK_LINE = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
FIELD = re.compile(r"^  ([a-z_]+)\s*: ?(.*)$")
WORKER = re.compile(WORKER_FIELD)
"""A worker's line (`match`): its field, `[<role><local rank>]:` (`node/agent.py`); group 1 the local rank."""
ENTRY = re.compile(WORKER_FIELD + r"|\[\d+\]:")
"""A worker's field, or the number of an entry in torchrun's failure summary (`[0]:`)."""
RANK_TAG = re.compile(r"^\[rank ?\d+\](?:: |:| )")
"""A rank's own prefix: torch's excepthook (`[rank3]: `) or the trainer's (`[rank 3] `)."""
GLOG = re.compile(r"^\[?[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\]]*\] ")
"""The c10 / torchrun log-line header (`E1201 21:41:11.974000 22219 .../api.py:1002] `)."""
TRACEBACK = "Traceback (most recent call last):"
EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*)(:(?: .*)?)?$")
"""`module.Name: message`, or a bare `Name` that reads like an exception class (`KeyboardInterrupt`)."""
BARE_EXCEPTION = re.compile(r"(?:Error|Exception|Interrupt|Exit|Warning|Failure|Timeout)$")
ARGPARSE = re.compile(r"^(?:[^\s:][^:]*: )?error: \S.*$")
TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']+)'")
WHAT = re.compile(r"^\s*what\(\):\s+(.*\S)")
GPU_ERROR = re.compile(
    r"CUDA error|CUDA out of memory|CUDA driver version is insufficient|no kernel image is available|"
    r"NCCL error|NCCL WARN|Watchdog caught collective operation timeout|CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+|"
    r"cudaError\w+|nccl(?:SystemError|InternalError|UnhandledCudaError|RemoteError|InvalidUsage)"
)
SIGNAL_EXCEPTION = re.compile(r"SignalException: Process \d+ got signal: (\d+)")
WRAPPERS = ("ChildFailedError",)
"""torchrun's own exception when a worker failed: never the cause, the worker's is."""

SIGNAL_HINTS = {
    "SIGKILL": "SIGKILL on a training node is usually the kernel's OOM killer (host memory: DataLoader workers, "
    "a RAM cache, pinned memory); its kernel log says so: orch exec --nodes {node} -- "
    '\'dmesg -T | grep -i -e "out of memory" -e "killed process"\'',
    "SIGSEGV": "a crash in native code (CUDA, NCCL, a compiled extension, a DataLoader worker's library): the "
    "lines above it in `orch logs --node {node}` show where",
    "SIGABRT": "an abort in native code: an uncaught C++ exception (`terminate called after throwing`) or NCCL's "
    "watchdog taking the process down after a collective timed out (see the other ranks)",
    "SIGBUS": "usually shared memory (/dev/shm) too small for the DataLoader workers: fewer --workers, or a larger "
    "/dev/shm (docker --shm-size)",
    "SIGTERM": "stopped from outside orch on {node}: a scheduler, systemd, or someone's kill",
    "SIGINT": "interrupted from outside orch on {node} (a Ctrl-C or kill -INT there)",
    "SIGHUP": "its terminal or session on {node} went away (a job started by hand without nohup?)",
}
HINTS = (
    (
        re.compile(
            r"unrecognized arguments|invalid choice|the following arguments are required|expected one argument|"
            r"argument [^:]+: invalid"
        ),
        "the job's arguments are not what the program accepts: fix job.args in the inventory (orch up --dry-run "
        "shows the exact command)",
    ),
    (
        re.compile(r"CUDA out of memory|OutOfMemoryError"),
        "the GPU ran out of memory: a smaller batch per GPU (job.args batch), a smaller imgsz, or AMP",
    ),
    (
        re.compile(
            r"no kernel image is available|cudaErrorNoKernelImageForDevice|not compatible with the current "
            r"PyTorch installation"
        ),
        "this torch build has no kernels for the node's GPU: install a torch built for a CUDA version that still "
        "supports it (orch check compares the two)",
    ),
    (
        re.compile(r"driver version is insufficient|cudaErrorInsufficientDriver"),
        "the NVIDIA driver is older than this torch's CUDA runtime needs: a newer driver, or a torch built for an "
        "older CUDA",
    ),
    (
        re.compile(r"Watchdog caught collective operation timeout|collective operation timeout"),
        "a collective timed out: a rank was slower, hung or gone (the first failure may be on another node), or "
        "the network between the nodes broke; NCCL_DEBUG=INFO in env says which link",
    ),
    (
        re.compile(r"NCCL error|ncclSystemError|ncclInternalError|ncclRemoteError|unhandled system error"),
        "NCCL could not talk between the ranks: rerun with NCCL_DEBUG=INFO in env, and check NCCL_SOCKET_IFNAME / "
        "NCCL_IB_HCA against the nodes (orch check: nccl_env, rdma)",
    ),
    (
        re.compile(r"Address already in use|EADDRINUSE"),
        "master.port is taken on the master node (another job, or one left over): pick another master.port, or "
        "stop what holds it",
    ),
    (
        re.compile(r"Connection refused|ECONNREFUSED"),
        "a rank could not reach the rendezvous on the master: is master.port open between the nodes (firewall), "
        "and did the master node start?",
    ),
    (
        re.compile(r"Connection (?:closed|reset) by peer|remote worker (?:crashing|hanging)"),
        "this rank lost a peer: it is a consequence, the failure that matters is on another rank or node (their "
        "logs: orch logs --grep Error)",
    ),
    (
        re.compile(r"Expected all tensors to be on the same device"),
        "a tensor and the model are on different devices: move both to cuda:LOCAL_RANK",
    ),
)


CONSEQUENCE = re.compile(
    r"Connection (?:closed|reset) by peer|remote worker (?:crashing|hanging)|ncclRemoteError|"
    r"remote process exited or there was a network error|NCCL communicator was aborted|Broken pipe"
)
"""A rank's error that says it lost a peer (gloo's, NCCL's): a consequence of another rank's failure."""
BEFORE_S, AFTER_S = 60.0, 10.0
"""How far before and after a lost peer another rank's exception is taken as its cause: a rank
that raised is gone from its peers once its process exits (seconds later: its torchrun stops it),
and the first rank to notice may print its own error before the cause's reaches the log."""


@dataclass(frozen=True)
class Raised:
    """An exception a worker raised: the last line of a traceback it printed."""

    at: float
    """When its node wrote that line (the node's clock, epoch seconds)."""
    local_rank: int
    text: str


def consequence(text: str | None) -> bool:
    """Is this failure a lost peer, which another rank's failure caused?"""
    return bool(text) and CONSEQUENCE.search(text or "") is not None


def _worker_texts(raw_lines: Sequence[str]) -> Iterator[tuple[str, int, str]]:
    """Each line a worker wrote (node.log lines, oldest first, up to its agent's stop): its node
    stamp, its local rank and its text after the prefixes (unstripped)."""
    for raw in raw_lines:
        parts = raw.split(" ", 2)
        if len(parts) < 3 or parts[1] not in STREAMS:
            continue
        if parts[2].startswith(STOPPING_PREFIX):
            return
        m = WORKER.match(parts[2])
        if not m:
            continue
        body = parts[2][m.end() :]
        tag = RANK_TAG.match(body)
        yield parts[0], int(m.group(1)), body[tag.end() :] if tag else body


def raised(raw_lines: Sequence[str]) -> list[Raised]:
    """Every exception the node's workers raised (node.log lines, oldest first), up to its agent's
    stop, in the order written."""
    out: list[Raised] = []
    open_tb: dict[int, bool] = {}
    for stamp, local, body in _worker_texts(raw_lines):
        if body.strip() == TRACEBACK:
            open_tb[local] = True
            continue
        if not open_tb.get(local) or not body.strip() or body[:1] in (" ", "\t"):
            continue
        e = EXCEPTION.match(body.strip())
        if e and (e.group(2) is not None or BARE_EXCEPTION.search(e.group(1))):
            open_tb[local] = False
            at = _epoch(stamp)
            if at is not None and not any(w in body for w in WRAPPERS):
                out.append(Raised(at, local, body.strip()))
    return out


def worker_lines(raw_lines: Sequence[str], pattern: re.Pattern[str]) -> list[Raised]:
    """Every line a worker wrote (node.log lines, oldest first, up to its agent's stop) that
    `pattern` finds, as `Raised` (when, its local rank, the text after its prefixes)."""
    out: list[Raised] = []
    for stamp, local, body in _worker_texts(raw_lines):
        at = _epoch(stamp)
        if at is not None and pattern.search(body):
            out.append(Raised(at, local, body.strip()))
    return out


def _epoch(stamp: str) -> float | None:
    """A node.log stamp (`2026-11-30T09:32:05.123456Z`) as epoch seconds."""
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class Summary:
    """torchrun's `Root Cause (first observed failure)` entry."""

    first: int
    """Index of its first line (the `----` rule above the heading, when there is one)."""
    last: int
    """Index of its closing `====` line (the last line when it is cut off)."""
    rank: int | None = None
    local_rank: int | None = None
    exit_code: int | None = None
    """The rank's exit code; negative: killed by that signal (-9: SIGKILL)."""
    signal: str | None = None
    traceback: list[str] = field(default_factory=list)
    """The entry's `traceback` field, one line per line (with `@record`: the worker's Python traceback)."""


@dataclass(frozen=True)
class Cause:
    """What ended the failing rank (or torchrun), in one line, and what usually fixes it."""

    text: str
    signal: str | None = None
    """The signal that ended it (SIGKILL), when one did."""
    hint: str | None = None


def untee(text: str) -> str:
    """A line without its worker field (torchrun's `--tee` prefix) or its summary entry's number."""
    return ENTRY.sub("", text, count=1)


def summary(texts: Sequence[str]) -> Summary | None:
    """torchrun's last Root Cause entry in these lines (node.log texts), or None."""
    starts = [i for i, t in enumerate(texts) if ROOT_CAUSE in t]
    if not starts:
        return None
    i = starts[-1]
    first = i - 1 if i > 0 and set(untee(texts[i - 1]).strip()) == {"-"} else i
    last = len(texts) - 1
    fields: dict[str, str] = {}
    tb: list[str] = []
    rank = local = None
    for j in range(i + 1, len(texts)):
        body = untee(texts[j])
        if body.startswith("===="):
            last = j
            break
        m = RANK_LINE.match(body)
        if m and rank is None:
            rank, local = int(m.group(1)), int(m.group(2))
        f = FIELD.match(body)
        if f and f.group(1) not in fields and not tb:
            fields[f.group(1)] = f.group(2)
            if f.group(1) == "traceback":
                tb.append(f.group(2))
        elif tb:
            tb.append(body[2:] if body.startswith("  ") else body)
    code = _int(fields.get("exitcode", ""))
    sig = None
    named = re.search(r"\((SIG[A-Z0-9]+)\)", fields.get("exitcode", "") + " " + fields.get("traceback", ""))
    if named:
        sig = named.group(1)
    elif code is not None and code < 0:
        sig = signal_name(-code)
    return Summary(first, last, rank, local, code, sig, tb)


def root_cause(texts: Sequence[str]) -> tuple[int, int, int, int] | None:
    """torchrun's last "Root Cause" block: (first line, last line, rank, local_rank; -1 unknown), or None."""
    s = summary(texts)
    if s is None:
        return None
    return s.first, s.last, -1 if s.rank is None else s.rank, -1 if s.local_rank is None else s.local_rank


def cause(texts: Sequence[str], *, node: str = "", signal: str | None = None) -> Cause | None:
    """The cause of a node's failure from its log's last lines (node.log texts, oldest first).
    `signal`: the one that killed torchrun itself, as the node agent saw it. None: nothing better
    than the agent's `exited with code N` is known."""
    stop = next((i for i, t in enumerate(texts) if t.startswith(STOPPING_PREFIX)), None)
    if stop is not None:
        texts = texts[:stop]  # what a node printed once its agent was told to stop is the stop's doing
    s = summary(texts)
    if s is None or s.rank is None or s.local_rank is None:
        if signal:
            return Cause(f"torchrun was killed by {signal}", signal, _signal_hint(signal, node))
        return _torchrun_cause([t for t in texts if not WORKER.match(t)], node)
    mine = rank_lines(texts[: s.first], s.local_rank)
    if s.signal:
        # the OOM killer leaves nothing in the rank's output; an abort or a crash may have said why
        found = None if s.signal == "SIGKILL" else (terminated(mine) or gpu_error(mine) or exception_line(mine))
        text = f"{found} (killed by {s.signal})" if found else f"killed by {s.signal}"
        return Cause(text, s.signal, hint_of(found or "") or _signal_hint(s.signal, node))
    found = (
        exception_line(s.traceback)
        or exception_line(mine)
        or argparse_error(mine)
        or gpu_error(mine)
        or terminated(mine)
    )
    if found:
        return Cause(found, None, hint_of(found))
    if s.exit_code is not None and 128 < s.exit_code < 160 and signal_name(s.exit_code - 128):
        sig = signal_name(s.exit_code - 128)
        return Cause(
            f"exited with code {s.exit_code} (128 + {s.exit_code - 128}: a shell's way of saying killed by {sig})",
            sig,
            _signal_hint(sig or "", node),
        )
    return Cause(f"exited with code {s.exit_code}") if s.exit_code is not None else None


def local_rank_of(text: str) -> int | None:
    """The local rank of the worker whose line this is (node.log text: its worker field), or None."""
    m = WORKER.match(text)
    return int(m.group(1)) if m else None


def rank_lines(texts: Sequence[str], local_rank: int) -> list[str]:
    """The lines one worker of the node wrote (its worker field), without that field or the rank's own prefix."""
    out = []
    for t in texts:
        m = WORKER.match(t)
        if m and int(m.group(1)) == local_rank:
            body = t[m.end() :]
            tag = RANK_TAG.match(body)
            out.append(body[tag.end() :] if tag else body)
    return out


def exception_line(lines: Sequence[str]) -> str | None:
    """The exception line of the last Python traceback in these lines (`ValueError: ...`), or None."""
    starts = [i for i, t in enumerate(lines) if t.strip() == TRACEBACK]
    if not starts:
        return None
    strangers = 0
    for t in lines[starts[-1] + 1 :]:
        if not t.strip() or t[:1] in (" ", "\t"):
            continue  # a frame, its source line, the carets
        text = t.strip()
        m = EXCEPTION.match(text)
        if m and (m.group(2) is not None or BARE_EXCEPTION.search(m.group(1))):
            return None if any(w in text for w in WRAPPERS) else text
        strangers += 1  # a line of another thread, printed in the middle of the traceback
        if strangers > 3:
            return None
    return None


def argparse_error(lines: Sequence[str]) -> str | None:
    """argparse's last `PROG: error: ...` line (or a program's own `error: ...`), or None."""
    for t in reversed(lines):
        if ARGPARSE.match(t.strip()):
            return t.strip()
    return None


def terminated(lines: Sequence[str]) -> str | None:
    """A C++ exception that ended the process: `c10::CUDAError: CUDA error: unknown error`, or None."""
    for i in range(len(lines) - 1, -1, -1):
        m = TERMINATE.search(lines[i])
        if m:
            for t in lines[i + 1 : i + 4]:
                w = WHAT.match(t)
                if w:
                    return f"{m.group(1)}: {w.group(1)}"
            return f"uncaught C++ exception {m.group(1)}"
    return None


def gpu_error(lines: Sequence[str]) -> str | None:
    """The first CUDA or NCCL error line, without its log header, or None."""
    for t in lines:
        if GPU_ERROR.search(t):
            text = t.strip()
            while True:
                stripped = GLOG.sub("", RANK_TAG.sub("", text, count=1), count=1)
                if stripped == text:
                    return text
                text = stripped
    return None


def signal_name(number: int) -> str | None:
    try:
        return _signal.Signals(number).name
    except ValueError:
        return None


def _torchrun_cause(own: Sequence[str], node: str) -> Cause | None:
    """torchrun failed with no worker to blame: its own exception, argparse error, or a signal it got."""
    for t in reversed(own):
        m = SIGNAL_EXCEPTION.search(t)
        if m:
            sig = signal_name(int(m.group(1))) or f"signal {m.group(1)}"
            return Cause(f"torchrun got {sig}", sig, _signal_hint(sig, node))
    found = exception_line(own) or argparse_error(own) or gpu_error(own)
    return Cause(found, None, hint_of(found)) if found else None


def hint_of(text: str) -> str | None:
    """What usually fixes the error this line names, or None."""
    for pattern, hint in HINTS:
        if pattern.search(text):
            return hint
    return None


def _signal_hint(sig: str, node: str) -> str | None:
    hint = SIGNAL_HINTS.get(sig)
    return hint.format(node=node or "the node") if hint else None


def _int(text: str) -> int | None:
    m = re.match(r"\s*(-?\d+)", text)
    return int(m.group(1)) if m else None
