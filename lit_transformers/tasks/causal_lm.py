"""Causal language modelling (GPT pretraining, and the SFT stage later): next-token cross-entropy."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torchmetrics import MinMetric
from torchmetrics.text import Perplexity

from lit_transformers.models import GPT, GPTConfig
from lit_transformers.nn import generate, left_pad
from lit_transformers.tasks.base import Task

IGNORE_INDEX = -100  # label value for positions without a target (padding, prompts in SFT)


class CausalLMTask(Task):
    def __init__(
        self,
        model: GPTConfig,
        optimizer: partial,
        scheduler: partial | None = None,
        init_from: str | None = None,
        compile: bool = False,
    ):
        super().__init__(optimizer, scheduler, init_from, compile)
        self.save_hyperparameters(logger=False)
        self.val_ppl = Perplexity(ignore_index=IGNORE_INDEX)
        self.test_ppl = Perplexity(ignore_index=IGNORE_INDEX)
        self.val_loss_best = MinMetric()
        self.val_loss_best.persistent(True)  # saved in checkpoints: the best survives a resume

    def build_model(self) -> GPT:
        self.fit_config_to_tokenizer(vocab_size=lambda tok: tok.vocab_size)
        return GPT(self.hparams.model)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids)

    def _step(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(batch["input_ids"])  # (B, T, V)
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=IGNORE_INDEX
        )
        return loss, logits

    def training_step(self, batch, batch_idx):
        loss, _ = self._step(batch)
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        loss, logits = self._step(batch)
        self.val_ppl(logits.float(), batch["labels"])
        self.log("val/loss", loss, on_epoch=True, prog_bar=True, sync_dist=True)
        self.log("val/ppl", self.val_ppl, on_epoch=True, prog_bar=True)

    def on_validation_epoch_end(self):
        self.log_best("val/loss", self.val_loss_best)

    def test_step(self, batch, batch_idx):
        loss, logits = self._step(batch)
        self.test_ppl(logits.float(), batch["labels"])
        self.log("test/loss", loss, on_epoch=True, sync_dist=True)
        self.log("test/ppl", self.test_ppl, on_epoch=True)

    @torch.no_grad()
    def sample(
        self,
        prompts: list[str],
        max_new_tokens: int = 64,
        temperature: float = 0.8,
        top_k: int | None = 50,
        top_p: float | None = None,
        seed: int | None = None,
    ) -> list[str]:
        """Continue each prompt; returns only the generated text."""
        if self.tokenizer is None:
            raise RuntimeError(
                "No tokenizer attached: load the task from a checkpoint or train it with a datamodule"
            )
        tok = self.tokenizer
        ids, valid = left_pad([[tok.bos_id, *tok.encode(p)] for p in prompts], tok.pad_id, device=self.device)
        max_new_tokens = min(max_new_tokens, self.model.config.block_size - ids.size(1))
        generator = torch.Generator(device=self.device).manual_seed(seed) if seed is not None else None
        was_training = self.model.training
        self.model.eval()
        out = generate(
            self.model,
            ids,
            valid,
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            eos_id=tok.eos_id,
            pad_id=tok.pad_id,
            generator=generator,
        )
        self.model.train(was_training)
        return [tok.decode(row[ids.size(1) :].tolist()) for row in out]
