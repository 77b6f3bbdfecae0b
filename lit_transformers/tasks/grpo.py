"""GRPO (Shao et al. 2024, DeepSeekMath; TRL's ``GRPOTrainer``), Lightning-native: each training batch of prompts is
one GRPO iteration inside ``training_step`` (manual optimisation): ``num_generations`` sampled completions per prompt
-> rewards (tasks/rewards.py: the judge, a format pattern, the reward model, weighted) -> group-relative advantages
-> ``num_iterations`` clipped policy updates, old log-probs computed once. No value model.

Models: ``policy`` (from the SFT checkpoint) trains; ``reference`` (the SFT weights, only when ``beta > 0``; under
``task.lora`` the policy with its adapters disabled, no copy) and ``reward`` (only for a ``reward_model`` reward) are
frozen. A rank's prompts and all their completions stay on that rank: groups are never split across DDP ranks, so
group statistics are exact; batch-wide ones (``scale_rewards=batch``, the ``dapo`` token count) are summed over
ranks. ``trainer.max_steps`` counts optimizer steps: GRPO iterations x num_iterations.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence

import torch

from lit_transformers.callbacks.throughput import StageClock
from lit_transformers.contract import TokenizedText
from lit_transformers.models import GPTConfig, ScalarGPT
from lit_transformers.nn.generation import logprobs_of, padded_forward
from lit_transformers.nn.rlhf import (
    GRPO_LOSS_TYPES,
    group_advantages,
    grpo_loss,
    masked_entropy,
    masked_mean,
    sample_std,
)
from lit_transformers.tasks.base import Task
from lit_transformers.tasks.causal_lm import build_decoder, decoder_spec
from lit_transformers.tasks.instruct import (
    ManualSteps,
    PolicyEvaluation,
    decode_responses,
    response_logprobs,
    rollout,
)
from lit_transformers.tasks.lora import FrozenBase, refuse_reference_source
from lit_transformers.tasks.reward import gpt_or_scalar
from lit_transformers.tasks.rewards import parse_rewards, score_completions, uses_reward_model
from lit_transformers.text.instructions import judge
from lit_transformers.utils.dashboards import log_table

log = logging.getLogger(__name__)

SCALE_REWARDS = {True: "group", False: "none", "group": "group", "batch": "batch", "none": "none"}


class GRPOTask(ManualSteps, PolicyEvaluation, Task):
    """Args (TRL's ``GRPOConfig`` names and defaults):
        model: the GPT config spec of the policy (and the reference and reward model).
        rewards: ``[{judge: 1.0}, {reward_model: 0.5}, ...]`` (tasks/rewards.py), summed with their weights.
        num_generations: completions sampled per prompt (a group), in one batched generation.
        scale_rewards: group | batch | none (or true = group, false = none): what divides ``r - mean_group``.
        loss_type: grpo | bnpo | dr_grpo | dapo (nn.rlhf.grpo_loss). epsilon, epsilon_high: the clip range
            ``[1 - epsilon, 1 + epsilon_high]`` (DAPO's clip-higher; null: epsilon).
        beta: weight of the k3 KL to the reference (0: no reference model held). use_bias_correction_kl: the KL
            term times the ratio (TRL's default).
        num_iterations: updates per generation batch (mu); old log-probs come from one forward before them.
        temperature: sampling temperature; log-probs are taken on ``logits / temperature``.
        max_new_tokens: completion length limit (TRL's max_completion_length; dr_grpo's constant).
        mask_truncated_completions: completions that never emit EOS take no part in the loss.
        max_grad_norm: gradient clipping inside the manual step.
    ``init_from``: ``{policy: <sft.ckpt>, reward: <reward.ckpt>}`` (or the SFT checkpoint alone); the reference
    starts as the policy. ``init_from_hf``: a Hugging Face causal LM directory for the policy and the reference.
    """

    data_needs = (TokenizedText,)
    context_field = "block_size"
    init_from_hint = (
        "pass init_from={policy: <sft.ckpt>} (and reward: <reward.ckpt> for a reward_model reward)"
    )
    lora_models = ("policy",)

    def __init__(
        self,
        model: dict | GPTConfig,
        rewards: Sequence[Mapping] = ({"judge": 1.0},),
        num_generations: int = 8,
        scale_rewards: str | bool = "group",
        loss_type: str = "dapo",
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        beta: float = 0.0,
        use_bias_correction_kl: bool = True,
        num_iterations: int = 1,
        temperature: float = 1.0,
        max_new_tokens: int = 16,
        mask_truncated_completions: bool = False,
        max_grad_norm: float | None = 1.0,
        init_from_hf: str | None = None,
        **task_args,
    ):
        model = decoder_spec(model, init_from_hf)
        parsed = parse_rewards(rewards)
        if num_generations < 2:
            raise ValueError(f"task.num_generations={num_generations}: a group needs at least 2 completions")
        if scale_rewards not in SCALE_REWARDS:
            raise ValueError(
                f"task.scale_rewards={scale_rewards!r}: use group, batch or none (or true / false)"
            )
        if loss_type not in GRPO_LOSS_TYPES:
            raise ValueError(f"task.loss_type={loss_type!r}: use one of {', '.join(GRPO_LOSS_TYPES)}")
        if temperature <= 0 or num_iterations < 1:
            raise ValueError(
                f"task.temperature={temperature}, task.num_iterations={num_iterations}: GRPO samples (temperature "
                "> 0) and updates at least once per generation batch (num_iterations >= 1)"
            )
        super().__init__(**task_args)
        self.automatic_optimization = False
        self.rewards = parsed
        self.scale_rewards = SCALE_REWARDS[scale_rewards]
        self.uses_reward_model = uses_reward_model(self.rewards)
        if self.hparams.lora is not None:
            refuse_reference_source(self.hparams)
        holds_reference = beta != 0 and self.hparams.lora is None  # under LoRA: the policy, adapters disabled
        self.frozen = ("reference",) * holds_reference + ("reward",) * self.uses_reward_model
        self.stage_clock = StageClock()  # train/time/{generation,scoring,update}_s of each iteration

    # ---- models ------------------------------------------------------------------------------------

    def build_models(self) -> dict:
        policy = build_decoder(self, "GRPO policy")
        models = {"policy": policy}
        if "reference" in self.frozen:
            models["reference"] = copy.deepcopy(policy)  # equal to the policy also without init_from
        elif self.hparams.beta:
            self.reference = FrozenBase(policy)  # under LoRA: the policy with its adapters off, no copy
        if self.uses_reward_model:
            models["reward"] = ScalarGPT(policy.config)
            init_from = self.hparams.init_from
            if not (isinstance(init_from, Mapping) and init_from.get("reward")):
                log.warning(
                    "GRPO's reward model starts from random weights: pass init_from.reward=<reward.ckpt>"
                )
        return models

    def _load_init_from(self, init_from: str | Mapping) -> None:
        targets = (
            {"policy": init_from} if isinstance(init_from, str) else {n: p for n, p in init_from.items() if p}
        )
        unknown = sorted(set(targets) - set(self.model_names))
        if unknown:
            raise ValueError(
                f"task.init_from names {', '.join(unknown)}, which this GRPO run does not build (its models: "
                f"{', '.join(self.model_names)}; a reward checkpoint needs a reward_model reward in task.rewards, "
                "a reference needs beta > 0): drop it, e.g. init_from='{policy: <sft.ckpt>}'"
            )
        if "reference" in self.model_names and targets.get("policy") and not self.hparams.init_from_hf:
            targets.setdefault("reference", targets["policy"])
        if (
            targets.get("reward")
            and gpt_or_scalar(targets["reward"], self.hparams.trust_checkpoint) == "body"
        ):
            targets["reward.body"] = targets.pop("reward")  # a GPT checkpoint: the body, with a fresh head
        super()._load_init_from(targets)

    @property
    def optimizer_steps_per_batch(self) -> int:
        """Optimizer steps of one GRPO iteration (a training batch); the progress bar counts iterations."""
        return self.hparams.num_iterations

    def reference_logprobs(self, sequences, attention_mask, n_response):
        if not self.hparams.beta:
            return None  # no reference held, no KL
        return super().reference_logprobs(sequences, attention_mask, n_response)

    # ---- one GRPO iteration ------------------------------------------------------------------------

    @torch.no_grad()
    def make_experience(self, batch) -> dict:
        """``num_generations`` completions of each prompt (a group: consecutive rows), their rewards and
        advantages, and the log-probs the updates compare against (old: only with ``num_iterations > 1``)."""
        h, tok, G = self.hparams, self.require_tokenizer(), self.hparams.num_generations
        prompt_ids, prompt_mask = (
            batch["prompt_ids"].repeat_interleave(G, 0),
            batch["prompt_mask"].repeat_interleave(G, 0),
        )
        answers = None if batch.get("answers") is None else [a for a in batch["answers"] for _ in range(G)]
        out = rollout(self.policy, tok, prompt_ids, prompt_mask, h.max_new_tokens, h.temperature)
        self.stage_clock.lap("generation")
        seq, attn, R = out.sequences, out.attention_mask, out.responses.size(1)
        texts = decode_responses(tok, out.responses, out.response_mask)
        rewards, per_function = score_completions(
            self.rewards, texts, answers, seq, attn, getattr(self, "reward", None)
        )  # (B G,), (B G, functions)
        advantages, zero_std = group_advantages(rewards, G, self.scale_rewards, self._all_reduce)
        mask = out.response_mask & out.has_eos[:, None] if h.mask_truncated_completions else out.response_mask
        world = self.trainer.world_size
        return {
            "sequences": seq,
            "attention_mask": attn,
            "mask": mask,
            "old_logprobs": response_logprobs(self.policy, seq, attn, R, h.temperature)
            if h.num_iterations > 1
            else None,
            "ref_logprobs": self.reference_logprobs(seq, attn, R) if h.beta else None,
            "advantages": advantages,
            "num_tokens": self._all_reduce(mask.sum().float())
            / world,  # dapo: all ranks' tokens / world size
            "rewards": rewards,
            "per_function": per_function,
            "zero_std": zero_std,
            "lengths": out.response_mask.sum(1).float(),
            "has_eos": out.has_eos,
            "texts": texts,
            "answers": answers,
        }

    def training_step(self, batch, batch_idx):
        h = self.hparams
        self.policy.eval()  # dropout off: recomputed log-probs must match the sampled ones
        self.stage_clock.start(self.device)
        exp = self.make_experience(batch)
        self.stage_clock.lap("scoring")
        seq, attn, mask = exp["sequences"], exp["attention_mask"], exp["mask"]
        R = mask.size(1)
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        stats: dict[str, list[torch.Tensor]] = {}
        for iteration in range(h.num_iterations):
            logits = padded_forward(self.policy, seq, attn)[:, -R - 1 : -1].float() / h.temperature
            logprobs = logprobs_of(logits, seq[:, -R:])
            old = (
                logprobs.detach() if exp["old_logprobs"] is None else exp["old_logprobs"]
            )  # TRL's, at mu = 1
            out = grpo_loss(
                logprobs, old, exp["advantages"], mask, h.loss_type, h.epsilon, h.epsilon_high, h.beta,
                exp["ref_logprobs"], h.use_bias_correction_kl, h.max_new_tokens, exp["num_tokens"],
            )  # fmt: skip
            optimizer.zero_grad()
            self.manual_backward(out["loss"])
            optimizer.step()  # clips first: ManualSteps.on_before_optimizer_step
            if scheduler is not None:
                scheduler.step()
            ratio = out.pop("ratio")
            if iteration == 0:
                self.first_ratio = masked_mean(ratio, mask)  # exactly 1: nothing has changed yet
            out["entropy"] = masked_entropy(logits.detach(), mask)
            for key, value in out.items():
                stats.setdefault(key, []).append(value.detach())
        self.stage_clock.lap("update")
        self._log_iteration(exp, stats, batch, batch_idx)
        self.stage_clock.log(self)

    def _log_iteration(self, exp: dict, stats: dict, batch, batch_idx: int) -> None:
        """TRL's GRPO metrics (``reward``, ``reward_std``, ``frac_reward_zero_std``, ``kl``, ``clip_ratio/*``,
        ``entropy``, ``completions/*``, ``rewards/<function>/{mean,std}``), the judge of the sampled completions,
        and now and then a table of one group's completions with their rewards (log_table rounds them)."""
        logged = {("train/loss" if k == "loss" else k): torch.stack(v).mean() for k, v in stats.items()}
        lengths, rewards = exp["lengths"], exp["rewards"]
        logged |= {
            "reward": rewards.mean(),
            "reward_std": sample_std(rewards, self._all_reduce),  # over all ranks' completions, as TRL's
            "frac_reward_zero_std": exp["zero_std"].float().mean(),
            "completions/mean_length": lengths.mean(),
            "completions/clipped_ratio": (~exp["has_eos"]).float().mean(),
            "policy/ratio_first": self.first_ratio,
        }
        names = [reward_key(r) for r in self.rewards]
        for name, column in zip(names, exp["per_function"].unbind(1)):
            logged |= {
                f"rewards/{name}/mean": column.mean(),
                f"rewards/{name}/std": sample_std(column, self._all_reduce),
            }
        steps = {"on_step": True, "on_epoch": False, "sync_dist": True}
        self.log("completions/min_length", lengths.min(), reduce_fx="min", **steps)  # over every rank
        self.log("completions/max_length", lengths.max(), reduce_fx="max", **steps)
        if exp["answers"] is not None:
            verdicts = torch.tensor(
                [judge(t, a) for t, a in zip(exp["texts"], exp["answers"])], device=self.device
            )
            logged |= {"train/judge_exact": verdicts[:, 0].mean(), "train/judge_score": verdicts[:, 1].mean()}
        for key, value in logged.items():
            self.log(key, value, prog_bar=key in ("reward", "kl"), **steps)
        if batch_idx % self.trainer.log_every_n_steps == 0:
            G, tok = self.hparams.num_generations, self.require_tokenizer()
            prompt = tok.decode(batch["prompt_ids"][0][batch["prompt_mask"][0].bool()].tolist())
            rows = [
                [prompt, exp["texts"][i], *exp["per_function"][i].tolist(), float(rewards[i]),
                 float(exp["advantages"][i])]
                for i in range(G)
            ]  # fmt: skip
            log_table(
                self.trainer,
                "train/completions",
                ["prompt", "completion", *names, "reward", "advantage"],
                rows,
            )

    # ---- evaluation --------------------------------------------------------------------------------

    def validation_step(self, batch, batch_idx):
        self.evaluate_policy(batch, "val", batch_idx)

    def test_step(self, batch, batch_idx):
        self.evaluate_policy(batch, "test", batch_idx)


def reward_key(reward) -> str:
    """A reward function's name in the logs: ``judge`` (``judge_graded``), ``format``, ``reward_model``."""
    return f"{reward.name}_graded" if reward.graded else reward.name
