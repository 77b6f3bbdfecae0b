"""BERT fine-tuning for token classification (NER, chunking, POS): a linear head on every hidden state."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics import SumMetric

from lit_transformers.nn import IGNORE_INDEX
from lit_transformers.tasks.encoder import EncoderClassifierTask
from lit_transformers.tasks.evaluation import entity_counts


class TokenClassificationTask(EncoderClassifierTask):
    """The classifier on each token's hidden state. Labels sit on the first WordPiece of each word (the
    datamodule puts IGNORE_INDEX elsewhere).

    Metrics: ``acc`` (share of words tagged right), ``entity_f1`` / ``entity_precision`` / ``entity_recall``
    over BIO spans (exact type and boundaries, CoNLL's conlleval), for ``val/`` and ``test/``.

    Args as in :class:`EncoderClassifierTask` (``class_names``: the tags)."""

    def __init__(self, model: dict, **task_args):
        super().__init__(model, **task_args)
        for stage in ("val", "test"):
            for count in ("tp", "predicted", "true"):
                setattr(self, f"{stage}_{count}", SumMetric())
        self.track_best("val/entity_f1", "max")

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, T, n_classes) logits."""
        return self.classifier(self.encode(batch))

    def training_step(self, batch, batch_idx):
        logits = self(batch)
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=IGNORE_INDEX
        )
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        return loss

    def _eval_step(self, batch, stage: str) -> None:
        logits, labels = self(batch), batch["labels"]
        words = labels != IGNORE_INDEX
        # per word (its first WordPiece), over every word of the split
        self.log_mean(
            f"{stage}/loss", F.cross_entropy(logits[words].float(), labels[words], reduction="none")
        )
        predicted = logits.argmax(-1)
        self.log_mean(f"{stage}/acc", (predicted[words] == labels[words]).float(), prog_bar=stage == "val")
        names = self.hparams.class_names
        counts = torch.zeros(3)
        for row_true, row_pred, row_words in zip(labels.tolist(), predicted.tolist(), words.tolist()):
            true = [names[t] for t, w in zip(row_true, row_words) if w]
            pred = [names[p] for p, w in zip(row_pred, row_words) if w]
            counts += torch.tensor(entity_counts(true, pred), dtype=torch.float)
        for metric, value in zip(("tp", "predicted", "true"), counts):
            getattr(self, f"{stage}_{metric}").update(value)

    def _log_entities(self, stage: str) -> torch.Tensor | None:
        """Entity precision, recall and F1 from the counts summed over batches and ranks; returns the F1."""
        tp, predicted, true = (getattr(self, f"{stage}_{m}") for m in ("tp", "predicted", "true"))
        if not tp.update_count:
            return None
        tp, predicted, true = tp.compute(), predicted.compute(), true.compute()
        f1 = 2 * tp / (predicted + true).clamp(min=1)
        self.log(f"{stage}/entity_precision", tp / predicted.clamp(min=1))
        self.log(f"{stage}/entity_recall", tp / true.clamp(min=1))
        self.log(f"{stage}/entity_f1", f1, prog_bar=stage == "val")
        for m in ("tp", "predicted", "true"):
            getattr(self, f"{stage}_{m}").reset()
        return f1

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self):
        f1 = self._log_entities("val")
        if f1 is not None:
            self.log_best("val/entity_f1", f1)

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, "test")

    def on_test_epoch_end(self):
        self._log_entities("test")
