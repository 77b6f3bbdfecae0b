"""GRPO: advantages and loss against TRL's GRPOTrainer on the same tensors, reward functions, the task through the
real config (first ratio, frozen models, DDP, resume) and the chain's grpo stage."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra.utils import instantiate

from lit_transformers.generate import language_model
from lit_transformers.models import GPT
from lit_transformers.nn.rlhf import group_advantages, grpo_loss, sample_std
from lit_transformers.tasks.instruct import response_logprobs
from lit_transformers.tasks.ppo import PPOTask
from lit_transformers.tasks.rewards import parse_rewards, score_completions
from lit_transformers.train import train

from conftest import TINY_TRAINER, compose_train_cfg, two_rank_group
from test_instructgpt import TINY, TINY_DATA, TINY_TASK, _fit

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")


# ---- TRL's computation on a stand-in trainer --------------------------------------------------------------


def trl_advantages(
    rewards_per_func: torch.Tensor, weights: list[float], num_generations: int, scale_rewards: str
):
    """TRL's ``GRPOTrainer._generate_and_score_completions`` on one process, with generation and the reward
    functions replaced by the given rewards (N, F): its advantages (N,) and its logged metrics."""
    n = rewards_per_func.size(0)
    trainer = SimpleNamespace(
        environment_factories=None,
        tools=None,
        environments=None,
        model=SimpleNamespace(training=True, is_gradient_checkpointing=False),
        accelerator=SimpleNamespace(device="cpu", gather=lambda t: t, process_index=0, num_processes=1),
        _generate=lambda prompts: ([[1, 2]] * n, [[3, 4]] * n, None, ["c"] * n, None, {}, None, None),
        _tokenizer=SimpleNamespace(pad_token_id=0),
        pad_to_multiple_of=None,
        mask_truncated_completions=False,
        args=SimpleNamespace(
            per_device_train_batch_size=n,
            gradient_checkpointing_kwargs=None,
            steps_per_generation=1,
            gradient_accumulation_steps=1,
        ),
        num_iterations=1,
        use_vllm=False,
        beta=0.0,
        _calculate_rewards=lambda *args: rewards_per_func,
        multi_objective_aggregation="sum_then_normalize",
        reward_weights=torch.tensor(weights),
        scale_rewards=scale_rewards,
        num_generations=num_generations,
        num_generations_eval=num_generations,
        reward_func_names=[f"f{i}" for i in range(len(weights))],
        _metrics={"train": defaultdict(list)},
        _logs={"prompt": [], "completion": [], "rewards": defaultdict(list), "advantages": [], "extra": {}},
        _pending_extra_logs={},
        _pending_metrics={},
    )
    out = trl_grpo.GRPOTrainer._generate_and_score_completions(trainer, [{"prompt": "p"}] * n)
    return out["advantages"], {k: v[0] for k, v in trainer._metrics["train"].items()}


def trl_loss(logps, old, ref, advantages, mask, loss_type, epsilon, epsilon_high, beta, max_len, num_items):
    """TRL's ``GRPOTrainer._compute_loss`` on one process, the policy's forward replaced by ``logps``: its loss
    and logged metrics."""
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logps, torch.zeros_like(logps), None),
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=beta,
        args=SimpleNamespace(use_bias_correction_kl=True, delta=None, steps_per_generation=1),
        loss_type=loss_type,
        epsilon_low=epsilon,
        epsilon_high=epsilon_high,
        use_vllm=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=max_len,
        accelerator=SimpleNamespace(num_processes=1, reduce=lambda t, reduction: t, gather=lambda t: t),
        _entropy_bonus_enabled=False,
        _metrics={"train": defaultdict(list)},
    )
    B = logps.size(0)
    inputs = {
        "prompt_ids": torch.ones(B, 2, dtype=torch.long),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.ones_like(mask, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": torch.tensor(float(num_items)),
    }
    loss = trl_grpo.GRPOTrainer._compute_loss(trainer, None, inputs)
    return loss, {k: v[0] for k, v in trainer._metrics["train"].items()}


def _rollout_tensors(seed: int = 0, B: int = 6, T: int = 5):
    """Log-probs of a policy that moved away from its old self and its reference, per-completion advantages, and a
    mask with completions of different lengths (one of a single token)."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3
    logps = (old + 0.4 * torch.randn(B, T, generator=g)).requires_grad_()
    ref = old + 0.3 * torch.randn(B, T, generator=g)
    lengths = torch.tensor([5, 3, 1, 4, 5, 2])[:B]
    mask = torch.arange(T)[None] < lengths[:, None]
    return logps, old, ref, torch.randn(B, generator=g), mask


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_group_advantages_equal_trls(scale_rewards):
    g = torch.Generator().manual_seed(1)
    per_func = torch.rand(12, 2, generator=g)
    per_func[4:8] = torch.tensor([0.5, 1.0])  # a group whose completions all score alike
    weights = [1.0, 0.5]
    expected, metrics = trl_advantages(per_func, weights, 4, scale_rewards)
    rewards = (per_func * torch.tensor(weights)).sum(1)
    advantages, zero_std = group_advantages(rewards, 4, scale_rewards)
    torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-6)
    assert zero_std.float().mean().item() == pytest.approx(metrics["frac_reward_zero_std"])
    assert rewards.std().item() == pytest.approx(metrics["reward_std"], abs=1e-6)


def test_a_zero_variance_group_gets_zero_advantages_not_nan():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    for scale_rewards in ("group", "batch", "none"):
        advantages, zero_std = group_advantages(rewards, 3, scale_rewards)
        assert torch.isfinite(advantages).all()
        if scale_rewards != "batch":
            assert (
                advantages[:3].tolist() == [0.0, 0.0, 0.0] and zero_std.tolist() == [True] * 3 + [False] * 3
            )
    # by hand: group 2 (0, 1, 0) has mean 1/3 and unbiased std sqrt(1/3); its 1 gets (1 - 1/3) / (std + 1e-4)
    advantages, _ = group_advantages(rewards, 3)
    assert advantages[4].item() == pytest.approx((2 / 3) / ((1 / 3) ** 0.5 + 1e-4))


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize(("epsilon_high", "beta"), [(0.2, 0.0), (0.28, 0.0), (0.28, 0.04)])
def test_grpo_loss_and_its_gradient_equal_trls(loss_type, epsilon_high, beta):
    logps, old, ref, advantages, mask = _rollout_tensors()
    num_items = int(mask.sum()) + 7  # dapo divides by the whole generation batch's tokens, not this step's
    expected, metrics = trl_loss(
        logps, old, ref, advantages, mask, loss_type, 0.2, epsilon_high, beta, 5, num_items
    )
    (expected_grad,) = torch.autograd.grad(expected, logps)
    out = grpo_loss(
        logps, old, advantages, mask, loss_type, 0.2, epsilon_high, beta, ref if beta else None,
        max_completion_length=5, num_tokens=num_items,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(out["loss"], logps)
    torch.testing.assert_close(out["loss"], expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-6)
    for key in (
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "clip_ratio/region_mean",
        *(["kl"] * bool(beta)),
    ):
        assert out[key].item() == pytest.approx(metrics[key], abs=1e-6), key
    assert metrics["clip_ratio/low_mean"] > 0 and metrics["clip_ratio/high_mean"] > 0  # both sides clip here


def test_first_update_ratio_is_one_and_the_loss_minus_mean_advantage():
    logps, _, _, advantages, mask = _rollout_tensors()
    out = grpo_loss(logps, logps.detach(), advantages, mask, "bnpo")
    assert (
        torch.equal(out["ratio"], torch.ones_like(out["ratio"])) and out["clip_ratio/region_mean"].item() == 0
    )
    by_token = (advantages[:, None] * mask).sum() / mask.sum()
    assert out["loss"].item() == pytest.approx(-by_token.item(), abs=1e-6)


def test_two_ranks_holding_whole_groups_compute_what_one_process_does():
    """Under DDP each rank samples all completions of its own prompts: groups never split, so group statistics are
    exact on each rank; the batch std (scale_rewards=batch) and dapo's token count are summed over ranks, and the
    DDP mean of the ranks' gradients is the one-process gradient."""
    logps, old, ref, _, mask = _rollout_tensors(B=6)
    rewards = torch.rand(6, generator=torch.Generator().manual_seed(2))
    halves = (slice(0, 4), slice(4, 6))  # rank 0: two groups of 2; rank 1: one
    for scale_rewards in ("group", "batch"):
        whole, _ = group_advantages(rewards, 2, scale_rewards)
        r = rewards.double()
        everyone = [torch.stack([r[h].sum(), (r[h] ** 2).sum(), r.new_tensor(r[h].numel())]) for h in halves]
        for rank, h in enumerate(halves):
            other = everyone[1 - rank]
            split, _ = group_advantages(
                rewards[h], 2, scale_rewards, all_reduce=lambda stats, o=other: stats + o
            )
            torch.testing.assert_close(split, whole[h], rtol=0, atol=1e-6)
    advantages, _ = group_advantages(rewards, 2)
    one_process = grpo_loss(logps, old, advantages, mask, "dapo", beta=0.04, ref_logprobs=ref)["loss"]
    (expected,) = torch.autograd.grad(one_process, logps)
    world_tokens = mask.sum() / 2  # all ranks' tokens / world size, as GRPOTask passes it
    grads = [
        torch.autograd.grad(
            grpo_loss(logps[h], old[h], advantages[h], mask[h], "dapo", beta=0.04, ref_logprobs=ref[h],
                      num_tokens=world_tokens)["loss"], logps)[0]
        for h in halves
    ]  # fmt: skip
    torch.testing.assert_close((grads[0] + grads[1]) / 2, expected, rtol=0, atol=1e-7)


# ---- reward functions -------------------------------------------------------------------------------------


def test_rewards_judge_exact_graded_format_and_weights():
    rewards = parse_rewards(
        [
            {"judge": 1.0},
            {"judge": {"weight": 0.5, "graded": True}},
            {"format": {"pattern": "[a-z]+( [a-z]+)*"}},
        ]
    )
    texts, answers = [" elm oak ash", "elm ash oak", "elm 3"], ["elm oak ash"] * 3
    total, values = score_completions(rewards, texts, answers, torch.zeros(3, 1), torch.ones(3, 1))
    # exact; the share of positions with the right word; the whole stripped response of lowercase words
    torch.testing.assert_close(values, torch.tensor([[1.0, 1.0, 1.0], [0.0, 1 / 3, 1.0], [0.0, 1 / 3, 0.0]]))
    assert [r.weight for r in rewards] == [1.0, 0.5, 1.0]
    torch.testing.assert_close(total, torch.tensor([2.5, 1 + 1 / 6, 1 / 6]))  # weighted: 1, 0.5, 1


@pytest.mark.parametrize(
    ("rewards", "needle"),
    [
        ([], "at least one reward function"),
        ([{"judge": 1.0, "format": 1.0}], "is not one {name: weight}"),
        ([{"jduge": 1.0}], "judge, format, reward_model"),
        ([{"judge": {"weight": 1.0, "pattern": "x"}}], "unknown options ['pattern']"),
        ([{"format": 0.2}], "needs a pattern"),
    ],
)
def test_bad_rewards_are_refused_with_the_fix(rewards, needle):
    with pytest.raises(ValueError, match="task.rewards") as error:
        parse_rewards(rewards)
    assert needle in str(error.value)


# ---- the task through the real config ----------------------------------------------------------------------

TINY_GRPO = [*TINY, *TINY_DATA, *TINY_TASK, "task.num_generations=3"]


def _grpo_cfg(compose_cfg, *extra: str):
    return compose_cfg("experiment=gpt_grpo", *TINY_GRPO, *extra)


def test_grpo_runs_fast_dev_run_and_logs_trls_metrics(compose_cfg):
    metrics = train(_grpo_cfg(compose_cfg, "debug=fdr")).metrics
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    expected = ["reward", "reward_std", "frac_reward_zero_std", "kl", "clip_ratio/region_mean", "entropy"]
    expected += [
        "completions/mean_length",
        "rewards/judge/mean",
        "train/judge_exact",
        "test/judge_exact",
        "test/kl",
    ]
    assert set(expected) <= set(metrics), sorted(metrics)


def test_grpo_iterations_start_at_ratio_one_and_only_the_policy_trains(compose_cfg):
    cfg = _grpo_cfg(compose_cfg, "task.num_iterations=2", "task.rewards=[{judge: 1.0}, {reward_model: 0.5}]")
    task, trainer, _ = _fit(cfg, max_steps=4)
    assert trainer.global_step == 4  # two generation batches, two updates each
    assert task.first_ratio.item() == 1.0  # exactly: old log-probs came from the same forward
    assert task.frozen == ("reference", "reward")
    for name in task.frozen:
        module = getattr(task, name)
        assert not module.training and all(
            not p.requires_grad and p.grad is None for p in module.parameters()
        )
    assert any(not torch.equal(p, q) for p, q in zip(task.policy.parameters(), task.reference.parameters()))
    optimized = {id(p) for group in task.optimizers().param_groups for p in group["params"]}
    assert optimized == {id(p) for p in task.policy.parameters()}


def test_beta_zero_holds_no_reference_and_logs_no_kl(compose_cfg):
    cfg = _grpo_cfg(compose_cfg, "task.beta=0.0", "test=false")
    task = instantiate(cfg.task, _recursive_=False, _convert_="all")
    assert task.frozen == ()
    metrics = train(cfg).metrics
    assert "val/judge_exact" in metrics and not {"kl", "val/kl"} & set(metrics)
    # lit-generate and lit-export take its policy
    ckpt = torch.load(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=False)
    generating = language_model(
        str(Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt")
    ).model.state_dict()
    for name, value in generating.items():
        assert torch.equal(value, ckpt["state_dict"][f"policy.{name}"]), name


def test_init_from_of_a_model_the_run_does_not_build_is_refused(compose_cfg, tiny_lm_run):
    ckpt = str(tiny_lm_run / "checkpoints" / "last.ckpt")
    cfg = _grpo_cfg(
        compose_cfg, f"init_from={{policy: '{ckpt}', reward: '{ckpt}'}}", "data.tokenizer_path=" + ckpt
    )
    with pytest.raises(ValueError, match="needs a reward_model reward in task.rewards"):
        train(cfg)


def test_grpo_under_lora_has_no_reference_copy_its_reference_is_the_frozen_base(compose_cfg, tiny_lm_run):
    ckpt = tiny_lm_run / "checkpoints" / "last.ckpt"
    cfg = _grpo_cfg(
        compose_cfg,
        f"init_from={{policy: '{ckpt}'}}",
        f"data.tokenizer_path={ckpt}",
        "model.block_size=32",  # the parent's
        "data.max_prompt_length=24",
        "task.lora={r: 4, alpha: 8}",
        "task.rewards=[{reward_model: 1.0}]",  # scores apart: the adapters move
    )
    task, _, _ = _fit(cfg, max_steps=2)
    assert task.model_names == ["policy", "reward"]
    base = GPT(task.policy.config)
    state = torch.load(ckpt)["state_dict"]
    base.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    seq = torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    attn = torch.ones_like(seq, dtype=torch.bool)
    with torch.no_grad():
        reference = task.reference_logprobs(seq, attn, 6)
        torch.testing.assert_close(reference, response_logprobs(base.eval(), seq, attn, 6, 1.0))
        assert not torch.allclose(response_logprobs(task.policy, seq, attn, 6, 1.0), reference)


@two_rank_group
def grpo_under_ddp(root, cache_dir):
    """Two GRPO steps on trainer=ddp_cpu, in the session's launch of 2 processes: the run folder."""
    overrides = ["experiment=gpt_grpo", *TINY_GRPO, "trainer.max_steps=2", "test=false", "trainer=ddp_cpu"]
    return [compose_train_cfg(*overrides, output_dir=root, cache_dir=cache_dir)], lambda results: root


@pytest.mark.cli
@pytest.mark.ddp
def test_grpo_under_ddp_cpu_keeps_groups_on_their_rank(grpo_under_ddp):
    run_dir = grpo_under_ddp
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    with open(run_dir / "csv" / "train_completions.csv") as f:
        rows = list(csv.DictReader(f))
    assert (
        len(rows) == 3 * 2 and len({r["prompt"] for r in rows if r["step"] == "1"}) == 1
    )  # one group a table


def _losses(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")}


def test_grpo_resumed_mid_run_trains_exactly_as_the_run_that_went_on(compose_cfg, tmp_path):
    exact = [*TINY_TRAINER[1:], "trainer.deterministic=true", "callbacks.model_checkpoint.save_top_k=-1"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    rewarded = "task.rewards=[{reward_model: 1.0}]"

    def run(run_dir: Path, *overrides: str) -> None:
        # a (random) reward model scores every completion apart: advantages, and so the updates, are not 0
        cfg = _grpo_cfg(compose_cfg, *exact, rewarded, "test=false", "trainer.max_steps=4", *overrides)
        cfg.paths.output_dir = str(run_dir)
        cfg.callbacks.model_checkpoint.dirpath = str(run_dir / "checkpoints")
        cfg.logger.csv.save_dir = str(run_dir)
        cfg.trainer.default_root_dir = str(run_dir)
        train(cfg)

    run(straight)
    run(resumed, f"ckpt_path={straight / 'checkpoints' / 'step_000002.ckpt'}")
    expected, got = _losses(straight), _losses(resumed)
    assert (
        len(expected) == 4 and sorted(got) == sorted(expected)[2:]
    )  # the steps after the checkpoint, once each
    assert {s: got[s] for s in got} == {s: expected[s] for s in got} and all(expected.values())
    weights = [torch.load(d / "checkpoints" / "last.ckpt")["state_dict"] for d in (straight, resumed)]
    for name, value in weights[1].items():
        torch.testing.assert_close(value, weights[0][name], rtol=0, atol=0, msg=name)


# ---- the chain's grpo stage ----------------------------------------------------------------------------------


def test_chain_rl_on_the_judge_starts_from_sft_alone_and_on_the_reward_model_needs_the_reward_stage(
    tmp_path, cache_dir
):
    from omegaconf import OmegaConf
    from test_chain import _tiny_chain

    from lit_transformers.instructgpt import chain

    from conftest import assert_user_error

    run = tmp_path / "run"
    cfg = _tiny_chain(run, ["pretrain", "sft", "grpo", "ppo_judge"], cache_dir)
    cfg.stage_configs.grpo = [*cfg.stage_configs.grpo, *TINY_DATA[:1], *TINY_TASK, "task.num_generations=2"]
    cfg.stage_configs.ppo_judge = [*cfg.stage_configs.ppo_judge, *TINY_DATA[:1], *TINY_TASK]
    rewarded = OmegaConf.to_container(cfg.stage_configs.grpo) + ["task.rewards=[{reward_model: 1.0}]"]
    summary = chain(cfg)
    assert {"judge_exact", "kl"} <= set(summary["grpo"])
    assert {"judge_exact", "kl"} <= set(summary["ppo_judge"]) and "rm_score" not in summary["ppo_judge"]
    sft = json.loads((run / "sft" / "stage.json").read_text())["checkpoint"]  # relative to the run folder
    for stage in ("grpo", "ppo_judge"):  # the judge needs no reward model
        assert dict(OmegaConf.load(run / stage / "config_resolved.yaml").init_from) == {
            "policy": str(run / sft)
        }
    # PPO's value model without a reward model: the SFT policy's body, its head new
    saved = torch.load(run / sft, map_location="cpu", weights_only=True)
    args = {key: saved["hyper_parameters"][key] for key in ("model", "optimizer", "tokenizer")}
    ppo = PPOTask(**args, rewards=[{"judge": 1.0}], init_from={"policy": str(run / sft)})
    ppo.configure_model()
    sft_state = saved["state_dict"]
    for name, value in ppo.value.body.state_dict().items():
        torch.testing.assert_close(value, sft_state[f"model.{name}"], rtol=0, atol=0)
    cfg.stage_configs.grpo = rewarded
    (run / "grpo" / "stage.json").unlink()
    assert_user_error(
        lambda: chain(cfg),
        "Chain stage grpo starts from the reward model (init_from.reward)",
        "'stages=[pretrain,sft,reward,ppo_judge,grpo]'",
    )
    cfg.stages = ["pretrain", "sft", "grpo_rm"]  # the stage of GRPO on the reward model, as configured
    assert_user_error(
        lambda: chain(cfg), "Chain stage grpo_rm starts from the reward model (init_from.reward)"
    )


def test_reward_std_is_the_std_over_every_rank_not_the_mean_of_the_ranks_stds():
    rank0, rank1 = torch.tensor([0.0, 0.0, 1.0, 1.0]), torch.tensor([5.0, 5.0, 5.0])
    other = torch.tensor(
        [3.0, rank1.sum().item(), (rank1**2).sum().item()], dtype=torch.float64
    )  # rank 1's moments
    both = sample_std(rank0, all_reduce=lambda moments: moments + other)
    assert both.item() == pytest.approx(torch.cat([rank0, rank1]).double().std().item(), abs=1e-6)
    assert both.item() != pytest.approx((rank0.std() + rank1.std()).item() / 2)
    assert sample_std(rank0).item() == pytest.approx(rank0.std().item(), abs=1e-7)  # one process: torch's
