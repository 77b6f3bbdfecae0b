"""Our GPT <-> Hugging Face ``GPT2LMHeadModel``: the name map and the config translation.

HF GPT-2 keeps its projections as ``Conv1D`` with (in, out) weights; ours are ``nn.Linear`` (out, in), so
every projection weight is ``transposed`` on the way in and out.
"""

from __future__ import annotations

from pathlib import Path

from lit_transformers.models import hf_convert, hf_decoder
from lit_transformers.models.gpt import GPT, GPTConfig
from lit_transformers.models.hf_convert import NameMap, Weight, affine, repeat

FAMILY = "GPT-2"
LAYER = [  # ours under blocks.{i}. <- HF under transformer.h.{i}.
    *affine("ln_1", "ln_1"),
    *affine("attn.qkv_proj", "attn.c_attn", "transposed"),
    *affine("attn.out_proj", "attn.c_proj", "transposed"),
    *affine("ln_2", "ln_2"),
    *affine("mlp.fc", "mlp.c_fc", "transposed"),
    *affine("mlp.proj", "mlp.c_proj", "transposed"),
]
# files saved by older transformers versions (the hub's gpt2 among them) hold each layer's causal mask and
# its fill value: buffers, not weights
BUFFERS = (".attn.bias", ".attn.masked_bias")


def name_map(config: GPTConfig) -> NameMap:
    body = [
        Weight("pos_emb.weight", "transformer.wpe.weight"),
        *repeat(LAYER, config.n_layer, "blocks.{i}.", "transformer.h.{i}."),
        *affine("ln_f", "transformer.ln_f"),
    ]
    embedding = Weight("tok_emb.weight", "transformer.wte.weight")
    weights = hf_convert.with_lm_head(embedding, body, config.tie_embeddings)
    return NameMap(FAMILY, tuple(weights), body_prefix="transformer.", buffers=BUFFERS)


def config_from_hf(hf: dict) -> GPTConfig:
    if hf.get("model_type", "gpt2") != "gpt2":
        raise ValueError(f"Expected a GPT-2 checkpoint, got model_type={hf.get('model_type')!r}")
    activation = hf_convert.activation_from_hf(hf.get("activation_function", "gelu_new"), FAMILY)
    if not hf.get("scale_attn_weights", True) or hf.get("add_cross_attention"):
        raise ValueError(
            "GPT-2 variants without scale_attn_weights or with add_cross_attention are not supported"
        )
    if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("reorder_and_upcast_attn"):
        raise ValueError(
            "GPT-2 variants with scale_attn_by_inverse_layer_idx/reorder_and_upcast_attn are not supported"
        )
    return GPTConfig(
        vocab_size=hf["vocab_size"],
        block_size=hf["n_positions"],
        n_layer=hf["n_layer"],
        n_head=hf["n_head"],
        d_model=hf["n_embd"],
        d_ff=hf.get("n_inner"),
        dropout=0.0,
        bias=True,
        activation=activation,
        position="learned",
        tie_embeddings=hf.get("tie_word_embeddings", True),
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
    )


def hf_config(c: GPTConfig):
    from transformers import GPT2Config

    if c.position != "learned" or not c.bias:
        raise ValueError("Only GPT-2 shaped models (position=learned, bias=true) export to HF GPT-2")
    return GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.block_size,
        n_embd=c.d_model,
        n_layer=c.n_layer,
        n_head=c.n_head,
        n_inner=c.d_ff,
        activation_function=hf_convert.activation_to_hf(c.activation, FAMILY),
        layer_norm_epsilon=c.norm_eps,
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=c.dropout,
        tie_word_embeddings=c.tie_embeddings,
        # GPT-2's BOS/EOS id 50256 does not exist in a smaller vocabulary; set them from your tokenizer
        bos_token_id=50256 if c.vocab_size > 50256 else None,
        eos_token_id=50256 if c.vocab_size > 50256 else None,
    )


def from_hf(cls: type[GPT], path_or_model, trust_checkpoint: bool = False, dtype=None) -> GPT:
    """``cls`` holding a ``GPT2LMHeadModel``/``GPT2Model`` object's or a local GPT-2 directory's weights, in
    ``dtype`` (None: the checkpoint's)."""
    config = config_from_hf(hf_decoder.config_of(path_or_model, FAMILY))
    return hf_decoder.build_from_hf(cls, config, name_map(config), path_or_model, trust_checkpoint, dtype)


def to_hf(model: GPT, save_dir: str | Path | None = None):
    """A ``transformers.GPT2LMHeadModel`` holding ``model``'s weights (saved to ``save_dir`` when given)."""
    from transformers import GPT2LMHeadModel

    hf_model = GPT2LMHeadModel(hf_config(model.config))
    return hf_convert.export_to_hf(model, hf_model, name_map(model.config), save_dir)
