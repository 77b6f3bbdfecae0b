"""What the GPT benchmarks share: model-size flags, and our GPT plus HF GPT-2 (``--layout llama``: HF
``LlamaForCausalLM``) holding the same weights."""

from __future__ import annotations

import argparse

import torch

from lit_transformers.models import GPT, GPTConfig


def add_model_args(p: argparse.ArgumentParser, block_size: int, block_size_help: str) -> None:
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--d-model", type=int, default=384)
    p.add_argument("--n-head", type=int, default=6)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument(
        "--layout",
        default="gpt2",
        choices=["gpt2", "llama"],
        help="llama: RMSNorm, SwiGLU (d_ff ~8/3 d_model), RoPE, untied head, against HF LlamaForCausalLM",
    )
    p.add_argument(
        "--n-kv-head", type=int, default=None, help="llama layout: key/value heads (default n_head)"
    )
    p.add_argument("--block-size", type=int, default=block_size, help=block_size_help)
    p.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)"
    )


def use_threads(args: argparse.Namespace) -> None:
    """``--threads``, before anything is measured (the matmul rate too)."""
    if args.threads:
        torch.set_num_threads(args.threads)


def our_config(args: argparse.Namespace) -> GPTConfig:
    """The ``GPTConfig`` the model flags describe (``--layout``: GPT-2's or Llama's)."""
    llama = {
        "norm": "rmsnorm",
        "gated_mlp": True,
        "activation": "silu",
        "position": "rope",
        "bias": False,
        "tie_embeddings": False,
        "n_kv_head": args.n_kv_head,
        "d_ff": -(-8 * args.d_model // 3 // 64) * 64,  # Llama's ~8/3 d_model, a multiple of 64
    }
    return GPTConfig(
        vocab_size=args.vocab_size,
        block_size=args.block_size,
        n_layer=args.n_layer,
        n_head=args.n_head,
        d_model=args.d_model,
        dropout=0.0,
        **({"activation": getattr(args, "activation", "gelu")} if args.layout == "gpt2" else llama),
    )


def same_weight_pair(args: argparse.Namespace) -> tuple[GPT, torch.nn.Module]:
    """Ours and ``transformers.GPT2LMHeadModel`` exported from it (Conv1D, HF's attention path), computing
    the same function: HF's activation is ATen's GELU, exact or tanh like ours (``args.activation``). With
    ``--layout llama``, ``LlamaForCausalLM`` (SDPA attention, ATen's SiLU, as ours)."""
    use_threads(args)
    torch.manual_seed(0)
    config = our_config(args)
    ours = GPT(config)
    hf = ours.to_hf()
    if config.activation == "gelu_tanh":  # to_hf writes GPT-2's gelu_new, a slower Python version of the same
        from transformers.activations import ACT2FN

        for block in hf.transformer.h:
            block.mlp.act = ACT2FN["gelu_pytorch_tanh"]
    return ours, hf
