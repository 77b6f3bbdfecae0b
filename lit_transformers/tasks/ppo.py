"""PPO with a KL penalty (InstructGPT stage 3), Lightning-native: each training batch of prompts is one PPO
iteration inside ``training_step`` (manual optimisation): rollout -> score -> per-token rewards -> GAE ->
``num_ppo_epochs`` of clipped policy + value updates over shuffled minibatches.

Four models: ``policy`` (from the SFT checkpoint) and ``value`` (from the reward model, its own copy of the
head) train; ``reference`` (the SFT weights) and ``reward`` are frozen. ``trainer.max_steps`` counts
optimizer steps: PPO iterations x num_ppo_epochs x num_mini_batches. The score is the reward model's by default
(InstructGPT); ``task.rewards`` takes GRPO's reward functions instead (tasks/rewards.py): with a verifiable reward
alone (``[{judge: 1.0}]``, RLVR as Tulu 3's PPO) no reward model is held and the value model starts from the policy's
checkpoint, its head new.

With ``task.lora``, three: the policy is its frozen base + adapters, and the reference is that base with the
adapters off (``lora.FrozenBase``), no second copy; the value model is its own frozen copy of the reward model's
body + adapters + its head trained in full; the reward model stays frozen. The value keeps a body of its own
rather than sharing the reward model's with a second adapter (TRL's older peft path): its base may be another
checkpoint than the reward model's (``init_from.value``, ``init_from_hf``), as in full fine-tuning, and the reward
model stays a plain frozen module, scored without switching adapters (TRL's current PPOTrainer likewise drops only
the reference under peft, and keeps a separate value model).
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping, Sequence

import torch

from lit_transformers.callbacks.throughput import StageClock
from lit_transformers.contract import TokenizedText
from lit_transformers.models import GPT, GPTConfig, ScalarGPT
from lit_transformers.nn.generation import logprobs_of, padded_forward
from lit_transformers.nn.rlhf import (
    AdaptiveKLController,
    clipped_policy_loss,
    clipped_value_loss,
    explained_variance,
    gae,
    kl_estimate,
    masked_entropy,
    masked_mean,
    masked_whiten,
    per_token_rewards,
)
from lit_transformers.tasks.base import Task
from lit_transformers.tasks.causal_lm import decoder_spec, load_hf_decoder
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

log = logging.getLogger(__name__)


PPO_MODELS = ("policy", "reference", "reward", "value")


def hf_dirs(init_from_hf: str | Mapping | None) -> dict[str, str]:
    """PPO's ``init_from_hf`` as ``{model: directory}``: one directory is the policy, the reference and the value
    model (the reward model comes from a reward checkpoint); a mapping names its models, the reference taking
    the policy's directory unless given."""
    if not init_from_hf:
        return {}
    if isinstance(init_from_hf, str):
        return dict.fromkeys(("policy", "reference", "value"), init_from_hf)
    dirs = {name: path for name, path in init_from_hf.items() if path}
    unknown = sorted(set(dirs) - set(PPO_MODELS))
    if unknown:
        raise ValueError(
            f"task.init_from_hf names {', '.join(unknown)}: PPO's models are {', '.join(PPO_MODELS)}; e.g. "
            "init_from_hf='{policy: <dir>, value: <dir>}'"
        )
    if "policy" in dirs:
        dirs.setdefault("reference", dirs["policy"])
    return dirs


class PPOTask(ManualSteps, PolicyEvaluation, Task):
    """Args (TRL's names and defaults where they exist):
        model: the GPT config spec shared by the four models.
        rewards: what scores a response: ``[{reward_model: 1.0}]`` (InstructGPT), or GRPO's reward functions
            (``[{judge: 1.0}]``, weighted sums; tasks/rewards.py).
        temperature: sampling temperature; log-probs are taken on ``logits / temperature``.
        max_new_tokens: response length limit.
        kl_coef: beta of the per-token penalty ``-beta * KL_t``; adaptive_kl: ``{target, horizon}`` or null.
        kl_estimator: k1 | k3. missing_eos_penalty: subtracted from the score of responses without EOS.
        gamma, lam: GAE. whiten_rewards: whiten per-token rewards (mean kept) before GAE.
        num_ppo_epochs, num_mini_batches: update passes over each rollout batch, and minibatches per pass.
        clip_range, clip_range_value, vf_coef, max_grad_norm: the clipped losses and gradient clipping.
    ``init_from``: ``{policy: <sft.ckpt>, reward: <reward.ckpt>}``; the reference starts as the policy and
    the value model as the reward model unless given too. ``init_from_hf``: a Hugging Face causal LM directory
    for the policy, the reference and the value model's body (its head new), or ``{policy: <dir>, value: <dir>,
    ...}`` in ``init_from``'s shape (the reference defaults to the policy's); a model comes from one of the two.
    """

    lora_models = ("policy", "value")
    data_needs = (TokenizedText,)
    context_field = "block_size"
    init_from_hint = "pass init_from={policy: <sft.ckpt>, reward: <reward.ckpt>}"

    def __init__(
        self,
        model: dict | GPTConfig,
        rewards: Sequence[Mapping] = ({"reward_model": 1.0},),
        temperature: float = 0.7,
        max_new_tokens: int = 16,
        kl_coef: float = 0.05,
        adaptive_kl: dict | None = None,
        kl_estimator: str = "k1",
        missing_eos_penalty: float = 1.0,
        gamma: float = 1.0,
        lam: float = 0.95,
        whiten_rewards: bool = False,
        num_ppo_epochs: int = 4,
        num_mini_batches: int = 1,
        clip_range: float = 0.2,
        clip_range_value: float = 0.2,
        vf_coef: float = 0.1,
        max_grad_norm: float | None = 1.0,
        init_from_hf: str | dict | None = None,
        **task_args,
    ):
        from_hf = hf_dirs(init_from_hf)
        if len({json.dumps(decoder_spec({}, path)) for path in set(from_hf.values())}) > 1:
            raise ValueError(
                f"task.init_from_hf={dict(init_from_hf)} names directories of different architectures; PPO's "
                "four models share one model config: give them the same base model (or its fine-tuned versions)"
            )
        model = decoder_spec(model, next(iter(from_hf.values()), None))
        parsed = parse_rewards(rewards)
        if kl_estimator not in ("k1", "k3"):
            raise ValueError(f"task.kl_estimator={kl_estimator!r}: use k1 or k3")
        if temperature <= 0:
            raise ValueError(f"task.temperature={temperature}: PPO samples, so it needs a temperature > 0")
        super().__init__(**task_args)
        self.rewards = parsed
        self.uses_reward_model = uses_reward_model(parsed)
        if self.hparams.lora is not None:  # the reference is the policy's base with the adapters off
            refuse_reference_source(self.hparams)
            from_hf.pop("reference", None)
        self.frozen = ("reference",) * (self.hparams.lora is None) + ("reward",) * self.uses_reward_model
        self.hf_dirs = from_hf  # {model: directory}, loaded when the models are built
        self.automatic_optimization = False
        self.kl_ctl = AdaptiveKLController(kl_coef, **adaptive_kl) if adaptive_kl else None
        self.kl_coef = kl_coef
        self.stage_clock = StageClock()  # train/time/{generation,scoring,update}_s of each iteration

    # ---- models ------------------------------------------------------------------------------------

    def build_models(self) -> dict:
        config = self.text_model_config(vocab_size=lambda tok: tok.vocab_size)
        policy, value = GPT(config), ScalarGPT(config)
        models = {"policy": policy, "value": value}
        if self.uses_reward_model:  # copies: without init_from the value still equals the reward model
            models["reward"] = copy.deepcopy(value)
        if self.hparams.lora is None:  # a copy: without init_from the reference still equals the policy
            models["reference"] = copy.deepcopy(policy)
        else:
            self.reference = FrozenBase(policy)
        init_from = self.hparams.init_from
        named = set(self.hf_dirs)
        if isinstance(init_from, Mapping):
            named |= {name for name, path in init_from.items() if path}
        missing = [name for name in ("policy", "reward") if name in models and name not in named]
        if missing and (init_from or self.hf_dirs):  # neither: Task warns that every model starts random
            log.warning(
                "PPO %s start(s) from random weights: no init_from or init_from_hf for them",
                ", ".join(missing),
            )
        decoders = {path: load_hf_decoder(self, path, "PPO decoder") for path in set(self.hf_dirs.values())}
        for name, path in self.hf_dirs.items():
            target = models[name].body if isinstance(models[name], ScalarGPT) else models[name]
            target.load_state_dict(decoders[path].state_dict())
            log.info(
                "init_from_hf: %s from %s%s",
                name,
                path,
                " (new: its head)" if target is not models[name] else "",
            )
        return models

    def _load_init_from(self, init_from: str | Mapping) -> None:
        if isinstance(init_from, str):
            raise ValueError(
                "PPO takes two checkpoints: init_from='{policy: <sft.ckpt>, reward: <reward.ckpt>}'"
            )
        targets = {name: path for name, path in init_from.items() if path}
        if "reward" in targets and not self.uses_reward_model:
            raise ValueError(
                f"task.init_from names a reward model, but task.rewards={[dict(r) for r in self.hparams.rewards]} "
                "does not use one: drop init_from.reward, or add {reward_model: <weight>} to task.rewards"
            )
        both = sorted(set(targets) & set(self.hf_dirs))
        if both:
            raise ValueError(
                f"PPO's {', '.join(both)} would come from both task.init_from and task.init_from_hf; name each "
                "model in one of them"
            )
        value_source = "reward" if self.uses_reward_model else "policy"  # a policy checkpoint: its body
        for name, default in (("reference", "policy"), ("value", value_source)):
            if name in self.model_names and name not in self.hf_dirs and targets.get(default):
                targets.setdefault(name, targets[default])
        for name in ("reward", "value"):
            if targets.get(name) and gpt_or_scalar(targets[name], self.hparams.trust_checkpoint) == "body":
                targets[f"{name}.body"] = targets.pop(name)  # a GPT checkpoint: the body, with a fresh head
        super()._load_init_from(targets)

    @property
    def optimizer_steps_per_batch(self) -> int:
        """Optimizer steps of one PPO iteration (a training batch); the progress bar counts iterations."""
        return self.hparams.num_ppo_epochs * self.hparams.num_mini_batches

    # ---- one PPO iteration -------------------------------------------------------------------------

    @torch.no_grad()
    def make_experience(self, batch, order: torch.Tensor, mb: int) -> dict[str, torch.Tensor]:
        """Rollout and everything PPO needs from it. Old log-probs and values are computed minibatch by
        minibatch in the first epoch's order, so its first update sees exactly the same numbers (ratio 1)."""
        h, tok = self.hparams, self.require_tokenizer()
        out = rollout(
            self.policy, tok, batch["prompt_ids"], batch["prompt_mask"], h.max_new_tokens, h.temperature
        )
        self.stage_clock.lap("generation")
        seq, attn, mask = out.sequences, out.attention_mask, out.response_mask
        R = out.responses.size(1)
        logprobs, values = (
            torch.empty(mask.shape, device=self.device),
            torch.empty(mask.shape, device=self.device),
        )
        for start in range(0, len(order), mb):
            idx = order[start : start + mb]
            logprobs[idx] = response_logprobs(self.policy, seq[idx], attn[idx], R, h.temperature)
            # value of the state before each token; float32 as the log-probs, also under autocast
            values[idx] = self.value(seq[idx], attn[idx])[:, -R - 1 : -1].float()
        ref_logprobs = response_logprobs(self.reference, seq, attn, R, h.temperature)
        texts = decode_responses(tok, out.responses, mask)
        scores, _ = score_completions(
            self.rewards, texts, batch.get("answers"), seq, attn, getattr(self, "reward", None)
        )
        scores = scores - h.missing_eos_penalty * (~out.has_eos).float()
        kl = kl_estimate(logprobs, ref_logprobs, h.kl_estimator) * mask
        rewards, non_score = per_token_rewards(kl, scores, mask, self.kl_coef)
        if h.whiten_rewards:
            rewards = masked_whiten(rewards, mask, shift_mean=False, all_reduce=self._all_reduce)
        advantages, returns = gae(rewards, values * mask, mask, h.gamma, h.lam)
        advantages = masked_whiten(advantages, mask, all_reduce=self._all_reduce)
        return {
            "sequences": seq,
            "attention_mask": attn,
            "mask": mask,
            "logprobs": logprobs * mask,
            "values": values * mask,
            "advantages": advantages,
            "returns": returns,
            "scores": scores,
            "kl": kl,
            "non_score": non_score,
            "has_eos": out.has_eos,
        }

    def training_step(self, batch, batch_idx):
        h = self.hparams
        for name in ("policy", "value"):
            getattr(self, name).eval()  # dropout off: recomputed log-probs must match the sampled ones
        B = batch["prompt_ids"].size(0)
        mb = max(1, B // h.num_mini_batches)
        orders = [torch.randperm(B, device=self.device) for _ in range(h.num_ppo_epochs)]
        self.stage_clock.start(self.device)
        exp = self.make_experience(batch, orders[0], mb)
        self.stage_clock.lap("scoring")
        R = exp["mask"].size(1)
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        stats: dict[str, list[torch.Tensor]] = {}
        for epoch, order in enumerate(orders):
            for start in range(0, B - mb + 1, mb):
                idx = order[start : start + mb]
                seq, attn, mask = exp["sequences"][idx], exp["attention_mask"][idx], exp["mask"][idx]
                logits = padded_forward(self.policy, seq, attn)[:, -R - 1 : -1].float() / h.temperature
                logprobs = logprobs_of(logits, seq[:, -R:])
                values = self.value(seq, attn)[:, -R - 1 : -1].float()
                pg = clipped_policy_loss(
                    logprobs, exp["logprobs"][idx], exp["advantages"][idx], mask, h.clip_range
                )
                vf = clipped_value_loss(
                    values, exp["values"][idx], exp["returns"][idx], mask, h.clip_range_value
                )
                loss = pg["loss"] + h.vf_coef * vf["loss"]
                optimizer.zero_grad()
                self.manual_backward(loss)
                optimizer.step()  # clips first: on_before_optimizer_step
                if scheduler is not None:
                    scheduler.step()
                if epoch == 0 and start == 0:
                    self.first_ratio = masked_mean(pg["ratio"], mask)  # exactly 1: nothing has changed yet
                for key, value in {
                    "loss/policy": pg["loss"],
                    "loss/value": vf["loss"],
                    "policy/clipfrac": pg["clipfrac"],
                    "policy/approxkl": pg["approxkl"],
                    "policy/entropy": masked_entropy(logits.detach(), mask),
                    "policy/ratio": masked_mean(pg["ratio"], mask),
                    "value/clipfrac": vf["clipfrac"],
                }.items():
                    stats.setdefault(key, []).append(value.detach())
        self.stage_clock.lap("update")
        self._log_iteration(exp, stats)
        self.stage_clock.log(self)

    def _log_iteration(self, exp: dict, stats: dict) -> None:
        mask = exp["mask"]
        kl_sum, non_score = exp["kl"].sum(1).mean(), exp["non_score"].sum(1).mean()
        logged = {key: torch.stack(values).mean() for key, values in stats.items()}
        logged |= {
            "objective/scores": exp["scores"].mean(),
            "objective/kl": kl_sum,
            "objective/entropy": (-exp["logprobs"]).sum(1).mean(),  # of the sampled tokens, as TRL
            "objective/non_score_reward": non_score,
            "objective/rlhf_reward": exp["scores"].mean() + non_score,
            "objective/kl_coef": torch.tensor(self.kl_coef),
            "policy/ratio_first": self.first_ratio,
            "value/explained_variance": explained_variance(exp["values"], exp["returns"], mask),
            "train/num_eos_tokens": exp["has_eos"].float().sum(),
            "train/response_length": mask.sum(1).float().mean(),
        }
        for key, value in logged.items():
            self.log(
                key, value, on_step=True, on_epoch=False, prog_bar=key in ("objective/scores", "objective/kl")
            )
        if self.kl_ctl is not None:
            kl = float(self._all_reduce(kl_sum.detach().clone()) / self.trainer.world_size)
            self.kl_coef = self.kl_ctl.update(kl, exp["mask"].size(0) * self.trainer.world_size)

    # ---- evaluation --------------------------------------------------------------------------------

    def validation_step(self, batch, batch_idx):
        self.evaluate_policy(batch, "val", batch_idx)

    def test_step(self, batch, batch_idx):
        self.evaluate_policy(batch, "test", batch_idx)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["kl_coef"] = self.kl_coef

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)  # a LoRA checkpoint: completed with its base, which is checked
        self.kl_coef = checkpoint.get("kl_coef", self.kl_coef)
        if self.kl_ctl is not None:
            self.kl_ctl.value = self.kl_coef
