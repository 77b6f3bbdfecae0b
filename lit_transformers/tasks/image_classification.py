"""Image classification with any timm backbone (ViT, DeiT, ...): cross-entropy or Mixup soft targets."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.loss import SoftTargetCrossEntropy
from timm.optim import param_groups_layer_decay
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

from lit_transformers.contract import ClassNames
from lit_transformers.models.backbone import ImageClassifierConfig, create_backbone
from lit_transformers.tasks.base import Task
from lit_transformers.tasks.specs import build_config, config_spec
from lit_transformers.utils.dashboards import log_image, log_table
from lit_transformers.utils.figures import confusion_figure, image_grid_figure


class ImageClassificationTask(Task):
    """Args: ``model``, the :class:`ImageClassifierConfig` spec (the class count comes from the data);
    ``label_smoothing``; ``layer_decay``: timm layer-wise lr decay; ``per_class_limit``: log the per-class
    test accuracy table up to this many classes; ``num_examples``: misclassified images shown after each
    validation and the test; ``class_names``: taken from the datamodule and kept in checkpoints; the rest
    as in :class:`Task`."""

    data_needs = (ClassNames,)

    def __init__(
        self,
        model: dict | ImageClassifierConfig,
        label_smoothing: float = 0.1,
        layer_decay: float | None = None,
        per_class_limit: int = 100,
        num_examples: int = 16,
        class_names: list[str] | None = None,
        **task_args,
    ):
        # a plain {backbone: ...}, as checkpoints from before ImageClassifierConfig hold
        if isinstance(model, dict) and "_target_" not in model:
            model = ImageClassifierConfig(**model)
        model = config_spec(model)  # before the base records the arguments as hyperparameters
        super().__init__(**task_args)
        self.soft_target_loss = SoftTargetCrossEntropy()
        self.track_best("val/acc", "max")
        self._misclassified: list[tuple[torch.Tensor, int, int, float]] = []  # (image, true, predicted, p)

    def build_model(self) -> nn.Module:
        n = len(self.attach_class_names())
        self.build_metrics(n)  # metrics need the class count too, so they are made here with the model
        return create_backbone(**build_config(self.hparams.model).backbone, num_classes=n)

    def build_metrics(self, n: int) -> None:
        """Top-1 and top-5 accuracy (val and test), per-class accuracy and the confusion matrix (test)."""
        top = {
            "acc": MulticlassAccuracy(n, top_k=1, average="micro"),  # share of images right, not a class mean
            f"acc_top{min(5, n)}": MulticlassAccuracy(n, top_k=min(5, n), average="micro"),
        }
        self.val_metrics = MetricCollection(top, prefix="val/")
        self.test_metrics = self.val_metrics.clone(prefix="test/")
        self.test_per_class = MulticlassAccuracy(n, average=None)
        self.test_confusion = MulticlassConfusionMatrix(n)

    def param_groups(self) -> list[dict]:
        """With ``layer_decay``, timm's groups: lr scaled by layer_decay^(depth - layer) ("lr_scale", applied
        in ``Task.configure_optimizers`` and kept by the scheduler), and no decay on ``no_weight_decay()``."""
        if self.hparams.layer_decay is None:
            return super().param_groups()
        return param_groups_layer_decay(
            self.model,
            weight_decay=self.hparams.optimizer.get("weight_decay", 0.0),
            no_weight_decay_list=getattr(self.model, "no_weight_decay", lambda: set())(),
            layer_decay=self.hparams.layer_decay,
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Hard labels (B,): smoothed cross-entropy. Mixup/CutMix soft targets (B, C): SoftTargetCrossEntropy,
        whose targets already carry the label smoothing."""
        if targets.ndim == 2:
            return self.soft_target_loss(logits.float(), targets)
        return F.cross_entropy(logits.float(), targets, label_smoothing=self.hparams.label_smoothing)

    def training_step(self, batch, batch_idx):
        images, targets = batch
        logits = self(images)  # (B, n_classes)
        loss = self.loss(logits, targets)
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        if targets.ndim == 1:
            self.log("train/acc", (logits.argmax(-1) == targets).float().mean(), on_step=True, on_epoch=False)
        return loss

    def _eval_step(self, batch, metrics: MetricCollection) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = batch
        logits = self(images)
        stage = metrics.prefix.rstrip("/")
        self.log_mean(
            f"{stage}/loss", F.cross_entropy(logits.float(), labels, reduction="none"), prog_bar=True
        )
        metrics(logits, labels)
        self.log_dict(metrics, on_epoch=True, prog_bar=stage == "val")
        self._keep_misclassified(images, logits, labels)
        return logits, labels

    def _keep_misclassified(self, images: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """The first ``num_examples`` wrong images of this evaluation (in loader order, so the same images
        are candidates every time), for :meth:`_log_misclassified`."""
        room = self.hparams.num_examples - len(self._misclassified)
        if room <= 0 or self.trainer.sanity_checking:
            return
        probs, predicted = logits.float().softmax(-1).max(-1)
        for i in (predicted != labels).nonzero().flatten()[:room].tolist():
            self._misclassified.append(
                (images[i].cpu(), labels[i].item(), predicted[i].item(), probs[i].item())
            )

    def _log_misclassified(self, stage: str) -> None:
        if not self._misclassified:
            return
        names = self.hparams.class_names
        images, true, predicted, probs = zip(*self._misclassified)
        captions = [
            f"true: {names[t]}\npredicted: {names[p]} ({q:.0%})" for t, p, q in zip(true, predicted, probs)
        ]
        title = f"{stage}: the first {len(images)} misclassified images (predicted probability in brackets)"
        log_image(
            self.trainer, f"{stage}/misclassified", image_grid_figure(torch.stack(images), captions, title)
        )
        self._misclassified = []

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, self.val_metrics)

    def on_validation_epoch_end(self):
        self.log_best("val/acc")
        self._log_misclassified("val")

    def test_step(self, batch, batch_idx):
        logits, labels = self._eval_step(batch, self.test_metrics)
        self.test_per_class.update(logits, labels)
        self.test_confusion.update(logits, labels)

    def on_test_epoch_end(self):
        per_class = self.test_per_class.compute()  # (C,) recall of each class, synced over ranks
        self.log("test/acc_class_min", per_class.min(), sync_dist=True)
        confusion = self.test_confusion.compute()  # (true, predicted) counts
        names = self.hparams.class_names
        if len(names) <= self.hparams.per_class_limit:  # one table, not a chart per class
            rows = [(n, a, int(c)) for n, a, c in zip(names, per_class, confusion.sum(1))]
            log_table(self.trainer, "test/acc_class", ["class", "accuracy", "images"], rows)
        figure = confusion_figure(confusion, names, "test confusion matrix (count, share of the true class)")
        log_image(self.trainer, "test/confusion_matrix", figure)
        self._log_misclassified("test")
        self.test_per_class.reset()
        self.test_confusion.reset()
