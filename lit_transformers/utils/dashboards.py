"""Pictures and tables to every attached dashboard: wandb, TensorBoard, and files beside the CSV metrics.

One place knows the logger types, so a task or callback says "log this image/table" and every dashboard
the run has (``logger=many``: all three) gets it. Rank 0 only.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence

import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger
from matplotlib import pyplot as plt
from matplotlib.figure import Figure

from lit_transformers.utils.figures import figure_to_image


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
    step = trainer.global_step
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


def log_table(trainer, key: str, columns: Sequence[str], rows: Sequence[Sequence]) -> None:
    """Rows of strings/numbers: a wandb table, a TensorBoard markdown table, and CSV runs append them to
    ``<csv dir>/<key>.csv`` with a leading ``step`` column (one file accumulates every validation)."""
    if not trainer.is_global_zero:
        return
    step = trainer.global_step
    rows = [list(row) for row in rows]
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            logger.log_text(key, columns=list(columns), data=rows, step=step)
        elif isinstance(logger, TensorBoardLogger):
            cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731 - markdown escaping
            lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
            lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
            logger.experiment.add_text(key, "\n".join(lines), global_step=step)
        elif isinstance(logger, CSVLogger):
            path = os.path.join(logger.log_dir, f"{_file_name(key)}.csv")
            os.makedirs(logger.log_dir, exist_ok=True)
            new = not os.path.exists(path)
            with open(path, "a", encoding="utf-8", newline="") as f:
                writer = csv.writer(f)
                if new:
                    writer.writerow(["step", *columns])
                writer.writerows([step, *row] for row in rows)
