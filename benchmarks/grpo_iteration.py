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

import torch
from rl_iteration import add_model_args, print_iteration, print_rates, random_rl_task, time_iteration
from timing import add_round_args, kept_note, quiet_rounds

import lit_transformers.tasks.grpo as grpo_module
from lit_transformers.nn import generate
from lit_transformers.tasks.grpo import GRPOTask


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--prompts", type=int, default=8, help="prompts per batch (B)")
    p.add_argument("--num-generations", type=int, default=8, help="samples per prompt (G)")
    add_round_args(p, 3, 12)
    p.add_argument("--iterations", type=int, default=3, help="GRPO iterations timed (after one warm-up)")
    p.add_argument("--num-iterations", type=int, default=1, help="policy updates per generation batch (mu)")
    p.add_argument("--beta", type=float, default=0.04, help="KL weight (0: no reference forward)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    B, G = args.prompts, args.num_generations
    task, prompts, ids, mask = random_rl_task(
        GRPOTask,
        args,
        B,
        rewards=[{"reward_model": 1.0}],  # random prompts have no right answer to judge
        num_generations=G,
        num_iterations=args.num_iterations,
        beta=args.beta,
    )
    policy = task.policy

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
    print_rates({f"{B * G} rows at once": together, f"{G} x {B} rows": apart})

    # ---- one GRPO iteration, split ------------------------------------------------------------------------
    med = time_iteration(task, grpo_module, prompts, args.iterations, args.num_iterations)
    title = f"GRPO iteration ({B} x {G} completions, num_iterations {args.num_iterations}, beta {args.beta})"
    print_iteration(title, med, args.iterations)


if __name__ == "__main__":
    main()
