"""GPT: a decoder-only Transformer for causal language modelling (nanoGPT spirit). One model, whose config
names the variant (litgpt's approach): the GPT-2 layout by default; RMSNorm, a SwiGLU MLP, grouped-query
attention, RoPE with a base and Hugging Face's scalings, q/k/v biases, a sliding window (on every layer or on
some) and an untied head make the Llama / Qwen2 / Mistral layouts (presets ``conf/model/llama_*.yaml``,
``qwen2_nano.yaml``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from lit_transformers.nn import (
    TRAINING_FLOPS_PER_WEIGHT,
    DecoderBlock,
    KVCache,
    LayerCache,
    LMHead,
    RotaryEmbedding,
    absolute_positions,
    attention_flops,
    check_rope_scaling,
    linear_cross_entropy,
    norm_layer,
    token_embedding,
)

if TYPE_CHECKING:
    from lit_transformers.text import Tokenizer


# the kinds of attention layer a GPT has, by Hugging Face's names (config.json's layer_types)
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass
class GPTConfig:
    vocab_size: int | None = None  # None: the task takes its tokenizer's size (GPT-2 pads 50257 to 50304)
    block_size: int = 256  # longest context the model sees
    n_layer: int = 6
    n_head: int = 6
    d_model: int = 384
    d_ff: int | None = None  # FFN width (gated: the intermediate size); None means 4 * d_model
    dropout: float = 0.0  # residual, embedding and attention dropout
    bias: bool = True  # biases in Linear and LayerNorm (GPT-2: True; Llama: False)
    activation: str = "gelu"  # exact GELU (nanoGPT); GPT-2 checkpoints use "gelu_tanh" (from_hf sets it)
    position: str = "learned"  # learned | sinusoidal | rope
    tie_embeddings: bool = True  # share token embedding and output projection (GPT-2, Press & Wolf 2017)
    norm_eps: float = 1e-5
    norm: str = "layernorm"  # layernorm (GPT-2) | rmsnorm (Llama, Qwen2, Mistral)
    gated_mlp: bool = False  # gated FFN proj(act(x W_gate) * x W_up): SwiGLU with activation=silu (Llama)
    n_kv_head: int | None = None  # key/value heads: None = n_head; fewer = grouped-query; 1 = multi-query
    head_dim: int | None = (
        None  # width of each head; None = d_model / n_head (some Qwen3/Mistral sizes differ)
    )
    qkv_bias: bool | None = None  # biases of the q/k/v projections; None = bias (Qwen2: true with bias=false)
    rope_theta: float = 10000.0  # RoPE base (position=rope; Llama 3: 500000)
    rope_scaling: dict | None = None  # HF's, e.g. {rope_type: linear, factor: 4.0}: linear|dynamic|llama3
    sliding_window: int | None = None  # attend to the latest this many tokens, itself included (Mistral)
    # per layer, Hugging Face's names: "sliding_attention" (the window) or "full_attention"; None: every layer
    # windowed when sliding_window is set (Qwen2 windows its layers from max_window_layers on)
    layer_types: list[str] | None = None
    # training: recompute each block's activations in the backward pass instead of keeping them (less memory,
    # about a third more compute); a setting of how it trains, not of the weights
    activation_checkpointing: bool = False

    @property
    def head_size(self) -> int:
        """Each attention head's width: ``head_dim``, else ``d_model / n_head``."""
        return self.head_dim or self.d_model // self.n_head

    def window(self, layer: int) -> int | None:
        """The sliding window of block ``layer`` (None: it attends to every earlier token)."""
        if self.layer_types is not None and self.layer_types[layer] == "full_attention":
            return None
        return self.sliding_window

    def check_layer_types(self) -> None:
        """Refuse ``layer_types`` of another length than ``n_layer``, of a kind we do not compute, or naming a
        window that ``sliding_window`` does not size."""
        if self.layer_types is None:
            return
        unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if len(self.layer_types) != self.n_layer or unknown or self.sliding_window is None:
            raise ValueError(
                f"layer_types={list(self.layer_types)} must name each of the n_layer={self.n_layer} layers "
                f"{' or '.join(map(repr, LAYER_TYPES))}{f' (not {unknown})' if unknown else ''}, with "
                f"sliding_window set (it is {self.sliding_window}); or set layer_types=null to window every "
                "layer alike"
            )


class GPT(nn.Module):
    """Token + position embeddings -> n_layer pre-norm decoder blocks -> final norm (the body,
    :meth:`hidden_states`) -> LM head, tied to the token embedding or not (:meth:`forward`).

    Other heads (a reward model's or PPO value's ``nn.ScalarHead``) read :meth:`hidden_states` directly.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        if config.position != "rope" and (config.rope_scaling or config.rope_theta != 10000.0):
            raise ValueError(
                f"rope_theta/rope_scaling set with position={config.position!r}; set position=rope or drop them"
            )
        check_rope_scaling(config.rope_scaling)
        config.check_layer_types()
        self.config = config
        self.tok_emb = token_embedding(config.vocab_size, config.d_model)
        self.pos_emb = absolute_positions(config.position, config.block_size, config.d_model)
        self.rotary = (
            RotaryEmbedding(config.head_size, config.block_size, config.rope_theta, config.rope_scaling)
            if config.position == "rope"
            else None
        )
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            DecoderBlock(
                config.d_model,
                config.n_head,
                d_ff=config.d_ff,
                dropout=config.dropout,
                attn_dropout=config.dropout,
                activation=config.activation,
                norm_first=True,
                bias=config.bias,
                norm_eps=config.norm_eps,
                norm=config.norm,
                gated_mlp=config.gated_mlp,
                n_kv_head=config.n_kv_head,
                qkv_bias=config.qkv_bias,
                sliding_window=config.window(i),
                head_dim=config.head_dim,
            )
            for i in range(config.n_layer)
        )
        self.ln_f = norm_layer(config.norm, config.d_model, config.norm_eps, config.bias)
        self.lm_head = LMHead(config.d_model, config.vocab_size)
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        # GPT-2: scale the init of projections that write into the residual stream by 1/sqrt(2 * n_layer),
        # so the residual variance does not grow with depth
        for name, param in self.named_parameters():
            if name.endswith(("attn.out_proj.weight", "mlp.proj.weight")):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and isinstance(self.pos_emb, nn.Module):
            n -= sum(p.numel() for p in self.pos_emb.parameters())
        return n

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token of a ``seq_len``-token sequence (default: block_size): 6 per weight (forward +
        backward matmuls) plus the attention scores and weighted values, 12 * n_layer * seq_len * n_head *
        head_size (PaLM, appendix B, where n_head * head_size = d_model; ``nn.flops``). An untied token embedding
        is a lookup, not a matmul: left out."""
        return self.weight_flops_per_token() + self.attention_flops_per_token(seq_len)

    def weight_flops_per_token(self) -> int:
        """The weights' part of :meth:`flops_per_token`: fixed for a run, but a walk over the parameters."""
        weights = self.num_params(non_embedding=True)
        if not self.config.tie_embeddings:
            weights -= self.tok_emb.weight.numel()
        return TRAINING_FLOPS_PER_WEIGHT * weights

    def attention_flops_per_token(self, seq_len: int | None = None) -> int:
        """The attention's part of :meth:`flops_per_token`, the one that grows with the sequence's length."""
        c = self.config
        return attention_flops(c.n_layer, seq_len or c.block_size, c.n_head * c.head_size)

    def new_caches(self, batch_size: int, max_len: int, device=None, dtype=None) -> list[LayerCache]:
        """Empty per-layer KV caches for incremental decoding (see ``lit_transformers.nn.generate``): each
        holds the ``n_kv_head`` key/value heads, not ``n_head`` (grouped-query attention's memory saving)."""
        if max_len > self.config.block_size:
            raise ValueError(
                f"Prompt + new tokens = {max_len} exceeds block_size {self.config.block_size}; "
                "shorten the prompt or lower max_new_tokens"
            )
        c = self.config
        return [
            LayerCache(KVCache(batch_size, c.n_kv_head or c.n_head, max_len, c.head_size, device, dtype))
            for _ in range(c.n_layer)
        ]

    def hidden_states(
        self,
        idx: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        caches: list[LayerCache] | None = None,
    ) -> torch.Tensor:
        """idx: (B, T) token ids -> final-norm hidden states (B, T, d_model).

        ``position_ids`` (B, T) default to 0..T-1 after any cached tokens; ``mask`` (B, 1, T, T_k) bool
        adds key padding on top of the causal mask (``nn.padded_attention_mask``).
        """
        B, T = idx.shape
        start = caches[0].self_attn.length if caches else 0
        if start + T > self.config.block_size:
            raise ValueError(f"Sequence of length {start + T} exceeds block_size {self.config.block_size}")
        if position_ids is None:
            position_ids = torch.arange(start, start + T, device=idx.device)[None]  # (1, T)
        x = self.tok_emb(idx)  # (B, T, d_model)
        if self.pos_emb is not None:
            x = x + self.pos_emb(position_ids)
        x = self.drop(x)
        recompute = self.config.activation_checkpointing and self.training and torch.is_grad_enabled()
        for i, block in enumerate(self.blocks):
            inputs = {"mask": mask, "rotary": self.rotary, "position_ids": position_ids}
            if recompute:  # the RNG state is saved, so dropout draws the same masks when recomputing
                x = checkpoint(block, x, **inputs, use_reentrant=False)
            else:
                x = block(x, **inputs, cache=caches[i] if caches else None)
        return self.ln_f(x)

    def forward(
        self,
        idx: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        caches: list[LayerCache] | None = None,
        last_only: bool = False,
        labels: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """idx: (B, T) -> logits (B, T, vocab_size), or (B, 1, vocab_size) with ``last_only`` (generation's
        prefill needs only the next token, and projecting a long prompt to the vocabulary is wasted work).

        With ``labels`` (B, T) (``IGNORE_INDEX`` where a position has no target), as nanoGPT's
        ``forward(idx, targets)``: the loss instead, as (summed next-token cross-entropy, number of labelled
        positions), over every position (``last_only`` does not apply). The LM head and the loss then run
        fused, a chunk of positions at a time (``nn.linear_cross_entropy``): faster than logits followed by
        ``F.cross_entropy``, and the (B, T, vocab_size) logits are never held. Training goes through
        ``forward`` (not a separate method), so that ``compile=true`` compiles it.
        """
        hidden = self.hidden_states(idx, position_ids, mask, caches)
        if labels is not None:
            return linear_cross_entropy(hidden, self.lm_head.weight, labels)
        return self.lm_head(hidden[:, -1:] if last_only else hidden)

    # ---- Hugging Face interoperability: GPT-2, Llama, Qwen2, Mistral -------------------------

    @classmethod
    def from_hf(cls, path_or_model, trust_checkpoint: bool = False, dtype: torch.dtype | None = None) -> GPT:
        """Load a Hugging Face causal LM (``hf_decoder.DECODERS``): a local directory (config.json + weights) or
        a ``transformers`` model object. ``dtype`` None keeps the checkpoint's (its config's ``torch_dtype``);
        ``trust_checkpoint`` allows a ``pytorch_model.bin`` that needs arbitrary unpickling."""
        from lit_transformers.models.hf_decoder import decoder_converter

        return decoder_converter(path_or_model).from_hf(cls, path_or_model, trust_checkpoint, dtype)

    def hf_converter(self):
        """The converter module this config exports through: ``hf_gpt2`` (the GPT-2 layout) or ``hf_llama``."""
        from lit_transformers.models import hf_gpt2, hf_llama

        c = self.config
        if c.norm == "layernorm" and c.head_size * c.n_head != c.d_model:
            raise ValueError(
                f"GPT-2 has no head_dim of its own: head_dim={c.head_dim} with n_head={c.n_head} and "
                f"d_model={c.d_model} does not export; the Llama layout (norm=rmsnorm) does"
            )
        return hf_gpt2 if c.norm == "layernorm" else hf_llama

    def to_hf(self, save_dir: str | Path | None = None, tokenizer: Tokenizer | None = None):
        """Export as ``transformers`` ``GPT2LMHeadModel`` (the GPT-2 layout) or ``LlamaForCausalLM`` /
        ``Qwen2ForCausalLM`` (q/k/v biases) / ``MistralForCausalLM`` (a sliding window), and
        ``save_pretrained`` it when save_dir is given. Our config holds no token ids: given the ``tokenizer`` the
        model was trained with, config.json carries its bos/eos/pad ids (None for a role it lacks) and
        generation_config.json stops at any of its ``end_of_turn_ids``, as instruct models ship; without one
        they stay unset (GPT-2's 50256 in a GPT-2-size vocabulary)."""
        hf_model = self.hf_converter().to_hf(self)
        if tokenizer is not None:
            import transformers

            special = {f"{role}_token_id": tokenizer.ids.get(role) for role in ("bos", "eos", "pad")}
            hf_model.config.update(special)
            hf_model.generation_config = transformers.GenerationConfig(
                **special | {"eos_token_id": tokenizer.end_of_turn_ids}
            )
        if save_dir is not None:
            hf_model.save_pretrained(str(save_dir))
        return hf_model
