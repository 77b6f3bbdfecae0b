"""Our BERT <-> Hugging Face ``BertModel`` / ``BertForPreTraining``: the name map and the config translation.

HF keeps query, key and value as three ``nn.Linear``; ours is one fused ``qkv_proj``, so their weights are
concatenated on the way in and split on the way out. Everything else is a renaming.
"""

from __future__ import annotations

from pathlib import Path

from lit_transformers.models import hf_convert
from lit_transformers.models.hf_convert import NameMap, Weight, affine, repeat

FAMILY = "BERT"
LAYER = [  # ours under blocks.{i}. <- HF under bert.encoder.layer.{i}.
    *affine("attn.qkv_proj", ("attention.self.query", "attention.self.key", "attention.self.value")),
    *affine("attn.out_proj", "attention.output.dense"),
    *affine("ln_1", "attention.output.LayerNorm"),
    *affine("mlp.fc", "intermediate.dense"),
    *affine("mlp.proj", "output.dense"),
    *affine("ln_2", "output.LayerNorm"),
]
HEADS = [  # BertForPreTraining's cls.; BertForMaskedLM has no NSP head, which then starts fresh
    *affine("mlm_head.dense", "cls.predictions.transform.dense"),
    *affine("mlm_head.norm", "cls.predictions.transform.LayerNorm"),
    Weight("mlm_head.bias", "cls.predictions.bias", aliases=("cls.predictions.decoder.bias",)),
    *affine("nsp_head", "cls.seq_relationship", optional=True),
]
# the position and segment ids 0..max_position-1 that BertEmbeddings keeps as buffers (older versions saved
# them); ours computes them
BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


def name_map(config) -> NameMap:
    # the MLM decoder is the word embedding matrix (model objects carry it, saved files drop it)
    tied_decoder = ("cls.predictions.decoder.weight",) if config.pretraining_heads else ()
    weights = [
        Weight("tok_emb.weight", "bert.embeddings.word_embeddings.weight", aliases=tied_decoder),
        Weight("pos_emb.weight", "bert.embeddings.position_embeddings.weight"),
        Weight("type_emb.weight", "bert.embeddings.token_type_embeddings.weight"),
        *affine("emb_norm", "bert.embeddings.LayerNorm"),
        *repeat(LAYER, config.n_layer, "blocks.{i}.", "bert.encoder.layer.{i}."),
        *affine("pooler", "bert.pooler.dense", optional=True),  # BertForMaskedLM has none
        *(HEADS if config.pretraining_heads else ()),
    ]
    return NameMap(FAMILY, tuple(weights), body_prefix="bert.", buffers=BUFFERS)


def read_hf_config(path: str | Path) -> dict:
    """The ``config.json`` of a Hugging Face BERT directory."""
    return hf_convert.read_hf_config(path, FAMILY)


def config_from_hf(hf: dict, pretraining_heads: bool):
    from lit_transformers.models.bert import BERTConfig

    if hf.get("model_type", "bert") != "bert":
        raise ValueError(f"Expected a BERT checkpoint, got model_type={hf.get('model_type')!r}")
    if hf.get("position_embedding_type", "absolute") != "absolute" or hf.get("is_decoder"):
        raise ValueError("Only encoder BERTs with absolute position embeddings are supported")
    return BERTConfig(
        vocab_size=hf["vocab_size"],
        max_position=hf.get("max_position_embeddings", 512),
        type_vocab_size=hf.get("type_vocab_size", 2),
        n_layer=hf["num_hidden_layers"],
        n_head=hf["num_attention_heads"],
        d_model=hf["hidden_size"],
        d_ff=hf["intermediate_size"],
        dropout=hf.get("hidden_dropout_prob", 0.1),
        attn_dropout=hf.get("attention_probs_dropout_prob", 0.1),
        activation=hf_convert.activation_from_hf(hf.get("hidden_act", "gelu"), FAMILY),
        norm_eps=hf.get("layer_norm_eps", 1e-12),
        pretraining_heads=pretraining_heads,
    )


def hf_config(c):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        num_hidden_layers=c.n_layer,
        num_attention_heads=c.n_head,
        intermediate_size=c.d_ff,
        hidden_act=hf_convert.activation_to_hf(c.activation, FAMILY),
        hidden_dropout_prob=c.dropout,
        attention_probs_dropout_prob=c.attn_dropout,
        max_position_embeddings=c.max_position,
        type_vocab_size=c.type_vocab_size,
        layer_norm_eps=c.norm_eps,
    )


def from_hf(cls, path_or_model, pretraining_heads: bool | None = None, trust_checkpoint: bool = False):
    """``cls`` holding a HF BERT's weights; ``pretraining_heads`` defaults to whether the checkpoint has an
    MLM head (``cls.predictions``), False drops the heads it has."""
    hf, hf_state = hf_convert.load_hf_checkpoint(path_or_model, FAMILY, trust_checkpoint)
    has_mlm = any(key.startswith("cls.predictions.") for key in hf_state)
    heads = has_mlm if pretraining_heads is None else pretraining_heads
    if heads and not has_mlm:
        raise ValueError(
            "The BERT checkpoint has no pretraining heads (cls.predictions); load it without them"
        )
    if not heads:  # dropped on request: the only HF weights that are not refused when unused
        hf_state = {key: value for key, value in hf_state.items() if not key.startswith("cls.")}
    model = cls(config_from_hf(hf, heads))
    hf_convert.load_from_hf(model, hf_state, name_map(model.config))
    return model


def to_hf(model, save_dir: str | Path | None = None):
    """A ``transformers.BertForPreTraining`` (with heads) or ``BertModel`` holding ``model``'s weights (saved
    to ``save_dir`` when given)."""
    from transformers import BertForPreTraining, BertModel

    c = model.config
    hf_model = (BertForPreTraining if c.pretraining_heads else BertModel)(hf_config(c))
    return hf_convert.export_to_hf(model, hf_model, name_map(c), save_dir)
