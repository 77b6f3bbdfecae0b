"""Our Seq2SeqTransformer <-> Hugging Face ``MarianMTModel`` (OPUS-MT): the name map and the config
translation.

Marian is the post-norm Transformer with scaled embeddings, sinusoidal positions laid out as [sin | cos]
(our ``sinusoidal_concat``), no final LayerNorm, a bias on the logits (``final_logits_bias``) and, in OPUS-MT,
the SiLU ("swish") activation. HF keeps query, key and value as three ``nn.Linear``; our self-attention fuses
them in ``qkv_proj`` and our cross-attention fuses key and value in ``kv_proj``, so those weights are
concatenated on the way in and split on the way out. Everything else is a renaming.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lit_transformers.models import hf_convert
from lit_transformers.models.hf_convert import NameMap, Weight, affine, repeat
from lit_transformers.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from lit_transformers.nn import sinusoidal_table

FAMILY = "Marian"
LAYER = [  # ours under {encoder,decoder}.{i}. <- HF under model.{encoder,decoder}.layers.{i}.
    *affine("attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    *affine("attn.out_proj", "self_attn.out_proj"),
    *affine("ln_1", "self_attn_layer_norm"),
    *affine("mlp.fc", "fc1"),
    *affine("mlp.proj", "fc2"),
    *affine("ln_2", "final_layer_norm"),
]
CROSS = [  # decoder layers only
    *affine("cross_attn.q_proj", "encoder_attn.q_proj"),
    *affine("cross_attn.kv_proj", ("encoder_attn.k_proj", "encoder_attn.v_proj")),
    *affine("cross_attn.out_proj", "encoder_attn.out_proj"),
    *affine("ln_cross", "encoder_attn_layer_norm"),
]
# the one matrix of a shared model; which of its copies a file holds depends on the version that saved it
SHARED_EMBEDDING_KEYS = (
    "model.shared.weight",
    "model.encoder.embed_tokens.weight",
    "model.decoder.embed_tokens.weight",
)
POSITION_KEYS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")
# flags of older (BART-derived) Marian configs that transformers' MarianMTModel ignores: a checkpoint that
# sets them to anything but the Marian value was trained as a different architecture than HF runs
LEGACY_FLAGS = {
    "normalize_before": False,  # pre-norm
    "normalize_embedding": False,  # a LayerNorm on the embeddings (BART's layernorm_embedding)
    "add_final_layer_norm": False,  # a LayerNorm after each stack
    "static_position_embeddings": True,  # fixed sinusoidal positions rather than learned ones
}


def embeddings_shared(hf: dict, hf_state: dict[str, torch.Tensor]) -> bool:
    """Whether the encoder and decoder embeddings are one matrix. ``share_encoder_decoder_embeddings`` says so,
    but transformers 5 ties them only together with ``tie_word_embeddings``: an untied model holds two."""
    copies = [hf_state[key] for key in SHARED_EMBEDDING_KEYS if key in hf_state]
    one = all(torch.equal(a, b) for a, b in zip(copies, copies[1:]))
    return hf.get("share_encoder_decoder_embeddings", True) and one


def config_from_hf(hf: dict, shared: bool) -> Seq2SeqConfig:
    """Our config for a Marian ``config.json`` dict (``shared``: :func:`embeddings_shared`); raises for what
    Seq2SeqTransformer cannot represent."""
    if hf.get("model_type", "marian") != "marian":
        raise ValueError(f"Expected a Marian checkpoint, got model_type={hf.get('model_type')!r}")
    activation = hf_convert.activation_from_hf(hf.get("activation_function", "gelu"), FAMILY)
    for flag, marian_value in LEGACY_FLAGS.items():
        if hf.get(flag, marian_value) != marian_value:
            raise ValueError(
                f"Marian checkpoints with {flag}={hf[flag]} are not supported (transformers' MarianMTModel "
                f"ignores the flag, so it is not a Marian model as Hugging Face runs it)"
            )
    for encoder_key, decoder_key in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if hf[encoder_key] != hf[decoder_key]:
            raise ValueError(
                f"Marian checkpoints with {encoder_key}={hf[encoder_key]} != {decoder_key}={hf[decoder_key]} "
                "are not supported: both stacks share model.n_head and model.d_ff"
            )
    unsupported = {
        key: hf[key]
        for key in ("activation_dropout", "encoder_layerdrop", "decoder_layerdrop")
        if hf.get(key, 0.0)
    }
    if unsupported:
        raise ValueError(f"Marian checkpoints with {unsupported} are not supported (ours has none of them)")
    one_vocabulary = hf.get("share_encoder_decoder_embeddings", True)
    return Seq2SeqConfig(
        vocab_size=hf["vocab_size"] if one_vocabulary else hf.get("decoder_vocab_size") or hf["vocab_size"],
        src_vocab_size=hf["vocab_size"],
        max_len=hf["max_position_embeddings"],
        n_encoder_layer=hf["encoder_layers"],
        n_decoder_layer=hf["decoder_layers"],
        n_head=hf["encoder_attention_heads"],
        d_model=hf["d_model"],
        d_ff=hf["encoder_ffn_dim"],
        dropout=hf.get("dropout", 0.1),
        attn_dropout=hf.get("attention_dropout", 0.0),
        activation=activation,
        norm_first=False,
        position="sinusoidal_concat",
        scale_embeddings=hf.get("scale_embedding", False),
        share_embeddings=shared,
        tie_output=hf.get("tie_word_embeddings", True),
        output_bias=True,  # final_logits_bias
        norm_eps=1e-5,  # HF Marian's LayerNorms use torch's default
        pad_id=hf["pad_token_id"],
        bos_id=hf.get("decoder_start_token_id", hf["pad_token_id"]),
        eos_id=hf["eos_token_id"],
    )


def name_map(config: Seq2SeqConfig) -> NameMap:
    tied_output = ("lm_head.weight",) if config.tie_output else ()
    if config.share_embeddings:  # one matrix: the source and target embeddings (and a tied output layer)
        shared, *copies = SHARED_EMBEDDING_KEYS
        weights = [Weight("tgt_emb.weight", shared, aliases=(*copies, *tied_output))]
    else:
        weights = [
            Weight("src_emb.weight", "model.encoder.embed_tokens.weight"),
            Weight("tgt_emb.weight", "model.decoder.embed_tokens.weight", aliases=tied_output),
        ]
    if not config.tie_output:
        weights.append(Weight("output.weight", "lm_head.weight"))
    if config.output_bias:
        weights.append(Weight("output.bias", "final_logits_bias", "row"))
    weights += repeat(LAYER, config.n_encoder_layer, "encoder.{i}.", "model.encoder.layers.{i}.")
    weights += repeat(LAYER + CROSS, config.n_decoder_layer, "decoder.{i}.", "model.decoder.layers.{i}.")
    buffers = ["embed_positions.weight"]  # the [sin | cos] tables HF computes; _check_positions checks them
    if not config.output_bias:  # HF's final_logits_bias buffer stays all zeros: no bias, as ours
        buffers.append("final_logits_bias")
    if not config.share_embeddings:  # transformers 5 embeds with the encoder's and decoder's own matrices
        buffers.append("model.shared.weight")
    return NameMap(FAMILY, tuple(weights), buffers=tuple(buffers))


def _check_positions(hf_state: dict[str, torch.Tensor], config: Seq2SeqConfig) -> None:
    """HF computes its [sin | cos] table itself; a model object carries it in its state dict: it must be ours."""
    expected = sinusoidal_table(config.max_len, config.d_model, concat=True)
    for key in POSITION_KEYS:
        if key in hf_state and not torch.allclose(hf_state[key].float().cpu(), expected, atol=1e-5, rtol=0):
            raise ValueError(f"{key} is not the sinusoidal [sin | cos] table that Marian computes")


def read_config(path_or_model, trust_checkpoint: bool = False) -> Seq2SeqConfig:
    """Our config for a Marian checkpoint (whether its embeddings are shared is read from the weights)."""
    hf, hf_state = hf_convert.load_hf_checkpoint(path_or_model, FAMILY, trust_checkpoint)
    return config_from_hf(hf, embeddings_shared(hf, hf_state))


def from_hf(
    cls: type[Seq2SeqTransformer], path_or_model, trust_checkpoint: bool = False
) -> Seq2SeqTransformer:
    """``cls`` holding a ``MarianMTModel`` object's or a local Marian checkpoint directory's weights."""
    hf, hf_state = hf_convert.load_hf_checkpoint(path_or_model, FAMILY, trust_checkpoint)
    model = cls(config_from_hf(hf, embeddings_shared(hf, hf_state)))
    _check_positions(hf_state, model.config)
    # transformers drops an all-zero final_logits_bias on load; a checkpoint without one has none
    hf_state = {"final_logits_bias": torch.zeros(1, model.config.vocab_size), **hf_state}
    hf_convert.load_from_hf(model, hf_state, name_map(model.config))
    return model


def hf_config(c: Seq2SeqConfig):
    """The ``MarianConfig`` of ``c``; raises for what Marian cannot represent."""
    from transformers import MarianConfig

    unsupported = {
        "position": (c.position, "sinusoidal_concat"),
        "norm_first": (c.norm_first, False),
        "norm_eps": (c.norm_eps, 1e-5),
    }
    for name, (value, marian_value) in unsupported.items():
        if value != marian_value:
            raise ValueError(
                f"Marian has model.{name}={marian_value} only; this model has {name}={value!r} and cannot be "
                "exported to Hugging Face Marian"
            )
    return MarianConfig(
        vocab_size=c.src_vocab_size or c.vocab_size,
        decoder_vocab_size=c.vocab_size,
        max_position_embeddings=c.max_len,
        encoder_layers=c.n_encoder_layer,
        decoder_layers=c.n_decoder_layer,
        encoder_attention_heads=c.n_head,
        decoder_attention_heads=c.n_head,
        encoder_ffn_dim=c.d_ff,
        decoder_ffn_dim=c.d_ff,
        d_model=c.d_model,
        activation_function=hf_convert.activation_to_hf(c.activation, FAMILY),
        dropout=c.dropout,
        attention_dropout=c.attn_dropout,
        scale_embedding=c.scale_embeddings,
        share_encoder_decoder_embeddings=c.share_embeddings,
        tie_word_embeddings=c.tie_output,
        pad_token_id=c.pad_id,
        decoder_start_token_id=c.bos_id,
        eos_token_id=c.eos_id,
        # MarianConfig forces EOS as the last token at the length limit by default (forced_eos_token_id=0);
        # ours ends a hypothesis there without one, so HF's greedy and beam decoding equal ours only unset
        forced_eos_token_id=None,
    )


def to_hf(model: Seq2SeqTransformer, save_dir: str | Path | None = None):
    """A ``transformers.MarianMTModel`` holding ``model``'s weights (saved to ``save_dir`` when given); raises
    for what Marian cannot represent."""
    from transformers import MarianMTModel

    hf_model = MarianMTModel(hf_config(model.config))
    _check_positions(hf_model.state_dict(), model.config)
    return hf_convert.export_to_hf(model, hf_model, name_map(model.config), save_dir)
