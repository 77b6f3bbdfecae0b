"""Name and layout mapping between our BERT and Hugging Face ``BertModel`` / ``BertForPreTraining``.

HF keeps query, key and value as three ``nn.Linear``; ours is one fused ``qkv_proj``, so their weights are
concatenated on the way in and split on the way out. Everything else is a renaming, held here as data.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from lit_transformers.models import hf_io

log = logging.getLogger(__name__)

HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
# ours <- HF, per layer; the HF names are relative to encoder.layer.{i}.
LAYER_NAMES = {
    "attn.out_proj.weight": "attention.output.dense.weight",
    "attn.out_proj.bias": "attention.output.dense.bias",
    "ln_1.weight": "attention.output.LayerNorm.weight",
    "ln_1.bias": "attention.output.LayerNorm.bias",
    "mlp.fc.weight": "intermediate.dense.weight",
    "mlp.fc.bias": "intermediate.dense.bias",
    "mlp.proj.weight": "output.dense.weight",
    "mlp.proj.bias": "output.dense.bias",
    "ln_2.weight": "output.LayerNorm.weight",
    "ln_2.bias": "output.LayerNorm.bias",
}
FUSED_QKV = ("query", "key", "value")  # attn.qkv_proj.{weight,bias} <- attention.self.{query,key,value}
BODY_NAMES = {
    "tok_emb.weight": "embeddings.word_embeddings.weight",
    "pos_emb.weight": "embeddings.position_embeddings.weight",
    "type_emb.weight": "embeddings.token_type_embeddings.weight",
    "emb_norm.weight": "embeddings.LayerNorm.weight",
    "emb_norm.bias": "embeddings.LayerNorm.bias",
    "pooler.weight": "pooler.dense.weight",
    "pooler.bias": "pooler.dense.bias",
}
# relative to the model root (BertForPreTraining keeps its heads under cls.)
MLM_NAMES = {
    "mlm_head.dense.weight": "cls.predictions.transform.dense.weight",
    "mlm_head.dense.bias": "cls.predictions.transform.dense.bias",
    "mlm_head.norm.weight": "cls.predictions.transform.LayerNorm.weight",
    "mlm_head.norm.bias": "cls.predictions.transform.LayerNorm.bias",
    "mlm_head.bias": "cls.predictions.bias",
}
NSP_NAMES = {"nsp_head.weight": "cls.seq_relationship.weight", "nsp_head.bias": "cls.seq_relationship.bias"}


def read_hf_config(path: str | Path) -> dict:
    """The ``config.json`` of a Hugging Face BERT directory."""
    return hf_io.read_hf_config(path, "BERT")


def load_hf_bert(path_or_model) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config dict, state dict) from a ``transformers`` BERT object or a local checkpoint directory."""
    return hf_io.load_hf_checkpoint(path_or_model, "BERT")


def config_from_hf(hf: dict, pretraining_heads: bool):
    from lit_transformers.models.bert import BERTConfig

    if hf.get("model_type", "bert") != "bert":
        raise ValueError(f"Expected a BERT checkpoint, got model_type={hf.get('model_type')!r}")
    activation = hf.get("hidden_act", "gelu")
    if activation not in HF_ACTIVATIONS:
        raise ValueError(f"Unsupported BERT activation {activation!r}; supported: {sorted(HF_ACTIVATIONS)}")
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
        activation=HF_ACTIVATIONS[activation],
        norm_eps=hf.get("layer_norm_eps", 1e-12),
        pretraining_heads=pretraining_heads,
    )


def _strip_prefix(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Body keys without ``bert.`` (BertFor* models) and without ``embeddings.position_ids`` (a buffer that
    older checkpoints saved); head keys (``cls.``) unchanged."""
    out = {}
    for key, value in hf_state.items():
        key = key.removeprefix("bert.")
        if key.endswith(("position_ids", "token_type_ids")):
            continue
        out[key] = value
    return out


def state_dict_from_hf(hf_state: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """Our state dict from a HF one; body keys must all be there (the pooler may be absent, then it stays
    initialised), head keys when ``config.pretraining_heads``."""
    hf_state = _strip_prefix(hf_state)

    def take(hf_name: str) -> torch.Tensor:
        if hf_name not in hf_state:
            raise KeyError(f"Hugging Face BERT checkpoint is missing {hf_name!r}")
        return hf_state[hf_name]

    ours = {}
    for name, hf_name in BODY_NAMES.items():
        if name.startswith("pooler.") and hf_name not in hf_state:
            log.warning(
                "The BERT checkpoint has no pooler (%s); it starts from a fresh initialisation", hf_name
            )
            continue
        ours[name] = take(hf_name)
    for i in range(config.n_layer):
        hf_prefix = f"encoder.layer.{i}."
        for name, hf_name in LAYER_NAMES.items():
            ours[f"blocks.{i}.{name}"] = take(hf_prefix + hf_name)
        for part in ("weight", "bias"):
            qkv = [take(f"{hf_prefix}attention.self.{p}.{part}") for p in FUSED_QKV]
            ours[f"blocks.{i}.attn.qkv_proj.{part}"] = torch.cat(qkv, dim=0)
    if config.pretraining_heads:
        for name, hf_name in MLM_NAMES.items():
            ours[name] = take(hf_name)
        ours["mlm_head.decoder.weight"] = ours["tok_emb.weight"]
        if NSP_NAMES["nsp_head.weight"] in hf_state:
            ours |= {name: take(hf_name) for name, hf_name in NSP_NAMES.items()}
        else:
            log.warning("The BERT checkpoint has an MLM head but no NSP head; the NSP head starts fresh")
    return ours


def model_from_hf(cls, hf_config: dict, hf_state: dict[str, torch.Tensor], pretraining_heads: bool | None):
    has_mlm = any(k.startswith(MLM_NAMES["mlm_head.dense.weight"]) for k in hf_state)
    heads = has_mlm if pretraining_heads is None else pretraining_heads
    if heads and not has_mlm:
        raise ValueError(
            "The BERT checkpoint has no pretraining heads (cls.predictions); load it without them"
        )
    model = cls(config_from_hf(hf_config, heads))
    state = state_dict_from_hf(hf_state, model.config)
    result = model.load_state_dict(state, strict=False)
    optional = ("pooler.", "nsp_head.")  # warned about above when absent
    missing = [k for k in result.missing_keys if not k.startswith(optional)]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"BERT import mismatch: missing {missing}, unexpected {result.unexpected_keys}")
    return model


def to_hf_model(model):
    from transformers import BertConfig, BertForPreTraining, BertModel

    c = model.config
    activation = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}[c.activation]
    hf_config = BertConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        num_hidden_layers=c.n_layer,
        num_attention_heads=c.n_head,
        intermediate_size=c.d_ff,
        hidden_act=activation,
        hidden_dropout_prob=c.dropout,
        attention_probs_dropout_prob=c.attn_dropout,
        max_position_embeddings=c.max_position,
        type_vocab_size=c.type_vocab_size,
        layer_norm_eps=c.norm_eps,
    )
    ours = model.state_dict()
    body = {hf_name: ours[name] for name, hf_name in BODY_NAMES.items()}
    for i in range(c.n_layer):
        hf_prefix = f"encoder.layer.{i}."
        body |= {hf_prefix + hf_name: ours[f"blocks.{i}.{name}"] for name, hf_name in LAYER_NAMES.items()}
        for part in ("weight", "bias"):
            q, k, v = ours[f"blocks.{i}.attn.qkv_proj.{part}"].chunk(3, dim=0)
            body |= {
                f"{hf_prefix}attention.self.{p}.{part}": t.contiguous() for p, t in zip(FUSED_QKV, (q, k, v))
            }
    if c.pretraining_heads:
        hf_model = BertForPreTraining(hf_config)
        hf_state = {f"bert.{k}": v for k, v in body.items()}
        hf_state |= {hf_name: ours[name] for name, hf_name in {**MLM_NAMES, **NSP_NAMES}.items()}
        hf_state["cls.predictions.decoder.weight"] = ours["tok_emb.weight"]
        hf_state["cls.predictions.decoder.bias"] = ours["mlm_head.bias"]
    else:
        hf_model, hf_state = BertModel(hf_config), body
    result = hf_model.load_state_dict(hf_state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith(("position_ids", "token_type_ids"))]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"BERT export mismatch: missing {missing}, unexpected {result.unexpected_keys}")
    return hf_model.eval()
