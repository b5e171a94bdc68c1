"""ultralytics' end-of-training outputs, drawn and formatted by ultralytics' own code: results.png
(``plot_results``), the per-class table of the final validation (its validator's format), and the
switch that keeps its PIL plots off the network.

The final validation's confusion matrices and PR/F1/P/R curves are drawn by ultralytics' validator
itself (``plots=True``, ``validate.run_validation(..., plots=True)``) from the statistics it
gathers from every rank's shard.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PIL_FONTS = ("Arial.ttf", "Arial.Unicode.ttf")
"""The fonts ultralytics' PIL plots ask ``check_font`` for; one missing from its config directory
is downloaded (``requests.head`` to ultralytics' assets), which this trainer never lets happen."""


def pil_fonts_local() -> bool:
    """Whether every font ultralytics' PIL plots (``val_batch*.jpg``) need is in its config
    directory, so that ``check_font`` finds it there and never goes to the network
    (``offline.seed_font`` puts matplotlib's DejaVuSans there at start-up)."""
    from ultralytics.utils import USER_CONFIG_DIR

    return all((Path(USER_CONFIG_DIR) / name).is_file() for name in PIL_FONTS)


def without_pil_plots(validator: Any) -> None:
    """Turn off ``validator``'s image plots (``val_batch*_labels.jpg``, ``val_batch*_pred.jpg``):
    the ones that need a PIL font. Its matplotlib plots (confusion matrices, curves) stay on."""
    validator.plot_val_samples = lambda *args, **kwargs: None
    validator.plot_predictions = lambda *args, **kwargs: None


def results_png(out: Path) -> tuple[Path | None, str | None]:
    """``out/results.png`` from ``out/results.csv``, as ultralytics' trainer draws it at the end of
    training (``plot_results``), and why it was not drawn: (None, None) when there is no
    results.csv (no epoch finished). A plot that cannot be drawn (``plot_results`` imports polars,
    which an ultralytics install may lack) never fails a run whose training is done: the reason
    comes back for one warning line, and results.csv holds every figure."""
    from ultralytics.utils.plotting import plot_results

    csv = out / "results.csv"
    if not csv.is_file():
        return None, None
    try:
        plot_results(file=csv)
    except Exception as exc:  # ImportError (polars), a matplotlib backend error: the figures are in results.csv
        return None, f"results.png not drawn: {type(exc).__name__}: {exc}"
    png = out / "results.png"
    return (png, None) if png.is_file() else (None, "results.png not drawn: plot_results wrote nothing")


def class_table(validator: Any) -> list[str]:
    """The per-class table ultralytics prints after its final validation, from ``validator``'s
    merged metrics (rank 0, after a validation over every shard): the header, the ``all`` row
    (images, instances, mean P, R, mAP50, mAP50-95 of boxes, and masks for segmentation), then one
    row per class that has labels or predictions. Empty for one class (ultralytics prints no rows
    per class then: the ``all`` row is the final validation's line)."""
    metrics = validator.metrics
    if len(validator.names) <= 1:
        return []
    pf = "%22s" + "%11i" * 2 + "%11.3g" * len(metrics.keys)  # ultralytics' print_results format
    lines = [validator.get_desc(), pf % ("all", validator.seen, metrics.nt_per_class.sum(), *metrics.mean_results())]
    for i, c in enumerate(metrics.ap_class_index):
        lines.append(
            pf % (validator.names[c], metrics.nt_per_image[c], metrics.nt_per_class[c], *metrics.class_result(i))
        )
    return lines
