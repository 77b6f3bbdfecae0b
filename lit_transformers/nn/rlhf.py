"""The math of InstructGPT's stages as plain torch: reward-model and DPO losses, and PPO's pieces (EOS
truncation, KL estimators, per-token rewards, GAE, masked whitening, clipped losses, adaptive KL), and GRPO's
(group-relative advantages, the clipped loss in TRL's four aggregations).

Conventions follow TRL's PPO trainer and "The N+ implementation details of RLHF with PPO" (Huang et al.):
response tensors are (B, T) over the generated tokens only, ``mask`` (B, T) bool marks real response tokens
(up to and including the first EOS), and every statistic is a mean over the mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

AllReduce = Callable[[torch.Tensor], torch.Tensor]  # sums a tensor over DDP ranks (identity on one process)


# ---- reward model and DPO ---------------------------------------------------------------------------------


def bradley_terry_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    margin: torch.Tensor | float | None = None,
    center_rewards_coefficient: float = 0.0,
) -> torch.Tensor:
    """Pairwise reward-model loss ``-log sigma(r_c - r_r [- margin])`` averaged over pairs (B,), plus
    ``center_rewards_coefficient * mean((r_c + r_r)^2)``, which keeps rewards centred on 0 (TRL)."""
    diff = chosen.float() - rejected.float()
    if margin is not None:
        diff = diff - margin
    loss = -F.logsigmoid(diff).mean()
    if center_rewards_coefficient:
        loss = loss + center_rewards_coefficient * ((chosen.float() + rejected.float()) ** 2).mean()
    return loss


DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "sigmoid_norm")  # TRL's loss_type names


def dpo_sequence_logprobs(
    token_logps: torch.Tensor, response_mask: torch.Tensor, ld_alpha: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs (2B, T) of B chosen rows then B rejected rows, and their response mask (2B, T) ->
    summed response log-probs of chosen (B,) and rejected (B,). ``ld_alpha`` (LD-DPO, Liu et al. 2024, as TRL's):
    the tokens of the longer response past the shorter one's length count ``ld_alpha`` times (1: plain sums,
    0: only the shared length), so a length difference alone cannot make a large log-ratio."""
    logps = token_logps * response_mask
    if ld_alpha is not None:
        position = response_mask.cumsum(1)  # 1, 2, ... along each response
        shared = torch.minimum(*response_mask.sum(1).chunk(2)).repeat(
            2
        )  # (2B,) the shorter response's length
        logps = torch.where(position > shared[:, None], ld_alpha * logps, logps)
    return logps.sum(1).chunk(2)


def chosen_nll(token_logps: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """RPO's term (Pang et al. 2024; TRL's ``sft`` loss type): the mean NLL over every chosen response token of
    per-token log-probs (2B, T), chosen rows first, under their response mask (2B, T)."""
    chosen_logps, chosen_mask = token_logps.chunk(2)[0], response_mask.chunk(2)[0]
    return -(chosen_logps * chosen_mask).sum() / chosen_mask.sum().clamp(min=1)


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    loss_type: str = "sigmoid",
    chosen_length: torch.Tensor | None = None,
    rejected_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The DPO family's per-pair losses, as TRL's ``DPOTrainer`` names them (``loss_type``), on the margin
    ``d = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))``:

    - ``sigmoid``: DPO (Rafailov et al. 2023), ``-log sigma(beta d)``; ``label_smoothing`` eps makes it
      conservative DPO, ``-(1 - eps) log sigma(beta d) - eps log sigma(-beta d)`` (sigmoid only);
    - ``hinge``: SLiC (Zhao et al. 2023), ``max(0, 1 - beta d)``;
    - ``ipo``: IPO (Azar et al. 2023), ``(d' - 1 / (2 beta))^2`` with ``d'`` the margin of per-token log-ratios
      (each response's log-ratio over its token count, as TRL and IPO's authors);
    - ``sigmoid_norm``: length-normalised DPO, ``-log sigma(beta d')``.

    Inputs (B,) are response log-probabilities summed over response tokens; ``ipo`` and ``sigmoid_norm`` also
    need each response's token count (B,). Returns per-pair losses (B,) and the implicit rewards
    ``beta * (log pi - log pi_ref)`` of chosen and rejected (B,), detached.
    """
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"DPO loss_type={loss_type!r}: choose one of {list(DPO_LOSS_TYPES)}")
    if label_smoothing and loss_type != "sigmoid":
        raise ValueError(
            f"DPO label_smoothing={label_smoothing} is conservative DPO, a form of the sigmoid loss; set"
            f" label_smoothing=0 with loss_type={loss_type!r}, or loss_type=sigmoid"
        )
    chosen_ratio = policy_chosen - reference_chosen  # (B,)
    rejected_ratio = policy_rejected - reference_rejected
    if loss_type in ("ipo", "sigmoid_norm"):
        if chosen_length is None or rejected_length is None:
            raise ValueError(
                f"DPO loss_type={loss_type!r} needs the responses' token counts (chosen/rejected_length)"
            )
        margin = chosen_ratio / chosen_length.clamp(min=1) - rejected_ratio / rejected_length.clamp(min=1)
    else:
        margin = chosen_ratio - rejected_ratio
    if loss_type == "sigmoid":
        losses = (
            -F.logsigmoid(beta * margin) * (1 - label_smoothing)
            - F.logsigmoid(-beta * margin) * label_smoothing
        )
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * margin)
    elif loss_type == "ipo":
        losses = (margin - 1 / (2 * beta)) ** 2
    else:
        losses = -F.logsigmoid(beta * margin)
    return losses, beta * chosen_ratio.detach(), beta * rejected_ratio.detach()


# ---- masks --------------------------------------------------------------------------------------------------


def last_true_index(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool -> (B,) index of each row's last True (0 for an all-False row). Works under right and
    left padding alike: the reward is read at the last real token wherever the padding sits."""
    positions = torch.arange(mask.size(-1), device=mask.device)
    return (mask.long() * (positions + 1)).argmax(dim=-1)


def truncate_after_eos(
    responses: torch.Tensor, eos_id: int | Sequence[int], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Generated tokens (B, T) -> (responses with every token after the first EOS replaced by ``pad_id``,
    mask (B, T) of real tokens up to and including that EOS, has_eos (B,)). Rows without EOS keep all T.
    ``eos_id``: one id, or several (an instruct tokenizer's ``end_of_turn_ids``): the first of any ends a row."""
    is_eos = torch.isin(responses, torch.tensor(eos_id, device=responses.device).reshape(-1))
    has_eos = is_eos.any(dim=-1)
    T = responses.size(1)
    first = torch.where(
        has_eos, is_eos.long().argmax(dim=-1), torch.full_like(has_eos, T - 1, dtype=torch.long)
    )
    mask = torch.arange(T, device=responses.device)[None] <= first[:, None]
    return responses.masked_fill(~mask, pad_id), mask, has_eos


def masked_mean(x: torch.Tensor, mask: torch.Tensor, all_reduce: AllReduce | None = None) -> torch.Tensor:
    """Mean of ``x`` over ``mask`` (summed over ranks when ``all_reduce`` is given)."""
    stats = torch.stack([(x * mask).sum(), mask.sum().to(x.dtype)])
    if all_reduce is not None:
        stats = all_reduce(stats)
    return stats[0] / stats[1].clamp(min=1)


def sample_std(x: torch.Tensor, all_reduce: AllReduce | None = None) -> torch.Tensor:
    """Unbiased standard deviation of ``x`` over every rank's values (TRL's ``reward_std``, taken after it gathers
    the completions); from the summed count, sum and sum of squares, in float64 against cancellation."""
    moments = torch.stack([x.new_tensor(x.numel()), x.sum(), (x * x).sum()]).double()
    if all_reduce is not None:
        moments = all_reduce(moments)
    n, total, squares = moments
    variance = (squares - total * total / n) / (n - 1).clamp(min=1)
    return variance.clamp(min=0).sqrt().to(x.dtype)


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, all_reduce: AllReduce | None = None
) -> torch.Tensor:
    """``(x - mean) / sqrt(var + 1e-8)`` with mean and unbiased variance over the masked entries (of all
    ranks with ``all_reduce``); ``shift_mean=False`` adds the mean back (TRL's reward whitening).
    Masked-out entries come back as 0."""
    mask_f = mask.to(x.dtype)
    stats = torch.stack([(x * mask_f).sum(), (x * x * mask_f).sum(), mask_f.sum()])
    if all_reduce is not None:
        stats = all_reduce(stats)
    total, total_sq, n = stats.unbind()
    mean = total / n.clamp(min=1)
    var = (total_sq - n * mean * mean) / (n - 1).clamp(min=1)  # Bessel-corrected, as TRL's masked_var
    whitened = (x - mean) * torch.rsqrt(var.clamp(min=0) + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask_f


# ---- PPO: rewards, advantages, losses -----------------------------------------------------------------------


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimates from the sampled tokens' log-probs (Schulman, "Approximating KL
    divergence"): k1 = log pi - log pi_ref (unbiased, can be negative); k3 = (r - 1) - log r with
    r = pi_ref / pi (unbiased, always >= 0, lower variance)."""
    log_ratio = ref_logprobs - logprobs  # log r
    if estimator == "k1":
        return -log_ratio
    if estimator == "k3":
        return log_ratio.exp() - 1 - log_ratio
    raise ValueError(f"kl_estimator={estimator!r}: use k1 or k3")


def per_token_rewards(
    kl: torch.Tensor, scores: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """InstructGPT's reward: ``-kl_coef * KL_t`` on every real response token, plus the reward model's
    ``scores`` (B,) at each row's last real token. Returns (rewards, non_score_rewards), both (B, T),
    zero where ``mask`` is False."""
    non_score = -kl_coef * kl * mask
    rewards = non_score.clone()
    rows = torch.arange(scores.size(0), device=scores.device)
    rewards[rows, last_true_index(mask)] += scores
    return rewards, non_score


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over response tokens (B, T) -> (advantages, returns).

    ``delta_t = r_t + gamma V_{t+1} - V_t``, ``A_t = delta_t + gamma lam A_{t+1}``; values and rewards
    past the mask count as 0, so the episode ends at the last real token. Returns = A + V (the value
    target). Advantages come back unwhitened (see :func:`masked_whiten`)."""
    mask_f = mask.to(values.dtype)
    values, rewards = values * mask_f, rewards * mask_f
    T = rewards.size(1)
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(T)):
        next_value = values[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * last
        advantages[:, t] = last
    return advantages * mask_f, (advantages + values) * mask_f


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float = 0.2,
) -> dict[str, torch.Tensor]:
    """PPO's clipped surrogate ``mean(max(-A r, -A clip(r, 1 - eps, 1 + eps)))`` over the mask, with
    r = pi / pi_old. Also returns the share of clipped tokens, ``approxkl = mean(0.5 (log r)^2)``, and r."""
    log_ratio = logprobs - old_logprobs
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip, 1 + clip)
    return {
        "loss": masked_mean(torch.maximum(unclipped, clipped), mask),
        "clipfrac": masked_mean((clipped > unclipped).float(), mask),
        "approxkl": masked_mean(0.5 * log_ratio.detach() ** 2, mask),
        "ratio": ratio.detach(),
    }


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float = 0.2,
) -> dict[str, torch.Tensor]:
    """``0.5 * mean(max((V - R)^2, (clip(V, V_old +- eps) - R)^2))`` over the mask, and the share clipped."""
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)
    unclipped_loss, clipped_loss = (values - returns) ** 2, (clipped_values - returns) ** 2
    return {
        "loss": 0.5 * masked_mean(torch.maximum(unclipped_loss, clipped_loss), mask),
        "clipfrac": masked_mean((clipped_loss > unclipped_loss).float(), mask),
    }


def masked_entropy(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of the (B, T, V) next-token distributions over the mask."""
    logp = logits.float().log_softmax(dim=-1)
    return masked_mean(-(logp.exp() * logp).sum(dim=-1), mask)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``1 - Var(R - V) / Var(R)`` over the mask: 1 is a perfect value function, 0 no better than a constant."""
    residual = returns - values
    var = lambda x: masked_mean((x - masked_mean(x, mask)) ** 2, mask)  # noqa: E731
    return 1 - var(residual) / var(returns).clamp(min=1e-8)


class AdaptiveKLController:
    """Ziegler et al. (2019): ``beta *= 1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon``, so the
    measured KL drifts towards ``target``. Plain floats: its state is one number, saved by the task."""

    def __init__(self, init_kl_coef: float, target: float, horizon: int):
        self.value, self.target, self.horizon = init_kl_coef, target, horizon

    def update(self, current_kl: float, n_steps: int) -> float:
        error = min(max(current_kl / self.target - 1, -0.2), 0.2)
        self.value *= 1 + error * n_steps / self.horizon
        return self.value


# ---- GRPO: group-relative advantages and the clipped loss --------------------------------------------------


def group_advantages(
    rewards: torch.Tensor,
    num_generations: int,
    scale_rewards: str = "group",
    all_reduce: AllReduce | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO's advantages (Shao et al. 2024) as TRL's ``GRPOTrainer``: rewards (N,), ``num_generations``
    consecutive completions per prompt, -> ``(r - mean_group) / (std + 1e-4)`` (N,) and whether each row's std is 0
    (N,). ``scale_rewards``: ``group`` (std within the group), ``batch`` (std over the whole batch, of all ranks
    with ``all_reduce``), ``none`` (Dr. GRPO: mean only). Stds are unbiased; a group whose completions all score
    alike gets advantages of exactly 0 (never NaN)."""
    grouped = rewards.view(-1, num_generations)  # (prompts, G)
    centred = grouped - grouped.mean(1, keepdim=True)
    if scale_rewards == "batch":
        r = rewards.double()  # sums of squares in float64: no cancellation against the mean's square
        stats = torch.stack([r.sum(), (r * r).sum(), r.new_tensor(r.numel())])
        if all_reduce is not None:
            stats = all_reduce(stats)
        total, total_sq, n = stats.unbind()
        var = (total_sq - total * total / n) / (n - 1).clamp(min=1)
        std = var.clamp(min=0).sqrt().to(rewards.dtype).expand_as(grouped)
    elif scale_rewards in ("group", "none"):  # "none" still tells zero-std groups apart, for logging
        std = grouped.std(1, keepdim=True).expand_as(grouped) if num_generations > 1 else 0 * grouped
    else:
        raise ValueError(f"scale_rewards={scale_rewards!r}: use group, batch or none")
    advantages = centred if scale_rewards == "none" else centred / (std + 1e-4)
    return advantages.flatten(), torch.isclose(std, torch.zeros_like(std)).flatten()


GRPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str = "dapo",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    bias_correction_kl: bool = True,
    max_completion_length: int | None = None,
    num_tokens: torch.Tensor | float | None = None,
) -> dict[str, torch.Tensor]:
    """GRPO's clipped objective per token, as TRL's ``GRPOTrainer._compute_loss`` (token-level ratios):
    ``-min(r A, clip(r, 1 - epsilon, 1 + epsilon_high) A) + beta * KL_t`` with r = pi / pi_old, advantages (B,)
    one per completion, KL_t the k3 estimate against ``ref_logprobs`` (times r with ``bias_correction_kl``:
    DeepSeek-V3.2's unbiased reverse-KL gradient, TRL's default). ``loss_type`` aggregates over (B, T) ``mask``:
    ``grpo`` each completion's token mean, then the mean; ``bnpo`` the mean over all tokens; ``dr_grpo`` the sum
    over ``B * max_completion_length``; ``dapo`` the sum over ``num_tokens`` (the tokens of the whole generation
    batch per rank: all ranks' count / world size; default the mask's). Also returns the masked-mean ``kl`` and
    TRL's ``clip_ratio/{low,high,region}_mean`` (tokens whose ratio left the clip range on the side that cuts
    their gradient), and the ratio r (detached)."""
    if loss_type not in GRPO_LOSS_TYPES:
        raise ValueError(f"loss_type={loss_type!r}: use one of {', '.join(GRPO_LOSS_TYPES)}")
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    mask = mask.to(logprobs.dtype)
    advantages = advantages[:, None]  # (B, 1): one per completion, on each of its tokens
    ratio = (logprobs - old_logprobs).exp()
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon_high)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    out = {}
    if beta:
        if ref_logprobs is None:
            raise ValueError("grpo_loss with beta > 0 needs the reference's log-probs (ref_logprobs)")
        kl = kl_estimate(logprobs, ref_logprobs, "k3")
        if bias_correction_kl:
            kl = kl * ratio
        per_token = per_token + beta * kl
        out["kl"] = masked_mean(kl.detach(), mask)
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    elif loss_type == "bnpo":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1)
    elif loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError(
                "loss_type=dr_grpo divides by B * max_completion_length: pass max_completion_length"
            )
        loss = (per_token * mask).sum() / (per_token.size(0) * max_completion_length)
    else:
        normalizer = mask.sum() if num_tokens is None else torch.as_tensor(num_tokens, dtype=mask.dtype)
        loss = (per_token * mask).sum() / normalizer.clamp(min=1)
    low = (ratio < 1 - epsilon) & (advantages < 0)
    high = (ratio > 1 + epsilon_high) & (advantages > 0)
    out |= {
        "loss": loss,
        "clip_ratio/low_mean": masked_mean(low.to(mask.dtype), mask),
        "clip_ratio/high_mean": masked_mean(high.to(mask.dtype), mask),
        "clip_ratio/region_mean": masked_mean((low | high).to(mask.dtype), mask),
        "ratio": ratio.detach(),
    }
    return out
