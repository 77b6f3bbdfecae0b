"""Memory of the KV cache with grouped-query attention: the same Llama-layout model with ``n_head`` key/value
heads (full multi-head) and fewer (``--kv-heads``), during a greedy KV-cached decode.

    python benchmarks/kv_cache_memory.py                        # n_head 8; n_kv_head 8, 2, 1
    python benchmarks/kv_cache_memory.py --batch-size 16 --new-tokens 1008 --block-size 1024

Prints, per ``n_kv_head``: the bytes of the cache tensors that ``generate`` allocates (``new_caches`` for
prompt + new tokens), and the peak of CPU memory allocated during the whole ``generate`` call above what was
allocated before it (torch.profiler's memory events: cache, activations and logits, not the weights), each
with its ratio to the full multi-head model's.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from lit_transformers.models import GPT
from lit_transformers.nn import generate

from gpt_pair import add_model_args, our_config, use_threads


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p, block_size=512, block_size_help="must hold prompt + new tokens")
    p.set_defaults(layout="llama", n_head=8)
    p.add_argument(
        "--kv-heads", type=int, nargs="+", default=[8, 2, 1], help="n_kv_head values (the first: baseline)"
    )
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=496)
    return p.parse_args()


def peak_allocated(fn) -> int:
    """Peak bytes allocated on the CPU while ``fn()`` runs, above those allocated before: each allocation is
    the own memory of the op that made it, each free a ``[memory]`` event, replayed in time order."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
    level = peak = 0
    for event in events:
        level += event.self_cpu_memory_usage
        peak = max(peak, level)
    return peak


def main() -> None:
    args = parse_args()
    if args.prompt_len + args.new_tokens > args.block_size:
        raise SystemExit(f"--prompt-len + --new-tokens must fit --block-size {args.block_size}")
    use_threads(args)
    prompt = torch.randint(
        0, args.vocab_size, (args.batch_size, args.prompt_len), generator=torch.Generator().manual_seed(1)
    )
    print(
        f"KV-cache memory, greedy decode (fp32): n_layer={args.n_layer} d_model={args.d_model} "
        f"n_head={args.n_head} vocab={args.vocab_size} batch={args.batch_size} "
        f"prompt={args.prompt_len} new tokens={args.new_tokens}"
    )
    print(f"{'n_kv_head':>9}{'cache MiB':>12}{'falls':>8}{'peak MiB':>12}{'falls':>8}")
    baseline = None
    for n_kv_head in args.kv_heads:
        args.n_kv_head = n_kv_head
        torch.manual_seed(0)
        model = GPT(our_config(args)).eval()
        # sized as generate sizes it: the last new token is never fed back
        caches = model.new_caches(args.batch_size, args.prompt_len + args.new_tokens - 1)
        cache = sum(c.self_attn.k.nbytes + c.self_attn.v.nbytes for c in caches)
        del caches
        with torch.no_grad():
            peak = peak_allocated(
                lambda model=model: generate(
                    model, prompt, max_new_tokens=args.new_tokens, temperature=0, use_cache=True
                )
            )
        baseline = baseline or (cache, peak)
        print(
            f"{n_kv_head:>9}{cache / 2**20:>12.1f}{baseline[0] / cache:>7.2f}x"
            f"{peak / 2**20:>12.1f}{baseline[1] / peak:>7.2f}x"
        )


if __name__ == "__main__":
    main()
