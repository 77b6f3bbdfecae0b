"""Direct preference optimisation (Rafailov et al. 2023): the policy learns from chosen/rejected pairs
directly, against a frozen reference, without a reward model or sampling during training."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch

from lit_transformers.contract import TokenizedText
from lit_transformers.models import GPTConfig
from lit_transformers.nn import token_logprobs
from lit_transformers.nn.rlhf import DPO_LOSS_TYPES, chosen_nll, dpo_loss, dpo_sequence_logprobs
from lit_transformers.tasks.base import Task
from lit_transformers.tasks.causal_lm import build_decoder, decoder_spec
from lit_transformers.tasks.instruct import PolicyEvaluation
from lit_transformers.tasks.lora import FrozenBase, refuse_reference_source


class DPOTask(PolicyEvaluation, Task):
    """Args: ``model`` (GPT config spec), ``beta`` (0.1), ``loss_type`` (TRL's: ``sigmoid`` DPO, ``hinge``,
    ``ipo``, ``sigmoid_norm`` on per-token log-ratios; :func:`lit_transformers.nn.rlhf.dpo_loss`), ``ld_alpha``
    (TRL's LD-DPO weight of the longer response's tokens past the shorter one's length; null: plain sums),
    ``label_smoothing`` (conservative DPO), ``rpo_alpha`` (adds ``alpha`` times the chosen responses' per-token
    NLL, Pang et al. 2024, TRL's ``loss_type=[sigmoid, sft]`` with ``loss_weights=[1, alpha]``, which keeps DPO
    from lowering the chosen responses' likelihood with the rejected ones'),
    ``max_new_tokens`` and ``temperature`` of the judged greedy responses and their KL, judged once per prompt
    (the first of its pairs in the split: the label stage gives a hard prompt many pairs, an easy one few); the
    rest as in :class:`Task`. ``init_from``: the SFT checkpoint, which initialises both policy and reference;
    ``init_from_hf``: or a Hugging Face causal LM directory, which does the same.

    The frozen reference's summed log-probs are computed once per pair (keyed by the batch's ``index`` in its
    split) and reused in later epochs and validations, as TRL's ``precompute_ref_log_probs``, but lazily: the
    first time a pair comes up, not in a pass before training. With ``task.lora`` the reference is the policy's
    frozen base with its adapters off (``lora.FrozenBase``), not a second copy.
    """

    frozen = ("reference",)
    lora_models = ("policy",)
    data_needs = (TokenizedText,)
    context_field = "block_size"
    init_from_hint = "pass the SFT checkpoint"

    def __init__(
        self,
        model: dict | GPTConfig,
        beta: float = 0.1,
        loss_type: str = "sigmoid",
        ld_alpha: float | None = None,
        label_smoothing: float = 0.0,
        rpo_alpha: float | None = None,
        max_new_tokens: int = 16,
        temperature: float = 1.0,
        init_from_hf: str | None = None,
        **task_args,
    ):
        if loss_type not in DPO_LOSS_TYPES:
            raise ValueError(f"task.loss_type={loss_type!r}: choose one of {list(DPO_LOSS_TYPES)}")
        if ld_alpha is not None and not 0 <= ld_alpha <= 1:
            raise ValueError(f"task.ld_alpha={ld_alpha} must lie in [0, 1] (1: plain DPO), or be null")
        model = decoder_spec(model, init_from_hf)
        super().__init__(**task_args)
        if self.hparams.lora is not None:
            refuse_reference_source(self.hparams)
            self.frozen = ()  # no reference model: the policy's base, adapters off
        self.reference_cache: dict[tuple[str, int], torch.Tensor] = {}  # (split, index) -> (chosen, rejected)

    def build_models(self) -> dict:
        policy = build_decoder(self, "policy and reference")
        if self.hparams.lora is not None:
            self.reference = FrozenBase(policy)
            return {"policy": policy}
        return {"policy": policy, "reference": copy.deepcopy(policy)}  # equal also without init_from

    def _load_init_from(self, init_from: str | Mapping) -> None:
        if isinstance(init_from, str):
            init_from = {name: init_from for name in ("policy", "reference") if name in self.model_names}
        super()._load_init_from(init_from)

    def _sequence_logprobs(
        self, model, batch, token_logps: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed response log-probs of chosen (B,) and rejected (B,), weighted by ``ld_alpha`` past the shorter
        response; ``token_logps`` (2B, T-1): the model's, when already computed."""
        if token_logps is None:
            token_logps = token_logprobs(model, batch["pair_ids"], batch["pair_mask"])  # token t+1 given <= t
        return dpo_sequence_logprobs(token_logps, batch["response_mask"][:, 1:], self.hparams.ld_alpha)

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
        token_logps = token_logprobs(self.policy, batch["pair_ids"], batch["pair_mask"])  # (2B, T-1)
        policy_chosen, policy_rejected = self._sequence_logprobs(self.policy, batch, token_logps)
        ref_chosen, ref_rejected = self._reference_logprobs(batch, stage)
        mask = batch["response_mask"][:, 1:]  # (2B, T-1) the tokens of each response
        chosen_mask, rejected_mask = mask.chunk(2)
        losses, chosen, rejected = dpo_loss(
            policy_chosen,
            policy_rejected,
            ref_chosen,
            ref_rejected,
            h.beta,
            h.label_smoothing,
            h.loss_type,
            chosen_mask.sum(1),
            rejected_mask.sum(1),
        )
        nll = chosen_nll(token_logps, mask)  # per chosen token
        loss = losses.mean()
        if h.rpo_alpha:  # RPO: + alpha * NLL of the chosen responses
            loss = loss + h.rpo_alpha * nll
        per_pair = {
            "rewards/chosen": chosen,
            "rewards/rejected": rejected,
            "rewards/accuracies": (chosen > rejected).float(),
            "rewards/margins": chosen - rejected,
        }
        if stage == "train":  # TRL's names in training: rewards/chosen, ...
            self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
            for key, value in per_pair.items():
                self.log(key, value.mean(), on_step=True, on_epoch=False)
            return loss
        # the loss over the split is made at epoch end, from each pair's DPO loss and every chosen token's NLL
        self.eval_mean(f"{stage}/dpo_loss").update(losses)
        self.eval_mean(f"{stage}/chosen_nll").update(nll, chosen_mask.sum())
        for key, value in per_pair.items():
            self.log_mean(f"{stage}/{key}", value)
        return loss

    def _log_loss(self, stage: str) -> None:
        """``<stage>/loss`` as training defines it, over the whole split: the mean DPO loss of its pairs, plus
        (RPO) alpha times the mean NLL of all their chosen tokens."""
        dpo, nll = self.eval_mean(f"{stage}/dpo_loss"), self.eval_mean(f"{stage}/chosen_nll")
        if dpo.update_count:
            loss = dpo.compute()
            if self.hparams.rpo_alpha:
                loss = loss + self.hparams.rpo_alpha * nll.compute()
            self.log(f"{stage}/loss", loss, prog_bar=True)
        dpo.reset()
        nll.reset()

    def on_validation_epoch_end(self):
        self._log_loss("val")

    def on_test_epoch_end(self):
        self._log_loss("test")

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def _evaluate_prompts(self, batch, stage: str, batch_idx: int) -> None:
        """The judged evaluation of the batch's prompts that are the first pair of their prompt (``judged``)."""
        rows = batch.get("judged")
        if rows is None:
            self.evaluate_policy(batch, stage, batch_idx)
        elif rows.any():
            prompts = {key: batch[key][rows] for key in ("prompt_ids", "prompt_mask")}
            answers = batch["answers"]
            prompts["answers"] = None if answers is None else [a for a, keep in zip(answers, rows) if keep]
            self.evaluate_policy(prompts, stage, batch_idx)

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")
        self._evaluate_prompts(batch, "val", batch_idx)

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")
        self._evaluate_prompts(batch, "test", batch_idx)
