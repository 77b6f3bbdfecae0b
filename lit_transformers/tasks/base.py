"""What every training objective shares: lazy model construction, ``init_from``, optimiser, grad-norm logging."""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path

import lightning as L
import torch
from torch import nn
from torchmetrics import Metric

from lit_transformers.data.tokenizer import Tokenizer
from lit_transformers.tasks.optim import decay_groups


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Copy weights from a Lightning checkpoint or a plain state dict; any key or shape mismatch is an error."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"init_from={path} not found; pass a .ckpt from an earlier run")
    state = torch.load(path, map_location="cpu", weights_only=False)
    state = state.get("state_dict", state)
    # Lightning checkpoints name weights "model.<name>" (the task's attribute) beside metric states
    if any(k.startswith("model.") for k in state):
        state = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(v.shape)}"
        for k, v in own.items()
        if k in state and state[k].shape != v.shape
    ]
    if missing or unexpected or mismatched:
        raise ValueError(
            f"init_from={path} does not fit the model.\n  missing keys: {missing}\n  unexpected keys: {unexpected}\n"
            f"  shape mismatches: {mismatched}\nUse a checkpoint trained with the same model config."
        )
    model.load_state_dict(state)


class Task(L.LightningModule):
    """Subclasses implement ``build_model()`` and the step methods; the model is built in ``configure_model``
    so that it can depend on the datamodule (vocab size) and is built once per rank (FSDP-friendly)."""

    def __init__(
        self,
        optimizer: partial,
        scheduler: partial | None = None,
        init_from: str | None = None,
        compile: bool = False,
    ):
        super().__init__()
        self.model: nn.Module | None = None
        self.tokenizer: Tokenizer | None = None  # text tasks take it from the datamodule in build_model

    def build_model(self) -> nn.Module:
        raise NotImplementedError

    def fit_config_to_tokenizer(self, **fields) -> None:
        """Take the datamodule's tokenizer (when training with one) and write ``fields(tokenizer)`` into the
        model config, so the checkpoint records the vocabulary the model was built for."""
        datamodule = self._trainer.datamodule if self._trainer is not None else None
        if getattr(datamodule, "tokenizer", None) is None:
            return
        self.tokenizer = datamodule.tokenizer
        values = {name: get(self.tokenizer) for name, get in fields.items()}
        self.hparams.model = dataclasses.replace(self.hparams.model, **values)

    def log_best(self, key: str, tracker: Metric) -> None:
        """At validation end, feed ``key`` to a Min/MaxMetric and log the best so far as ``<key>_best``."""
        value = self.trainer.callback_metrics.get(key)
        if value is not None and not self.trainer.sanity_checking:
            tracker(value)
            self.log(f"{key}_best", tracker.compute(), sync_dist=True)

    def configure_model(self) -> None:
        if self.model is not None:
            return
        self.model = self.build_model()
        if self.hparams.init_from:
            load_weights(self.model, self.hparams.init_from)
            # the weights now live in this task's own checkpoints; reloading them must not need the parent file
            self.hparams.init_from = None
        if self.hparams.compile:
            self.model.compile()  # in place: state-dict names stay free of "_orig_mod."

    def param_groups(self) -> list[dict]:
        skip = getattr(self.model, "no_weight_decay", lambda: set())()
        return decay_groups(self.model, set(skip))

    def configure_optimizers(self):
        optimizer = self.hparams.optimizer(params=self.param_groups())
        for group in optimizer.param_groups:  # timm layer-wise lr decay stores "lr_scale" per group
            group["lr"] *= group.get("lr_scale", 1.0)
        if self.hparams.scheduler is None:
            return optimizer
        scheduler = self.hparams.scheduler(optimizer, total_steps=self.trainer.estimated_stepping_batches)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "name": "train/lr"},
        }

    def on_before_optimizer_step(self, optimizer) -> None:
        if (self.trainer.global_step + 1) % self.trainer.log_every_n_steps:
            return  # an extra pass over every gradient is only worth it on steps that get logged
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads:
            self.log("train/grad_norm", torch.nn.utils.get_total_norm(grads), on_step=True, on_epoch=False)

    def on_fit_start(self) -> None:
        checkpoints = self.trainer.checkpoint_callback
        if (
            self.tokenizer is not None
            and self.trainer.is_global_zero
            and getattr(checkpoints, "dirpath", None)
        ):
            self.tokenizer.save(
                Path(checkpoints.dirpath) / "tokenizer.json"
            )  # for tools outside this package

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.tokenizer is not None:
            checkpoint["tokenizer"] = self.tokenizer.to_str()  # generation/zero-shot reload exactly this one

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "tokenizer" in checkpoint:
            self.tokenizer = Tokenizer.from_str(checkpoint["tokenizer"])
