"""Training-step throughput of our GPT vs ``transformers.GPT2LMHeadModel`` at an identical config.

    python benchmarks/gpt_step.py                 # eager, defaults: 6 layers, d_model 384, context 256
    python benchmarks/gpt_step.py --compile       # torch.compile both models (our config: task.compile=true)
    python benchmarks/gpt_step.py --compile ours  # our compiled model vs HF eager

Both models start from the same weights (ours exported with ``to_hf``), see the same batches, use the
same loss (next-token cross-entropy on the logits) and the same AdamW settings. Runs alternate between
the two models; the ratio printed is the median over repeats. Also prints model FLOPs utilisation:
achieved training FLOP/s (6 N per token + the attention term) over this machine's measured fp32 matmul FLOP/s.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from gpt_pair import add_model_args, same_weight_pair


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p, block_size=256, block_size_help="context length of every training sequence")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=2, help="timed optimizer steps per run")
    p.add_argument("--repeats", type=int, default=5, help="alternating (ours, HF) run pairs")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model before timing")
    p.add_argument(
        "--compile",
        nargs="?",
        const="both",
        choices=["both", "ours"],
        default=None,
        help="torch.compile both models (default when given) or only ours (task.compile=true) vs eager HF",
    )
    return p.parse_args()


def matmul_flops(n: int = 2048, repeats: int = 5) -> float:
    """Best fp32 matmul FLOP/s of this machine on an n x n x n product."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def make_step(model, logits_of, optimizer):
    def step(x, y):
        logits = logits_of(model, x)  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def timed(step, batches) -> float:
    t0 = time.perf_counter()
    for x, y in batches:
        step(x, y)
    return time.perf_counter() - t0


def main() -> None:
    args = parse_args()
    ours, hf = same_weight_pair(args)
    ours, hf = ours.train(), hf.train()
    models = {
        "ours": (ours, lambda m, x: m(x)),
        "hf": (hf, lambda m, x: m(input_ids=x, use_cache=False).logits),
    }
    steps = {}
    for name, (model, logits_of) in models.items():
        # identical optimizer settings for both (torch's default multi-tensor AdamW on CPU)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
        if args.compile == "both" or (args.compile == "ours" and name == "ours"):
            model = torch.compile(model)
        steps[name] = make_step(model, logits_of, optimizer)

    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, args.vocab_size, (args.steps, args.batch_size, args.block_size + 1), generator=g)
    batches = [(d[:, :-1].contiguous(), d[:, 1:].contiguous()) for d in data]
    for step in steps.values():
        timed(step, batches[:1] * args.warmup)

    tokens = args.steps * args.batch_size * args.block_size
    rates = {"ours": [], "hf": []}
    for r in range(args.repeats):
        order = ("ours", "hf") if r % 2 == 0 else ("hf", "ours")  # alternate who runs first
        for name in order:
            rates[name].append(tokens / timed(steps[name], batches))
    ratios = [o / h for o, h in zip(rates["ours"], rates["hf"])]

    n_params = ours.num_params(non_embedding=True)  # tied token embedding counted once (it is the LM head)
    L, T, d = args.n_layer, args.block_size, args.d_model
    flops_per_token = 6 * n_params + 12 * L * T * d  # forward+backward matmuls + attention scores/values
    peak = matmul_flops()
    mode = {None: "eager", "both": "torch.compile both", "ours": "torch.compile ours, HF eager"}[args.compile]
    print(f"\nGPT training step  ({mode}, fp32, {torch.get_num_threads()} threads)")
    print(
        f"config: n_layer={L} d_model={d} n_head={args.n_head} block_size={T} vocab={args.vocab_size} "
        f"batch={args.batch_size}  params={n_params / 1e6:.2f}M  steps/run={args.steps} repeats={args.repeats}"
    )
    print(f"{'model':<8}{'median tok/s':>14}{'min':>10}{'max':>10}{'TFLOP/s':>10}{'MFU':>8}")
    for name in ("ours", "hf"):
        med = statistics.median(rates[name])
        achieved = med * flops_per_token
        print(
            f"{name:<8}{med:>14.0f}{min(rates[name]):>10.0f}{max(rates[name]):>10.0f}"
            f"{achieved / 1e12:>10.3f}{achieved / peak:>8.1%}"
        )
    print(f"measured fp32 matmul peak (2048^3): {peak / 1e12:.3f} TFLOP/s")
    print(f"ratio ours/hf per repeat: {' '.join(f'{x:.3f}' for x in ratios)}")
    print(f"median speedup ours/hf: {statistics.median(ratios):.3f}x  (target >= 1.1x)")


if __name__ == "__main__":
    main()
