"""task.lora on the RLHF stages: the reward model trains adapters and its scalar head; PPO and DPO take their
reference as the policy's base with the adapters off (no second copy), and a PPO LoRA run resumes exactly."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from torch import nn

from lit_transformers.models import GPT, GPTConfig
from lit_transformers.tasks.dpo import DPOTask
from lit_transformers.tasks.grpo import GRPOTask
from lit_transformers.tasks.ppo import PPOTask
from lit_transformers.tasks.reward import RewardTask
from lit_transformers.train import train

from test_instructgpt import _fit
from test_lora import ADAM, TINY_GPT, _base_file, _optimized

pytest.importorskip("peft")

# PPO at test_instructgpt's tiny sizes on tiny_lm_run's GPT (its model and tokenizer) as policy and reward body
PPO_TINY = [
    "experiment=gpt_ppo",
    "model.n_layer=1",
    "model.n_head=2",
    "model.d_model=32",
    "model.block_size=32",
    "data.batch_size=4",
    "data.n_examples=120",
    "data.vocab_size=300",
    "data.max_prompt_length=20",
    "task.max_new_tokens=4",
    "trainer.log_every_n_steps=1",
    "callbacks.progress_bar=null",
    "callbacks.model_summary=null",
    "sample=null",
]


def _ppo_cfg(compose_cfg, base: Path, *extra: str):
    init_from = f"init_from={{policy: {base}, reward: {base}}}"
    return compose_cfg(*PPO_TINY, init_from, f"data.tokenizer_path={base}", *extra)


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_ppo_under_lora_holds_no_reference_copy_and_its_first_ratio_is_one(compose_cfg, tiny_lm_run):
    base = tiny_lm_run / "checkpoints" / "last.ckpt"
    cfg = _ppo_cfg(compose_cfg, base, "task.lora={r:4}", "task.num_ppo_epochs=2", "task.num_mini_batches=2")
    task, trainer, _ = _fit(cfg, max_steps=4)
    assert task.first_ratio.item() == 1.0  # exactly: old log-probs came from the same minibatch forward

    full = instantiate(_ppo_cfg(compose_cfg, base).task, _recursive_=False, _convert_="all")
    full.connect_data(trainer.datamodule)
    full.configure_model()
    adapters = sum(p.numel() for n, p in task.named_parameters() if ".lora_" in n)
    assert adapters and _numel(task) == _numel(full) - _numel(full.reference) + adapters
    assert "reference" not in task.model_names and not isinstance(task.reference, nn.Module)
    assert not any(key.startswith("reference.") for key in task.state_dict())

    trained = {n for n, p in task.named_parameters() if p.requires_grad}
    assert {"value.head.proj.weight", "value.head.proj.bias"} <= trained  # the value's head trains in full
    assert all(".lora_" in n for n in trained - {"value.head.proj.weight", "value.head.proj.bias"})
    optimized = {id(p) for group in task.optimizers().param_groups for p in group["params"]}
    assert optimized == {id(p) for p in task.parameters() if p.requires_grad}
    assert all(p.grad is None for p in task.reward.parameters())
    # the reference computes as the base the policy started from, though the policy's adapters moved
    ids = torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    sft = GPT(full.policy.config)
    saved = torch.load(base)["state_dict"]
    sft.load_state_dict({k.removeprefix("model."): v for k, v in saved.items() if k.startswith("model.")})
    with torch.no_grad():
        assert not torch.allclose(task.policy.eval()(ids), sft.eval()(ids), atol=1e-6, rtol=0)
        torch.testing.assert_close(task.reference(ids), sft(ids), rtol=0, atol=1e-6)


def _metrics(run_dir: Path, key: str) -> dict[int, float]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return {int(r["step"]): float(r[key]) for r in csv.DictReader(f) if r.get(key)}


def _run_in(compose_cfg, base: Path, run_dir: Path, *extra: str) -> dict:
    cfg = _ppo_cfg(
        compose_cfg,
        base,
        "task.lora={r:4,alpha:8}",
        "task.num_ppo_epochs=1",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        "trainer.limit_val_batches=1",
        "callbacks.model_checkpoint.save_top_k=-1",
        "test=false",
        *extra,
    )
    cfg.paths.output_dir = str(run_dir)
    cfg.callbacks.model_checkpoint.dirpath = str(run_dir / "checkpoints")
    cfg.logger.csv.save_dir = cfg.trainer.default_root_dir = str(run_dir)
    train(cfg)
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)


def test_ppo_lora_checkpoint_resumes_exactly(compose_cfg, tmp_path, tiny_lm_run):
    base = tiny_lm_run / "checkpoints" / "last.ckpt"
    straight = _run_in(compose_cfg, base, tmp_path / "straight")
    assert straight["lora_base"]["source"].startswith("init_from={")
    assert all(
        ".lora_" in k or ".head." in k for k in straight["state_dict"] if k.startswith(("policy.", "value."))
    )
    assert not any(k.startswith("reward.") for k in straight["state_dict"])  # frozen: rebuilt from init_from
    step_2 = tmp_path / "straight" / "checkpoints" / "step_000002.ckpt"
    resumed = _run_in(compose_cfg, base, tmp_path / "resumed", f"ckpt_path={step_2}")
    for key in ("loss/policy", "objective/scores"):
        expected, got = _metrics(tmp_path / "straight", key), _metrics(tmp_path / "resumed", key)
        assert got and got == {step: expected[step] for step in got}, key
    assert straight["state_dict"].keys() == resumed["state_dict"].keys()
    for name, value in resumed["state_dict"].items():
        torch.testing.assert_close(value, straight["state_dict"][name], rtol=0, atol=0, msg=name)


def _pairs() -> dict[str, torch.Tensor]:
    """Two chosen then two rejected sequences, right-padded, their responses after a 3-token prompt."""
    lengths = [9, 7, 8, 6]
    ids = torch.randint(3, 64, (4, 10), generator=torch.Generator().manual_seed(2))
    mask = torch.arange(10)[None] < torch.tensor(lengths)[:, None]
    response = mask & (torch.arange(10)[None] >= 3)
    return {"pair_ids": ids * mask, "pair_mask": mask, "response_mask": response, "index": torch.arange(2)}


def test_dpo_reference_logprobs_with_adapters_off_equal_the_base_models(tmp_path):
    spec = GPTConfig(**TINY_GPT, dropout=0.1)  # dropout on: the reference must still compute in eval mode
    torch.manual_seed(0)
    path = _base_file(tmp_path, GPT(spec))
    task = DPOTask(model=spec, optimizer=ADAM, init_from=path, lora={"r": 4})
    task.configure_model()
    assert task.model_names == ["policy"] and _numel(task) < 1.5 * _numel(GPT(spec))
    for name, param in task.policy.named_parameters():
        if "lora_B" in name:  # as if trained: the policy's log-probs move away from the base's
            nn.init.normal_(param, std=0.2)
    batch = _pairs()
    task.train()
    reference = torch.stack(task._reference_logprobs(batch, "train"), 1)  # (pairs, chosen/rejected)
    assert task.policy.training  # the reference's eval mode was the call's only

    base = GPT(spec)  # independently: the saved base without adapters, a plain forward, by hand
    base.load_state_dict(torch.load(path))
    with torch.no_grad():
        logp = F.log_softmax(base.eval()(batch["pair_ids"])[:, :-1], -1)
    token = logp.gather(-1, batch["pair_ids"][:, 1:, None]).squeeze(-1)
    expected = (token * batch["response_mask"][:, 1:]).sum(1).view(2, 2).T  # (pairs, chosen/rejected)
    torch.testing.assert_close(reference, expected, rtol=0, atol=1e-5)
    with torch.no_grad():
        policy = torch.stack(task._sequence_logprobs(task.policy.eval(), batch), 1)
    assert (policy - expected).abs().max() > 1e-2  # the adapters do change the policy
    nn.init.zeros_(next(p for n, p in task.policy.named_parameters() if "lora_B" in n))
    cached = torch.stack(task._reference_logprobs(batch, "train"), 1)
    assert torch.equal(cached, reference)  # computed once, then read from the cache


def test_reward_model_trains_adapters_and_its_scalar_head(tmp_path):
    spec = GPTConfig(**TINY_GPT)
    torch.manual_seed(0)
    task = RewardTask(model=spec, optimizer=ADAM, init_from=_base_file(tmp_path, GPT(spec)), lora={"r": 4})
    task.configure_model()
    trained = {n for n, p in task.named_parameters() if p.requires_grad}
    head = {"model.head.proj.weight", "model.head.proj.bias"}
    assert head <= trained and all(".lora_" in n for n in trained - head)
    adapted = {
        n.split(".lora_")[0].split(".", 4)[-1] for n in trained - head
    }  # model.body.blocks.{i}.<layer>
    assert adapted == {"attn.qkv_proj", "attn.out_proj", "mlp.fc", "mlp.proj"}
    assert _optimized(task) == {id(p) for p in task.parameters() if p.requires_grad}


@pytest.mark.parametrize("task_class", [PPOTask, DPOTask, GRPOTask])
def test_policy_tasks_under_lora_refuse_a_reference_model_of_their_own(task_class):
    with pytest.raises(
        ValueError, match="task.init_from.reference name.* policy's frozen base with its adapters"
    ):
        task_class(
            model=GPTConfig(**TINY_GPT),
            optimizer=ADAM,
            init_from={"policy": "sft.ckpt", "reference": "other.ckpt", "reward": "rm.ckpt"},
            lora={"r": 4},
        )
