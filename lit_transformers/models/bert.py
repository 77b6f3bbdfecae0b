"""BERT: a bidirectional encoder-only Transformer (Devlin et al. 2019), the Hugging Face ``BertModel`` layout.

Token + learned position + segment embeddings, summed -> LayerNorm -> dropout -> n_layer post-norm encoder
blocks (no causal mask: every token attends to every real token) -> hidden states. The pooler reads the
[CLS] position, ``tanh(W h_[CLS])``; the optional pretraining heads predict masked tokens (MLM, decoder tied
to the word embeddings) and whether segment B follows segment A (NSP, on the pooled [CLS]).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from lit_transformers.nn import (
    TRAINING_FLOPS_PER_WEIGHT,
    EncoderBlock,
    LearnedPositions,
    MaskedLMHead,
    attention_flops,
    linear_weights,
    padding_mask,
    token_embedding,
)
from lit_transformers.nn.attention import recorded_attention


@dataclass
class BERTConfig:
    vocab_size: int | None = None  # None: the task takes its tokenizer's size (BERT's WordPiece: 30522)
    max_position: int = 512  # longest input, [CLS] and [SEP]s included
    type_vocab_size: int = 2  # segments: 0 for "[CLS] A [SEP]", 1 for "B [SEP]"
    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    d_ff: int = 3072  # FFN width (4 * d_model in every published size)
    dropout: float = 0.1  # embedding and residual dropout
    attn_dropout: float = 0.1  # dropout on attention probabilities
    activation: str = "gelu"  # exact GELU, as BERT; "gelu_tanh" for checkpoints trained with "gelu_new"
    norm_eps: float = 1e-12  # LayerNorm epsilon (BERT's 1e-12)
    pretraining_heads: bool = True  # MLM + NSP heads (pretraining); fine-tuning tasks build the body alone


class BERT(nn.Module):
    """Embeddings -> post-norm encoder blocks -> hidden states (:meth:`forward`); :meth:`pool` for [CLS];
    :meth:`mlm_logits` / :meth:`nsp_logits` when ``pretraining_heads``."""

    def __init__(self, config: BERTConfig):
        super().__init__()
        self.config = c = config
        self.tok_emb = token_embedding(c.vocab_size, c.d_model)
        self.pos_emb = LearnedPositions(c.max_position, c.d_model)
        self.type_emb = nn.Embedding(c.type_vocab_size, c.d_model)
        self.emb_norm = nn.LayerNorm(c.d_model, eps=c.norm_eps)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            EncoderBlock(
                c.d_model,
                c.n_head,
                d_ff=c.d_ff,
                dropout=c.dropout,
                attn_dropout=c.attn_dropout,
                activation=c.activation,
                norm_first=False,  # post-norm: LN(x + f(x)), as the original Transformer and BERT
                norm_eps=c.norm_eps,
            )
            for _ in range(c.n_layer)
        )
        self.pooler = nn.Linear(c.d_model, c.d_model)
        if c.pretraining_heads:
            self.mlm_head = MaskedLMHead(c.d_model, c.vocab_size, c.norm_eps, c.activation)
            self.mlm_head.decoder.weight = (
                self.tok_emb.weight
            )  # tied: the input and output vocabularies agree
            self.nsp_head = nn.Linear(c.d_model, 2)  # logits of (IsNext, NotNext)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        """BERT's init: N(0, 0.02) weights, zero biases, LayerNorm (1, 0)."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token of the encoder in a ``seq_len``-token batch: 6 per weight of the blocks'
        matmuls plus attention, 12 * n_layer * seq_len * d_model (``nn.flops``). The heads are left out: the
        pooler and NSP run once per sequence, the MLM head on the masked positions only."""
        return self.weight_flops_per_token() + self.attention_flops_per_token(seq_len)

    def weight_flops_per_token(self) -> int:
        """The weights' part of :meth:`flops_per_token`: fixed for a run, but a walk over the modules."""
        return TRAINING_FLOPS_PER_WEIGHT * linear_weights(self.blocks)

    def attention_flops_per_token(self, seq_len: int) -> int:
        """The attention's part of :meth:`flops_per_token`, the one that grows with the batch's length."""
        return attention_flops(self.config.n_layer, seq_len, self.config.d_model)

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        B, T = input_ids.shape
        if T > self.config.max_position:
            raise ValueError(f"Sequence of length {T} exceeds max_position {self.config.max_position}")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = torch.arange(T, device=input_ids.device)[None]  # (1, T)
        x = self.tok_emb(input_ids) + self.pos_emb(positions) + self.type_emb(token_type_ids)  # (B, T, d)
        return self.drop(self.emb_norm(x))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, attention_mask (1/True = real token), token_type_ids: (B, T) -> hidden states (B, T, d).

        No causal mask: position i sees every real position, before and after it."""
        mask = padding_mask(attention_mask) if attention_mask is not None else None  # (B, 1, 1, T)
        x = self.embed(input_ids, token_type_ids)
        for block in self.blocks:
            x = block(x, mask=mask)
        return x

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, T, d) -> (B, d): ``tanh(W h_[CLS])``, the sentence representation NSP and classifiers read."""
        return torch.tanh(self.pooler(hidden[:, 0]))

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., d) hidden states of the positions to predict -> (..., vocab_size)."""
        return self.mlm_head(hidden)

    def nsp_logits(self, pooled: torch.Tensor) -> torch.Tensor:
        """(B, d) pooled [CLS] -> (B, 2) logits; class 0 = B follows A (HF's convention)."""
        return self.nsp_head(pooled)

    @torch.no_grad()
    def attention_map(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, T, T) attention probabilities of the last layer, mean over heads (for dashboards).

        The blocks attend through SDPA, which returns no weights, so the last layer writes them out during
        a whole forward (:func:`nn.attention.recorded_attention`): from inside its block, as FSDP needs."""
        with recorded_attention(self.blocks[-1].attn) as probs:
            self(input_ids, attention_mask, token_type_ids)
        return probs[0].mean(1)

    # ---- Hugging Face BERT interoperability --------------------------------------------------

    @classmethod
    def from_hf(
        cls, path_or_model, pretraining_heads: bool | None = None, trust_checkpoint: bool = False
    ) -> BERT:
        """Load a Hugging Face BERT: a local directory (``config.json`` + ``model.safetensors`` or
        ``pytorch_model.bin``; ``BertModel``, ``BertForPreTraining``/``BertForMaskedLM`` or a
        sentence-transformers root; a ``.bin`` that needs unpickling only with ``trust_checkpoint``) or a
        ``transformers`` model object. ``pretraining_heads`` defaults to
        whether the checkpoint has an MLM head; False drops them. Other weights it cannot hold (a
        ``BertForSequenceClassification``'s classifier) are refused by name."""
        from lit_transformers.models.hf_bert import from_hf

        return from_hf(cls, path_or_model, pretraining_heads, trust_checkpoint)

    def to_hf(self, save_dir: str | Path | None = None):
        """Export as ``transformers.BertForPreTraining`` (with heads) or ``BertModel``; ``save_pretrained``
        it when save_dir is given."""
        from lit_transformers.models.hf_bert import to_hf

        return to_hf(self, save_dir)
