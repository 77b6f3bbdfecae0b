"""Generated text at the end of each validation, on the console and on every attached dashboard."""

from __future__ import annotations

import logging

import lightning as L

from lit_transformers.utils.dashboards import log_table

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
        rows = list(zip(self.prompts, texts))
        log_table(trainer, "val/samples", ["prompt", "continuation"], rows)
        log.info(
            "Samples at step %d:\n%s", trainer.global_step, "\n".join(f"  {p!r} -> {t!r}" for p, t in rows)
        )
