"""The Hugging Face causal LMs our GPT loads (:data:`DECODERS`) and how one is built from a checkpoint.

Building the model as usual and then copying the checkpoint in holds the weights twice (the random init and
the file's tensors) and, at real sizes, spends longer on the random init than on reading the file.
:func:`build_from_hf` builds the model on the meta device instead (shapes only: no memory, no init), hands it
the converted checkpoint tensors themselves (``load_state_dict(assign=True)``), and recomputes the buffers that
the config determines (the RoPE tables): the weights are held about once. This is PyTorch's own recipe for large
checkpoints (meta device, memory-mapped tensors, ``assign``): the weights that need no conversion stay pages of
the safetensors file, mapped copy-on-write, so training writes private copies and never the file.
"""

from __future__ import annotations

import importlib
from itertools import chain
from types import ModuleType

import torch
from torch import nn

from lit_transformers.models import hf_convert
from lit_transformers.models.hf_convert import NameMap

# Hugging Face causal LMs our GPT loads: model_type -> (the converter module, its architecture)
DECODERS = {
    "gpt2": ("hf_gpt2", "GPT2LMHeadModel"),
    "llama": ("hf_llama", "LlamaForCausalLM"),
    "qwen2": ("hf_llama", "Qwen2ForCausalLM"),
    "mistral": ("hf_llama", "MistralForCausalLM"),
}


def config_of(path_or_model, family: str) -> dict:
    """The config dict of a ``transformers`` model object or a local checkpoint directory, weights unread."""
    if isinstance(path_or_model, nn.Module):
        return path_or_model.config.to_dict()
    return hf_convert.read_hf_config(path_or_model, family)


def decoder_converter(path_or_model) -> ModuleType:
    """The converter module (``hf_gpt2``, ``hf_llama``) of a Hugging Face causal LM, by its ``model_type``;
    another architecture (a mixture of experts, an encoder) is refused with the supported list."""
    hf = config_of(path_or_model, "causal LM")
    if hf.get("model_type") not in DECODERS:
        raise ValueError(
            f"Unsupported architecture {hf.get('architectures') or hf.get('model_type')!r} "
            f"(model_type={hf.get('model_type')!r}): our GPT loads "
            f"{', '.join(architecture for _, architecture in DECODERS.values())}. Pass a checkpoint of one of "
            "them (mixture-of-experts variants such as Mixtral or Qwen2-MoE are not among them)."
        )
    return importlib.import_module(f"lit_transformers.models.{DECODERS[hf['model_type']][0]}")


def checkpoint_dtype(path_or_model, hf_config: dict, hf_state: dict[str, torch.Tensor]) -> torch.dtype:
    """The dtype a checkpoint is in: a model object's weights', else its config's ``dtype`` (``torch_dtype``
    before transformers 5), else its weights'."""
    name = (
        None
        if isinstance(path_or_model, nn.Module)
        else hf_config.get("dtype") or hf_config.get("torch_dtype")
    )
    if isinstance(getattr(torch, str(name), None), torch.dtype):
        return getattr(torch, name)
    return next((t.dtype for t in hf_state.values() if t.is_floating_point()), torch.float32)


def build_from_hf(
    cls: type[nn.Module],
    config,
    name_map: NameMap,
    path_or_model,
    trust_checkpoint: bool = False,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """``cls(config)`` holding the weights of a ``transformers`` model object or a local checkpoint directory
    (``hf_convert.load_hf_checkpoint``) through ``name_map``, in ``dtype`` (None: the checkpoint's), built as
    the module docstring says. A model object's tensors are copied, so that ours never shares their storage."""
    hf, hf_state = hf_convert.load_hf_checkpoint(path_or_model, name_map.family, trust_checkpoint)
    dtype = dtype or checkpoint_dtype(path_or_model, hf, hf_state)
    ours = hf_convert.state_from_hf(hf_state, name_map)
    del hf_state  # the tensors converted as they are now live in ours alone
    shared = isinstance(path_or_model, nn.Module)
    for key in ours:  # one tensor at a time: a dtype change holds one tensor twice, not the model
        ours[key] = ours[key].to(dtype, copy=shared)
    with torch.device("meta"):
        model = cls(config)
    hf_convert.load_exactly(model, ours, lambda key: False, name_map.family, assign=True)
    for module in model.modules():
        if hasattr(module, "reset_buffers"):
            module.reset_buffers()
    on_meta = [name for name, t in chain(model.named_parameters(), model.named_buffers()) if t.is_meta]
    if on_meta:
        raise RuntimeError(f"{cls.__name__} tensors {on_meta} were neither loaded nor recomputed: a bug")
    return model
