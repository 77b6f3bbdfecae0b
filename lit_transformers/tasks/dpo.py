"""Direct preference optimisation (Rafailov et al. 2023): the policy learns from chosen/rejected pairs
directly, against a frozen reference, without a reward model or sampling during training."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch

from lit_transformers.contract import TokenizedText
from lit_transformers.models import GPT, GPTConfig
from lit_transformers.nn import token_logprobs
from lit_transformers.nn.rlhf import dpo_loss
from lit_transformers.tasks.base import Task
from lit_transformers.tasks.causal_lm import decoder_spec, load_hf_decoder
from lit_transformers.tasks.instruct import PolicyEvaluation, eval_metrics


class DPOTask(PolicyEvaluation, Task):
    """Args: ``model`` (GPT config spec), ``beta`` (0.1), ``label_smoothing`` (conservative DPO), ``rpo_alpha``
    (TRL's: adds ``alpha`` times the chosen responses' per-token NLL, Pang et al. 2024, which keeps DPO from
    lowering the chosen responses' likelihood with the rejected ones'),
    ``max_new_tokens`` and ``temperature`` of the judged greedy responses and their KL; the rest as in
    :class:`Task`. ``init_from``: the SFT checkpoint, which initialises both policy and reference;
    ``init_from_hf``: or a Hugging Face causal LM directory, which does the same.

    The frozen reference's summed log-probs are computed once per pair (keyed by the batch's ``index`` in its
    split) and reused in later epochs and validations, as TRL's ``precompute_ref_log_probs``, but lazily: the
    first time a pair comes up, not in a pass before training.
    """

    frozen = ("reference",)
    data_needs = (TokenizedText,)
    init_from_hint = "pass the SFT checkpoint"

    def __init__(
        self,
        model: dict | GPTConfig,
        beta: float = 0.1,
        label_smoothing: float = 0.0,
        rpo_alpha: float | None = None,
        max_new_tokens: int = 16,
        temperature: float = 1.0,
        init_from_hf: str | None = None,
        **task_args,
    ):
        model = decoder_spec(model, init_from_hf)
        super().__init__(**task_args)
        self.eval_metrics = eval_metrics(self.EVAL_KEYS)
        self.reference_cache: dict[tuple[str, int], torch.Tensor] = {}  # (split, index) -> (chosen, rejected)

    def build_models(self) -> dict:
        path = self.hparams.init_from_hf
        if path:
            policy = load_hf_decoder(self, path, "policy and reference")
        else:
            policy = GPT(self.text_model_config(vocab_size=lambda tok: tok.vocab_size))
        return {"policy": policy, "reference": copy.deepcopy(policy)}  # equal also without init_from

    def _load_init_from(self, init_from: str | Mapping) -> None:
        if isinstance(init_from, str):
            init_from = {"policy": init_from, "reference": init_from}
        super()._load_init_from(init_from)

    def _sequence_logprobs(self, model, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed response log-probs of chosen (B,) and rejected (B,)."""
        logp = token_logprobs(model, batch["pair_ids"], batch["pair_mask"])  # (2B, T-1), token t+1 given <= t
        return (logp * batch["response_mask"][:, 1:]).sum(1).chunk(2)

    @torch.no_grad()
    def _reference_logprobs(self, batch, stage: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The reference's summed log-probs of chosen (B,) and rejected (B,), each pair computed once."""
        keys = [(stage, int(i)) for i in batch["index"]]
        if not all(key in self.reference_cache for key in keys):
            chosen, rejected = self._sequence_logprobs(self.reference, batch)
            self.reference_cache.update(zip(keys, torch.stack([chosen, rejected], 1)))
        return torch.stack([self.reference_cache[key] for key in keys]).unbind(1)

    def _step(self, batch, stage: str) -> torch.Tensor:
        h = self.hparams
        policy_chosen, policy_rejected = self._sequence_logprobs(self.policy, batch)
        ref_chosen, ref_rejected = self._reference_logprobs(batch, stage)
        losses, chosen, rejected = dpo_loss(
            policy_chosen, policy_rejected, ref_chosen, ref_rejected, h.beta, h.label_smoothing
        )
        loss = losses.mean()
        if h.rpo_alpha:  # RPO: + alpha * NLL of the chosen responses, per token
            chosen_tokens = batch["response_mask"][: len(policy_chosen), 1:].sum()
            loss = loss - h.rpo_alpha * policy_chosen.sum() / chosen_tokens
        on_step = stage == "train"
        prefix = "" if on_step else f"{stage}/"  # TRL's names in training: rewards/chosen, ...
        for key, value in {
            f"{stage}/loss": loss,
            f"{prefix}rewards/chosen": chosen.mean(),
            f"{prefix}rewards/rejected": rejected.mean(),
            f"{prefix}rewards/accuracies": (chosen > rejected).float().mean(),
            f"{prefix}rewards/margins": (chosen - rejected).mean(),
        }.items():
            self.log(key, value, on_step=on_step, on_epoch=not on_step, prog_bar=key.endswith("loss"))
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")
        self.evaluate_policy(batch, "val", batch_idx)

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")
        self.evaluate_policy(batch, "test", batch_idx)
