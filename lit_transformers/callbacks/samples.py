"""Generated text at the end of each validation, on the console and on every attached dashboard."""

from __future__ import annotations

import logging
import os

import lightning as L
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger

log = logging.getLogger(__name__)


class TextSamples(L.Callback):
    def __init__(
        self, prompts: list[str], max_new_tokens: int = 48, temperature: float = 0.8, top_k: int = 50
    ):
        self.prompts = list(prompts)
        self.max_new_tokens, self.temperature, self.top_k = max_new_tokens, temperature, top_k

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not self.prompts:
            return
        # every rank generates (a sharded FSDP forward needs them all); rank 0 logs
        texts = pl_module.sample(
            self.prompts, self.max_new_tokens, self.temperature, self.top_k, seed=trainer.global_step
        )
        if not trainer.is_global_zero:
            return
        step = trainer.global_step
        rows = list(zip(self.prompts, texts))
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_text(
                    "val/samples", columns=["prompt", "continuation"], data=[list(r) for r in rows], step=step
                )
            elif isinstance(logger, TensorBoardLogger):
                markdown = "\n\n".join(f"**{p}**{t}" for p, t in rows)
                logger.experiment.add_text("val/samples", markdown, global_step=step)
            elif isinstance(logger, CSVLogger):
                os.makedirs(logger.log_dir, exist_ok=True)
                with open(f"{logger.log_dir}/samples.txt", "a", encoding="utf-8") as f:
                    f.writelines(f"[step {step}] {p!r} -> {t!r}\n" for p, t in rows)
        log.info("Samples at step %d:\n%s", step, "\n".join(f"  {p!r} -> {t!r}" for p, t in rows))
