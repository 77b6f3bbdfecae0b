"""What the InstructGPT stages share: rolling out responses to left-padded prompts, response log-probs, and
judging generations against the right answers (``val/judge_exact``, ``val/judge_score``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lit_transformers.nn import generate, token_logprobs, truncate_after_eos
from lit_transformers.tasks.base import eval_mode
from lit_transformers.text import Tokenizer
from lit_transformers.text.instructions import judge
from lit_transformers.utils.dashboards import log_table


@dataclass
class Rollout:
    sequences: torch.Tensor  # (B, P + R) prompt (left-padded) + response
    attention_mask: torch.Tensor  # (B, P + R) real tokens of both
    responses: torch.Tensor  # (B, R) generated tokens, padding after the first EOS
    response_mask: torch.Tensor  # (B, R) real response tokens, up to and including the first EOS
    has_eos: torch.Tensor  # (B,) whether the response ended with EOS (any end-of-turn id)


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
    """Sample (greedy at temperature 0) through the KV cache, stopping at any of the tokenizer's
    ``end_of_turn_ids`` (EOS, or an instruct model's ``<|im_end|>``...), then truncate after the first of them.
    The policy is put in eval mode (dropout off) for sampling and restored."""
    P = prompt_ids.size(1)
    max_new_tokens = min(max_new_tokens, model.config.block_size - P)  # the context holds prompt + response
    with eval_mode(model):
        out = generate(
            model,
            prompt_ids,
            prompt_mask,
            max_new_tokens,
            temperature,
            eos_id=tokenizer.end_of_turn_ids,
            pad_id=tokenizer.pad_id,
            generator=generator,
        )
    responses, response_mask, has_eos = truncate_after_eos(
        out[:, P:], tokenizer.end_of_turn_ids, tokenizer.pad_id
    )
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


def log_judged(task, batch, stage: str, batch_idx: int, texts: list[str], values: dict, prog_bar=()) -> None:
    """The evaluation of a stage's generated ``texts`` for ``batch``: the judge's verdicts against the batch's
    answers (``judge_exact``, ``judge_score``) join ``values``; each (one per response) is logged as
    ``<stage>/<key>``, its mean over every prompt of the split (``Task.log_mean``); the first batch of each
    evaluation shows up to 8 prompts with their responses, answers and every value (the judge's, and those the
    stage has: reward-model score, KL, response length) as a table."""
    answers = batch.get("answers")
    if answers is not None:
        verdicts = [judge(text, answer) for text, answer in zip(texts, answers)]
        values = {
            "judge_exact": torch.tensor([v[0] for v in verdicts], device=task.device),
            "judge_score": torch.tensor([v[1] for v in verdicts], device=task.device),
            **values,
        }
    for key, value in values.items():
        task.log_mean(f"{stage}/{key}", value, prog_bar=key in prog_bar)
    if batch_idx or task.trainer.sanity_checking:
        return
    tok = task.require_tokenizer()
    columns = {
        "prompt": [tok.decode(p[m].tolist()) for p, m in zip(batch["prompt_ids"], batch["prompt_mask"])],
        "response": texts,
    }
    if answers is not None:
        columns["answer"] = answers
    columns |= {key: value.tolist() for key, value in values.items()}  # log_table rounds
    log_table(task.trainer, f"{stage}/samples", list(columns), list(zip(*columns.values()))[:8])


class PolicyEvaluation:
    """Validation/test of a policy against its frozen reference on held-out prompts: greedy responses, the
    judge (``judge_exact``, ``judge_score``), ``kl`` (summed k1 over response tokens, on ``logits / T``),
    ``rm_score`` when the task has a reward model, ``response_length``, and a sample table at each validation.
    Mixed into PPO, GRPO and DPO."""

    def reference_logprobs(self, sequences: torch.Tensor, attention_mask: torch.Tensor, n_response: int):
        """(B, R) the frozen reference's log-probs of the responses, on ``logits / T``: the other side of the KL
        (None for a task that holds no reference: then no ``kl``)."""
        return response_logprobs(
            self.reference, sequences, attention_mask, n_response, self.hparams.temperature
        )

    def evaluate_policy(self, batch, stage: str, batch_idx: int) -> None:
        tok = self.require_tokenizer()
        h = self.hparams
        out = rollout(self.policy, tok, batch["prompt_ids"], batch["prompt_mask"], h.max_new_tokens, 0.0)
        R, mask = out.responses.size(1), out.response_mask
        ref = self.reference_logprobs(out.sequences, out.attention_mask, R)
        reward = getattr(self, "reward", None)
        values = {"rm_score": reward.score(out.sequences, out.attention_mask)} if reward is not None else {}
        if ref is not None:
            logp = response_logprobs(self.policy, out.sequences, out.attention_mask, R, h.temperature)
            values["kl"] = ((logp - ref) * mask).sum(1)
        values["response_length"] = mask.sum(1).float()
        texts = decode_responses(tok, out.responses, mask)
        log_judged(self, batch, stage, batch_idx, texts, values, prog_bar=("judge_score", "rm_score"))


class ManualSteps:
    """What the RL tasks that step their optimizer themselves in ``training_step`` share (PPO, GRPO:
    ``automatic_optimization = False``, several updates per batch of prompts): ``trainer.max_steps`` and the
    schedule count optimizer steps, gradients are clipped to ``hparams.max_grad_norm`` where automatic
    optimization clips, and statistics are summed over DDP ranks."""

    @property
    def optimizer_steps_per_batch(self) -> int:
        """Optimizer steps of one iteration (a training batch); the progress bar counts iterations."""
        raise NotImplementedError

    def total_steps(self) -> int:
        if self.trainer.max_steps > 0:
            return self.trainer.max_steps  # manual optimisation: global_step counts optimizer steps already
        return int(self.trainer.estimated_stepping_batches) * self.optimizer_steps_per_batch

    def _all_reduce(self, stats: torch.Tensor) -> torch.Tensor:
        return self.trainer.strategy.reduce(stats, reduce_op="sum") if self.trainer.world_size > 1 else stats

    def on_before_optimizer_step(self, optimizer) -> None:
        """Clip where automatic optimization clips: inside ``optimizer.step()``, after a GradScaler unscaled the
        gradients (before it, as Lightning's manual-optimization examples do, the clip would act on scaled ones)."""
        super().on_before_optimizer_step(optimizer)
        if self.hparams.max_grad_norm:
            self.clip_gradients(
                optimizer, gradient_clip_val=self.hparams.max_grad_norm, gradient_clip_algorithm="norm"
            )
