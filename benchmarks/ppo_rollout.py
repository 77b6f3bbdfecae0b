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

from rl_iteration import add_model_args, print_iteration, print_rates, random_rl_task, time_iteration
from timing import add_round_args, kept_note, quiet_rounds

import lit_transformers.tasks.ppo as ppo_module
from lit_transformers.nn import generate
from lit_transformers.tasks import PPOTask


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--batch-size", type=int, default=32)
    add_round_args(p, 3, 12, "--repeats")
    p.add_argument("--iterations", type=int, default=3, help="PPO iterations timed (after one warm-up)")
    p.add_argument("--ppo-epochs", type=int, default=4)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    task, prompts, ids, mask = random_rl_task(
        PPOTask, args, args.batch_size, num_ppo_epochs=args.ppo_epochs, missing_eos_penalty=0.0
    )
    policy = task.policy

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
    print_rates({"KV cache": cached, "no cache": uncached})

    # ---- one PPO iteration, split ------------------------------------------------------------------------
    med = time_iteration(task, ppo_module, prompts, args.iterations, args.ppo_epochs)
    print_iteration(f"PPO iteration ({args.ppo_epochs} epochs, 1 minibatch)", med, args.iterations)


if __name__ == "__main__":
    main()
