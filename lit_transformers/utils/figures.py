"""Dashboard figures drawn with matplotlib (headless: no pyplot, an Agg canvas): labelled matrices (confusion
matrices, attention maps, CLIP similarities) and captioned image grids.

Every figure uses DejaVu Sans, the font that ships with matplotlib and covers Latin, Greek and Cyrillic
(German ü/ä/ß included), and is at least 640 x 480 px, readable at a dashboard card's size.
:func:`lit_transformers.utils.dashboards.log_image` takes the figures and renders them.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import numpy as np
import torch
from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

FONT = "DejaVu Sans"
DPI = 100
MIN_SIZE = (6.4, 4.8)  # inches: 640 x 480 px at DPI
MAX_INCHES = 24.0  # a 100-class confusion matrix stays one readable picture, not a poster
MAX_TOKENS = 40  # attention maps show at most this many tokens a side
LABEL_CHARS = 28  # tick labels longer than this are cut, with an ellipsis


@contextmanager
def figure_style():
    """The font and sizes of every dashboard figure; builders and the renderer both run inside it, so text
    that matplotlib lays out late (at draw time) gets the same font."""
    with rc_context({"font.family": "sans-serif", "font.sans-serif": [FONT], "font.size": 10}):
        yield


def _short(label) -> str:
    # newlines and tabs would break a tick label's line; a whitespace token (BPE's " ") shows as ␣
    text = " ".join(str(label).split()) or "␣"
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"


def matrix_figure(
    values: torch.Tensor | np.ndarray,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    *,
    title: str,
    x_label: str,
    y_label: str,
    colorbar_label: str,
    vmin: float | None = None,
    vmax: float | None = None,
    cell_text: Sequence[Sequence[str]] | None = None,
    cmap: str = "viridis",
) -> Figure:
    """The one labelled-matrix figure: (R, C) values as a heatmap with the rows and columns named, the axes
    titled, a colour bar (fixed to [vmin, vmax] when given, so pictures compare across steps) and, with
    ``cell_text``, a string written in every cell."""
    values = np.asarray(torch.as_tensor(values).detach().float().cpu())
    rows, cols = values.shape
    if len(row_labels) != rows or len(col_labels) != cols:
        raise ValueError(
            f"A {rows} x {cols} matrix needs {rows} row and {cols} column labels, got {len(row_labels)} and "
            f"{len(col_labels)}"
        )
    cell = 0.6 if cell_text is not None else 0.28  # inches per cell: room for the numbers when written
    width = min(max(MIN_SIZE[0], cols * cell + 3.5), MAX_INCHES)
    height = min(max(MIN_SIZE[1], rows * cell + 2.5), MAX_INCHES)
    with figure_style():
        figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
        ax = figure.add_subplot()
        image = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
        ax.set_xticks(range(cols), [_short(t) for t in col_labels], rotation=90)
        ax.set_yticks(range(rows), [_short(t) for t in row_labels])
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        ax.set_title(title)
        figure.colorbar(image, ax=ax, label=colorbar_label)
        if cell_text is not None:
            low, high = image.norm.vmin, image.norm.vmax
            for i in range(rows):
                for j in range(cols):
                    dark = (values[i, j] - low) < 0.6 * (high - low)  # viridis is dark at the low end
                    ax.text(j, i, cell_text[i][j], ha="center", va="center", fontsize=9,
                            color="white" if dark else "black")  # fmt: skip
    return figure


def confusion_figure(counts: torch.Tensor, class_names: Sequence[str], title: str) -> Figure:
    """(true, predicted) counts: cells coloured by the row-normalised share (each true class's recall on the
    diagonal, on a fixed 0-100 % scale), each cell showing its count and that percentage."""
    counts = torch.as_tensor(counts).detach().double().cpu()
    percent = 100 * counts / counts.sum(1, keepdim=True).clamp(min=1)
    text = None
    if len(class_names) <= 20:  # beyond that the numbers no longer fit their cells
        text = [[f"{int(c)}\n{p:.0f}%" for c, p in zip(crow, prow)] for crow, prow in zip(counts, percent)]
    return matrix_figure(
        percent, class_names, class_names, title=title, x_label="predicted class", y_label="true class",
        colorbar_label="share of the true class (%)", vmin=0, vmax=100, cell_text=text,
    )  # fmt: skip


def attention_figure(
    probs: torch.Tensor,
    query_labels: Sequence[str],
    key_labels: Sequence[str],
    *,
    title: str,
    x_label: str = "key token",
    y_label: str = "query token",
) -> Figure:
    """(T_query, T_key) attention probabilities on a shared 0-1 scale, the tokens on the axes; at most
    :data:`MAX_TOKENS` a side (the first ones), and the title says when the map was cut."""
    rows, cols = probs.shape
    shown = probs[:MAX_TOKENS, :MAX_TOKENS]
    if rows > MAX_TOKENS or cols > MAX_TOKENS:
        title += f"\n(first {shown.size(0)} of {rows} x {shown.size(1)} of {cols} tokens shown)"
    return matrix_figure(
        shown, query_labels[:MAX_TOKENS], key_labels[:MAX_TOKENS], title=title, x_label=x_label,
        y_label=y_label, colorbar_label="attention probability", vmin=0, vmax=1,
    )  # fmt: skip


def class_label(label: int, class_names: Sequence[str]) -> str:
    """A class id's name; -1 (an image without a label, as caption data has) reads "unlabelled"."""
    return class_names[label] if label >= 0 else "unlabelled"


def similarity_figure(
    similarity: torch.Tensor,
    labels: Sequence[int],
    class_names: Sequence[str],
    captions: Sequence[str],
    title: str,
) -> Figure:
    """CLIP's (images, captions) cosine similarities of a batch whose caption j describes image j, rows and
    columns sorted by the image's class id (-1: unlabelled), so same-class blocks sit on the diagonal; at
    most :data:`MAX_TOKENS` pairs."""
    order = sorted(range(len(captions)), key=lambda i: labels[i])[:MAX_TOKENS]
    if len(captions) > MAX_TOKENS:
        title += f"\n(first {MAX_TOKENS} of {len(captions)} pairs, sorted by class)"
    classes = [class_label(labels[i], class_names) for i in order]
    picked = similarity.detach().float().cpu()[order][:, order]
    return matrix_figure(
        picked, classes, [captions[i] for i in order], title=title, x_label="caption", y_label="image (class)",
        colorbar_label="cosine similarity", vmin=-1, vmax=1,
    )  # fmt: skip


def image_grid_figure(
    images: torch.Tensor,
    captions: Sequence[str],
    title: str,
    columns: int = 4,
    row_titles: Sequence[str] | None = None,
) -> Figure:
    """(N, C, H, W) images (any range: each is min-max scaled for display, like torchvision's
    ``make_grid(normalize=True, scale_each=True)``) in a grid, each with its caption; ``row_titles`` name
    the rows (e.g. the query a row of retrieved images answers)."""
    n = images.size(0)
    rows = max(1, -(-n // columns))
    images = images.detach().float().cpu()
    with figure_style():
        figure = Figure(
            figsize=(max(MIN_SIZE[0], 2.2 * columns), max(MIN_SIZE[1], 2.4 * rows + 0.6)),
            dpi=DPI,
            layout="constrained",
        )
        figure.suptitle(title)
        axes = figure.subplots(rows, columns, squeeze=False)
        for k, ax in enumerate(axes.flat):
            ax.set_xticks([])
            ax.set_yticks([])
            if k >= n:
                ax.set_axis_off()
                continue
            image = images[k]
            image = (image - image.min()) / (image.max() - image.min()).clamp(min=1e-12)
            pixels = image.permute(1, 2, 0).numpy()
            ax.imshow(pixels[..., 0] if pixels.shape[2] == 1 else pixels, cmap="gray", vmin=0, vmax=1)
            ax.set_title(captions[k], fontsize=9)
        for r, row_title in enumerate(row_titles or []):
            axes[r, 0].set_ylabel(_short(row_title), fontsize=9)
    return figure


def figure_to_image(figure: Figure) -> torch.Tensor:
    """(3, H, W) uint8 RGB pixels of a figure, drawn on an Agg canvas (no display needed)."""
    with figure_style():
        canvas = FigureCanvasAgg(figure)
        canvas.draw()
        rgba = np.asarray(canvas.buffer_rgba())  # (H, W, 4)
    return torch.from_numpy(rgba[..., :3].copy()).permute(2, 0, 1).contiguous()
