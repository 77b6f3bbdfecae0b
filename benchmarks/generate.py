"""Greedy generation speed: KV-cached vs uncached, vs ``transformers`` ``generate()`` on the same weights.

    python benchmarks/generate.py                      # 6 layers, d_model 384, 256 new tokens, batch 1
    python benchmarks/generate.py --batch-size 4 --rounds 5
    python benchmarks/generate.py --layout llama --n-kv-head 2   # grouped-query decode vs LlamaForCausalLM

Prints tokens/s per method (median over rounds: ``timing.quiet_rounds``, rotating order, busy rounds discarded
and counted), the median per-round ours/HF ratio, checks that
our tokens equal HF's, and the time of one cached decode step at several sequence lengths (flat with
the cache) next to one uncached step (a full forward pass, which grows with the length).
"""

from __future__ import annotations

import argparse
import statistics

import torch
from timing import add_round_args, kept_note, quiet_rounds, ratio_spread, seconds_of

from lit_transformers.models import GPT
from lit_transformers.nn import generate

from gpt_pair import add_model_args, same_weight_pair


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p, block_size=512, block_size_help="must hold prompt + new tokens")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument(
        "--uncached-new-tokens",
        type=int,
        default=64,
        help="new tokens for the (slow, quadratic) uncached run",
    )
    p.add_argument("--batch-size", type=int, default=1)
    add_round_args(p, 5, 20, "--repeats")
    p.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=[16, 64, 128, 256, 384, 496],
        help="sequence lengths for the per-token table",
    )
    return p.parse_args()


@torch.no_grad()
def per_token_ms(model: GPT, length: int, cached: bool, n: int = 5) -> float:
    """Median ms to produce the logits of token `length + 1` given `length` earlier tokens."""
    ids = torch.randint(
        0, model.config.vocab_size, (1, length + 1), generator=torch.Generator().manual_seed(0)
    )
    times = []
    if cached:
        caches = model.new_caches(1, length + 1)
        model(ids[:, :length], caches=caches)  # prefill once
        for _ in range(n):
            for c in caches:
                c.self_attn.length = length  # rewind: decode the same next token again
            times.append(seconds_of(lambda: model(ids[:, length:], caches=caches)))
    else:
        for _ in range(n):
            times.append(seconds_of(lambda: model(ids)))
    return 1e3 * statistics.median(times)


def main() -> None:
    args = parse_args()
    if args.prompt_len + args.new_tokens > args.block_size:
        raise SystemExit(f"--prompt-len + --new-tokens must fit --block-size {args.block_size}")
    ours, hf = same_weight_pair(args)
    ours, hf = ours.eval(), hf.eval()
    prompt = torch.randint(
        0, args.vocab_size, (args.batch_size, args.prompt_len), generator=torch.Generator().manual_seed(1)
    )
    mask = torch.ones_like(prompt)

    def run_ours(cache=True, n=args.new_tokens):
        return generate(ours, prompt, mask, max_new_tokens=n, temperature=0, use_cache=cache)

    def run_hf(n=args.new_tokens):
        return hf.generate(
            prompt,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )

    with torch.no_grad():
        same = torch.equal(run_ours(), run_hf())  # also the warm-up
        run_ours(cache=False, n=2)
    methods = {
        "ours (KV cache)": run_ours,
        "hf generate()": run_hf,
        "ours (no cache)": lambda: run_ours(cache=False, n=args.uncached_new_tokens),
    }
    new_tokens = {name: args.new_tokens for name in methods} | {"ours (no cache)": args.uncached_new_tokens}
    with torch.no_grad():
        seconds, busy = quiet_rounds(methods, args)
    rates = {name: [args.batch_size * new_tokens[name] / t for t in times] for name, times in seconds.items()}

    print(
        f"\nGreedy generation (fp32, {torch.get_num_threads()} threads): n_layer={args.n_layer} "
        f"d_model={args.d_model} vocab={args.vocab_size} batch={args.batch_size} prompt={args.prompt_len}"
    )
    print(kept_note(seconds, busy))
    if not rates["ours (KV cache)"]:
        return
    print(f"{'method':<18}{'new tokens':>12}{'median tok/s':>14}")
    for name, n in new_tokens.items():
        print(f"{name:<18}{n:>12}{statistics.median(rates[name]):>14.1f}")
    print(f"tokens identical to HF greedy: {'yes' if same else 'NO'}")
    ratio_hf = ratio_spread(rates["ours (KV cache)"], rates["hf generate()"])[0]
    print(f"ours cached / hf generate(): {ratio_hf:.3f}x")
    print(
        f"ours cached / ours uncached: "
        f"{statistics.median(rates['ours (KV cache)']) / statistics.median(rates['ours (no cache)']):.1f}x "
        f"(uncached measured on {args.uncached_new_tokens} new tokens; it only gets slower with more)"
    )

    print(f"\nper-token time vs sequence length (batch 1)\n{'length':>8}{'cached ms':>12}{'uncached ms':>14}")
    for length in args.lengths:
        if length + 1 > args.block_size:
            continue
        print(
            f"{length:>8}{per_token_ms(ours, length, True):>12.2f}{per_token_ms(ours, length, False):>14.2f}"
        )


if __name__ == "__main__":
    main()
