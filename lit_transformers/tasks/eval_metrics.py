"""Validation and test metrics that mean what they say, for every task: means over every sample (or token) of a
split, all batches and ranks weighed alike, and bests that survive a resume."""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torchmetrics import MaxMetric, MeanMetric, MinMetric


class EvalMetrics(L.LightningModule):
    """The base of :class:`~lit_transformers.tasks.base.Task` that gives it :meth:`log_mean` and
    :meth:`track_best` / :meth:`log_best`."""

    def __init__(self):
        super().__init__()
        self.eval_means = nn.ModuleDict()  # the running means of log_mean, one per logged key

    def eval_mean(self, key: str) -> MeanMetric:
        """The running mean behind :meth:`log_mean`'s ``key``, made at its first use (on this task's device)."""
        if key not in self.eval_means:
            self.eval_means[key] = MeanMetric().to(self.device)
        return self.eval_means[key]

    def log_mean(
        self, key: str, values: torch.Tensor, weight: torch.Tensor | float = 1.0, prog_bar: bool = False
    ) -> None:
        """Log the validation or test value ``key`` as its mean over every sample (or token) of the split, all
        batches and ranks together: ``values`` holds one value per sample (weight 1 each), or is a batch mean
        that stands for ``weight`` samples or tokens. The sums of value x weight and of weight are all-reduced
        before the division, so 2 DDP ranks log what 1 process logs, whatever their shares of the split.
        (``self.log(..., sync_dist=True)`` does not: Lightning divides the ranks' summed batch sizes by the
        world size as integers, so 13 samples on 2 ranks count as 12.) Lightning computes and resets the mean
        at epoch end; read it then from ``trainer.callback_metrics[key]``."""
        metric = self.eval_mean(key)
        metric.update(values, weight)
        self.log(
            key, metric, on_step=False, on_epoch=True, prog_bar=prog_bar, metric_attribute=f"eval_means.{key}"
        )

    def track_best(self, key: str, mode: str) -> None:
        """Keep the best (``mode``: min or max) validation ``key`` for :meth:`log_best`, in a tracker saved in
        checkpoints (so the best survives a resume) and named ``<key with _>_best`` in the state dict."""
        tracker = {"min": MinMetric, "max": MaxMetric}[mode]()
        tracker.persistent(True)
        setattr(self, f"{key.replace('/', '_')}_best", tracker)

    def log_best(self, key: str, value: torch.Tensor | None = None) -> None:
        """At validation end, feed ``value`` (default: ``key`` as the steps logged it) to ``key``'s tracker
        (:meth:`track_best`) and log the best so far as ``<key>_best``; nothing during the sanity check."""
        value = self.trainer.callback_metrics.get(key) if value is None else value
        if value is not None and not self.trainer.sanity_checking:
            tracker = getattr(self, f"{key.replace('/', '_')}_best")
            tracker(value)
            self.log(f"{key}_best", tracker.compute(), sync_dist=True)
