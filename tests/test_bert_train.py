"""BERT experiments end to end: fast_dev_run of each, metrics and dashboards, DDP on CPU, init_from chains."""

from __future__ import annotations

import csv

import pytest
import torch

from lit_transformers.tasks import MaskedLMTask
from lit_transformers.train import train

from conftest import TINY_TRAINER

# a BERT small enough that every stage of a run takes seconds on 2 CPU cores
TINY_MODEL = [
    "model.n_layer=1",
    "model.n_head=2",
    "model.d_model=32",
    "model.d_ff=64",
    "model.max_position=128",  # the longest data.max_seq_len of the tiny runs (token classification)
]
# bert_pretrain's pairs (64 tokens) cut to 48, to keep its steps short
TINY_PAIRS = "data.max_seq_len=48"
TINY_BERT = [*TINY_MODEL, TINY_PAIRS, "data.vocab_size=400", "data.dupe_factor=1", *TINY_TRAINER]


def test_fast_dev_run_bert_pretrain(compose_cfg):
    metrics = train(
        compose_cfg("experiment=bert_pretrain", "debug=fdr", *TINY_MODEL, TINY_PAIRS, "data.vocab_size=400")
    ).metrics
    for key in (
        "test/mlm_loss",
        "test/mlm_acc",
        "test/mlm_ppl",
        "test/nsp_loss",
        "test/nsp_acc",
        "test/loss",
    ):
        assert key in metrics and torch.isfinite(torch.tensor(metrics[key])), key


# the full BERT-base with a 30k vocabulary takes minutes on 2 CPU cores; by default one block, small vocab
SHRINK = ["model.n_layer=1", "data.vocab_size=500", "data.dupe_factor=1"]


@pytest.mark.parametrize(
    "size", [pytest.param(SHRINK, id="one-block"), pytest.param([], id="full", marks=pytest.mark.slow)]
)
def test_fast_dev_run_bert_base_pretrain(compose_cfg, size):
    cfg = compose_cfg(
        "experiment=bert_base_pretrain",
        "debug=fdr",
        "data.batch_size=2",
        "data.num_workers=0",
        "trainer.precision=32-true",
        *size,
    )
    assert (
        cfg.model.d_model == 768
        and cfg.task.optimizer.lr == 1e-4
        and cfg.task.scheduler.warmup_steps == 10000
    )
    assert "test/mlm_acc" in train(cfg).metrics


def test_tiny_pretraining_logs_every_metric_and_the_dashboards(compose_cfg, tmp_path):
    metrics = train(compose_cfg("experiment=bert_pretrain", *TINY_BERT)).metrics
    with open(tmp_path / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    logged = {k for row in rows for k, v in row.items() if v}
    val_losses = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    assert float([r for r in rows if r.get("val/loss_best")][-1]["val/loss_best"]) == pytest.approx(
        min(val_losses)
    )
    for key in (
        "train/loss", "train/mlm_loss", "train/nsp_loss", "train/lr/pg1",
        "val/mlm_acc", "val/nsp_acc", "val/mlm_ppl", "val/mlm_loss", "val/nsp_loss", "val/loss", "val/loss_best",
        "test/mlm_acc", "test/nsp_acc", "test/mlm_ppl",
    ):  # fmt: skip
        assert key in logged, key
    assert metrics["val/mlm_ppl"] == pytest.approx(
        torch.tensor(metrics["val/mlm_loss"]).exp().item(), rel=1e-4
    )
    assert metrics["val/loss"] == pytest.approx(metrics["val/mlm_loss"] + metrics["val/nsp_loss"], rel=1e-4)
    table = (tmp_path / "csv" / "val_mlm_top5.csv").read_text()
    assert "[MASK]" in table and table.count("\n") > 2
    assert list((tmp_path / "csv" / "images").glob("val_attention_last_layer_step*.png"))
    # the checkpoint reloads with weights_only and carries the WordPiece tokenizer
    task = MaskedLMTask.load_from_checkpoint(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert (
        task.tokenizer.special_id("mask") == 4 and task.model.config.vocab_size == task.tokenizer.vocab_size
    )
    rows = task.predict_masked(["The for statement is used to iterate."])
    assert rows and len(rows[0]["top"]) == 5


@pytest.mark.cli
@pytest.mark.ddp
def test_bert_pretrain_under_ddp_cpu(ddp_cli):
    run_dir = ddp_cli(
        "experiment=bert_pretrain",
        *TINY_BERT,
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
        "data.batch_size=4",
    )
    assert (run_dir / "train_ddp_process_1.log").is_file()
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 3
    assert "val/nsp_acc" in (run_dir / "csv" / "metrics.csv").read_text()
