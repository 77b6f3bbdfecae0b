"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al. 2017), for translation.

Source tokens -> scaled embeddings + positions -> encoder self-attention blocks -> memory. Target prefix
(BOS y1 .. y_{t-1}) -> scaled embeddings + positions -> decoder blocks (masked self-attention, cross-attention
whose queries come from the decoder and keys/values from the memory, FFN) -> vocabulary logits. Post-norm as
in the paper by default (pre-norm adds a final LayerNorm to each stack). Marian / OPUS-MT checkpoints are this
model with SiLU, [sin | cos] positions and a bias on the logits (:meth:`Seq2SeqTransformer.from_hf`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from lit_transformers.nn import (
    TRAINING_FLOPS_PER_WEIGHT,
    DecoderBlock,
    EncoderBlock,
    KVCache,
    LayerCache,
    RotaryEmbedding,
    absolute_positions,
    attention_flops,
    generate,
    linear_cross_entropy,
    linear_weights,
    padding_mask,
    token_embedding,
)
from lit_transformers.nn.beam import beam_search


@dataclass
class Seq2SeqConfig:
    vocab_size: int | None = None  # target vocabulary (the joint one by default); None: the tokenizer's
    src_vocab_size: int | None = None  # None: vocab_size (one joint vocabulary)
    max_len: int = 512  # longest source or target, special tokens included
    n_encoder_layer: int = 6
    n_decoder_layer: int = 6
    n_head: int = 8
    d_model: int = 512
    d_ff: int = 2048
    dropout: float = 0.1  # on embeddings + positions and on each sublayer's output (the paper's P_drop)
    attn_dropout: float = 0.0  # on attention probabilities
    activation: str = "relu"  # the paper's; Marian / OPUS-MT use "silu"
    norm_first: bool = False  # post-norm (the paper); True: pre-norm, with a final LayerNorm per stack
    position: str = "sinusoidal"  # sinusoidal | sinusoidal_concat (Marian) | learned | rope
    scale_embeddings: bool = True  # embeddings * sqrt(d_model) before adding positions
    share_embeddings: bool = True  # one embedding for source and target (needs one joint vocabulary)
    tie_output: bool = True  # the output projection is the target embedding matrix
    output_bias: bool = False  # a bias on the logits (Marian's final_logits_bias)
    norm_eps: float = 1e-5
    pad_id: int | None = None  # None: the tokenizer's
    bos_id: int | None = None  # the decoder's start token (Marian: the pad id)
    eos_id: int | None = None


def source_mask(src_valid: torch.Tensor | None) -> torch.Tensor | None:
    """The (B, 1, 1, S) attention mask hiding source padding, or None when there is none (attention without a
    mask takes a faster kernel; length-bucketed batches are often unpadded)."""
    return None if src_valid is None or bool(src_valid.all()) else padding_mask(src_valid)


class SourceDecoder(nn.Module):
    """The decoder bound to a batch of encoded sources, in the protocol of ``nn.generate`` and
    ``nn.beam_search``: ``decoder(ids, position_ids=, mask=, caches=, last_only=)`` and ``new_caches``.

    ``beams`` > 1 repeats each source for that many consecutive rows. The first decoding step projects the
    encoder memory to every layer's cross-attention keys/values, which the caches keep for the later steps.
    """

    def __init__(
        self, model: Seq2SeqTransformer, memory: torch.Tensor, src_valid: torch.Tensor, beams: int = 1
    ):
        super().__init__()
        self.model, self.beams = model, beams
        self.memory = memory.repeat_interleave(beams, dim=0) if beams > 1 else memory  # (B * beams, S, d)
        self.context_mask = source_mask(src_valid.repeat_interleave(beams, dim=0))

    def forward(self, ids, position_ids=None, mask=None, caches=None, last_only=False) -> torch.Tensor:
        return self.model.decode(ids, self.memory, self.context_mask, position_ids, mask, caches, last_only)

    def new_caches(self, batch_size: int, max_len: int, device=None, dtype=None) -> list[LayerCache]:
        c = self.model.config
        if max_len > c.max_len:
            raise ValueError(f"Decoding {max_len} tokens exceeds model.max_len={c.max_len}")
        head_dim, S = c.d_model // c.n_head, self.memory.size(1)
        # the cross-attention caches start empty: the first step projects the memory inside each block's
        # forward (where FSDP has the block's weights), later steps read it back
        return [
            LayerCache(
                KVCache(batch_size, c.n_head, max_len, head_dim, device, dtype),
                KVCache(batch_size, c.n_head, S, head_dim, device, dtype),
            )
            for _ in self.model.decoder
        ]


class Seq2SeqTransformer(nn.Module):
    """:meth:`encode` sources, :meth:`decode` target prefixes over the memory; :meth:`forward` does both
    (teacher forcing); :meth:`translate` decodes greedily or with beam search."""

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.config = c = config
        src_vocab = c.src_vocab_size or c.vocab_size
        if c.share_embeddings and src_vocab != c.vocab_size:
            raise ValueError(
                f"share_embeddings needs one vocabulary, got src_vocab_size={src_vocab} and vocab_size="
                f"{c.vocab_size}; set model.share_embeddings=false for separate vocabularies"
            )
        self.tgt_emb = token_embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        self.src_emb = self.tgt_emb if c.share_embeddings else nn.Embedding(src_vocab, c.d_model, c.pad_id)
        self.pos_emb = absolute_positions(c.position, c.max_len, c.d_model)
        self.rotary = RotaryEmbedding(c.d_model // c.n_head, c.max_len) if c.position == "rope" else None
        self.embed_scale = math.sqrt(c.d_model) if c.scale_embeddings else 1.0
        self.drop = nn.Dropout(c.dropout)
        block_args = dict(
            d_ff=c.d_ff,
            dropout=c.dropout,
            attn_dropout=c.attn_dropout,
            activation=c.activation,
            norm_first=c.norm_first,
            norm_eps=c.norm_eps,
        )
        self.encoder = nn.ModuleList(
            EncoderBlock(c.d_model, c.n_head, **block_args) for _ in range(c.n_encoder_layer)
        )
        self.decoder = nn.ModuleList(
            DecoderBlock(c.d_model, c.n_head, cross_attention=True, **block_args)
            for _ in range(c.n_decoder_layer)
        )
        # pre-norm leaves the residual stream unnormalised: each stack ends with a LayerNorm
        self.encoder_norm = nn.LayerNorm(c.d_model, eps=c.norm_eps) if c.norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(c.d_model, eps=c.norm_eps) if c.norm_first else nn.Identity()
        self.output = nn.Linear(c.d_model, c.vocab_size, bias=c.output_bias)
        self._init_weights()
        if c.tie_output:
            self.output.weight = self.tgt_emb.weight

    def _init_weights(self) -> None:
        """Xavier-uniform matrices and zero biases (the paper's tensor2tensor / fairseq); embeddings
        N(0, d^-1/2), so that after the sqrt(d) scale they have unit variance, with the padding row zero."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=self.config.d_model**-0.5)
                if module.padding_idx is not None:
                    nn.init.zeros_(module.weight[module.padding_idx])

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, src_len: int, tgt_len: int) -> tuple[int, int]:
        """Training FLOPs (per source token, per target token) of a batch of sources padded to ``src_len`` and
        targets to ``tgt_len`` (``nn.flops``): 6 per weight a token passes through plus 12 * span * d_model per
        attention layer. A source token: the encoder blocks, self-attention over src_len, and the projection to
        every decoder layer's cross-attention keys/values. A target token: the decoder blocks but those, the
        output layer, self-attention over tgt_len and cross-attention over src_len."""
        weights, attention = self.weight_flops_per_token(), self.attention_flops_per_token(src_len, tgt_len)
        return weights[0] + attention[0], weights[1] + attention[1]

    def weight_flops_per_token(self) -> tuple[int, int]:
        """The weights' part of :meth:`flops_per_token`: fixed for a run, but a walk over the modules."""
        cross_kv = sum(block.cross_attn.kv_proj.weight.numel() for block in self.decoder)
        source = linear_weights(self.encoder) + cross_kv
        target = linear_weights(self.decoder) - cross_kv + self.output.weight.numel()
        return TRAINING_FLOPS_PER_WEIGHT * source, TRAINING_FLOPS_PER_WEIGHT * target

    def attention_flops_per_token(self, src_len: int, tgt_len: int) -> tuple[int, int]:
        """The attention's part of :meth:`flops_per_token`, the one that grows with the batch's lengths."""
        c = self.config
        source = attention_flops(c.n_encoder_layer, src_len, c.d_model)
        return source, attention_flops(c.n_decoder_layer, tgt_len + src_len, c.d_model)

    def _embed(self, embedding: nn.Embedding, ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        x = embedding(ids) * self.embed_scale
        if self.pos_emb is not None:
            x = x + self.pos_emb(position_ids)
        return self.drop(x)

    def _check_length(self, length: int, what: str) -> None:
        if length > self.config.max_len:
            raise ValueError(f"{what} of {length} tokens exceeds model.max_len={self.config.max_len}")

    def encode(self, src_ids: torch.Tensor, src_valid: torch.Tensor | None = None) -> torch.Tensor:
        """src_ids (B, S), src_valid (B, S) bool of real tokens (None: no padding) -> memory (B, S, d)."""
        self._check_length(src_ids.size(1), "A source")
        positions = torch.arange(src_ids.size(1), device=src_ids.device)[None]
        x = self._embed(self.src_emb, src_ids, positions)
        mask = source_mask(src_valid)
        for block in self.encoder:
            x = block(x, mask=mask, rotary=self.rotary, position_ids=positions)
        return self.encoder_norm(x)

    def decode(
        self,
        tgt_ids: torch.Tensor,
        memory: torch.Tensor,
        context_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        caches: list[LayerCache] | None = None,
        last_only: bool = False,
        labels: torch.Tensor | None = None,
        label_smoothing: float = 0.0,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """tgt_ids (B, T) target prefix -> logits (B, T, V) (the last position only with ``last_only``).

        Target positions see themselves and earlier targets only (causal); ``context_mask`` (B, 1, 1, S)
        hides source padding from cross-attention. Positions continue after cached tokens. With ``labels``
        (B, T): the loss instead, (summed cross-entropy, number of labelled positions), the output layer fused
        with it as in ``GPT.forward`` (``nn.linear_cross_entropy``).
        """
        start = caches[0].self_attn.length if caches else 0
        self._check_length(start + tgt_ids.size(1), "A target")
        if position_ids is None:
            position_ids = torch.arange(start, start + tgt_ids.size(1), device=tgt_ids.device)[None]
        x = self._embed(self.tgt_emb, tgt_ids, position_ids)
        for i, block in enumerate(self.decoder):
            x = block(
                x,
                mask=mask,
                context=memory,
                context_mask=context_mask,
                rotary=self.rotary,
                position_ids=position_ids,
                cache=caches[i] if caches else None,
            )
        x = self.decoder_norm(x)
        if labels is not None:
            return linear_cross_entropy(x, self.output.weight, labels, label_smoothing, bias=self.output.bias)
        return self.output(x[:, -1:] if last_only else x)

    def forward(
        self,
        src_ids: torch.Tensor,
        tgt_ids: torch.Tensor,
        src_valid: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        label_smoothing: float = 0.0,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Teacher forcing: logits (B, T, V) of the next target token at each position of ``tgt_ids``
        (BOS y1 .. y_{T-1}, right-padded: a real position never sees the padding after it); with ``labels``
        (B, T), the loss as in :meth:`decode`."""
        memory = self.encode(src_ids, src_valid)
        context_mask = source_mask(src_valid)
        return self.decode(tgt_ids, memory, context_mask, labels=labels, label_smoothing=label_smoothing)

    # ---- decoding ------------------------------------------------------------------------------

    @torch.no_grad()
    def translate(
        self,
        src_ids: torch.Tensor,
        src_valid: torch.Tensor | None = None,
        beam_size: int = 1,
        alpha: float = 0.6,
        max_extra_tokens: int = 50,
        use_cache: bool = True,
    ) -> list[list[int]]:
        """Token ids of each source's translation (without BOS / EOS): greedy with ``beam_size`` 1, else
        beam search with GNMT length penalty ``alpha``; at most source length + ``max_extra_tokens``."""
        c = self.config
        if None in (c.bos_id, c.eos_id, c.pad_id):
            raise ValueError("model.bos_id, eos_id and pad_id must be set to translate")
        if src_valid is None:
            src_valid = torch.ones_like(src_ids, dtype=torch.bool)
        B = src_ids.size(0)
        max_new = (src_valid.sum(dim=1) + max_extra_tokens).clamp(max=c.max_len - 1)
        decoder = SourceDecoder(self, self.encode(src_ids, src_valid), src_valid, beams=beam_size)
        if beam_size == 1:
            start = torch.full((B, 1), c.bos_id, dtype=torch.long, device=src_ids.device)
            out = generate(
                decoder,
                start,
                max_new_tokens=int(max_new.max()),
                temperature=0,
                eos_id=c.eos_id,
                pad_id=c.pad_id,
                use_cache=use_cache,
                max_lengths=max_new,
            )
        else:
            out, _ = beam_search(
                decoder, B, c.bos_id, c.eos_id, c.pad_id, max_new, beam_size, alpha, use_cache
            )
        hypotheses = []
        for row, limit in zip(out[:, 1:].tolist(), max_new.tolist()):
            row = row[:limit]  # a hypothesis stopped by its length limit is padded after it
            hypotheses.append(row[: row.index(c.eos_id)] if c.eos_id in row else row)
        return hypotheses

    # ---- Hugging Face Marian interoperability ----------------------------------------------------

    @classmethod
    def from_hf(cls, path_or_model, trust_checkpoint: bool = False) -> Seq2SeqTransformer:
        """Load a Hugging Face Marian (OPUS-MT) model: a local directory or a ``MarianMTModel`` (a ``.bin`` that
        needs unpickling only with ``trust_checkpoint``)."""
        from lit_transformers.models.hf_marian import from_hf

        return from_hf(cls, path_or_model, trust_checkpoint)

    def to_hf(self, save_dir: str | Path | None = None):
        """Export as ``transformers.MarianMTModel`` (and ``save_pretrained`` it when save_dir is given)."""
        from lit_transformers.models.hf_marian import to_hf

        return to_hf(self, save_dir)
