"""Training-step time of LoRA SFT against full SFT, and of our LoRA step against peft's on the equivalent Hugging
Face model, all four holding the same weights and computing the same loss:

- ``full``: our GPT, every weight trained (``task.lora=null``);
- ``lora``: the same GPT with ``task.lora``'s adapters (``tasks.lora.add_adapters``, peft's LoRA layers on our
  fused projections, the default targets), its base frozen;
- ``peft``: ``transformers.LlamaForCausalLM`` exported from our GPT (``--layout gpt2``: ``GPT2LMHeadModel``) with
  our adapters loaded through ``PeftModel.from_pretrained`` (``tasks.lora_export.save_peft_adapter``: on HF's separate
  q/k/v and gate/up projections, each its copy of our shared A and its rows of B), so the same function at
  identical numerics (fp32, SDPA, ATen's SiLU); the first-batch losses are printed to show it.

    python benchmarks/lora_step.py                                 # llama_mini's shape, batch 8 x 256
    python benchmarks/lora_step.py --batch-sizes 4 16 --block-sizes 512 --lora-r 16 --rounds 8

Each model steps AdamW over what trains (``gpt_step.make_step``), on the same batches; the models are timed in
rounds (``timing.quiet_rounds``: rotating order, busy rounds discarded and counted). Prints tokens/s (median over
kept rounds) and per-round ratios (median, min, max): lora/full, and lora/peft (>= 1 where ours is faster).
The B matrices start random (peft starts them at zero): the adapters then change the function, as after training.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile

import torch
from gpt_step import fused_head_loss, hf_loss, make_step
from timing import add_round_args, kept_note, quiet_rounds, ratio_spread
from torch import nn

from lit_transformers.tasks.lora import LoRASpec, add_adapters
from lit_transformers.tasks.lora_export import save_peft_adapter

from gpt_pair import add_model_args, same_weight_pair


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p, block_size=256, block_size_help="(unused: see --block-sizes)")
    p.set_defaults(layout="llama", n_kv_head=2)  # conf/model/llama_mini.yaml: 6 x 384, 6 heads, 2 kv heads
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[8])
    p.add_argument("--block-sizes", type=int, nargs="+", default=[256])
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--steps", type=int, default=2, help="timed optimizer steps per model per round")
    add_round_args(p, rounds=5, max_rounds=40)  # per configuration
    return p.parse_args()


def models(args: argparse.Namespace) -> dict[str, tuple[nn.Module, object]]:
    """The three models of one configuration, each with the loss it trains on."""
    import peft

    full, hf = same_weight_pair(args)
    ours = add_lora(copy.deepcopy(full), args.lora_r)
    with tempfile.TemporaryDirectory() as adapter:
        save_peft_adapter(ours, adapter)
        hf = peft.PeftModel.from_pretrained(hf, adapter, is_trainable=True)
    return {"full": (full, fused_head_loss), "lora": (ours, fused_head_loss), "peft": (hf, hf_loss)}


def add_lora(model: nn.Module, r: int) -> nn.Module:
    add_adapters(model, LoRASpec(r=r, alpha=2 * r), "model")
    for name, param in model.named_parameters():
        if "lora_B" in name:
            nn.init.normal_(param, std=0.02)
    return model


def measure(args: argparse.Namespace, batch_size: int, block_size: int) -> None:
    args.block_size = block_size
    compared = models(args)
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, args.vocab_size, (args.steps, batch_size, block_size + 1), generator=g)
    batches = [(d[:, :-1].contiguous(), d[:, 1:].contiguous()) for d in data]
    with torch.no_grad():  # identical numerics: lora and peft, the same loss before any step
        first = {name: loss_of(m.train(), *batches[0]).item() for name, (m, loss_of) in compared.items()}
    steps = {name: make_step(m, loss_of, fused=True) for name, (m, loss_of) in compared.items()}
    for step in steps.values():  # warm-up: allocator, optimizer state
        step(*batches[0])
    tokens = args.steps * batch_size * block_size
    run_all = {name: (lambda step=step: [step(x, y) for x, y in batches]) for name, step in steps.items()}
    seconds, busy = quiet_rounds(run_all, args)
    trained = {
        name: sum(p.numel() for p in m.parameters() if p.requires_grad) for name, (m, _) in compared.items()
    }
    print(f"\nbatch {batch_size} x context {block_size}: {kept_note(seconds, busy)}")
    print("  first-batch loss " + ", ".join(f"{name} {loss:.6f}" for name, loss in first.items()))
    if not seconds["lora"]:
        return
    rates = {name: [tokens / t for t in times] for name, times in seconds.items()}
    print(f"  {'model':<7}{'trained':>11}{'median tok/s':>14}{'min':>9}{'max':>9}")
    for name, values in rates.items():
        print(
            f"  {name:<7}{trained[name] / 1e6:>10.3f}M{statistics.median(values):>14.0f}{min(values):>9.0f}"
            f"{max(values):>9.0f}"
        )
    for peer in ("full", "peft"):
        ratio, low, high = ratio_spread(rates["lora"], rates[peer])
        print(f"  lora / {peer} tokens/s per round: {ratio:.3f}x ({low:.3f}-{high:.3f})")


def main() -> None:
    args = parse_args()
    print(
        f"SFT training step, fp32, {torch.get_num_threads()} threads, layout {args.layout}, n_layer={args.n_layer} "
        f"d_model={args.d_model} n_head={args.n_head} n_kv_head={args.n_kv_head} vocab={args.vocab_size}, "
        f"LoRA r={args.lora_r} alpha={2 * args.lora_r} on attn.qkv_proj, attn.out_proj, mlp.fc, mlp.proj, AdamW fused"
    )
    for batch_size in args.batch_sizes:
        for block_size in args.block_sizes:
            measure(args, batch_size, block_size)


if __name__ == "__main__":
    main()
