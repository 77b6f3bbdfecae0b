"""Reward model (InstructGPT stage 2): a GPT body + scalar head trained on comparisons with the
Bradley-Terry loss; chosen and rejected go through the model in one forward pass."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from lit_transformers.contract import TokenizedText
from lit_transformers.models import GPTConfig, ScalarGPT
from lit_transformers.nn import bradley_terry_loss
from lit_transformers.tasks.base import Task
from lit_transformers.tasks.causal_lm import decoder_spec, load_hf_decoder
from lit_transformers.tasks.specs import model_weights
from lit_transformers.utils.checkpoints import read_checkpoint


def gpt_or_scalar(path: str, trust_checkpoint: bool) -> str:
    """``"body"`` when ``path`` holds a plain GPT (an SFT or pretraining checkpoint), ``""`` when it holds
    a whole scalar model (a reward model's): where its weights go inside a :class:`ScalarGPT`."""
    state = model_weights(read_checkpoint(path, "init_from", trust_checkpoint))
    return "" if any(k.startswith("head.") for k in state) else "body"


class RewardTask(Task):
    """Args: ``model`` (the GPT config spec), ``margin`` subtracted from r_chosen - r_rejected in the loss,
    ``center_rewards_coefficient`` (TRL's penalty on mean((r_c + r_r)^2)); the rest as in :class:`Task`.
    ``init_from`` may be a GPT checkpoint (the body; the head starts fresh) or a reward model's;
    ``init_from_hf`` a Hugging Face causal LM directory (its decoder is the body, the head starts fresh)."""

    new_heads = ("model.head",)
    data_needs = (TokenizedText,)
    context_field = "block_size"
    init_from_hint = "pass the SFT checkpoint"

    def __init__(
        self,
        model: dict | GPTConfig,
        margin: float = 0.0,
        center_rewards_coefficient: float = 0.0,
        init_from_hf: str | None = None,
        **task_args,
    ):
        model = decoder_spec(model, init_from_hf)
        super().__init__(**task_args)
        self.track_best("val/accuracy", "max")

    def build_model(self) -> ScalarGPT:
        path = self.hparams.init_from_hf
        if path:
            body = load_hf_decoder(self, path, "reward model's body (new: its scalar head, model.head.*)")
            return ScalarGPT(body.config, body)
        return ScalarGPT(self.text_model_config(vocab_size=lambda tok: tok.vocab_size))

    def _load_init_from(self, init_from: str | Mapping) -> None:
        if isinstance(init_from, str):
            where = gpt_or_scalar(init_from, self.hparams.trust_checkpoint)
            init_from = {"model.body" if where else "model": init_from}
        super()._load_init_from(init_from)

    def _scores(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.model.score(batch["pair_ids"], batch["pair_mask"])  # (2B,): chosen rows, then rejected
        return scores.chunk(2)

    def _loss(self, chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
        h = self.hparams
        return bradley_terry_loss(chosen, rejected, h.margin or None, h.center_rewards_coefficient)

    def training_step(self, batch, batch_idx):
        chosen, rejected = self._scores(batch)
        loss = self._loss(chosen, rejected)
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        self.log("train/accuracy", (chosen > rejected).float().mean(), on_step=True, on_epoch=False)
        return loss

    def _eval_step(self, batch, stage: str) -> None:
        chosen, rejected = self._scores(batch)
        both = torch.cat([chosen, rejected])
        self.log_mean(f"{stage}/loss", self._loss(chosen, rejected), chosen.numel())  # a mean over the pairs
        self.log_mean(f"{stage}/accuracy", (chosen > rejected).float(), prog_bar=True)
        self.log_mean(f"{stage}/margin", chosen - rejected)
        self.log_mean(f"{stage}/reward_mean", both)
        self.eval_mean(f"{stage}/reward_sq").update(both**2)  # for reward_std, not logged itself

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, "test")

    def _log_std(self, stage: str) -> None:
        mean = self.trainer.callback_metrics.get(f"{stage}/reward_mean")
        if mean is None:
            return
        squares = self.eval_mean(f"{stage}/reward_sq")
        sq = squares.compute()
        squares.reset()
        self.log(f"{stage}/reward_std", (sq - mean**2).clamp(min=0).sqrt())

    def on_validation_epoch_end(self):
        self._log_std("val")
        self.log_best("val/accuracy")

    def on_test_epoch_end(self):
        self._log_std("test")
