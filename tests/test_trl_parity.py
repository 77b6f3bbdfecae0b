"""Our DPO losses (every loss_type, LD-DPO's ld_alpha, RPO's NLL term) and the reward model's Bradley-Terry loss
equal TRL's own computation on identical tensors: TRL's ``DPOTrainer._compute_loss`` and
``RewardTrainer.compute_loss`` run on a stand-in trainer (only the attributes they read) and a stand-in model that
returns the given per-token log-probs (or rewards) the way TRL's fused LM head does (0 where the label is -100)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl.trainer.dpo_trainer import DPOTrainer
from trl.trainer.reward_trainer import RewardTrainer

from lit_transformers.nn.rlhf import (
    DPO_LOSS_TYPES,
    bradley_terry_loss,
    chosen_nll,
    dpo_loss,
    dpo_sequence_logprobs,
)

B, T = 5, 12  # pairs, tokens per row (prompt + response + padding)


class Accelerator:
    device = torch.device("cpu")

    @staticmethod
    def gather(x):
        return x

    gather_for_metrics = gather


def trainer(**args) -> SimpleNamespace:
    """What TRL's loss methods read of ``self``; ``args``: the trainer's loss settings."""
    model = torch.nn.Module()  # in training mode; TRL asks accelerate whether it is a PEFT model
    model.is_gradient_checkpointing = False
    return SimpleNamespace(
        model=model,
        accelerator=Accelerator(),
        args=SimpleNamespace(gradient_checkpointing_kwargs=None, center_rewards_coefficient=None),
        aux_loss_enabled=False,
        precompute_ref_logps=False,
        f_divergence_type="reverse_kl",
        use_weighting=False,
        label_smoothing=0.0,
        _metrics=defaultdict(lambda: defaultdict(list)),
        _total_train_tokens=0,
        _tp_size=1,
        **args,
    )


def fused_head(token_logps: torch.Tensor):
    """A model called as TRL calls it (``labels``, ``fused_lm_head=True``) that returns ``token_logps`` (2B, T-1)
    as TRL's fused LM head returns log-probs: label t+1 for position t, 0 where that label is -100."""

    def forward(labels, fused_lm_head, **_):
        mask = labels[:, 1:] != -100
        zeros = torch.zeros_like(token_logps)
        return SimpleNamespace(
            log_probs=token_logps.masked_fill(~mask, 0),
            entropy=zeros,
            mean_logits=zeros,
            is_top1=mask,
        )

    return forward


def pairs(seed: int = 0) -> dict[str, torch.Tensor]:
    """B pairs, chosen rows then rejected, with prompts of 2-4 tokens, responses of 1-8 and right padding; random
    per-token log-probs of a policy and a reference, junk (large) outside the responses."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(2, 5, (2 * B,), generator=g)
    length = torch.randint(1, 9, (2 * B,), generator=g)
    position = torch.arange(T)[None]
    response = (position >= prompt[:, None]) & (position < (prompt + length)[:, None])
    attention = position < (prompt + length)[:, None]
    policy = -torch.rand(2 * B, T - 1, generator=g, dtype=torch.float64) * 3
    reference = -torch.rand(2 * B, T - 1, generator=g, dtype=torch.float64) * 3
    outside = ~response[:, 1:]
    return {
        "input_ids": torch.randint(3, 50, (2 * B, T), generator=g),
        "attention_mask": attention.long(),
        "completion_mask": response.long(),
        "policy": policy.masked_fill(outside, 100.0).requires_grad_(),
        "reference": reference.masked_fill(outside, 100.0),
    }


def trl_dpo_loss(batch, beta: float, loss_types: list[str], loss_weights: list[float], ld_alpha=None):
    self = trainer(
        beta=beta,
        loss_types=loss_types,
        loss_weights=loss_weights,
        ld_alpha=ld_alpha,
        ref_model=fused_head(batch["reference"]),
    )
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "completion_mask")}
    return DPOTrainer._compute_loss(self, fused_head(batch["policy"]), inputs, return_outputs=False)


def our_dpo_loss(batch, beta: float, loss_type: str, ld_alpha=None) -> torch.Tensor:
    mask = batch["completion_mask"][:, 1:]
    policy_chosen, policy_rejected = dpo_sequence_logprobs(batch["policy"], mask, ld_alpha)
    ref_chosen, ref_rejected = dpo_sequence_logprobs(batch["reference"], mask, ld_alpha)
    chosen_length, rejected_length = mask.sum(1).chunk(2)
    losses, _, _ = dpo_loss(
        policy_chosen,
        policy_rejected,
        ref_chosen,
        ref_rejected,
        beta,
        loss_type=loss_type,
        chosen_length=chosen_length,
        rejected_length=rejected_length,
    )
    return losses.mean()


@pytest.mark.parametrize("loss_type", DPO_LOSS_TYPES)
@pytest.mark.parametrize("ld_alpha", [None, 0.0, 0.4])
def test_dpo_loss_and_its_gradient_equal_trls_for_every_loss_type(loss_type, ld_alpha):
    for seed, beta in ((0, 0.1), (1, 0.5)):
        ours, theirs = pairs(seed), pairs(seed)
        expected = trl_dpo_loss(theirs, beta, [loss_type], [1.0], ld_alpha)
        got = our_dpo_loss(ours, beta, loss_type, ld_alpha)
        assert got.item() == pytest.approx(expected.item(), abs=1e-6, rel=1e-6)
        expected.backward()
        got.backward()
        torch.testing.assert_close(ours["policy"].grad, theirs["policy"].grad, atol=1e-6, rtol=1e-6)


def test_ld_alpha_one_is_plain_dpo_and_zero_drops_the_longer_tail():
    batch = pairs(2)
    mask = batch["completion_mask"][:, 1:]
    plain = dpo_sequence_logprobs(batch["policy"], mask)
    assert all(torch.equal(a, b) for a, b in zip(plain, dpo_sequence_logprobs(batch["policy"], mask, 1.0)))
    shared = torch.minimum(*mask.sum(1).chunk(2)).repeat(2)
    logps = batch["policy"].detach()
    by_hand = [logps[i][mask[i].bool()][: shared[i]].sum() for i in range(2 * B)]  # the first `shared` tokens
    torch.testing.assert_close(
        torch.cat(dpo_sequence_logprobs(logps, mask, 0.0)), torch.stack(by_hand), atol=1e-12, rtol=0
    )


def test_rpo_alpha_equals_trls_sigmoid_plus_weighted_sft_loss():
    """Our RPO (``rpo_alpha``: + alpha x the chosen tokens' mean NLL, summed over the batch's tokens) is TRL
    1.16's ``loss_type=[sigmoid, sft]`` with ``loss_weights=[1, alpha]``."""
    batch = pairs(3)
    expected = trl_dpo_loss(batch, 0.1, ["sigmoid", "sft"], [1.0, 0.7])
    mask = batch["completion_mask"][:, 1:]
    got = our_dpo_loss(batch, 0.1, "sigmoid") + 0.7 * chosen_nll(batch["policy"], mask)
    assert got.item() == pytest.approx(expected.item(), abs=1e-6, rel=1e-6)


@pytest.mark.parametrize("margin", [False, True])
@pytest.mark.parametrize("center", [None, 0.01])
def test_bradley_terry_loss_equals_trls_reward_trainer(margin, center):
    g = torch.Generator().manual_seed(4)
    rewards = torch.randn(2 * B, 1, generator=g, dtype=torch.float64) * 3  # chosen rows, then rejected
    inputs = {"input_ids": torch.zeros(2 * B, 3), "attention_mask": torch.ones(2 * B, 3)}
    if margin:
        inputs["margin"] = torch.rand(B, generator=g, dtype=torch.float64)
    self = trainer(ld_alpha=None)
    self.args.center_rewards_coefficient = center

    def reward_model(**_):
        return SimpleNamespace(logits=rewards)

    expected = RewardTrainer.compute_loss(self, reward_model, dict(inputs))
    chosen, rejected = rewards.squeeze(-1).chunk(2)
    got = bradley_terry_loss(chosen, rejected, inputs.get("margin"), center or 0.0)
    assert got.item() == pytest.approx(expected.item(), abs=1e-6, rel=1e-6)
