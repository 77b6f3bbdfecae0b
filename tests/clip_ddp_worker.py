"""A job of a launch of 2 processes (conftest.TwoRankCall("clip_ddp_worker.one_step", OUT), from test_clip): one
ContrastiveTask step on ``trainer=ddp_cpu``, 2 ranks x 4 rows of a fixed 8-row batch. Rank 0 saves the loss
averaged over ranks and the DDP-synced gradients to OUT."""

from __future__ import annotations

import sys

import lightning as L
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate

from image_helpers import FixedBatches, fixed_caption_batch, tiny_clip_task


class Record(L.Callback):
    def __init__(self, out: str):
        self.out, self.grads = out, {}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.grads = {n: p.grad.clone() for n, p in pl_module.model.named_parameters()}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = trainer.strategy.reduce(outputs["loss"].detach(), reduce_op="mean")
        if trainer.is_global_zero:
            torch.save({"loss": loss, "grads": self.grads, "world_size": trainer.world_size}, self.out)


def one_step(out: str) -> None:
    GlobalHydra.instance().clear()
    with initialize_config_module("lit_transformers.conf", version_base="1.3"):
        cfg = compose("train", overrides=["trainer=ddp_cpu", f"paths.output_dir={out}.run"])
    trainer = instantiate(
        cfg.trainer,
        max_steps=1,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        callbacks=[Record(out)],
    )
    L.seed_everything(0)
    trainer.fit(tiny_clip_task(), datamodule=FixedBatches(fixed_caption_batch(8)))


if __name__ == "__main__":  # on its own: python tests/clip_ddp_worker.py OUT
    one_step(sys.argv[1])
