"""Name and layout mapping between our Seq2SeqTransformer and Hugging Face ``MarianMTModel`` (OPUS-MT).

Marian is the post-norm Transformer with scaled embeddings, sinusoidal positions laid out as [sin | cos]
(our ``sinusoidal_concat``), no final LayerNorm, a bias on the logits (``final_logits_bias``) and, in OPUS-MT,
the SiLU ("swish") activation. HF keeps query, key and value as three ``nn.Linear``; our self-attention fuses
them in ``qkv_proj`` and our cross-attention fuses key and value in ``kv_proj``, so those weights are
concatenated on the way in and split on the way out. Everything else is a renaming, held here as data.
"""

from __future__ import annotations

import torch

from lit_transformers.models import hf_io
from lit_transformers.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from lit_transformers.nn import sinusoidal_table

HF_ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh"}
OUR_ACTIVATIONS = {"silu": "swish", "gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_new"}
# ours <- HF, per layer of either stack; the HF names are relative to model.{encoder,decoder}.layers.{i}.
LAYER_NAMES = {
    "attn.out_proj": "self_attn.out_proj",
    "ln_1": "self_attn_layer_norm",
    "mlp.fc": "fc1",
    "mlp.proj": "fc2",
    "ln_2": "final_layer_norm",
}
CROSS_NAMES = {
    "cross_attn.q_proj": "encoder_attn.q_proj",
    "cross_attn.out_proj": "encoder_attn.out_proj",
    "ln_cross": "encoder_attn_layer_norm",
}
# fused projections: ours <- the HF projections concatenated along the output dimension, in this order
FUSED = {"attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")}
CROSS_FUSED = {"cross_attn.kv_proj": ("encoder_attn.k_proj", "encoder_attn.v_proj")}
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
    activation = hf.get("activation_function", "gelu")
    if activation not in HF_ACTIVATIONS:
        raise ValueError(f"Unsupported Marian activation {activation!r}; supported: {sorted(HF_ACTIVATIONS)}")
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
        activation=HF_ACTIVATIONS[activation],
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


def _layer_pairs(config: Seq2SeqConfig):
    """(our prefix, HF prefix, renamings, fusions) of every encoder and decoder layer."""
    for i in range(config.n_encoder_layer):
        yield f"encoder.{i}.", f"model.encoder.layers.{i}.", LAYER_NAMES, FUSED
    for i in range(config.n_decoder_layer):
        yield f"decoder.{i}.", f"model.decoder.layers.{i}.", LAYER_NAMES | CROSS_NAMES, FUSED | CROSS_FUSED


def _embedding_keys(config: Seq2SeqConfig) -> dict[str, tuple[str, ...]]:
    """Ours <- the HF keys that may hold it, preferred first: which of them a checkpoint stores depends on
    the transformers version that saved it (tied copies are dropped on save)."""
    if config.share_embeddings:
        keys = {"tgt_emb.weight": SHARED_EMBEDDING_KEYS}
    else:
        keys = {
            "src_emb.weight": ("model.encoder.embed_tokens.weight",),
            "tgt_emb.weight": ("model.decoder.embed_tokens.weight",),
        }
    if not config.tie_output:
        keys["output.weight"] = ("lm_head.weight",)
    return keys


def _check_positions(hf_state: dict[str, torch.Tensor], config: Seq2SeqConfig) -> None:
    """HF computes its [sin | cos] table itself; a model object carries it in its state dict: it must be ours."""
    expected = sinusoidal_table(config.max_len, config.d_model, concat=True)
    for key in POSITION_KEYS:
        if key in hf_state and not torch.allclose(hf_state[key].float().cpu(), expected, atol=1e-5, rtol=0):
            raise ValueError(f"{key} is not the sinusoidal [sin | cos] table that Marian computes")


def state_dict_from_hf(hf_state: dict[str, torch.Tensor], config: Seq2SeqConfig) -> dict[str, torch.Tensor]:
    """Our state dict from a HF MarianMTModel one; every HF weight must be used (else it is another model)."""
    _check_positions(hf_state, config)
    # model.shared is unused (transformers 5 embeds with the encoder's and decoder's own matrices) when the
    # two differ; when they are one, it is that matrix
    used = {*POSITION_KEYS, "model.shared.weight"}

    def take(hf_name: str) -> torch.Tensor:
        if hf_name not in hf_state:
            raise KeyError(f"Hugging Face Marian checkpoint is missing {hf_name!r}")
        used.add(hf_name)
        return hf_state[hf_name]

    ours = {}
    for name, candidates in _embedding_keys(config).items():
        present = [key for key in candidates if key in hf_state]
        if not present:
            raise KeyError(f"Hugging Face Marian checkpoint has none of {list(candidates)}")
        ours[name] = take(present[0])
        used.update(present)  # tied copies of the same matrix
    if config.share_embeddings:
        ours["src_emb.weight"] = ours["tgt_emb.weight"]
    if config.tie_output:
        ours["output.weight"] = ours["tgt_emb.weight"]
        used.add("lm_head.weight")
    # transformers drops an all-zero final_logits_bias on load; a checkpoint without one has none
    bias = hf_state.get("final_logits_bias", torch.zeros(1, config.vocab_size))
    used.add("final_logits_bias")
    ours["output.bias"] = bias.reshape(-1)
    for our_prefix, hf_prefix, names, fused in _layer_pairs(config):
        for part in ("weight", "bias"):
            for name, hf_name in names.items():
                ours[f"{our_prefix}{name}.{part}"] = take(f"{hf_prefix}{hf_name}.{part}")
            for name, hf_names in fused.items():
                parts = [take(f"{hf_prefix}{hf_name}.{part}") for hf_name in hf_names]
                ours[f"{our_prefix}{name}.{part}"] = torch.cat(parts, dim=0)
    unused = sorted(set(hf_state) - used)
    if unused:
        raise ValueError(f"Hugging Face Marian checkpoint has weights this model cannot hold: {unused}")
    return ours


def read_config(path_or_model) -> Seq2SeqConfig:
    """Our config for a Marian checkpoint (whether its embeddings are shared is read from the weights)."""
    hf_config, hf_state = hf_io.load_hf_checkpoint(path_or_model, "Marian")
    return config_from_hf(hf_config, embeddings_shared(hf_config, hf_state))


def from_hf(cls: type[Seq2SeqTransformer], path_or_model) -> Seq2SeqTransformer:
    """``cls`` holding a ``MarianMTModel`` object's or a local Marian checkpoint directory's weights."""
    hf_config, hf_state = hf_io.load_hf_checkpoint(path_or_model, "Marian")
    model = cls(config_from_hf(hf_config, embeddings_shared(hf_config, hf_state)))
    model.load_state_dict(state_dict_from_hf(hf_state, model.config), strict=True)
    return model


def to_hf(model: Seq2SeqTransformer):
    """A ``transformers.MarianMTModel`` holding ``model``'s weights; raises for what Marian cannot represent."""
    from transformers import MarianConfig, MarianMTModel

    c = model.config
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
    if c.activation not in OUR_ACTIVATIONS:
        raise ValueError(f"Marian has no {c.activation!r} activation; supported: {sorted(OUR_ACTIVATIONS)}")
    hf_config = MarianConfig(
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
        activation_function=OUR_ACTIVATIONS[c.activation],
        dropout=c.dropout,
        attention_dropout=c.attn_dropout,
        scale_embedding=c.scale_embeddings,
        share_encoder_decoder_embeddings=c.share_embeddings,
        tie_word_embeddings=c.tie_output,
        pad_token_id=c.pad_id,
        decoder_start_token_id=c.bos_id,
        eos_token_id=c.eos_id,
        forced_eos_token_id=c.eos_id,
    )
    hf_model = MarianMTModel(hf_config)
    ours = model.state_dict()
    hf_state = {
        "model.encoder.embed_tokens.weight": ours["src_emb.weight"],
        "model.decoder.embed_tokens.weight": ours["tgt_emb.weight"],
        "lm_head.weight": ours["output.weight"],
        "final_logits_bias": ours["output.bias"][None] if c.output_bias else torch.zeros(1, c.vocab_size),
    }
    if c.share_embeddings:
        hf_state["model.shared.weight"] = ours["tgt_emb.weight"]
    for our_prefix, hf_prefix, names, fused in _layer_pairs(c):
        for part in ("weight", "bias"):
            for name, hf_name in names.items():
                hf_state[f"{hf_prefix}{hf_name}.{part}"] = ours[f"{our_prefix}{name}.{part}"]
            for name, hf_names in fused.items():
                chunks = ours[f"{our_prefix}{name}.{part}"].chunk(len(hf_names), dim=0)
                hf_state |= {f"{hf_prefix}{n}.{part}": t.contiguous() for n, t in zip(hf_names, chunks)}
    result = hf_model.load_state_dict(hf_state, strict=False)
    missing = [k for k in result.missing_keys if k not in POSITION_KEYS]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"Marian export mismatch: missing {missing}, unexpected {result.unexpected_keys}")
    _check_positions(hf_model.state_dict(), c)
    return hf_model.eval()
