"""PPO rollout speed with and without the KV cache, and where a PPO iteration's time goes.

    python benchmarks/ppo_rollout.py                       # GPT-nano (4 x 128), 32 prompts, 32 new tokens
    python benchmarks/ppo_rollout.py --batch-size 64 --new-tokens 48 --iterations 5 --rounds 3

Prints sampled tokens/s with the cache and without it (median over rounds: ``timing.quiet_rounds``, rotating
order, busy rounds discarded and counted), then the median
time of one PPO iteration (``PPOTask.training_step`` inside a Lightning Trainer) split into rollout
(sampling), scoring (policy/reference log-probs, values, reward) and update (num_ppo_epochs x minibatches).
Random weights: speed does not depend on what the model learned; EOS is never emitted, so every row
generates all new tokens.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import lightning as L
import torch
from timing import add_round_args, kept_note, quiet_rounds
from torch.utils.data import DataLoader

import lit_transformers.tasks.ppo as ppo_module
from lit_transformers.data.instructions import collate
from lit_transformers.nn import generate
from lit_transformers.tasks import PPOTask
from lit_transformers.text import Tokenizer, left_pad


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    add_round_args(p, 3, 12, "--repeats")
    p.add_argument("--iterations", type=int, default=3, help="PPO iterations timed (after one warm-up)")
    p.add_argument("--ppo-epochs", type=int, default=4)
    return p.parse_args()


def main() -> None:
    args = parse_args()
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
    task = PPOTask(
        model=model,
        optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-5},
        tokenizer=tokenizer.state(),
        max_new_tokens=args.new_tokens,
        num_ppo_epochs=args.ppo_epochs,
        missing_eos_penalty=0.0,
    )
    task.configure_model()
    policy = task.policy.eval()
    policy.lm_head.weight.data[tokenizer.eos_id] = 0  # (tied) keep EOS rare: full-length responses
    prompts = [
        [tokenizer.bos_id, *torch.randint(4, tokenizer.vocab_size, (args.prompt_len - 1,)).tolist()]
        for _ in range(args.batch_size)
    ]
    ids, mask = left_pad(prompts, tokenizer.pad_id)

    # ---- rollout tokens/s, cached vs uncached --------------------------------------------------------------
    def sample(cached: bool) -> int:
        out = generate(policy, ids, mask, args.new_tokens, 0.7, use_cache=cached, eos_id=None)
        return args.batch_size * (out.size(1) - ids.size(1))

    n_tokens = sample(True)  # also the warm-up
    seconds, busy = quiet_rounds({"cached": lambda: sample(True), "uncached": lambda: sample(False)}, args)
    print(f"rollout, batch {args.batch_size}, {args.new_tokens} new tokens after {args.prompt_len}:")
    print(f"  {kept_note(seconds, busy)}")
    if not seconds["cached"]:
        return
    cached, uncached = (n_tokens / statistics.median(seconds[c]) for c in ("cached", "uncached"))
    print(
        f"  KV cache    {cached:9.1f} tok/s\n  no cache    {uncached:9.1f} tok/s\n  ratio       {cached / uncached:9.2f}x"
    )

    # ---- one PPO iteration, split ------------------------------------------------------------------------
    spent: dict[str, list[float]] = {"rollout": [], "experience": [], "step": []}

    def timed(key, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            result = fn(*a, **k)
            spent[key].append(time.perf_counter() - t0)
            return result

        return wrapper

    ppo_module.rollout = timed("rollout", ppo_module.rollout)
    task.make_experience = timed("experience", task.make_experience)
    task.training_step = timed("step", task.training_step)
    items = [{"prompt": p, "answer": None} for p in prompts]
    loader = DataLoader(
        items, batch_size=args.batch_size, collate_fn=partial(collate, format="prompts", pad_id=0)
    )
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=(args.iterations + 1) * args.ppo_epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        max_epochs=-1,
    )
    trainer.fit(task, train_dataloaders=loader)
    med = {k: statistics.median(v[1:]) for k, v in spent.items()}  # the first iteration warms up
    split = {
        "rollout": med["rollout"],
        "scoring": med["experience"] - med["rollout"],
        "update": med["step"] - med["experience"],
    }
    print(
        f"PPO iteration ({args.ppo_epochs} epochs, 1 minibatch), median of {args.iterations}: {med['step']:.3f} s"
    )
    for key, value in split.items():
        print(f"  {key:<8} {value:7.3f} s  {100 * value / med['step']:5.1f} %")


if __name__ == "__main__":
    main()
