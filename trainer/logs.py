"""Every line the trainer prints, and how to read the ones that carry numbers back.

Each line starts with ``[rank R] `` and is flushed: the orchestrator attributes lines to ranks by
that prefix, so it also goes in front of ultralytics' own log lines and Python warnings.

The lines ``orch report`` reads (the epoch summaries, validation metrics, the throughput table,
where the weights and results.csv are) are written by the ``*_line`` functions here and parsed by
the ``parse_*`` functions here, so the two cannot drift apart. Numbers are printed with
results.csv's own format (``%.6g``): what a parser reads from the log is what the CSV holds.

This module imports neither torch nor ultralytics (``orch report`` runs on the controller).
"""

from __future__ import annotations

import logging
import math
import re
import sys
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TextIO

RANK_PREFIX = r"\[rank (\d+)\] "
"""The prefix :func:`rank_prefix` writes, as a regex: group 1 is the global rank."""


def rank_prefix(rank: int) -> str:
    """The prefix of every line rank ``rank`` prints."""
    return f"[rank {rank}] "


_PREFIX = rank_prefix(0)


def set_rank(rank: int) -> None:
    """Set the prefix for every later line of this process."""
    global _PREFIX
    _PREFIX = rank_prefix(rank)


def prefixed(text: str) -> str:
    """``text`` with the rank prefix in front of each of its lines."""
    return "\n".join(_PREFIX + line for line in str(text).splitlines() or [""])


def say(text: str, stream: TextIO | None = None) -> None:
    """Print ``text`` with the rank prefix on each line, then flush (logs are streamed live)."""
    out = stream or sys.stdout
    out.write(prefixed(text) + "\n")
    out.flush()


SGR = re.compile(r"\x1b\[[0-9;]*m")
"""An SGR sequence (colours and attributes), as ultralytics' ``colorstr`` writes them."""


class _PrefixFormatter(logging.Formatter):
    """Formats ultralytics' records with the rank prefix on every line; without ``color`` (its
    stream is no terminal: torchrun's pipe) ultralytics' colour sequences are left out."""

    def __init__(self, fmt: str, color: bool = True) -> None:
        super().__init__(fmt)
        self.color = color

    def format(self, record: logging.LogRecord) -> str:
        """Prefix each line of the formatted record."""
        text = super().format(record)
        return prefixed(text if self.color else SGR.sub("", text))


def library_formatter(stream: object) -> logging.Formatter:
    """The formatter of a handler of ultralytics' logger writing to ``stream``."""
    isatty = getattr(stream, "isatty", None)
    try:
        color = bool(isatty and isatty())
    except (ValueError, OSError):  # a stream closed under its handler is no terminal
        color = False
    return _PrefixFormatter("%(message)s", color=color)


def route_library_output() -> None:
    """Give ultralytics' logger and Python warnings the rank prefix (imports ultralytics)."""
    import ultralytics.utils  # noqa: F401  (its import installs the handlers we re-format)

    logger = logging.getLogger("ultralytics")
    for handler in logger.handlers:
        handler.setFormatter(library_formatter(getattr(handler, "stream", None)))

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        say(f"{category.__name__}: {message} ({filename}:{lineno})", sys.stderr)

    warnings.showwarning = show


@dataclass
class StepMeter:
    """Images and time of one rank over a window of steps, split into data wait and compute."""

    images: int = 0
    """Images this rank trained on in the window."""
    wait_s: float = 0.0
    """Seconds spent waiting for the data loader."""
    total_s: float = 0.0
    """Wall seconds of the window (wait + compute + communication)."""

    def add(self, images: int, wait_s: float, total_s: float) -> None:
        """Account one step."""
        self.images += images
        self.wait_s += wait_s
        self.total_s += total_s

    @property
    def ips(self) -> float:
        """This rank's images per second."""
        return self.images / self.total_s if self.total_s > 0 else 0.0

    @property
    def wait_share(self) -> float:
        """Fraction of the time spent waiting for data."""
        return self.wait_s / self.total_s if self.total_s > 0 else 0.0


# --- the lines -------------------------------------------------------------------------------------

METRIC_NAMES = {
    "metrics/mAP50(B)": "mAP50",
    "metrics/mAP50-95(B)": "mAP50-95",
    "metrics/mAP50(M)": "mask-mAP50",
    "metrics/mAP50-95(M)": "mask-mAP50-95",
    "metrics/precision(B)": "P",
    "metrics/recall(B)": "R",
    "metrics/precision(M)": "mask-P",
    "metrics/recall(M)": "mask-R",
}
"""results.csv column -> the shorter name on a log line (the order is the line's order)."""
_COLUMN_OF = {short: column for column, short in METRIC_NAMES.items()}


def number(value: float) -> str:
    """A number as results.csv writes it (``%.6g``), so a parsed log value equals the CSV's."""
    return f"{float(value):.6g}"


def _pairs(items: Iterable[tuple[str, float]]) -> str:
    return " ".join(f"{name} {number(value)}" for name, value in items)


STEP_COUNTS = ("steps/nonfinite", "steps/skipped", "steps/recoveries")
"""results.csv's counts of an epoch's troubled steps, on the epoch line too (the first two on every
progress line): micro-steps whose loss was not finite (inf or NaN), optimizer steps that changed
nothing (the fp16 GradScaler skips a step whose gradients overflowed), and the NaN recoveries the
epoch took before it trained (each trained it again at half the rate of the attempt before)."""


def step_line(
    epoch: int,
    epochs: int,
    batch: int,
    batches: int,
    losses: Mapping[str, float],
    lr: float,
    ips: float,
    wait_share: float,
    nonfinite: int = 0,
    skipped: int = 0,
) -> str:
    """Rank 0's progress line: epoch, batch, the epoch's mean loss components so far, lr, global
    images/s and data-wait share since the last line, then rank 0's non-finite losses and skipped
    steps so far in the epoch (``nonfinite 0 skipped 0`` on a healthy run)."""
    return (
        f"epoch {epoch}/{epochs} batch {batch}/{batches} {_pairs(losses.items())} lr {lr:.6g} "
        f"images/s {ips:.1f} data {wait_share:.0%} nonfinite {nonfinite} skipped {skipped}"
    )


def timing_line(
    epoch: int,
    batch: int,
    steps: int,
    images: int,
    data_s: float,
    compute_s: float,
    wall_s: float,
    sync_s: float | None = None,
) -> str:
    """Every rank's own timing of the window of steps that ended at ``batch`` of ``epoch``: how
    many micro-steps and images, and the seconds spent waiting for data, computing outside the
    gradient collectives (forward and loss) and in all (wall). Every rank ends its windows at the
    same batches, so orch compares ranks window by window (``orchestrator/run/straggler.py``):
    in synchronous DDP every rank's wall time is the slowest's, the time outside collectives is
    its own. ``sync_s``, only where the forward holds collectives (SyncBatchNorm's all-gathers,
    ``--sync-bn``): their seconds, the wait for the slowest rank included, left out of
    ``compute_s``.

    ``timing epoch 3 batch 40 steps 10 images 80 data_s 0.0123 compute_s 1.52 wall_s 3.1 [sync_s 0.21]``
    """
    return (
        f"timing epoch {epoch} batch {batch} steps {steps} images {images} data_s {data_s:.4g} "
        f"compute_s {compute_s:.4g} wall_s {wall_s:.4g}" + (f" sync_s {sync_s:.4g}" if sync_s is not None else "")
    )


STEP_FIELDS = re.compile(
    r"(?:^|\] )epoch (\d+)/(\d+) batch (\d+)/(\d+) (.+?) lr (\S+) images/s (\S+) data (\d+)% "
    r"nonfinite (\d+) skipped (\d+)$"
)
"""Every field of a progress line (:func:`parse_step`); ``STEP_LINE`` below is the lenient match
orch's live progress reads."""


@dataclass(frozen=True)
class Step:
    """A progress line read back."""

    epoch: int
    epochs: int
    batch: int
    batches: int
    losses: dict[str, float]
    lr: float
    ips: float
    wait_share: float
    nonfinite: int
    skipped: int


def parse_step(line: str) -> Step | None:
    """A :func:`step_line` read back (None for any other line)."""
    m = STEP_FIELDS.search(line.rstrip("\n"))
    if not m:
        return None
    return Step(
        int(m.group(1)),
        int(m.group(2)),
        int(m.group(3)),
        int(m.group(4)),
        dict(_read_pairs(m.group(5))),
        float(m.group(6)),
        float(m.group(7)),
        int(m.group(8)) / 100,
        int(m.group(9)),
        int(m.group(10)),
    )


def epoch_line(
    epoch: int,
    epochs: int,
    losses: Mapping[str, float],
    lrs: Mapping[str, float],
    counts: Mapping[str, float] | None = None,
) -> str:
    """The end of a training epoch: mean loss components over all ranks' images, each group's lr,
    and the epoch's troubled steps over all ranks (``STEP_COUNTS``).

    ``train epoch 3/10 box_loss 1.23456 cls_loss 2.5 dfl_loss 1.1 lr/pg0 0.00123 ... steps/nonfinite 0
    steps/skipped 0``: the ``train/*``, ``lr/*`` and ``steps/*`` columns of results.csv.
    """
    return f"train epoch {epoch}/{epochs} {_pairs([*losses.items(), *lrs.items(), *(counts or {}).items()])}"


def _metric_items(results: Mapping[str, float]) -> list[tuple[str, float]]:
    shown = [(short, results[column]) for column, short in METRIC_NAMES.items() if column in results]
    losses = [(k.split("/", 1)[1], v) for k, v in results.items() if k.startswith("val/")]
    return shown + losses


def val_line(epoch: int, epochs: int, results: Mapping[str, float]) -> str:
    """One validation: ``val epoch 3/10 mAP50 0.41 mAP50-95 0.22 [mask-mAP50 ...] P .. R .. box_loss ..``."""
    return f"val epoch {epoch}/{epochs} {_pairs(_metric_items(results))}"


def final_line(name: str, epoch: int, results: Mapping[str, float]) -> str:
    """The validation of the final ``best.pt`` after training: ``final val best.pt (epoch 7) mAP50 ...``."""
    return f"final val {name} (epoch {epoch}) {_pairs(_metric_items(results))}"


def done_line(epochs: int, seconds: float, weights_dir: str, results_csv: str) -> str:
    """The last line of a run: where the weights and results.csv are (absolute, on this node)."""
    return f"done: {epochs} epochs in {seconds:.1f} s; weights in {weights_dir}, results in {results_csv}"


def throughput_table(epoch: int, rows: list[list[float]], ref_ips: float | None) -> str:
    """The end-of-epoch table: one line per rank, then the job total and scaling efficiency.

    Args:
        epoch: 1-based epoch number.
        rows: ``[images, wait_s, total_s]`` of every rank, in rank order.
        ref_ips: single-rank images/s to compare against (``--ref-ips``), if known.
    """
    lines = [f"throughput epoch {epoch}: rank  images/s  data-wait"]
    total = 0.0
    for rank, (images, wait_s, total_s) in enumerate(rows):
        if total_s <= 0:  # nothing measured (no step timed): never a 0.0 that reads as a stalled rank
            lines.append(f"throughput epoch {epoch}: {rank:>4}  {'n/a':>8}  {'n/a':>8}")
            continue
        ips = images / total_s
        total += ips
        lines.append(f"throughput epoch {epoch}: {rank:>4}  {ips:8.1f}  {wait_s / total_s:8.1%}")
    summary = f"throughput epoch {epoch}: total {total:.1f} images/s over {len(rows)} ranks"
    if ref_ips:
        summary += f", scaling efficiency {total / (len(rows) * ref_ips):.1%} of {len(rows)} x {ref_ips:g} images/s"
    lines.append(summary)
    return "\n".join(lines)


# --- reading them back ----------------------------------------------------------------------------

THROUGHPUT_ROW = re.compile(r"throughput epoch (\d+):\s+(\d+)\s+([\d.]+)\s+([\d.]+)%")
"""A rank's row of the throughput table: epoch, rank, images/s, data-wait %."""
THROUGHPUT_TOTAL = re.compile(
    r"throughput epoch (\d+): total ([\d.]+) images/s over (\d+) ranks"
    r"(?:, scaling efficiency ([\d.]+)%)?"
)
"""The table's last line: epoch, total images/s, ranks, scaling efficiency % (if --ref-ips)."""
RESULTS_PATH = re.compile(r"(/\S+/results\.csv)\b")
"""The absolute results.csv path on the done line."""
WEIGHTS_DIR = re.compile(r"weights in (\S+?)[;,]?(?:\s|$)")
"""The weights directory on the done line."""
TIMING_LINE = re.compile(
    r"(?:^|\] )timing epoch (\d+) batch (\d+) steps (\d+) images (\d+) data_s ([\d.e+-]+) "
    r"compute_s ([\d.e+-]+) wall_s ([\d.e+-]+)(?: sync_s ([\d.e+-]+))?$"
)
"""A :func:`timing_line`: epoch, batch, steps, images, data_s, compute_s, wall_s[, sync_s]."""
EPOCH_LINE = re.compile(r"(?:^|\] )train epoch (\d+)/(\d+) (.+)$")
VAL_LINE = re.compile(r"(?:^|\] )val epoch (\d+)/(\d+) (.+)$")
FINAL_LINE = re.compile(r"(?:^|\] )final val (\S+) \(epoch (\d+)\) (.+)$")


@dataclass
class Throughput:
    """The last epoch's per-rank figures the trainer printed."""

    epoch: int = 0
    ips: dict[int, float] = field(default_factory=dict)
    wait_share: dict[int, float] = field(default_factory=dict)
    total: float | None = None
    efficiency: float | None = None


def parse_throughput(lines: Iterable[str]) -> Throughput:
    """Keep the table of the latest epoch seen in the log."""
    tp = Throughput()
    for line in lines:
        m = THROUGHPUT_ROW.search(line)
        if m and _counts(m.group(1), m.group(2)):
            epoch = int(m.group(1))
            if epoch > tp.epoch:
                tp = Throughput(epoch=epoch)
            if epoch == tp.epoch:
                tp.ips[int(m.group(2))] = float(m.group(3))
                tp.wait_share[int(m.group(2))] = float(m.group(4)) / 100
            continue
        m = THROUGHPUT_TOTAL.search(line)
        if m and int(m.group(1)) == tp.epoch:
            tp.total = float(m.group(2))
            tp.efficiency = float(m.group(4)) / 100 if m.group(4) else None
    return tp


@dataclass(frozen=True)
class Timing:
    """One rank's timing of one window (a :func:`timing_line` read back)."""

    epoch: int
    batch: int
    steps: int
    images: int
    data_s: float
    compute_s: float
    wall_s: float
    sync_s: float = 0.0
    """Seconds in the forward's own collectives (SyncBatchNorm), not in ``compute_s``; 0 without them."""

    @property
    def outside_s(self) -> float:
        """Seconds per step outside the gradient collectives: data wait + forward and loss."""
        return (self.data_s + self.compute_s) / self.steps if self.steps else 0.0

    @property
    def ips(self) -> float:
        """This rank's images per second over the window."""
        return self.images / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def data_share(self) -> float:
        """The share of the window's wall time spent waiting for data."""
        return self.data_s / self.wall_s if self.wall_s > 0 else 0.0


MAX_COUNT = 2**53
"""Epochs, batches, ranks, steps and images a line read back may carry are below this (what a
float holds exactly); a line with a larger one is not a record (it is skipped, never a crash)."""
TIMING_SECONDS = (1e-9, 1e9)
"""A timing line's seconds are 0 or within this range (a nanosecond, 31 years): a window's figures
(images/s, shares, time per step) and the detector's ratios of them are then finite numbers."""


def _finite_seconds(value: float) -> bool:
    return value == 0.0 or TIMING_SECONDS[0] <= value <= TIMING_SECONDS[1]


def parse_timing(text: str) -> Timing | None:
    """A :func:`timing_line` (with or without its rank prefix), or None for any other line, and for
    one that is not a finite record: a count out of ``[0, 2**53)``, seconds negative, not finite
    (``1e999``), or out of ``TIMING_SECONDS``. What a node prints never becomes an infinity."""
    m = TIMING_LINE.search(text.rstrip("\n"))
    if not m:
        return None
    try:
        t = Timing(
            int(m.group(1)),
            int(m.group(2)),
            int(m.group(3)),
            int(m.group(4)),
            float(m.group(5)),
            float(m.group(6)),
            float(m.group(7)),
            float(m.group(8) or 0.0),
        )
    except ValueError:
        return None
    if not all(0 <= n < MAX_COUNT for n in (t.epoch, t.batch, t.steps, t.images)):
        return None
    if not all(_finite_seconds(s) for s in (t.data_s, t.compute_s, t.wall_s, t.sync_s)):
        return None
    return t


def announced(lines: Iterable[str]) -> tuple[str | None, str | None]:
    """(weights directory, results.csv path): the last of each a :func:`done_line` announced."""
    weights = results = None
    for line in lines:
        m = WEIGHTS_DIR.search(line)
        if m:
            weights = m.group(1)
        m = RESULTS_PATH.search(line)
        if m:
            results = m.group(1)
    return weights, results


def _counts(*digits: str) -> bool:
    """Whether every one of these runs of digits is a count below MAX_COUNT."""
    return all(len(d) < 17 and int(d) < MAX_COUNT for d in digits)


def _read_pairs(text: str) -> list[tuple[str, float]]:
    """``"a 1 b 2.5"`` -> ``[("a", 1.0), ("b", 2.5)]`` (an odd trailing word is dropped)."""
    words = text.split()
    out = []
    for name, value in zip(words[0::2], words[1::2]):
        try:
            out.append((name, float(value)))
        except ValueError:
            continue
    return out


def _val_columns(text: str) -> dict[str, float]:
    return {_COLUMN_OF.get(name, f"val/{name}"): value for name, value in _read_pairs(text)}


def parse_results(lines: Iterable[str]) -> dict[str, list[float]]:
    """results.csv's columns (``epoch``, ``train/*``, ``lr/*``, ``steps/*``, ``metrics/*``, ``val/*``) from the log.

    One row per ``train epoch`` line; the metrics of the ``val epoch`` line of the same epoch
    join its row (epochs without validation repeat the last metrics, as results.csv does). A
    resumed run's log that repeats an epoch keeps the later values.
    """
    rows: dict[int, dict[str, float]] = {}
    last_val: dict[str, float] = {}
    for line in lines:
        line = line.rstrip("\n")
        m = EPOCH_LINE.search(line)
        if m and _counts(m.group(1)):
            epoch = int(m.group(1))
            row = {"epoch": float(epoch)}
            for name, value in _read_pairs(m.group(3)):
                row[name if name.startswith(("lr/", "steps/")) else f"train/{name}"] = value
            rows[epoch] = {**row, **last_val}
            continue
        m = VAL_LINE.search(line)
        if m:
            last_val = _val_columns(m.group(3))
            epoch = int(m.group(1))
            if epoch in rows:
                rows[epoch].update(last_val)
    keys = list(dict.fromkeys(k for row in rows.values() for k in row))
    # before the first validation results.csv holds zeros in the metric columns: so does this
    return {key: [rows[epoch].get(key, 0.0) for epoch in sorted(rows)] for key in keys}


def parse_final(lines: Iterable[str]) -> tuple[str, int, dict[str, float]] | None:
    """The last ``final val`` line: checkpoint name, its epoch and its metrics (results.csv names)."""
    found = None
    for line in lines:
        m = FINAL_LINE.search(line.rstrip("\n"))
        if m:
            found = (m.group(1), int(m.group(2)), _val_columns(m.group(3)))
    return found


STEP_LINE = re.compile(r"(?:^|\] )epoch (\d+)/(\d+) batch (\d+)/(\d+) .*?images/s ([\d.]+) data (\d+)%")
"""Rank 0's progress line (:func:`step_line`): epoch, epochs, batch, batches, images/s, data-wait %."""
DONE_LINE = re.compile(r"(?:^|\] )done: (\d+) epochs in ")
"""The last line of a run (:func:`done_line`)."""


@dataclass
class Progress:
    """Where a training run is, read from rank 0's lines as they come (``orch up``'s live line,
    ``orch status``): the epoch and batch, the latest images/s, the last validation, an ETA."""

    epoch: int = 0
    """The epoch in progress (1-based); 0 before the first progress line."""
    epochs: int = 0
    batch: int = 0
    batches: int = 0
    images_per_s: float | None = None
    data_wait: float | None = None
    """Share of the time rank 0 waited for data since the last progress line (0..1)."""
    val_epoch: int | None = None
    """The epoch of the last validation."""
    map50_95: float | None = None
    map50: float | None = None
    eta_s: float | None = None
    """Seconds left at the rate since the first progress line seen; None until it can tell."""
    done: bool = False
    """The done line was seen: training ended."""
    _first: tuple[float, float] | None = field(default=None, repr=False)
    """(fraction done, time) of the first progress line seen: the rate's start."""

    def fraction(self) -> float:
        """How much of the run is done (0..1) by epochs and batches."""
        if not self.epochs or not self.batches:
            return 0.0
        return min(1.0, ((self.epoch - 1) + self.batch / self.batches) / self.epochs)

    def feed(self, text: str, ts: float) -> bool:
        """Take one line (its text, and when it was written); True when it changed the progress."""
        m = STEP_LINE.search(text)
        if m:
            ips = float(m.group(5))
            if not (_counts(*m.group(1, 2, 3, 4, 6)) and math.isfinite(ips)):
                return False  # not a record of finite numbers: ignored
            self.epoch, self.epochs, self.batch, self.batches = (int(m.group(i)) for i in range(1, 5))
            self.images_per_s, self.data_wait = ips, int(m.group(6)) / 100
            now = self.fraction()
            if self._first is None or now < self._first[0]:  # a retry that resumed earlier starts over
                self._first = (now, ts)
            else:
                done_since, elapsed = now - self._first[0], ts - self._first[1]
                self.eta_s = (1.0 - now) * elapsed / done_since if done_since > 0 and elapsed > 0 else self.eta_s
            return True
        m = VAL_LINE.search(text)
        if m:
            values = {k: v for k, v in _read_pairs(m.group(3)) if math.isfinite(v)}
            if not _counts(m.group(1), m.group(2)):
                return False
            self.val_epoch, self.epochs = int(m.group(1)), int(m.group(2))
            self.map50_95, self.map50 = values.get("mAP50-95"), values.get("mAP50")
            return True
        if DONE_LINE.search(text):
            self.done, self.eta_s = True, 0.0
            return True
        return False

    @property
    def known(self) -> bool:
        """A progress or validation line was seen."""
        return bool(self.epochs)

    def to_json(self) -> dict[str, object]:
        return {
            "epoch": self.epoch,
            "epochs": self.epochs,
            "batch": self.batch,
            "batches": self.batches,
            "images_per_s": self.images_per_s,
            "data_wait": self.data_wait,
            "val_epoch": self.val_epoch,
            "map50_95": self.map50_95,
            "map50": self.map50,
            "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
            "done": self.done,
        }


def parse_throughput_epochs(lines: Iterable[str]) -> dict[int, Throughput]:
    """Every epoch's throughput table in the log (a resumed run's repeated epoch: the later one)."""
    out: dict[int, Throughput] = {}
    for line in lines:
        m = THROUGHPUT_ROW.search(line)
        if m and _counts(m.group(1), m.group(2)):
            epoch, rank = int(m.group(1)), int(m.group(2))
            tp = out.setdefault(epoch, Throughput(epoch=epoch))
            tp.ips[rank] = float(m.group(3))
            tp.wait_share[rank] = float(m.group(4)) / 100
            continue
        m = THROUGHPUT_TOTAL.search(line)
        if m and int(m.group(1)) in out:
            tp = out[int(m.group(1))]
            tp.total = float(m.group(2))
            tp.efficiency = float(m.group(4)) / 100 if m.group(4) else None
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Phase:
    """A span of rank 0's time the report marks on the timeline (node clock, epoch seconds)."""

    kind: str
    """``validation`` (from the epoch's train line to its val line) or ``checkpoint`` (from the val
    line, or the train line without validation, to rank 0's next line: the epoch's end, where the
    checkpoint is written)."""
    epoch: int
    start: float
    end: float


def parse_phases(lines: Iterable[tuple[float, str]]) -> list[Phase]:
    """Validation and checkpoint spans from rank 0's ``(time, text)`` lines, oldest first."""
    phases: list[Phase] = []
    train_at: dict[int, float] = {}
    pending: tuple[int, float] | None = None  # an epoch's end, waiting for the next line
    for ts, text in lines:
        if pending is not None:
            phases.append(Phase("checkpoint", pending[0], pending[1], ts))
            pending = None
        m = EPOCH_LINE.search(text)
        if m:
            train_at[int(m.group(1))] = ts
            pending = (int(m.group(1)), ts)
            continue
        m = VAL_LINE.search(text)
        if m:
            epoch = int(m.group(1))
            if epoch in train_at:
                phases.append(Phase("validation", epoch, train_at[epoch], ts))
            phases = [p for p in phases if not (p.kind == "checkpoint" and p.epoch == epoch and p.end == ts)]
            pending = (epoch, ts)
    return phases
