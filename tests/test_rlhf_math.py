"""nn.rlhf against hand computations on tiny tensors (numbers worked out by hand in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from lit_transformers.nn.rlhf import (
    AdaptiveKLController,
    bradley_terry_loss,
    clipped_policy_loss,
    clipped_value_loss,
    dpo_loss,
    explained_variance,
    gae,
    kl_estimate,
    last_true_index,
    masked_mean,
    masked_whiten,
    per_token_rewards,
    truncate_after_eos,
)


def close(actual: torch.Tensor, expected) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), rtol=1e-5, atol=1e-6)


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x))


def test_bradley_terry_loss_margin_and_centering_by_hand():
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0])
    # diffs 1 and -1
    assert bradley_terry_loss(chosen, rejected).item() == pytest.approx(
        -(log_sigmoid(1.0) + log_sigmoid(-1.0)) / 2
    )
    # margin 0.5: diffs 0.5 and -1.5
    assert bradley_terry_loss(chosen, rejected, margin=0.5).item() == pytest.approx(
        -(log_sigmoid(0.5) + log_sigmoid(-1.5)) / 2
    )
    # centering: (2 + 1)^2 = 9 and (0 + 1)^2 = 1, mean 5, times 0.01
    assert bradley_terry_loss(chosen, rejected, center_rewards_coefficient=0.01).item() == pytest.approx(
        -(log_sigmoid(1.0) + log_sigmoid(-1.0)) / 2 + 0.05
    )


def test_dpo_loss_rewards_and_label_smoothing_by_hand():
    pc, pr, rc, rr = (torch.tensor([v]) for v in (-3.0, -5.0, -4.0, -4.5))
    # logits = (-3 + 5) - (-4 + 4.5) = 1.5; beta 0.1 -> 0.15
    losses, chosen, rejected = dpo_loss(pc, pr, rc, rr, beta=0.1)
    assert losses.item() == pytest.approx(-log_sigmoid(0.15))
    assert chosen.item() == pytest.approx(0.1 * (-3 + 4)) and rejected.item() == pytest.approx(
        0.1 * (-5 + 4.5)
    )
    smoothed, _, _ = dpo_loss(pc, pr, rc, rr, beta=0.1, label_smoothing=0.2)
    assert smoothed.item() == pytest.approx(-0.8 * log_sigmoid(0.15) - 0.2 * log_sigmoid(-0.15))


def test_last_true_index_under_right_and_left_padding():
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    left = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]], dtype=torch.bool)
    assert last_true_index(right).tolist() == [1, 3]
    assert last_true_index(left).tolist() == [3, 3]


def test_truncate_after_first_eos_and_report_missing_eos():
    eos, pad = 9, 0
    responses = torch.tensor([[5, 9, 6, 9], [5, 6, 7, 8], [9, 4, 4, 4]])
    out, mask, has_eos = truncate_after_eos(responses, eos, pad)
    assert out.tolist() == [[5, 9, 0, 0], [5, 6, 7, 8], [9, 0, 0, 0]]
    assert mask.tolist() == [[True, True, False, False], [True] * 4, [True, False, False, False]]
    assert has_eos.tolist() == [True, False, True]


def test_kl_estimators_k1_and_k3_by_hand():
    logp, ref = torch.tensor([math.log(0.5), math.log(0.2)]), torch.tensor([math.log(0.25), math.log(0.4)])
    # k1 = log p - log q: log 2, log 0.5
    assert kl_estimate(logp, ref, "k1").tolist() == pytest.approx([math.log(2), math.log(0.5)])
    # k3 = (r - 1) - log r with r = q / p: r = 0.5 -> -0.5 + log 2; r = 2 -> 1 - log 2
    assert kl_estimate(logp, ref, "k3").tolist() == pytest.approx([-0.5 + math.log(2), 1 - math.log(2)])
    with pytest.raises(ValueError, match="k1 or k3"):
        kl_estimate(logp, ref, "k2")


def test_per_token_rewards_put_the_score_on_the_last_real_token():
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    rewards, non_score = per_token_rewards(kl, torch.tensor([1.0, -2.0]), mask, kl_coef=0.5)
    close(non_score, [[-0.05, -0.1, 0.0], [-0.2, -0.25, -0.3]])
    close(rewards, [[-0.05, 0.9, 0.0], [-0.2, -0.25, -2.3]])


def test_gae_by_hand():
    rewards = torch.tensor([[0.0, 1.0, 5.0]])
    values = torch.tensor([[0.5, 0.2, 7.0]])
    mask = torch.tensor([[True, True, False]])  # the third token is padding: its reward and value are ignored
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # t=1: delta = 1 + 0.9 * 0 - 0.2 = 0.8, A1 = 0.8
    # t=0: delta = 0 + 0.9 * 0.2 - 0.5 = -0.32, A0 = -0.32 + 0.9 * 0.5 * 0.8 = 0.04
    close(advantages, [[0.04, 0.8, 0.0]])
    close(returns, [[0.54, 1.0, 0.0]])


def test_masked_whitening_uses_only_masked_entries_and_reduces_across_ranks():
    x = torch.tensor([[1.0, 3.0, 100.0], [5.0, 7.0, -100.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    # entries 1, 3, 5, 7: mean 4, unbiased var (9 + 1 + 1 + 9) / 3 = 20 / 3
    std = math.sqrt(20 / 3 + 1e-8)
    out = masked_whiten(x, mask)
    close(out, [[-3 / std, -1 / std, 0.0], [1 / std, 3 / std, 0.0]])
    assert masked_whiten(x, mask, shift_mean=False)[0, 0].item() == pytest.approx(-3 / std + 4)
    # two "ranks" holding one row each, summed by all_reduce, whiten as the whole batch does
    other = torch.stack([(x[1] * mask[1]).sum(), (x[1] ** 2 * mask[1]).sum(), mask[1].sum().float()])
    split = masked_whiten(x[:1], mask[:1], all_reduce=lambda stats: stats + other)
    torch.testing.assert_close(split, out[:1])
    assert masked_mean(x, mask).item() == pytest.approx(4.0)


def test_clipped_policy_loss_by_hand():
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    mask = torch.tensor([[True, True, False]])
    out = clipped_policy_loss(new, old, adv, mask, clip=0.2)
    # token 0: max(-1.5, -1.2) = -1.2 (clipped); token 1: max(0.5, 0.8) = 0.8 (clipped); token 2 masked
    assert out["loss"].item() == pytest.approx((-1.2 + 0.8) / 2)
    assert out["clipfrac"].item() == pytest.approx(1.0)
    assert out["approxkl"].item() == pytest.approx((0.5 * math.log(1.5) ** 2 + 0.5 * math.log(0.5) ** 2) / 2)


def test_ratio_is_one_and_loss_is_minus_mean_advantage_when_nothing_changed():
    logp = torch.randn(2, 4)
    adv = torch.randn(2, 4)
    mask = torch.ones(2, 4, dtype=torch.bool)
    out = clipped_policy_loss(logp, logp.clone(), adv, mask)
    assert torch.equal(out["ratio"], torch.ones(2, 4))
    assert out["loss"].item() == pytest.approx(-adv.mean().item(), abs=1e-6)
    assert out["clipfrac"].item() == 0 and out["approxkl"].item() == 0


def test_clipped_value_loss_by_hand():
    old = torch.tensor([[1.0, 1.0]])
    new = torch.tensor([[2.0, 1.1]])
    returns = torch.tensor([[0.0, 3.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    out = clipped_value_loss(new, old, returns, mask, clip=0.2)
    # token 0: unclipped (2 - 0)^2 = 4, clipped (1.2 - 0)^2 = 1.44 -> 4; token 1: 1.9^2 both -> 3.61
    assert out["loss"].item() == pytest.approx(0.5 * (4 + 3.61) / 2)
    assert out["clipfrac"].item() == 0.0
    out = clipped_value_loss(torch.tensor([[2.0]]), torch.tensor([[1.0]]), torch.tensor([[3.0]]), mask[:, :1])
    # unclipped (2 - 3)^2 = 1, clipped (1.2 - 3)^2 = 3.24: the clipped one is larger and counts
    assert out["loss"].item() == pytest.approx(0.5 * 3.24) and out["clipfrac"].item() == 1.0


def test_explained_variance_is_one_for_a_perfect_value_function():
    returns = torch.tensor([[1.0, 2.0, 3.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    assert explained_variance(returns, returns, mask).item() == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.0), returns, mask).item() == pytest.approx(0.0)


def test_adaptive_kl_controller_moves_beta_towards_the_target():
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=100)
    # KL 12: error clipped to 0.2 -> beta * (1 + 0.2 * 10 / 100)
    assert ctl.update(12.0, 10) == pytest.approx(0.1 * 1.02)
    # KL 4.5: error -0.25 clipped to -0.2
    assert ctl.update(4.5, 10) == pytest.approx(0.1 * 1.02 * 0.98)
