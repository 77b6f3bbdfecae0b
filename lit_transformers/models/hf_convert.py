"""The one idiom of the Hugging Face converters (``hf_gpt2``, ``hf_llama``, ``hf_bert``, ``hf_marian``): a family is a
:class:`NameMap` (which of our tensors is which HF tensor, in which layout: data) plus its config
translation; :func:`load_from_hf` and :func:`export_to_hf` apply any map, in either direction, strictly.

The strictness rule, the same for every family: a HF weight that the map does not use, or one that it needs
and the file lacks, is refused by name (a checkpoint of another architecture or head would otherwise load
half-way and compute something else). Only the keys a map lists in ``buffers`` are skipped: tensors HF keeps
that hold no weight of ours.

A new family is one module like ``hf_gpt2``: its per-layer and global :class:`Weight` rows (built with
:func:`affine` and :func:`repeat`), ``name_map(config)``, the config translation both ways, and ``from_hf`` /
``to_hf`` of a few lines calling :func:`load_hf_checkpoint`, :func:`load_from_hf` and :func:`export_to_hf`. A
tensor stored in another layout is one more row of ``LAYOUTS``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from lit_transformers.utils.checkpoints import read_weights

log = logging.getLogger(__name__)

# HF ``hidden_act`` / ``activation_function`` -> ours (``nn.blocks.ACTIVATIONS``); export writes the first HF
# name of each of ours: "gelu_new", GPT-2's own spelling of the tanh GELU, and "swish", OPUS-MT's of SiLU
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "relu": "relu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
}
EXPORTED_ACTIVATIONS = {ours: hf for hf, ours in reversed(HF_ACTIVATIONS.items())}

# (to ours, to HF) per layout of a tensor
LAYOUTS: dict[str, tuple[Callable, Callable]] = {
    "same": (lambda t: t, lambda t: t),
    # GPT-2's Conv1D keeps its weight as (in, out); nn.Linear as (out, in)
    "transposed": (lambda t: t.t().contiguous(), lambda t: t.t().contiguous()),
    # Marian's final_logits_bias is a (1, vocab) row; our logits bias a (vocab,) vector
    "row": (lambda t: t.reshape(-1), lambda t: t[None]),
    # timm keeps a ViT's class token as (1, 1, W) and its position table as (1, N, W); CLIPs as (W,), (N, W)
    "token": (lambda t: t.reshape(1, 1, -1), lambda t: t.reshape(-1)),
    "sequence": (lambda t: t[None], lambda t: t[0]),
}


@dataclass(frozen=True)
class Weight:
    """One of our tensors and the HF tensor(s) it is.

    ``hf`` a tuple: HF keeps separate projections that ours fuses (query, key, value), concatenated along the
    output dimension in that order. ``aliases``: further HF keys holding the same (tied) tensor, which some
    files and every model object carry; on import the first present is read and the others must equal it.
    ``optional``: a file may lack it (a model without a pooler); ours then keeps its fresh initialisation.
    ``split``: the output sizes of a tuple's HF tensors when they differ (grouped-query q, k, v); equal if empty.
    """

    ours: str
    hf: str | tuple[str, ...]
    layout: str = "same"
    aliases: tuple[str, ...] = ()
    optional: bool = False
    split: tuple[int, ...] = ()

    @property
    def hf_keys(self) -> tuple[str, ...]:
        return self.hf if isinstance(self.hf, tuple) else (self.hf, *self.aliases)


def _each(names: str | tuple[str, ...], rename: Callable[[str], str]) -> str | tuple[str, ...]:
    return tuple(map(rename, names)) if isinstance(names, tuple) else rename(names)


def affine(
    ours: str, hf: str | tuple[str, ...], layout: str = "same", optional: bool = False
) -> list[Weight]:
    """A Linear's or LayerNorm's weight and bias (the bias keeps its layout: it is a vector)."""
    return [
        Weight(f"{ours}.weight", _each(hf, lambda name: f"{name}.weight"), layout, optional=optional),
        Weight(f"{ours}.bias", _each(hf, lambda name: f"{name}.bias"), optional=optional),
    ]


def repeat(layer: Iterable[Weight], n: int, ours_prefix: str, hf_prefix: str) -> list[Weight]:
    """``layer``'s weights for layers 0..n-1; the prefixes hold ``{i}``."""
    return [
        replace(
            weight,
            ours=ours_prefix.format(i=i) + weight.ours,
            hf=_each(weight.hf, hf_prefix.format(i=i).__add__),
            aliases=_each(weight.aliases, hf_prefix.format(i=i).__add__),
        )
        for i in range(n)
        for weight in layer
    ]


def with_lm_head(embedding: Weight, body: Iterable[Weight], tied: bool) -> list[Weight]:
    """A decoder's token ``embedding``, its ``body`` and its output projection ``lm_head.weight``: tied, HF's is
    the token embedding (model objects carry it, saved files drop it); untied, a weight of its own."""
    if tied:
        return [replace(embedding, aliases=(*embedding.aliases, "lm_head.weight")), *body]
    return [embedding, *body, Weight("lm_head.weight", "lm_head.weight")]


@dataclass(frozen=True)
class NameMap:
    """One family's map between our state dict and HF's. HF names are those of the family's full model
    (``GPT2LMHeadModel``, ``BertForPreTraining``); ``body_prefix`` is what a bare body (``GPT2Model``,
    ``BertModel``) lacks. ``buffers``: suffixes of HF keys that hold no weight of ours, skipped on import and
    left to HF on export; each family says why it has them."""

    family: str
    weights: tuple[Weight, ...]
    body_prefix: str = ""
    buffers: tuple[str, ...] = ()


def read_hf_config(path: str | Path, family: str) -> dict:
    """The ``config.json`` of a Hugging Face ``family`` checkpoint directory."""
    path = Path(path).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"No config.json in {path}; pass a Hugging Face {family} checkpoint directory"
        )
    return json.loads((path / "config.json").read_text())


def load_hf_checkpoint(
    path_or_model, family: str, trust_checkpoint: bool = False
) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config dict, state dict) from a ``transformers`` model object or a local checkpoint directory
    (``model.safetensors``, sharded ones with their ``model.safetensors.index.json``, or ``pytorch_model.bin``,
    the latter read weights-only unless ``trust_checkpoint``); a truncated, corrupt or (untrusted) pickled
    weights file is refused in one paragraph naming it (``read_weights``)."""
    if isinstance(path_or_model, nn.Module):
        return path_or_model.config.to_dict(), path_or_model.state_dict()
    path = Path(path_or_model).expanduser()
    config = read_hf_config(path, family)
    if (path / SHARD_INDEX).is_file() and not (path / "model.safetensors").is_file():
        return config, read_sharded_safetensors(path)
    found = [path / name for name in ("model.safetensors", "pytorch_model.bin") if (path / name).is_file()]
    if not found:
        raise FileNotFoundError(f"No model.safetensors or pytorch_model.bin in {path}")
    state = read_weights(
        found[0],
        f"{found[0]} (task.init_from_hf={path})",
        trusted=trust_checkpoint,
        pickled_fix="If you trust where it came from, add trust_checkpoint=true, or save its weights as "
        "model.safetensors (transformers: save_pretrained), which holds tensors only",
        corrupt_fix="Download the checkpoint again",
    )
    return config, state


SHARD_INDEX = (
    "model.safetensors.index.json"  # save_pretrained(max_shard_size=...): which shard holds which tensor
)


def read_sharded_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint saved in shards, read through the index that names their files."""
    shards = sorted(set(json.loads((path / SHARD_INDEX).read_text())["weight_map"].values()))
    missing = [name for name in shards if not (path / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{path / SHARD_INDEX} names shards that are not there: {missing}")
    tensors = {}
    for name in shards:
        tensors.update(read_weights(path / name, f"{path / name} (task.init_from_hf={path})"))
    return tensors


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Modules built inside have ``dtype`` parameters (a bf16 checkpoint never passes through float32); buffers
    made in an explicit dtype, as the RoPE tables, keep it."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def activation_from_hf(name: str, family: str) -> str:
    if name not in HF_ACTIVATIONS:
        raise ValueError(f"Unsupported {family} activation {name!r}; supported: {sorted(HF_ACTIVATIONS)}")
    return HF_ACTIVATIONS[name]


def activation_to_hf(name: str, family: str) -> str:
    if name not in EXPORTED_ACTIVATIONS:
        raise ValueError(
            f"Hugging Face {family} has no {name!r} activation; use one of {sorted(EXPORTED_ACTIVATIONS)}"
        )
    return EXPORTED_ACTIVATIONS[name]


def _bare_body(keys: Iterable[str], prefix: str) -> bool:
    """Whether state dict ``keys`` are a bare body's (``GPT2Model``, ``BertModel``): none has ``prefix``."""
    return bool(prefix) and not any(key.startswith(prefix) for key in keys)


def state_from_hf(hf_state: dict[str, torch.Tensor], name_map: NameMap) -> dict[str, torch.Tensor]:
    """Our tensors from a HF state dict; refuses, by name, HF weights the map does not use and those it needs
    that the state dict lacks."""
    if _bare_body(hf_state, name_map.body_prefix):
        hf_state = {name_map.body_prefix + key: value for key, value in hf_state.items()}
    ours, lacking = {}, []
    for weight in name_map.weights:
        present = [key for key in weight.hf_keys if key in hf_state]
        if isinstance(weight.hf, tuple) and len(present) < len(weight.hf):
            lacking += sorted(set(weight.hf) - set(present))
        elif not present and weight.optional:
            log.warning(
                "The %s checkpoint has no %s; %s starts fresh", name_map.family, weight.hf, weight.ours
            )
        elif not present:
            lacking.append(weight.hf)
        elif isinstance(weight.hf, tuple):
            ours[weight.ours] = torch.cat([LAYOUTS[weight.layout][0](hf_state[key]) for key in present])
        else:
            _check_copies(hf_state, present, name_map.family)
            ours[weight.ours] = LAYOUTS[weight.layout][0](hf_state[present[0]])
    used = {key for weight in name_map.weights for key in weight.hf_keys}
    unused = sorted(key for key in hf_state if key not in used and not key.endswith(name_map.buffers))
    if unused:
        raise ValueError(
            f"The {name_map.family} checkpoint has weights that {name_map.family} models here do not use: "
            f"{unused}. It is another architecture or carries a head we do not convert; load a checkpoint of "
            "the plain model (or add the weights to the family's NameMap)."
        )
    if lacking:
        raise ValueError(
            f"The {name_map.family} checkpoint lacks weights the model needs: {lacking}. The file is "
            "incomplete or of another architecture; check that it loads with transformers' own class."
        )
    return ours


def _check_copies(hf_state: dict[str, torch.Tensor], keys: list[str], family: str) -> None:
    first = hf_state[keys[0]]
    differing = [key for key in keys[1:] if not torch.equal(hf_state[key], first)]
    if differing:
        raise ValueError(
            f"The {family} checkpoint's {differing} should be tied to {keys[0]!r} but differ from it; its "
            "config's tying flags (tie_word_embeddings, share_encoder_decoder_embeddings) contradict its "
            "weights: fix the config.json"
        )


def state_to_hf(state: dict[str, torch.Tensor], name_map: NameMap) -> dict[str, torch.Tensor]:
    """HF tensors (full-model names, aliases included) from our state dict."""
    hf_state = {}
    for weight in name_map.weights:
        tensor = LAYOUTS[weight.layout][1](state[weight.ours])
        if isinstance(weight.hf, tuple):
            parts = tensor.split(list(weight.split)) if weight.split else tensor.chunk(len(weight.hf))
            hf_state |= {key: t.contiguous() for key, t in zip(weight.hf, parts)}
        else:
            hf_state |= dict.fromkeys(weight.hf_keys, tensor)
    return hf_state


def load_exactly(
    module: nn.Module,
    state: dict[str, torch.Tensor],
    may_lack: Callable[[str], bool],
    what: str,
    assign: bool = False,
) -> None:
    """``module.load_state_dict(state)`` where ``state`` must name only tensors of ``module`` and set every
    one (a tied tensor through any of its names) but those ``may_lack``; a miss is a bug of the name map.

    ``assign``: the module's parameters become ``state``'s tensors instead of receiving a copy (a module built
    on the meta device has no memory to copy into); a parameter tied under several names stays one parameter.
    """
    tensors = module.state_dict(keep_vars=True)
    loaded = {id(tensors[key]) for key in state if key in tensors}
    unknown = sorted(set(state) - set(tensors))
    unset = sorted(key for key, t in tensors.items() if id(t) not in loaded and not may_lack(key))
    if unknown or unset:
        raise RuntimeError(f"The {what} name map is out of step with the model: no {unknown}, unset {unset}")
    names_of: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(param), []).append(name)
    module.load_state_dict(state, strict=False, assign=assign)
    # load_state_dict(assign=True) replaces only the names that state holds: point the other names of each
    # tied parameter at the same new one
    for names in names_of.values() if assign else ():
        param = module.get_parameter(next((name for name in names if name in state), names[0]))
        for name in names:
            owner, _, leaf = name.rpartition(".")
            setattr(module.get_submodule(owner), leaf, param)


def load_from_hf(model: nn.Module, hf_state: dict[str, torch.Tensor], name_map: NameMap) -> None:
    """Loads ``hf_state`` into our ``model`` through ``name_map`` (see the module docstring for the rule)."""
    ours = state_from_hf(hf_state, name_map)
    fresh = {weight.ours for weight in name_map.weights if weight.optional and weight.ours not in ours}
    load_exactly(model, ours, fresh.__contains__, name_map.family)


def export_to_hf(
    model: nn.Module, hf_model: nn.Module, name_map: NameMap, save_dir: str | Path | None = None
):
    """``hf_model`` (eval mode) holding our ``model``'s weights through ``name_map``; ``save_pretrained`` to
    ``save_dir`` when given."""
    hf_state = state_to_hf(model.state_dict(), name_map)
    if _bare_body(hf_model.state_dict(), name_map.body_prefix):
        hf_state = {key.removeprefix(name_map.body_prefix): value for key, value in hf_state.items()}
    load_exactly(hf_model, hf_state, lambda key: key.endswith(name_map.buffers), name_map.family)
    if save_dir is not None:
        hf_model.save_pretrained(str(save_dir))
    return hf_model.eval()
