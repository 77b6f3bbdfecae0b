"""Training-step throughput of our GPT against two peers holding the same weights, on the same batches, each
computing the mean next-token loss its own way:

- ``ours``: ``GPT(idx, labels=...)`` as our tasks train (the LM head fused with the cross-entropy, a chunk
  of positions at a time: ``nn.linear_cross_entropy``);
- ``hf``: ``transformers.GPT2LMHeadModel(input_ids, labels, shift_labels)`` at identical numerics (its
  activation is ATen's, as ours: ``gelu`` or ``gelu_pytorch_tanh``; HF's default ``gelu_new`` is Python code
  and would flatter us); logits, then its ``ForCausalLMLoss``. ``--layout llama``: our Llama layout against
  ``LlamaForCausalLM`` (SDPA, SiLU), ``--n-kv-head`` for grouped-query attention;
- ``nanogpt``: nanoGPT's ``model.py`` architecture, re-created in ``nanogpt.py`` (fused QKV, SDPA, exact GELU,
  tied head; logits, then ``F.cross_entropy``), compared when our activation is ``gelu`` (the default).
  ``--no-fused-loss`` trains ours the same way (logits, then ``F.cross_entropy``): the model bodies alone.

    python benchmarks/gpt_step.py                                  # batch 4, 8, 16 x context 256, 512
    python benchmarks/gpt_step.py --batch-sizes 16 --block-sizes 256 --rounds 8
    python benchmarks/gpt_step.py --activation gelu_tanh           # GPT-2's activation (no nanoGPT peer)
    python benchmarks/gpt_step.py --layout llama --n-kv-head 2     # the Llama layout vs LlamaForCausalLM
    python benchmarks/gpt_step.py --batch-sizes 8 --block-sizes 256 --rounds 1 --profile 15   # where time goes

Every model steps the same AdamW (fused where torch supports it, our default; ``--no-fused`` for the
for-each path). The models are timed in rounds (``timing.quiet_rounds``: rotating order, busy rounds discarded
and counted). Prints tokens/s (median over kept rounds), model FLOPs utilisation against a large-matmul rate
measured in the same run, and ours/peer ratios per round (median, min, max), in which the machine's drift
between rounds cancels.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from nanogpt import NanoGPT
from timing import add_round_args, kept_note, quiet_rounds, ratio_spread

from lit_transformers.callbacks.throughput import matmul_flops
from lit_transformers.nn import token_mean

from gpt_pair import add_model_args, same_weight_pair, use_threads


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p, block_size=256, block_size_help="(unused: see --block-sizes)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--block-sizes", type=int, nargs="+", default=[256, 512])
    p.add_argument("--activation", default="gelu", choices=["gelu", "gelu_tanh"])
    p.add_argument("--no-fused", action="store_true", help="AdamW's for-each path instead of fused")
    p.add_argument(
        "--no-fused-loss", action="store_true", help="ours: logits, then F.cross_entropy (as the peers)"
    )
    p.add_argument("--steps", type=int, default=2, help="timed optimizer steps per model per round")
    add_round_args(p, rounds=5, max_rounds=40)  # per configuration
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="then print the N ops of each step taking most CPU time",
    )
    return p.parse_args()


def fused_head_loss(model, x, y):
    return token_mean(*model(x, labels=y))


def logits_loss(model, x, y):
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def hf_loss(model, x, y):
    return model(input_ids=x, labels=y, shift_labels=y, use_cache=False).loss


def nanogpt_loss(model, x, y):
    return model(x, y)[1]


def make_step(model, loss_of, fused: bool):
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=fused
    )

    def step(x, y):
        loss = loss_of(model, x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def print_profile(name: str, step, batches, rows: int) -> None:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for x, y in batches:
            step(x, y)
    print(f"\n{name}, {len(batches)} steps under torch.profiler:")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def measure(args, batch_size: int, block_size: int, peak: float) -> None:
    args.block_size = block_size
    ours, hf = same_weight_pair(args)
    models = {"ours": (ours, logits_loss if args.no_fused_loss else fused_head_loss), "hf": (hf, hf_loss)}
    if args.activation == "gelu" and args.layout == "gpt2":
        models["nanogpt"] = (NanoGPT.from_ours(ours), nanogpt_loss)
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, args.vocab_size, (args.steps, batch_size, block_size + 1), generator=g)
    batches = [(d[:, :-1].contiguous(), d[:, 1:].contiguous()) for d in data]
    with torch.no_grad():  # identical numerics: the same loss before any step
        first = {name: loss_of(m.train(), *batches[0]).item() for name, (m, loss_of) in models.items()}
    steps = {name: make_step(m, loss_of, not args.no_fused) for name, (m, loss_of) in models.items()}
    for step in steps.values():  # warm-up: allocator, optimizer state
        step(*batches[0])

    tokens = args.steps * batch_size * block_size
    run_all = {name: (lambda step=step: [step(x, y) for x, y in batches]) for name, step in steps.items()}
    seconds, busy = quiet_rounds(run_all, args)
    rates = {name: [tokens / t for t in times] for name, times in seconds.items()}

    n_params = ours.num_params(non_embedding=True)
    flops = ours.flops_per_token()
    print(
        f"\nbatch {batch_size} x context {block_size}  ({n_params / 1e6:.2f}M params, {flops / 1e6:.1f} MFLOP/token)"
    )
    if not rates["ours"]:
        print(f"  {kept_note(seconds, busy)}")
        return
    print(
        f"  {kept_note(seconds, busy)}; first-batch loss "
        + ", ".join(f"{name} {loss:.6f}" for name, loss in first.items())
    )
    print(f"  {'model':<9}{'median tok/s':>13}{'min':>9}{'max':>9}{'MFU':>8}{'ours/model per round':>23}")
    for name, values in rates.items():
        med = statistics.median(values)
        ratio, low, high = ratio_spread(rates["ours"], values)
        print(
            f"  {name:<9}{med:>13.0f}{min(values):>9.0f}{max(values):>9.0f}{med * flops / peak:>8.1%}"
            f"{ratio:>11.3f}x ({low:.3f}-{high:.3f})"
        )
    for name, step in steps.items() if args.profile else ():
        print_profile(name, step, batches, args.profile)


def main() -> None:
    args = parse_args()
    use_threads(args)
    peak = matmul_flops()
    print(
        f"GPT training step, fp32, {torch.get_num_threads()} threads, layout {args.layout} (n_kv_head "
        f"{args.n_kv_head or args.n_head}), activation {args.activation if args.layout == 'gpt2' else 'silu'}, "
        f"AdamW {'for-each' if args.no_fused else 'fused'}, our loss "
        f"{'after the logits' if args.no_fused_loss else 'fused with the LM head'}; n_layer={args.n_layer} "
        f"d_model={args.d_model} n_head={args.n_head} vocab={args.vocab_size}"
    )
    print(f"measured fp32 matmul rate (2048^3): {peak / 1e12:.3f} TFLOP/s = MFU 100%")
    for batch_size in args.batch_sizes:
        for block_size in args.block_sizes:
            measure(args, batch_size, block_size, peak)


if __name__ == "__main__":
    main()
