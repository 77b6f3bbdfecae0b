"""nanoGPT's ``model.py`` architecture, re-created from its description as a benchmark peer.

Pre-norm blocks with a fused QKV projection (``c_attn``) and ``F.scaled_dot_product_attention(is_causal=True)``,
an MLP with exact GELU, learned positions, a final LayerNorm and an LM head tied to the token embedding.
As nanoGPT's, ``forward(idx, targets)`` computes logits at every position and their mean ``F.cross_entropy``
(``ignore_index=-1``). ``from_ours`` copies the weights of our GPT (same layouts).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lit_transformers.models import GPT


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, d_model: int):
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, d_model: int):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(block_size, d_model)
        self.h = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

    @classmethod
    def from_ours(cls, ours: GPT) -> NanoGPT:
        c = ours.config
        if (
            c.activation != "gelu"
            or c.position != "learned"
            or not c.bias
            or c.d_ff not in (None, 4 * c.d_model)
        ):
            raise ValueError(
                "nanoGPT's architecture needs activation=gelu, learned positions, biases, d_ff=4d"
            )
        peer = cls(c.vocab_size, c.block_size, c.n_layer, c.n_head, c.d_model)
        names = {"tok_emb.weight": "wte.weight", "pos_emb.weight": "wpe.weight", "ln_f.weight": "ln_f.weight"}
        names["ln_f.bias"] = "ln_f.bias"
        for i in range(c.n_layer):
            for ours_name, theirs in {
                "ln_1": "ln_1",
                "attn.qkv_proj": "attn.c_attn",
                "attn.out_proj": "attn.c_proj",
                "ln_2": "ln_2",
                "mlp.fc": "mlp.c_fc",
                "mlp.proj": "mlp.c_proj",
            }.items():
                for p in ("weight", "bias"):
                    names[f"blocks.{i}.{ours_name}.{p}"] = f"h.{i}.{theirs}.{p}"
        state = {theirs: ours.state_dict()[name] for name, theirs in names.items()}
        state["lm_head.weight"] = state["wte.weight"]
        peer.load_state_dict(state)
        return peer
