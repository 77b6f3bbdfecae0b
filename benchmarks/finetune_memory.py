"""Memory of supervised fine-tuning (SFT) of Hub decoders, computed from their shapes: full fine-tuning with AdamW
against LoRA, with the activations measured (``--tokens`` positions, with and without
``model.activation_checkpointing``), and which sizes fit one machine of ``--memory-gb``.

    python benchmarks/finetune_memory.py                         # batch 8 x 1024 tokens, 24 GB
    python benchmarks/finetune_memory.py --batch-size 4 --context 2048 --lora-r 16

Bytes per parameter (weights, gradients, AdamW's two moments): fp32 and ``trainer.precision=bf16-mixed`` (fp32
master weights, autocast computes in bf16) 4 + 4 + 4 + 4 = 16; ``bf16-true`` 2 + 2 + 2 + 2 = 8. LoRA
(``task.lora``, adapters on ``attn.qkv_proj``, ``attn.out_proj``, ``mlp.fc`` and ``mlp.proj``, the default):
the frozen base's weights only (4, or 2 in bf16) plus 16 per adapter parameter (r x (in + out) per projection).

Every model is built on torch's ``meta`` device (shapes only, no memory): its parameter count is ours, and its
activations are the bytes of the tensors one fp32 training forward of the body saves for the backward pass
(``saved_tensors_hooks``, each storage once, the weights excluded), one sequence of ``--tokens`` positions.
With checkpointing a block keeps only its input; its own activations exist again while its backward recomputes
them, so the peak adds one block's worth (the whole body's divided by ``n_layer``). Not counted: one chunk of
logits of the fused LM-head loss, the data, the allocator's slack.
"""

from __future__ import annotations

import argparse

import torch

from lit_transformers.models import GPT, GPTConfig
from lit_transformers.tasks.lora import PROJECTIONS

LLAMA = {"norm": "rmsnorm", "gated_mlp": True, "activation": "silu", "position": "rope", "bias": False}
# from each checkpoint's config.json: num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads,
# intermediate_size, vocab_size, tie_word_embeddings (Qwen2: attention_bias, q/k/v biases)
MODELS = {
    "SmolLM2-135M": dict(n_layer=30, d_model=576, n_head=9, n_kv_head=3, d_ff=1536, vocab_size=49152),
    "SmolLM2-360M": dict(n_layer=32, d_model=960, n_head=15, n_kv_head=5, d_ff=2560, vocab_size=49152),
    "Qwen2.5-0.5B": dict(
        n_layer=24, d_model=896, n_head=14, n_kv_head=2, d_ff=4864, vocab_size=151936, qkv_bias=True
    ),
    "TinyLlama-1.1B": dict(
        n_layer=22, d_model=2048, n_head=32, n_kv_head=4, d_ff=5632, vocab_size=32000, tie_embeddings=False
    ),
    "Llama-3.2-1B": dict(n_layer=16, d_model=2048, n_head=32, n_kv_head=8, d_ff=8192, vocab_size=128256),
    "Qwen2.5-1.5B": dict(
        n_layer=28, d_model=1536, n_head=12, n_kv_head=2, d_ff=8960, vocab_size=151936, qkv_bias=True
    ),
    "SmolLM2-1.7B": dict(n_layer=24, d_model=2048, n_head=32, n_kv_head=32, d_ff=8192, vocab_size=49152),
    "Llama-3.2-3B": dict(n_layer=28, d_model=3072, n_head=24, n_kv_head=8, d_ff=8192, vocab_size=128256),
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=1024, help="positions of the measured forward")
    p.add_argument("--lora-r", type=int, default=8, help="task.lora.r (the default: 8)")
    p.add_argument("--memory-gb", type=float, default=24.0)
    return p.parse_args()


def meta_model(shape: dict, tokens: int, checkpointing: bool) -> GPT:
    config = GPTConfig(**(LLAMA | shape), block_size=tokens, activation_checkpointing=checkpointing)
    with torch.device("meta"):
        return GPT(config).train()


def saved_bytes(model: GPT, tokens: int) -> int:
    """Bytes of the tensors a training forward of ``tokens`` positions keeps for backward (weights excluded)."""
    weights = {id(p) for p in model.parameters()}
    saved: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        base = t if t._base is None else t._base
        if id(base) not in weights:
            saved[id(base)] = base.nbytes
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model(torch.zeros(1, tokens, dtype=torch.long, device="meta"))  # body + LM head; no loss
    return sum(saved.values())


def lora_params(model: GPT, r: int) -> int:
    return sum(
        r * (m.in_features + m.out_features)
        for name, m in model.named_modules()
        if any(name.endswith(target) for target in PROJECTIONS)
    )


def main() -> None:
    args = parse_args()
    tokens = args.batch_size * args.context
    print(
        f"SFT memory per model (GB = 1e9 bytes): batch {args.batch_size} x context {args.context} = {tokens} "
        f"tokens; activations fp32, measured on {args.tokens} positions; LoRA r={args.lora_r}; fits: "
        f"<= {args.memory_gb:g} GB with checkpointing"
    )
    head = ("model", "params", "full fp32", "full bf16", "LoRA fp32", "LoRA bf16", "act", "act ckpt", "fits")
    print(f"{head[0]:<15}{head[1]:>8}" + "".join(f"{h:>11}" for h in head[2:]))
    for name, shape in MODELS.items():
        model = meta_model(shape, args.tokens, checkpointing=False)
        n, adapters = model.num_params(), lora_params(model, args.lora_r)
        full = saved_bytes(model, args.tokens) / args.tokens * tokens
        stored = saved_bytes(meta_model(shape, args.tokens, checkpointing=True), args.tokens)
        checkpointed = (stored / args.tokens * tokens) + full / shape["n_layer"]
        states = {"full fp32": 16 * n, "full bf16": 8 * n, "LoRA fp32": 4 * n, "LoRA bf16": 2 * n}
        states = {k: v + (16 * adapters if k.startswith("LoRA") else 0) for k, v in states.items()}
        fits = [k for k, v in states.items() if v + checkpointed <= args.memory_gb * 1e9]
        print(
            f"{name:<15}{n / 1e6:>7.0f}M"
            + "".join(f"{v / 1e9:>11.1f}" for v in states.values())
            + f"{full / 1e9:>11.1f}{checkpointed / 1e9:>11.1f}  {', '.join(fits) or 'none'}"
        )


if __name__ == "__main__":
    main()
