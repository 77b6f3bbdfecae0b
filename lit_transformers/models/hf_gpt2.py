"""Name and layout mapping between our GPT and Hugging Face ``GPT2LMHeadModel``.

HF GPT-2 stores its projections as ``Conv1D`` with (in, out) weights; ours are ``nn.Linear`` (out, in),
so every projection weight is transposed on the way in and out.
"""

from __future__ import annotations

import torch

from lit_transformers.models.gpt import GPT, GPTConfig
from lit_transformers.models.hf_io import load_hf_checkpoint

HF_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
# ours <- HF, per layer; the HF names are relative to transformer.h.{i}.
LAYER_NAMES = {
    "ln_1.weight": "ln_1.weight",
    "ln_1.bias": "ln_1.bias",
    "attn.qkv_proj.weight": "attn.c_attn.weight",
    "attn.qkv_proj.bias": "attn.c_attn.bias",
    "attn.out_proj.weight": "attn.c_proj.weight",
    "attn.out_proj.bias": "attn.c_proj.bias",
    "ln_2.weight": "ln_2.weight",
    "ln_2.bias": "ln_2.bias",
    "mlp.fc.weight": "mlp.c_fc.weight",
    "mlp.fc.bias": "mlp.c_fc.bias",
    "mlp.proj.weight": "mlp.c_proj.weight",
    "mlp.proj.bias": "mlp.c_proj.bias",
}
GLOBAL_NAMES = {
    "tok_emb.weight": "wte.weight",
    "pos_emb.weight": "wpe.weight",
    "ln_f.weight": "ln_f.weight",
    "ln_f.bias": "ln_f.bias",
}


def load_hf_gpt2(path_or_model) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config dict, state dict) from a ``transformers`` GPT-2 object or a local checkpoint directory."""
    return load_hf_checkpoint(path_or_model, "GPT-2")


def config_from_hf(hf: dict) -> GPTConfig:
    if hf.get("model_type", "gpt2") != "gpt2":
        raise ValueError(f"Expected a GPT-2 checkpoint, got model_type={hf.get('model_type')!r}")
    activation = hf.get("activation_function", "gelu_new")
    if activation not in HF_ACTIVATIONS:
        raise ValueError(f"Unsupported GPT-2 activation {activation!r}; supported: {sorted(HF_ACTIVATIONS)}")
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
        activation=HF_ACTIVATIONS[activation],
        position="learned",
        tie_embeddings=hf.get("tie_word_embeddings", True),
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
    )


def _name_pairs(config: GPTConfig):
    """(our name, HF name relative to ``transformer.``, is_projection) for every weight."""
    for ours, theirs in GLOBAL_NAMES.items():
        yield ours, theirs, False
    for i in range(config.n_layer):
        for ours, theirs in LAYER_NAMES.items():
            yield f"blocks.{i}.{ours}", f"h.{i}.{theirs}", ours.endswith(("proj.weight", "fc.weight"))


def state_dict_from_hf(hf_state: dict[str, torch.Tensor], config: GPTConfig) -> dict[str, torch.Tensor]:
    # GPT2LMHeadModel prefixes "transformer."; a bare GPT2Model checkpoint does not
    hf_state = {k.removeprefix("transformer."): v for k, v in hf_state.items()}
    ours = {}
    for name, hf_name, transpose in _name_pairs(config):
        if hf_name not in hf_state:
            raise KeyError(f"Hugging Face checkpoint is missing {hf_name!r}")
        tensor = hf_state[hf_name]
        ours[name] = tensor.t().contiguous() if transpose else tensor
    if "lm_head.weight" not in hf_state and not config.tie_embeddings:
        raise KeyError("Untied GPT-2 checkpoint (tie_word_embeddings=false) is missing 'lm_head.weight'")
    ours["lm_head.weight"] = hf_state.get("lm_head.weight", ours["tok_emb.weight"])
    return ours


def to_hf_model(model: GPT):
    from transformers import GPT2Config, GPT2LMHeadModel

    c = model.config
    if c.position != "learned" or not c.bias:
        raise ValueError("Only GPT-2 shaped models (position=learned, bias=true) export to HF GPT-2")
    activation = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}[c.activation]
    hf_config = GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.block_size,
        n_embd=c.d_model,
        n_layer=c.n_layer,
        n_head=c.n_head,
        n_inner=c.d_ff,
        activation_function=activation,
        layer_norm_epsilon=c.norm_eps,
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=c.dropout,
        tie_word_embeddings=c.tie_embeddings,
        # GPT-2's BOS/EOS id 50256 does not exist in a smaller vocabulary; set them from your tokenizer
        bos_token_id=50256 if c.vocab_size > 50256 else None,
        eos_token_id=50256 if c.vocab_size > 50256 else None,
    )
    hf_model = GPT2LMHeadModel(hf_config)
    ours = model.state_dict()
    hf_state = {
        f"transformer.{hf_name}": ours[name].t().contiguous() if transpose else ours[name]
        for name, hf_name, transpose in _name_pairs(c)
    }
    hf_state["lm_head.weight"] = ours["lm_head.weight"]
    result = hf_model.load_state_dict(hf_state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith(("attn.bias", "attn.masked_bias"))]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"GPT-2 export mismatch: missing {missing}, unexpected {result.unexpected_keys}")
    return hf_model.eval()
