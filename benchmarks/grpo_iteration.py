"""GRPO generation speed with a group's samples batched, and where a GRPO iteration's time goes.

    python benchmarks/grpo_iteration.py                     # GPT-nano (4 x 128), 8 prompts x 8 samples, 32 new tokens
    python benchmarks/grpo_iteration.py --prompts 4 --num-generations 16 --num-iterations 2 --iterations 5

Prints sampled tokens/s through the KV cache with every prompt's ``num_generations`` samples in one batch (as
``GRPOTask`` samples: prompts repeated, B x G rows) and with one batch per sample index (G calls of B rows), median
over rounds (``timing.quiet_rounds``: rotating order, busy rounds discarded and counted); then the median time of
one GRPO iteration (``GRPOTask.training_step`` inside a Lightning Trainer) split into generation (sampling),
scoring (rewards from the reward model, group advantages, reference and old log-probs) and update
(``num_iterations`` policy steps). Random weights: speed does not depend on what the model learned; EOS is never
emitted, so every row generates all new tokens.
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

import lit_transformers.tasks.grpo as grpo_module
from lit_transformers.data.instructions import collate
from lit_transformers.nn import generate
from lit_transformers.tasks.grpo import GRPOTask
from lit_transformers.text import Tokenizer, left_pad


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--prompts", type=int, default=8, help="prompts per batch (B)")
    p.add_argument("--num-generations", type=int, default=8, help="samples per prompt (G)")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    add_round_args(p, 3, 12)
    p.add_argument("--iterations", type=int, default=3, help="GRPO iterations timed (after one warm-up)")
    p.add_argument("--num-iterations", type=int, default=1, help="policy updates per generation batch (mu)")
    p.add_argument("--beta", type=float, default=0.04, help="KL weight (0: no reference forward)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    words = "the of and to a in is for that with as on be by this are from or an it".split()
    tokenizer = Tokenizer.train([" ".join(words)] * 10, kind="char")
    B, G = args.prompts, args.num_generations
    task = GRPOTask(
        model={
            "_target_": "lit_transformers.models.GPTConfig",
            "vocab_size": tokenizer.vocab_size,
            "block_size": args.prompt_len + args.new_tokens,
            "n_layer": args.n_layer,
            "n_head": args.n_head,
            "d_model": args.d_model,
            "dropout": 0.0,
        },
        rewards=[{"reward_model": 1.0}],  # random prompts have no right answer to judge
        num_generations=G,
        num_iterations=args.num_iterations,
        beta=args.beta,
        optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-5},
        tokenizer=tokenizer.state(),
        max_new_tokens=args.new_tokens,
    )
    task.configure_model()
    policy = task.policy.eval()
    policy.lm_head.weight.data[tokenizer.eos_id] = 0  # (tied) keep EOS rare: full-length completions
    prompts = [
        [tokenizer.bos_id, *torch.randint(4, tokenizer.vocab_size, (args.prompt_len - 1,)).tolist()]
        for _ in range(B)
    ]
    ids, mask = left_pad(prompts, tokenizer.pad_id)

    # ---- generation tokens/s: a group's samples in one batch, or one batch per sample -----------------------
    def sample(rows: torch.Tensor, rows_mask: torch.Tensor) -> int:
        out = generate(policy, rows, rows_mask, args.new_tokens, 1.0, eos_id=None)
        return rows.size(0) * (out.size(1) - rows.size(1))

    def batched() -> int:
        return sample(ids.repeat_interleave(G, 0), mask.repeat_interleave(G, 0))

    def one_batch_per_sample() -> int:
        return sum(sample(ids, mask) for _ in range(G))

    n_tokens = batched()  # also the warm-up
    seconds, busy = quiet_rounds({"batched": batched, "per sample": one_batch_per_sample}, args)
    print(
        f"generation, {B} prompts x {G} samples, {args.new_tokens} new tokens after {args.prompt_len} (KV cache):"
    )
    print(f"  {kept_note(seconds, busy)}")
    if not seconds["batched"]:
        return
    together, apart = (n_tokens / statistics.median(seconds[k]) for k in ("batched", "per sample"))
    print(
        f"  {B * G} rows at once   {together:9.1f} tok/s\n  {G} x {B} rows        {apart:9.1f} tok/s\n"
        f"  ratio           {together / apart:9.2f}x"
    )

    # ---- one GRPO iteration, split ------------------------------------------------------------------------
    spent: dict[str, list[float]] = {"generation": [], "experience": [], "step": []}

    def timed(key, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            result = fn(*a, **k)
            spent[key].append(time.perf_counter() - t0)
            return result

        return wrapper

    grpo_module.rollout = timed("generation", grpo_module.rollout)
    task.make_experience = timed("experience", task.make_experience)
    task.training_step = timed("step", task.training_step)
    loader = DataLoader(
        [{"prompt": p, "answer": None} for p in prompts],
        batch_size=B,
        collate_fn=partial(collate, format="prompts", pad_id=0),
    )
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=(args.iterations + 1) * args.num_iterations,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        max_epochs=-1,
        log_every_n_steps=10**6,  # no sample tables
    )
    trainer.fit(task, train_dataloaders=loader)
    med = {k: statistics.median(v[1:]) for k, v in spent.items()}  # the first iteration warms up
    split = {
        "generation": med["generation"],
        "scoring": med["experience"] - med["generation"],
        "update": med["step"] - med["experience"],
    }
    print(
        f"GRPO iteration ({B} x {G} completions, num_iterations {args.num_iterations}, beta {args.beta}), "
        f"median of {args.iterations}: {med['step']:.3f} s"
    )
    for key, value in split.items():
        print(f"  {key:<10} {value:7.3f} s  {100 * value / med['step']:5.1f} %")


if __name__ == "__main__":
    main()
