"""Pictures and tables to every attached dashboard: wandb, TensorBoard, and files beside the CSV metrics.

One place knows the logger types, so a task or callback says "log this image/table" and every dashboard
the run has (``logger=many``: all three) gets it. Rank 0 only.
"""

from __future__ import annotations

import csv
import html
import numbers
import os
import re
from collections.abc import Mapping, Sequence

import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger
from matplotlib import pyplot as plt
from matplotlib.figure import Figure

from lit_transformers.utils.figures import figure_to_image

SIGNIFICANT_DIGITS = 4  # of a table's numbers: 0.1235, 12.35, 1235.0


def logged_step(trainer) -> int:
    """The step ``self.log`` gives its scalars, so the pictures and tables of a validation sit beside its metrics.
    Lightning's logger connector (``_LoggerConnector.log_metrics``) logs at the fit loop's count of training
    batches whose optimizer step is done, not at ``global_step``: a validation after 50 steps is at 49, with the
    50th batch's training scalars; a PPO iteration (one batch, several optimizer steps) counts once."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def _file_name(key: str) -> str:
    return key.replace("/", "_")


def log_image(trainer, key: str, image: torch.Tensor | Figure) -> None:
    """A (3, H, W) uint8 image or a matplotlib Figure (rendered to one, then closed); CSV runs get
    ``<csv dir>/images/<key>_step<N>.png``. Nothing during the sanity check: its step-0 pictures come from
    an untrained model on a couple of batches, and would sit first on every slider."""
    logged = trainer.is_global_zero and not trainer.sanity_checking
    if isinstance(image, Figure):
        figure, image = image, figure_to_image(image) if logged else None
        plt.close(figure)  # a pyplot-made figure would otherwise stay open for the whole run
    if not logged:
        return
    step = logged_step(trainer)
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            logger.log_image(key, [image.permute(1, 2, 0).numpy()], step=step)
        elif isinstance(logger, TensorBoardLogger):
            logger.experiment.add_image(key, image, global_step=step)
        elif isinstance(logger, CSVLogger):
            path = os.path.join(logger.log_dir, "images", f"{_file_name(key)}_step{step}.png")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            import torchvision  # here: a text run that logs only tables need not import it

            torchvision.io.write_png(image, path)


def rounded(value, decimals: int | None = None):
    """A table cell: a float (also a 0-d tensor or numpy float) to ``decimals`` places where given, else to
    ``SIGNIFICANT_DIGITS``; anything else as is."""
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        return float(f"{value:.{SIGNIFICANT_DIGITS}g}") if decimals is None else round(float(value), decimals)
    return value


# what Python-Markdown (TensorBoard's text plugin) reads as formatting and unescapes after a backslash; "<" and
# "&" go as HTML entities, since its sanitiser would drop what looks like a tag
_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_{}\[\]()#+\-.!|])")
_REPEATED_SPACE = re.compile(r"(?:^|(?<= )) ", re.MULTILINE)  # indentation, and every space after another


def markdown_cell(value) -> str:
    """``value`` as TensorBoard's text plugin shows it verbatim in a markdown table cell: ``__init__`` is not
    bold, ``*args`` keeps its star, a line break stays one (``<br>``), indentation stays (no-break spaces)."""
    text = html.escape(str(value).expandtabs(4), quote=False)
    text = _MARKDOWN_PUNCTUATION.sub(r"\\\1", text)
    text = _REPEATED_SPACE.sub("&nbsp;", text)
    return "<br>".join(text.splitlines())


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence]) -> str:
    lines = ["| " + " | ".join(map(markdown_cell, columns)) + " |", "|" + " --- |" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(map(markdown_cell, row)) + " |" for row in rows])


def log_table(
    trainer,
    key: str,
    columns: Sequence[str],
    rows: Sequence[Sequence],
    decimals: Mapping[str, int] | None = None,
) -> None:
    """Rows of strings/numbers, the same to every dashboard: a ``wandb.Table``, a TensorBoard markdown table
    (each cell escaped: :func:`markdown_cell`), and CSV runs append them to ``<csv dir>/<key>.csv`` with a
    leading ``step`` column (one file accumulates every validation). Floats are rounded here, the one place:
    to ``SIGNIFICANT_DIGITS``, or to ``decimals[column]`` places in the columns it names (a score read as
    its library prints it, chrF to 1)."""
    columns, decimals = list(columns), decimals or {}
    unknown = sorted(set(decimals) - set(columns))
    if unknown:
        raise ValueError(
            f"log_table {key!r}: decimals names {unknown}, which are not among its columns {columns}; "
            "key decimals by the column names the table has"
        )
    if not trainer.is_global_zero:
        return
    step = logged_step(trainer)
    places = [decimals.get(column) for column in columns]
    rows = [[rounded(value, digits) for value, digits in zip(row, places)] for row in rows]
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            logger.log_table(key, columns=columns, data=rows, step=step)
        elif isinstance(logger, TensorBoardLogger):
            logger.experiment.add_text(key, markdown_table(columns, rows), global_step=step)
        elif isinstance(logger, CSVLogger):
            path = os.path.join(logger.log_dir, f"{_file_name(key)}.csv")
            os.makedirs(logger.log_dir, exist_ok=True)
            new = not os.path.exists(path)
            with open(path, "a", encoding="utf-8", newline="") as f:
                writer = csv.writer(f)
                if new:
                    writer.writerow(["step", *columns])
                writer.writerows([step, *row] for row in rows)
