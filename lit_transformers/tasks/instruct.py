"""What the InstructGPT stages share: rolling out responses to left-padded prompts, response log-probs, and
judging generations against the right answers (``val/judge_exact``, ``val/judge_score``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torchmetrics import MeanMetric

from lit_transformers.nn import (
    generate,
    padded_attention_mask,
    padded_position_ids,
    token_logprobs,
    truncate_after_eos,
)
from lit_transformers.text import Tokenizer
from lit_transformers.text.instructions import judge
from lit_transformers.utils.dashboards import log_table


@dataclass
class Rollout:
    sequences: torch.Tensor  # (B, P + R) prompt (left-padded) + response
    attention_mask: torch.Tensor  # (B, P + R) real tokens of both
    responses: torch.Tensor  # (B, R) generated tokens, padding after the first EOS
    response_mask: torch.Tensor  # (B, R) real response tokens, up to and including the first EOS
    has_eos: torch.Tensor  # (B,) whether the response ended with EOS


@torch.no_grad()
def rollout(
    model: nn.Module,
    tokenizer: Tokenizer,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> Rollout:
    """Sample (greedy at temperature 0) through the KV cache, then truncate after the first EOS. The policy
    is put in eval mode (dropout off) for sampling and restored."""
    P = prompt_ids.size(1)
    max_new_tokens = min(max_new_tokens, model.config.block_size - P)  # the context holds prompt + response
    was_training = model.training
    model.eval()
    out = generate(
        model,
        prompt_ids,
        prompt_mask,
        max_new_tokens,
        temperature,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        generator=generator,
    )
    model.train(was_training)
    responses, response_mask, has_eos = truncate_after_eos(out[:, P:], tokenizer.eos_id, tokenizer.pad_id)
    return Rollout(
        torch.cat([prompt_ids, responses], dim=1),
        torch.cat([prompt_mask.bool(), response_mask], dim=1),
        responses,
        response_mask,
        has_eos,
    )


def response_logprobs(
    model: nn.Module,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    n_response: int,
    temperature: float,
) -> torch.Tensor:
    """(B, R) log-probs of the last ``n_response`` tokens of each sequence, on ``logits / temperature``."""
    return token_logprobs(model, sequences, attention_mask, temperature)[:, -n_response:]


def decode_responses(tokenizer: Tokenizer, responses: torch.Tensor, mask: torch.Tensor) -> list[str]:
    return [tokenizer.decode(row[keep].tolist()) for row, keep in zip(responses, mask)]


class JudgeMetrics(nn.Module):
    """Running means of the judge's exact match and graded score over a stage's generations."""

    def __init__(self):
        super().__init__()
        self.exact, self.score = MeanMetric(), MeanMetric()

    def update(self, texts: list[str], answers: list[str]) -> list[tuple[float, float]]:
        verdicts = [judge(text, answer) for text, answer in zip(texts, answers)]
        device = self.exact.device
        self.exact.update(torch.tensor([v[0] for v in verdicts], device=device))
        self.score.update(torch.tensor([v[1] for v in verdicts], device=device))
        return verdicts


def sequence_logits(model: nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T, V) logits under the padding-aware mask and positions that generation used."""
    return model(
        sequences,
        position_ids=padded_position_ids(attention_mask),
        mask=padded_attention_mask(attention_mask),
    )


class PolicyEvaluation:
    """Validation/test of a policy against its frozen reference on held-out prompts: greedy responses, the
    judge (``judge_exact``, ``judge_score``), ``kl`` (summed k1 over response tokens, on ``logits / T``),
    ``rm_score`` when the task has a reward model, ``response_length``, and a sample table at each validation.
    Mixed into PPO and DPO; they set ``self.eval_metrics`` with :meth:`make_eval_metrics`."""

    EVAL_KEYS = ("judge_exact", "judge_score", "kl", "rm_score", "response_length")

    @staticmethod
    def make_eval_metrics() -> nn.ModuleDict:
        return nn.ModuleDict(
            {
                f"{stage}_{key}": MeanMetric()
                for stage in ("val", "test")
                for key in PolicyEvaluation.EVAL_KEYS
            }
        )

    def evaluate_policy(self, batch, stage: str, batch_idx: int) -> None:
        tok = self.require_tokenizer()
        h = self.hparams
        out = rollout(self.policy, tok, batch["prompt_ids"], batch["prompt_mask"], h.max_new_tokens, 0.0)
        R, mask = out.responses.size(1), out.response_mask
        logp = response_logprobs(self.policy, out.sequences, out.attention_mask, R, h.temperature)
        ref = response_logprobs(self.reference, out.sequences, out.attention_mask, R, h.temperature)
        values = {"kl": ((logp - ref) * mask).sum(1), "response_length": mask.sum(1).float()}
        reward = getattr(self, "reward", None)
        if reward is not None:
            values["rm_score"] = reward.score(out.sequences, out.attention_mask)
        texts = decode_responses(tok, out.responses, mask)
        if batch.get("answers") is not None:
            verdicts = [judge(t, a) for t, a in zip(texts, batch["answers"])]
            values["judge_exact"] = torch.tensor([v[0] for v in verdicts], device=self.device)
            values["judge_score"] = torch.tensor([v[1] for v in verdicts], device=self.device)
        for key, value in values.items():
            metric = self.eval_metrics[f"{stage}_{key}"]
            metric.update(value)
            self.log(f"{stage}/{key}", metric, on_epoch=True, prog_bar=key in ("judge_score", "rm_score"))
        if batch_idx == 0 and not self.trainer.sanity_checking:
            prompts = [tok.decode(p[m].tolist()) for p, m in zip(batch["prompt_ids"], batch["prompt_mask"])]
            columns = ["prompt", "response"] + [k for k in ("rm_score", "judge_score") if k in values]
            rows = [
                [p, t] + [round(float(values[k][i]), 3) for k in columns[2:]]
                for i, (p, t) in enumerate(zip(prompts, texts))
            ][:8]
            log_table(self.trainer, f"{stage}/samples", columns, rows)
