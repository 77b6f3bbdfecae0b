"""What the RL benchmarks share: a task with a random policy on random prompts (:func:`random_rl_task`), and the
median time of one RL iteration (a ``training_step`` of PPO or GRPO inside a Lightning Trainer) and of its parts:
the rollout (sampling) and the experience (rollout + scoring) it starts with; the rest is the update."""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial
from types import ModuleType

import lightning as L
import torch
from torch.utils.data import DataLoader

from lit_transformers.data.instructions import collate
from lit_transformers.text import Tokenizer, left_pad


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The random policy's shape and the lengths: GPT-nano (4 x 128), 16 prompt tokens, 32 new ones."""
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)


def random_rl_task(task_class, args: argparse.Namespace, n_prompts: int, **task_args):
    """A ``task_class`` (PPOTask, GRPOTask) on a character tokenizer, its models built at ``args``' sizes with
    random weights, EOS kept rare (every row generates all new tokens), and ``n_prompts`` random prompts ->
    (task, prompts as id lists, left-padded ids, their mask)."""
    torch.manual_seed(0)
    words = "the of and to a in is for that with as on be by this are from or an it".split()
    tokenizer = Tokenizer.train([" ".join(words)] * 10, kind="char")
    model = {
        "_target_": "lit_transformers.models.GPTConfig",
        "vocab_size": tokenizer.vocab_size,
        "block_size": args.prompt_len + args.new_tokens,
        "n_layer": args.n_layer,
        "n_head": args.n_head,
        "d_model": args.d_model,
        "dropout": 0.0,
    }
    task = task_class(
        model=model,
        optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-5},
        tokenizer=tokenizer.state(),
        max_new_tokens=args.new_tokens,
        **task_args,
    )
    task.configure_model()
    task.policy.eval().lm_head.weight.data[tokenizer.eos_id] = (
        0  # (tied) keep EOS rare: full-length responses
    )
    prompts = [
        [tokenizer.bos_id, *torch.randint(4, tokenizer.vocab_size, (args.prompt_len - 1,)).tolist()]
        for _ in range(n_prompts)
    ]
    return (task, prompts, *left_pad(prompts, tokenizer.pad_id))


def time_iteration(
    task, module: ModuleType, prompts: list[list[int]], iterations: int, steps_per_iteration: int
) -> dict[str, float]:
    """Fit ``task`` (its models built) on ``prompts`` (one batch) for ``iterations`` + 1 iterations, timing the
    ``rollout`` that ``module`` (the task's) calls, ``make_experience`` and ``training_step``; the first iteration
    warms up. Returns median seconds of ``rollout``, ``scoring`` (experience - rollout) and ``update``
    (step - experience), and ``step``."""
    spent: dict[str, list[float]] = {"rollout": [], "experience": [], "step": []}

    def timed(key, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            result = fn(*a, **k)
            spent[key].append(time.perf_counter() - t0)
            return result

        return wrapper

    module.rollout = timed("rollout", module.rollout)
    task.make_experience = timed("experience", task.make_experience)
    task.training_step = timed("step", task.training_step)
    items = [{"prompt": p, "answer": None} for p in prompts]
    loader = DataLoader(items, batch_size=len(items), collate_fn=partial(collate, format="prompts", pad_id=0))
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=(iterations + 1) * steps_per_iteration,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        max_epochs=-1,
        log_every_n_steps=10**6,  # no sample tables
    )
    trainer.fit(task, train_dataloaders=loader)
    med = {k: statistics.median(v[1:]) for k, v in spent.items()}
    return {
        "rollout": med["rollout"],
        "scoring": med["experience"] - med["rollout"],
        "update": med["step"] - med["experience"],
        "step": med["step"],
    }


def print_rates(rates: dict[str, float]) -> None:
    """Two methods' tokens/s, one line each, and the ratio of the first to the second."""
    (first, a), (_, b) = rates.items()
    width = max(map(len, rates)) + 2
    for name, rate in rates.items():
        print(f"  {name:<{width}}{rate:9.1f} tok/s")
    print(f"  {'ratio':<{width}}{a / b:9.2f}x")


def print_iteration(title: str, med: dict[str, float], iterations: int) -> None:
    """:func:`time_iteration`'s medians: the whole iteration, then generation, scoring and update with their
    shares of it."""
    print(f"{title}, median of {iterations}: {med['step']:.3f} s")
    for key, name in (("rollout", "generation"), ("scoring", "scoring"), ("update", "update")):
        print(f"  {name:<10} {med[key]:7.3f} s  {100 * med[key] / med['step']:5.1f} %")
