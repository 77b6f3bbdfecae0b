"""Dashboards as a user reads them: tables whose cells TensorBoard shows verbatim (read back from the event file
and rendered by TensorBoard's own text plugin), the same rows in CSV and wandb, pictures and tables of a
validation at the step of its scalars in every family, and PPO's progress bar counting its iterations."""

from __future__ import annotations

import csv
import re
from html.parser import HTMLParser
from pathlib import Path

import lightning as L
import pytest
import wandb
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.text.text_plugin import text_array_to_html
from tensorboard.util import tensor_util
from test_translation import _translation, write_parallel_locale

from lit_transformers.train import train
from lit_transformers.utils.dashboards import log_table

from conftest import TINY_LM, TINY_TRAINER
from test_bert_train import TINY_BERT
from test_instructgpt import TINY, TINY_DATA, TINY_TASK

# every cell is something a markdown renderer would reformat
CELLS = [
    "def __init__(self, *args, **kwargs):\n    return  a|b",
    "x = 2 * 3 * 4  # [link](url) <b>not bold</b> & `tick`",
    "1. first\n- second\n+ third\n\n> quoted",
    "_private_ and a\\|b",
]


class CellText(HTMLParser):
    """The text a browser shows in each cell of the innermost HTML tables: ``<br>`` a line break, a no-break
    space a space; rows in document order (an enclosing table's rows come after the table they hold)."""

    def __init__(self):
        super().__init__()
        self.rows: list[list[str]] = []
        self._rows: list[list[str]] = []
        self._cells: list[list[str]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self._rows.append([])
        elif tag in ("td", "th"):
            self._cells.append([])
        elif tag == "br" and self._cells:
            self._cells[-1].append("\n")

    def handle_endtag(self, tag):
        if tag == "tr":
            self.rows.append(self._rows.pop())
        elif tag in ("td", "th"):
            self._rows[-1].append("".join(self._cells.pop()).replace("\xa0", " "))

    def handle_data(self, data):
        if self._cells:
            self._cells[-1].append(data)


def tensorboard_table(log_dir: Path, tag: str) -> list[list[str]]:
    """The cells TensorBoard's text tab shows for ``tag``'s last event: header first."""
    events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    events.Reload()
    event = events.Tensors(f"{tag}/text_summary")[-1]
    parser = CellText()
    parser.feed(text_array_to_html(tensor_util.make_ndarray(event.tensor_proto), enable_markdown=True))
    return parser.rows[:-1]  # the last row is the text plugin's own one-cell table around the markdown one


def test_table_cells_survive_tensorboard_and_reach_csv_and_wandb_unchanged(tmp_path, monkeypatch):
    tensorboard, csv_logger = TensorBoardLogger(tmp_path, name="tb"), CSVLogger(tmp_path, name="csv")
    wandb_logger = WandbLogger(
        save_dir=tmp_path, offline=True
    )  # its run never starts: what it would log is recorded
    wandb_logged = []
    monkeypatch.setattr(
        wandb_logger, "log_metrics", lambda metrics, step: wandb_logged.append((metrics, step))
    )
    trainer = L.Trainer(
        logger=[tensorboard, csv_logger, wandb_logger], accelerator="cpu", enable_progress_bar=False
    )
    rows = [[cell, 0.123456789] for cell in CELLS]
    log_table(trainer, "val/samples", ["text_*", "score"], rows)
    tensorboard.experiment.flush()

    shown = tensorboard_table(tensorboard.log_dir, "val/samples")
    assert shown == [["text_*", "score"]] + [[cell, "0.1235"] for cell in CELLS]
    with open(Path(csv_logger.log_dir) / "val_samples.csv", encoding="utf-8", newline="") as f:
        assert list(csv.reader(f)) == [["step", "text_*", "score"]] + [
            ["0", cell, "0.1235"] for cell in CELLS
        ]
    ((logged, step),) = wandb_logged
    table = logged["val/samples"]
    assert isinstance(table, wandb.Table) and step == 0
    assert table.columns == ["text_*", "score"] and table.data == [[cell, 0.1235] for cell in CELLS]


# ---- one step axis --------------------------------------------------------------------------------------

ON_TENSORBOARD = ["logger=tensorboard", "trainer.num_sanity_val_steps=0"]  # the sanity check logs no metrics
TINY_VISION = [*TINY_TRAINER, "test=true"]


def _runs(root: Path) -> dict[str, list[str]]:
    return {
        "gpt": [*TINY_LM, "test=false", "sample=null"],
        "bert": ["experiment=bert_pretrain", *TINY_BERT, "test=false"],
        "translation": _translation(write_parallel_locale(root / "locale"), "test=false"),
        "vit": ["experiment=vit", *TINY_VISION],
        "clip": ["experiment=clip", *TINY_VISION],
        "ppo": [
            "experiment=gpt_ppo", *TINY, *TINY_DATA, *TINY_TASK, "trainer.max_steps=8", "task.num_ppo_epochs=2",
            "task.num_mini_batches=2", "test=false",
        ],
    }  # fmt: skip


def logged_steps(log_dir: Path) -> tuple[dict[str, set[int]], dict[str, set[int]]]:
    """({scalar tag: steps}, {picture or table tag: steps}) as the event files hold them."""
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    tags = events.Tags()
    scalars = {tag: {e.step for e in events.Scalars(tag)} for tag in tags["scalars"]}
    shown = {tag: {e.step for e in events.Images(tag)} for tag in tags["images"]}
    shown |= {
        tag.removesuffix("/text_summary"): {e.step for e in events.Tensors(tag)}
        for tag in tags["tensors"]
        if tag.endswith("/text_summary")  # tables; not the custom-scalars layout
    }
    return scalars, shown


@pytest.mark.parametrize("family", ["gpt", "bert", "translation", "vit", "clip", "ppo"])
def test_pictures_and_tables_of_an_evaluation_share_its_scalars_step(family, compose_cfg, tmp_path):
    train(compose_cfg(*_runs(tmp_path)[family], *ON_TENSORBOARD))
    scalars, shown = logged_steps(tmp_path / "tensorboard")
    evaluations = {
        stage: set().union(*(steps for tag, steps in scalars.items() if tag.startswith(f"{stage}/")))
        for stage in ("val", "test")
    }
    assert shown, f"{family} logged no picture or table"
    for tag, steps in shown.items():
        assert steps == evaluations[tag.split("/")[0]], (tag, steps, evaluations)
    if family == "ppo":  # one axis, iterations: 2 of them (4 optimizer steps each)
        assert set().union(*scalars.values(), *shown.values()) == {0, 1}


def test_ppo_progress_bar_counts_its_iterations(compose_cfg, tmp_path, capfd):
    shown = [o for o in _runs(tmp_path)["ppo"] if not o.startswith("callbacks.progress_bar")]
    capfd.readouterr()
    train(compose_cfg(*shown, "trainer.max_steps=12"))  # 3 iterations of 2 epochs x 2 minibatches
    bar = "".join(capfd.readouterr())
    with open(tmp_path / "csv" / "metrics.csv") as f:
        iterations = sum(bool(row["objective/scores"]) for row in csv.DictReader(f))  # logged every iteration
    assert iterations == 3
    assert re.search(rf"iteration\W+{iterations}/{iterations} ", bar) and "/12" not in bar, bar[-2000:]


CLIP = 1e-6  # far below any real gradient norm


@pytest.mark.parametrize(
    "family", ["gpt", "ppo"]
)  # Lightning's clipping (automatic optimisation), PPO's own (manual)
def test_grad_norm_is_logged_before_clipping(family, compose_cfg, tmp_path):
    clip = {"gpt": "trainer.gradient_clip_val", "ppo": "task.max_grad_norm"}[family]
    train(compose_cfg(*_runs(tmp_path)[family], f"{clip}={CLIP}", "trainer.limit_val_batches=0"))
    with open(tmp_path / "csv" / "metrics.csv") as f:
        norms = [float(row["train/grad_norm"]) for row in csv.DictReader(f) if row["train/grad_norm"]]
    assert norms and all(norm > 100 * CLIP for norm in norms), norms  # a clipped norm would read CLIP
