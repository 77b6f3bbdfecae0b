"""Our GPT <-> Hugging Face ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` and ``MistralForCausalLM`` (SmolLM2 and
TinyLlama are Llama): one name map and config translation for the three, which differ only in config.

The three share the layout (RMSNorm, SwiGLU MLP, grouped-query attention with RoPE, no biases); Qwen2 adds
q/k/v biases and a sliding window on its upper layers (off in the released checkpoints), Mistral a sliding
window on every layer. HF keeps q, k, v and gate, up as separate projections; ours fuses
each group along the output dimension, so a grouped-query ``qkv_proj`` splits into unequal parts on export.
"""

from __future__ import annotations

from pathlib import Path

from lit_transformers.models import hf_convert, hf_decoder
from lit_transformers.models.gpt import GPT, LAYER_TYPES, GPTConfig
from lit_transformers.models.hf_convert import NameMap, Weight, repeat
from lit_transformers.nn.positions import check_rope_scaling, rope_type

FAMILY = "Llama/Qwen2/Mistral"
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
# a bare body (LlamaModel, ...) loads too; its files lack "model." and the head
BODIES = {"LlamaModel", "Qwen2Model", "MistralModel"}
# files saved by older transformers versions hold each layer's RoPE frequencies: a buffer, not a weight
BUFFERS = (".rotary_emb.inv_freq",)


def name_map(config: GPTConfig) -> NameMap:
    q_dim = config.n_head * config.head_size
    kv_dim = (config.n_kv_head or config.n_head) * config.head_size
    qkv = tuple(f"self_attn.{name}_proj" for name in "qkv")
    gate_up = ("mlp.gate_proj", "mlp.up_proj")

    def fused(ours: str, hf: tuple[str, ...], suffix: str, split: tuple[int, ...] = ()) -> Weight:
        return Weight(f"{ours}.{suffix}", tuple(f"{name}.{suffix}" for name in hf), split=split)

    biased = config.bias
    qkv_biased = config.bias if config.qkv_bias is None else config.qkv_bias
    layer = [  # ours under blocks.{i}. <- HF under model.layers.{i}.
        Weight("ln_1.weight", "input_layernorm.weight"),
        fused("attn.qkv_proj", qkv, "weight", (q_dim, kv_dim, kv_dim)),
        *([fused("attn.qkv_proj", qkv, "bias", (q_dim, kv_dim, kv_dim))] if qkv_biased else []),
        Weight("attn.out_proj.weight", "self_attn.o_proj.weight"),
        *([Weight("attn.out_proj.bias", "self_attn.o_proj.bias")] if biased else []),
        Weight("ln_2.weight", "post_attention_layernorm.weight"),
        fused("mlp.fc", gate_up, "weight"),
        *([fused("mlp.fc", gate_up, "bias")] if biased else []),
        Weight("mlp.proj.weight", "mlp.down_proj.weight"),
        *([Weight("mlp.proj.bias", "mlp.down_proj.bias")] if biased else []),
    ]
    body = [
        *repeat(layer, config.n_layer, "blocks.{i}.", "model.layers.{i}."),
        Weight("ln_f.weight", "model.norm.weight"),
    ]
    embedding = Weight("tok_emb.weight", "model.embed_tokens.weight")
    weights = hf_convert.with_lm_head(embedding, body, config.tie_embeddings)
    return NameMap(FAMILY, tuple(weights), body_prefix="model.", buffers=BUFFERS)


def _refuse(hf: dict, what: str) -> None:
    raise ValueError(
        f"This {hf.get('model_type')} checkpoint has {what}, which our GPT cannot represent; supported "
        f"architectures: {', '.join(a for _, a in hf_decoder.DECODERS.values())}, in their plain form"
    )


def rope_from_hf(hf: dict) -> tuple[float, dict | None]:
    """(rope_theta, our rope_scaling) from transformers 5's ``rope_parameters`` or older files' ``rope_theta``
    + ``rope_scaling``; an unsupported type is refused by name."""
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
    kind = rope_type(rope)
    if kind in (None, "default"):
        return theta, None
    rope.pop("type", None)
    rope["rope_type"] = kind
    if kind == "dynamic":  # HF's dynamic NTK scales past max_position_embeddings, the pretraining length
        rope["original_max_position_embeddings"] = hf["max_position_embeddings"]
    check_rope_scaling(rope)
    return theta, rope


def windows_from_hf(hf: dict) -> tuple[int | None, list[str] | None]:
    """Our (sliding_window, layer_types), as the checkpoint's transformers class windows its attention: Mistral
    every layer; Qwen2, with use_sliding_window, the layers its ``layer_types`` name "sliding_attention" (older
    files lack them: the layers from ``max_window_layers`` on). layer_types stays None unless the layers differ."""
    if hf["model_type"] == "mistral":
        return hf.get("sliding_window"), None
    if hf["model_type"] != "qwen2" or not hf.get("use_sliding_window") or hf.get("sliding_window") is None:
        return None, None
    first = hf.get("max_window_layers", 28)  # Qwen2Config's default
    kinds = hf.get("layer_types") or [
        "sliding_attention" if i >= first else "full_attention" for i in range(hf["num_hidden_layers"])
    ]
    if set(kinds) - set(LAYER_TYPES):
        _refuse(
            hf, f"layer_types {sorted(set(kinds) - set(LAYER_TYPES))} (ours computes {list(LAYER_TYPES)})"
        )
    if "sliding_attention" not in kinds:
        return None, None
    return hf["sliding_window"], list(kinds) if "full_attention" in kinds else None


def _qwen2_windows(c: GPTConfig) -> dict:
    """Qwen2Config's window keys for ``c``: ``layer_types`` for transformers that read them, and for those
    before, ``max_window_layers``: the number of leading full-attention layers (exact for Qwen2's own pattern,
    full layers then windowed ones)."""
    kinds = [("full_attention" if c.window(i) is None else "sliding_attention") for i in range(c.n_layer)]
    return {
        "use_sliding_window": c.sliding_window is not None,
        "sliding_window": c.sliding_window,
        "max_window_layers": kinds.index("sliding_attention") if c.sliding_window is not None else c.n_layer,
        "layer_types": kinds,
    }


def config_from_hf(hf: dict) -> GPTConfig:
    if hf.get("model_type") not in ARCHITECTURES:
        raise ValueError(f"Expected a {FAMILY} checkpoint, got model_type={hf.get('model_type')!r}")
    unknown = set(hf.get("architectures") or ()) - set(ARCHITECTURES.values()) - BODIES
    if unknown:
        _refuse(hf, f"architectures {sorted(unknown)}")
    head_dim = hf.get("head_dim")
    if head_dim == hf["hidden_size"] // hf["num_attention_heads"]:
        head_dim = None  # the default width: configs stay as they were before head_dim existed
    if hf.get("attention_bias", False) != hf.get("mlp_bias", False):
        _refuse(hf, "attention_bias != mlp_bias (ours biases the output projection and the MLP alike)")
    theta, scaling = rope_from_hf(hf)
    n_kv_head = hf.get("num_key_value_heads") or hf["num_attention_heads"]
    block_size = hf["max_position_embeddings"]
    if rope_type(scaling) == "dynamic":
        block_size = int(block_size * scaling["factor"])
    sliding_window, layer_types = windows_from_hf(hf)
    return GPTConfig(
        vocab_size=hf["vocab_size"],
        block_size=block_size,
        n_layer=hf["num_hidden_layers"],
        n_head=hf["num_attention_heads"],
        d_model=hf["hidden_size"],
        d_ff=hf["intermediate_size"],
        dropout=0.0,
        bias=hf.get("attention_bias", False),
        activation=hf_convert.activation_from_hf(hf.get("hidden_act", "silu"), FAMILY),
        position="rope",
        tie_embeddings=hf.get("tie_word_embeddings", False),
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        norm="rmsnorm",
        gated_mlp=True,
        n_kv_head=n_kv_head if n_kv_head != hf["num_attention_heads"] else None,  # None: multi-head
        head_dim=head_dim,
        qkv_bias=True if hf["model_type"] == "qwen2" else None,
        rope_theta=theta,
        rope_scaling=scaling,
        sliding_window=sliding_window,
        layer_types=layer_types,
    )


def architecture(c: GPTConfig) -> str:
    """The model_type a Llama-layout config exports as: Qwen2 with q/k/v biases alone (a window on all, some
    or no layers), else Mistral with a sliding window, else Llama; a config none of them represents is refused,
    naming what differs."""
    unrepresentable = [
        f"{key}={getattr(c, key)!r} (needs {need!r})"
        for key, need in (("norm", "rmsnorm"), ("gated_mlp", True), ("position", "rope"))
        if getattr(c, key) != need
    ]
    qkv_only = c.qkv_bias and not c.bias
    if c.sliding_window is not None and not qkv_only and (c.bias or c.qkv_bias):
        unrepresentable.append("biases with a sliding window (Mistral has none, Qwen2 q/k/v biases alone)")
    if c.layer_types is not None and not qkv_only:
        unrepresentable.append(
            "a window on some layers only (layer_types) without Qwen2's q/k/v biases alone (Mistral windows "
            "every layer): set qkv_bias=true bias=false, or layer_types=null"
        )
    if c.qkv_bias is not None and c.qkv_bias != c.bias and not qkv_only:
        unrepresentable.append(f"qkv_bias={c.qkv_bias} with bias={c.bias}")
    if unrepresentable:
        raise ValueError(
            f"This GPT config does not export to {FAMILY}: {'; '.join(unrepresentable)}. The GPT-2 layout "
            "(norm=layernorm) exports to GPT2LMHeadModel instead."
        )
    return "qwen2" if qkv_only else "mistral" if c.sliding_window is not None else "llama"


def hf_config(c: GPTConfig):
    import transformers

    model_type = architecture(c)
    scaling = dict(c.rope_scaling) if c.rope_scaling else None
    max_positions = c.block_size
    if rope_type(scaling) == "dynamic":  # HF's dynamic scaling starts past max_position_embeddings
        max_positions = scaling.pop("original_max_position_embeddings")
    kwargs = {
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "intermediate_size": c.d_ff or 4 * c.d_model,
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_kv_head or c.n_head,
        "head_dim": c.head_size,
        "hidden_act": hf_convert.activation_to_hf(c.activation, FAMILY),
        "max_position_embeddings": max_positions,
        "rms_norm_eps": c.norm_eps,
        "tie_word_embeddings": c.tie_embeddings,
        "rope_theta": c.rope_theta,
        "rope_scaling": scaling,
        "attention_dropout": c.dropout,
        # our config holds no token ids: GPT.to_hf(tokenizer=...) sets them from the tokenizer
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }
    if model_type == "llama":
        kwargs |= {"attention_bias": c.bias, "mlp_bias": c.bias}
    elif model_type == "mistral":
        kwargs |= {"sliding_window": c.sliding_window}
    else:
        kwargs |= _qwen2_windows(c)
    return transformers.AutoConfig.for_model(model_type, **kwargs)


def from_hf(cls: type[GPT], path_or_model, trust_checkpoint: bool = False, dtype=None) -> GPT:
    """``cls`` holding a Llama/Qwen2/Mistral model object's or local directory's weights, in ``dtype`` (None:
    the checkpoint's)."""
    config = config_from_hf(hf_decoder.config_of(path_or_model, FAMILY))  # refusals before reading weights
    return hf_decoder.build_from_hf(cls, config, name_map(config), path_or_model, trust_checkpoint, dtype)


def to_hf(model: GPT, save_dir: str | Path | None = None):
    """A ``transformers`` Llama/Qwen2/Mistral causal LM (:func:`architecture`) holding ``model``'s weights,
    in their dtype (saved to ``save_dir`` when given)."""
    import transformers

    config = hf_config(model.config)
    with hf_convert.default_dtype(model.tok_emb.weight.dtype):
        hf_model = transformers.AutoModelForCausalLM.from_config(config)
    return hf_convert.export_to_hf(model, hf_model, name_map(model.config), save_dir)
