"""BERT fine-tuning for sentence and sentence-pair classification: pooled [CLS] -> dropout -> linear."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix, MulticlassF1Score

from lit_transformers.tasks.base import eval_mode
from lit_transformers.tasks.encoder import EncoderClassifierTask
from lit_transformers.text import pack_pair, right_pad
from lit_transformers.utils.dashboards import log_image, log_table
from lit_transformers.utils.figures import confusion_figure


class SequenceClassificationTask(EncoderClassifierTask):
    """The classifier on the body's pooled [CLS]. Metrics: accuracy and macro-F1 (``val/``, ``test/``), a
    test confusion matrix with the class names on its axes, and after each validation and the test a table
    of the first ``num_examples`` misclassified texts. Args as in :class:`EncoderClassifierTask`."""

    def __init__(self, model: dict, num_examples: int = 16, **task_args):
        super().__init__(model, **task_args)
        self.track_best("val/acc", "max")
        self._misclassified: list[tuple[str, str, str, float]] = []  # (text, true, predicted, probability)

    def build_models(self) -> dict[str, nn.Module]:
        models = super().build_models()
        n = len(self.hparams.class_names)
        metrics = {
            "acc": MulticlassAccuracy(n, average="micro"),  # share of examples right
            "f1_macro": MulticlassF1Score(n, average="macro"),  # every class counts the same
        }
        self.val_metrics = MetricCollection(metrics, prefix="val/")
        self.test_metrics = self.val_metrics.clone(prefix="test/")
        self.test_confusion = MulticlassConfusionMatrix(n)
        return models

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, n_classes) logits."""
        return self.classifier(self.model.pool(self.encode(batch)))

    def training_step(self, batch, batch_idx):
        logits = self(batch)
        loss = F.cross_entropy(logits.float(), batch["labels"])
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        self.log(
            "train/acc", (logits.argmax(-1) == batch["labels"]).float().mean(), on_step=True, on_epoch=False
        )
        return loss

    def _eval_step(self, batch, metrics: MetricCollection) -> torch.Tensor:
        logits = self(batch)
        stage = metrics.prefix.rstrip("/")
        losses = F.cross_entropy(logits.float(), batch["labels"], reduction="none")  # (B,)
        self.log_mean(f"{stage}/loss", losses)
        metrics(logits, batch["labels"])
        self.log_dict(metrics, on_epoch=True, prog_bar=stage == "val")
        self._keep_misclassified(batch, logits)
        return logits

    def _keep_misclassified(self, batch: dict[str, torch.Tensor], logits: torch.Tensor) -> None:
        """The first ``num_examples`` misclassified texts of this evaluation (in loader order), decoded
        from their tokens (a pair's two texts joined by " | "), for :meth:`_log_misclassified`."""
        room = self.hparams.num_examples - len(self._misclassified)
        if room <= 0 or self.trainer.sanity_checking:
            return
        tok, names = self.require_tokenizer(), self.hparams.class_names
        probs, predicted = logits.float().softmax(-1).max(-1)
        types = batch.get("token_type_ids", torch.zeros_like(batch["input_ids"]))
        for i in (predicted != batch["labels"]).nonzero().flatten()[:room].tolist():
            ids, valid = batch["input_ids"][i], batch["attention_mask"][i].bool()
            parts = [tok.decode(ids[valid & (types[i] == t)].tolist()) for t in (0, 1)]
            text = " | ".join(p for p in parts if p)
            true, guess = names[batch["labels"][i].item()], names[predicted[i].item()]
            self._misclassified.append((text, true, guess, probs[i].item()))

    def _log_misclassified(self, stage: str) -> None:
        if self._misclassified:
            columns = ["text", "true", "predicted", "probability"]
            log_table(self.trainer, f"{stage}/misclassified", columns, self._misclassified)
        self._misclassified = []

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, self.val_metrics)

    def on_validation_epoch_end(self):
        self.log_best("val/acc")
        self._log_misclassified("val")

    def test_step(self, batch, batch_idx):
        self.test_confusion.update(self._eval_step(batch, self.test_metrics), batch["labels"])

    def on_test_epoch_end(self):
        confusion = self.test_confusion.compute()  # (true, predicted) counts, synced over ranks
        figure = confusion_figure(
            confusion, self.hparams.class_names, "test confusion matrix (count, share of the true class)"
        )
        log_image(self.trainer, "test/confusion_matrix", figure)
        self._log_misclassified("test")
        self.test_confusion.reset()

    @torch.no_grad()
    def predict(self, texts: list[str], text_pairs: list[str] | None = None) -> list[str]:
        """Class names for raw texts (and second texts), with the checkpoint's tokenizer."""
        tok = self.require_tokenizer()
        cls_id, sep_id = tok.special_id("cls"), tok.special_id("sep")
        pairs = text_pairs or [None] * len(texts)
        packed = [
            pack_pair(
                tok.encode(a), tok.encode(b) if b else None, cls_id, sep_id, self.model.config.max_position
            )
            for a, b in zip(texts, pairs)
        ]
        ids, valid = right_pad([p[0] for p in packed], tok.pad_id, device=self.device)
        types, _ = right_pad([p[1] for p in packed], 0, device=self.device)
        with eval_mode(self):
            logits = self({"input_ids": ids, "attention_mask": valid, "token_type_ids": types})
        return [self.hparams.class_names[i] for i in logits.argmax(-1).tolist()]
