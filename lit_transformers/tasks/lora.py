"""LoRA (Hu et al. 2021) through ``peft`` on our own modules, for ``task.lora``.

:func:`configure_lora` adds low-rank adapters to a task's ``lora_models`` by module name (peft's
``inject_adapter_in_model``), freezes everything else but ``modules_to_save``, and records the frozen base's
identity: its source (``init_from`` or ``init_from_hf``) and a hash of its weights. A LoRA checkpoint then holds
only what trains (:func:`slim_checkpoint`), and loading one rebuilds the base from its source and refuses a base
with other weights (:func:`restore_base`). :func:`adapters_disabled` and :class:`FrozenBase` give the frozen base's forward (a
reference model without a second copy). Export in peft's format: :mod:`lit_transformers.tasks.lora_export`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)

# the attention (fused q/k/v, output) and MLP (in, out) projections of nn.blocks, which GPT, BERT, the
# translation model and CLIP's text tower share; the translation decoder's cross-attention (q, fused k/v, output)
PROJECTIONS = ("attn.qkv_proj", "attn.out_proj", "mlp.fc", "mlp.proj")
CROSS_PROJECTIONS = ("cross_attn.q_proj", "cross_attn.kv_proj", "cross_attn.out_proj")
# timm's ViT blocks (ViT classifiers, CLIP's image tower): fused q/k/v, attention output, MLP in and out
VIT_PROJECTIONS = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")
DEFAULT_TARGETS = {  # by model class
    "GPT": PROJECTIONS,
    "ScalarGPT": PROJECTIONS,
    "BERT": PROJECTIONS,
    "Seq2SeqTransformer": PROJECTIONS + CROSS_PROJECTIONS,
    "VisionTransformer": VIT_PROJECTIONS,
    "CLIP": PROJECTIONS + VIT_PROJECTIONS,  # both towers
}


@dataclass
class LoRASpec:
    """``task.lora``: the adapters' shape, where they go, and what else trains."""

    r: int = 8  # rank of each adapter: delta W = B A with A (r, in), B (out, r)
    alpha: float = 16.0  # the adapter's output is scaled by alpha / r (peft's lora_alpha)
    dropout: float = 0.0  # dropout on the adapter's input
    # module names (or their trailing parts, "attn.qkv_proj") to adapt; None: DEFAULT_TARGETS of the model's family
    target_modules: list[str] | None = None
    # task submodules trained in full and saved, e.g. ["classifier"]; None: the task's new heads and models
    modules_to_save: list[str] | None = None


def lora_spec(lora: Mapping) -> LoRASpec:
    known = [field.name for field in dataclasses.fields(LoRASpec)]
    unknown = sorted(set(lora) - set(known))
    if unknown:
        raise ValueError(f"task.lora has unknown keys {unknown}; its keys are {known}")
    return LoRASpec(**lora)


def module_names(model: nn.Module) -> list[str]:
    """The names of ``model``'s modules that hold weights of their own, one per layer pattern (``blocks.{i}.``)."""
    named = (
        name for name, module in model.named_modules() if next(module.parameters(False), None) is not None
    )
    return list(dict.fromkeys(re.sub(r"\.\d+\.", ".{i}.", name) for name in named))


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith(f".{target}")  # peft's rule for a list of target_modules


def add_adapters(model: nn.Module, spec: LoRASpec, where: str) -> None:
    """Adapters on ``model``'s ``spec.target_modules`` (named ``where`` in errors); peft freezes the rest."""
    from peft import LoraConfig, inject_adapter_in_model

    family = type(model).__name__
    targets = spec.target_modules or DEFAULT_TARGETS.get(family)
    if not targets:
        raise ValueError(
            f"task.lora has no default target_modules for {where} ({family}); set task.lora.target_modules to "
            f"some of its modules: {module_names(model)}"
        )
    names = [name for name, _ in model.named_modules()]
    unmatched = [target for target in targets if not any(_matches(name, target) for name in names)]
    if unmatched:
        raise ValueError(
            f"task.lora.target_modules {unmatched} match no module of {where} ({family}); name modules (or their "
            f"trailing parts, e.g. attn.qkv_proj) among: {module_names(model)}"
        )
    config = LoraConfig(
        r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout, target_modules=list(targets)
    )
    inject_adapter_in_model(config, model)


def configure_lora(task) -> None:
    """Apply ``task.hparams.lora`` to the built ``task`` (after ``init_from``): adapters on its ``lora_models``,
    every other weight frozen but ``modules_to_save``, the base's identity in ``task.lora_base``."""
    missing = [name for name in task.lora_models if name not in task.model_names]
    if missing or not task.lora_models:
        raise ValueError(
            f"{type(task).__name__} has no model to put task.lora's adapters on (it trains none of its own); set "
            "task.lora=null"
        )
    spec = lora_spec(task.hparams.lora)
    source = base_source(task.hparams)
    for name in task.lora_models:
        if name in task.frozen:
            raise ValueError(
                f"task.lora on {name}, which {type(task).__name__} keeps frozen: a frozen model does not train, "
                "so adapters on it would learn nothing; LoRA goes on the trained models "
                f"({', '.join(task.trainable_models())})"
            )
        add_adapters(getattr(task, name), spec, name)
    for name in set(task.trainable_models()) - set(task.lora_models):
        getattr(task, name).requires_grad_(False)
    saved = spec.modules_to_save
    if saved is None:  # heads on top of the base, and models of their own beside it (a classifier)
        beside = (n for n in task.trainable_models() if n not in task.lora_models)
        saved = list(dict.fromkeys([*task.new_heads, *beside, *family_heads(task)]))
    for path in saved:
        try:
            task.get_submodule(path).requires_grad_(True)
        except AttributeError as err:
            raise ValueError(
                f"task.lora.modules_to_save names {path!r}, which {type(task).__name__} lacks; name one of its "
                f"models ({', '.join(task.model_names)}) or a part of one (model.lm_head)"
            ) from err
    task.lora_base = {"source": source, "sha256": base_hash(task)}


def family_heads(task) -> list[str]:
    """The heads of the task's ``lora_models`` that map the base's features to the task's outputs, trained in
    full: a scalar model's ``head`` (reward, value), a timm classifier's (``head`` of a ViT, ``fc`` of a ResNet)."""
    heads = []
    for name in task.lora_models:
        model = getattr(task, name)
        if type(model).__name__ == "ScalarGPT":
            heads.append(f"{name}.head")
        elif hasattr(model, "get_classifier"):  # timm's API, whatever the classifier's name
            classifier = model.get_classifier()
            heads += [f"{name}.{n}" for n, m in model.named_modules() if m is classifier and n]
    return heads


# the hyperparameters that name a pretrained base (a checkpoint, a Hugging Face or open_clip directory)
BASE_SOURCES = ("init_from", "init_from_hf", "init_from_open_clip")


def base_source(hparams: Mapping) -> str:
    """Where the frozen base comes from, as a command line sets it; a LoRA run needs one to rebuild it from."""
    sources = [f"{key}={hparams[key]}" for key in BASE_SOURCES if hparams.get(key)]
    backbone = (hparams.get("model") or {}).get("backbone") or {}  # a timm classifier's pretrained weights
    if backbone.get("pretrained"):
        where = backbone.get("pretrained_file") or "timm's pretrained weights"
        sources.append(f"model.backbone.name={backbone.get('name')} ({where})")
    if not sources:
        raise ValueError(
            "task.lora trains adapters on a frozen pretrained base, and this run has none (its LoRA checkpoints "
            "could not rebuild a random one): set init_from=<checkpoint>, task.init_from_hf=<directory> (or "
            "task.init_from_open_clip), or model.backbone.pretrained=true for a timm backbone"
        )
    return ", ".join(sources)


def base_hash(task) -> str:
    """sha256 of the frozen weights of the task's ``lora_models``, by name (without peft's ``.base_layer``)."""
    digest = hashlib.sha256()
    for model in task.lora_models:
        frozen = {n: p for n, p in getattr(task, model).named_parameters() if not p.requires_grad}
        for name in sorted(frozen, key=lambda n: n.replace(".base_layer", "")):
            digest.update(name.replace(".base_layer", "").encode())
            digest.update(frozen[name].detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _frozen_keys(task) -> set[str]:
    return {name for name, p in task.named_parameters(remove_duplicate=False) if not p.requires_grad}


def slim_checkpoint(task, checkpoint: dict) -> None:
    """Drop the frozen weights from a checkpoint of ``task`` and name the base they come from instead."""
    frozen = _frozen_keys(task)
    checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k not in frozen}
    checkpoint["lora_base"] = dict(task.lora_base)


def restore_base(task, checkpoint: dict) -> None:
    """Before a LoRA checkpoint's weights load into ``task``: refuse it unless ``task`` was built on the base it
    names (same weights), then complete it with the frozen weights of that base."""
    theirs, ours = checkpoint.get("lora_base"), getattr(task, "lora_base", None)
    if theirs is None and ours is None:
        return
    if theirs is None:
        raise ValueError(
            "The checkpoint holds full weights, not LoRA adapters, but this task has task.lora set: load it with "
            "task.lora=null, or start LoRA from its weights with init_from=<it> instead of ckpt_path"
        )
    if ours is None:
        raise ValueError(
            f"The checkpoint holds LoRA adapters on the base {theirs['source']}; load it with the task.lora of its run"
        )
    if theirs["sha256"] != ours["sha256"]:
        raise ValueError(
            f"The checkpoint holds LoRA adapters trained on the base {theirs['source']} (weights sha256 "
            f"{theirs['sha256'][:12]}), but this task's base, {ours['source']}, has other weights (sha256 "
            f"{ours['sha256'][:12]}); pass the base it names ({theirs['source']}) with the same weights"
        )
    state = task.state_dict()
    checkpoint["state_dict"] = {**{k: state[k] for k in _frozen_keys(task)}, **checkpoint["state_dict"]}


def merged_weights(checkpoint: Mapping, path: str | Path, trusted: bool) -> dict[str, torch.Tensor]:
    """The full weights of a LoRA checkpoint's model, for ``init_from``: its task reloaded (which rebuilds the
    base it names, and checks it), the adapters merged into it, as a plain state dict."""
    from hydra.utils import get_class

    name = checkpoint.get("task_class", "")
    if not name.startswith("lit_transformers."):  # importing a module the file names could run its code
        raise ValueError(
            f"init_from={path} holds LoRA adapters of an unknown task {name!r}; pass a checkpoint of ours"
        )
    parent = get_class(name).load_from_checkpoint(path, map_location="cpu", weights_only=not trusted)
    return without_adapters(parent.model, merge=True).state_dict()


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Inside, ``model`` computes as its frozen base (the adapters are bypassed): a reference model for free."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [module for module in model.modules() if isinstance(module, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def refuse_reference_source(hparams: Mapping) -> None:
    """Under LoRA a policy task's reference is its frozen base with the adapters off (:class:`FrozenBase`): a
    reference named in ``init_from`` or ``init_from_hf`` would have no model to load into."""
    named = [
        f"task.{key}.reference"
        for key in ("init_from", "init_from_hf")
        if isinstance(hparams.get(key), Mapping) and hparams[key].get("reference")
    ]
    if named:
        raise ValueError(
            f"{' and '.join(named)} name(s) a reference model, but under task.lora the reference is the "
            "policy's frozen base with its adapters off (no model of its own): drop reference from it"
        )


class FrozenBase:
    """``model`` called as its frozen base: each call runs with the adapters bypassed and dropout off, then
    restores both. A reference model without a second copy; a plain object, not a submodule, so nothing of it
    is counted twice in the task's parameters or written to its checkpoints."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __call__(self, *args, **kwargs):
        was_training = self.model.training
        self.model.eval()
        try:
            with adapters_disabled(self.model):
                return self.model(*args, **kwargs)
        finally:
            self.model.train(was_training)


def without_adapters(model: nn.Module, merge: bool) -> nn.Module:
    """A copy of ``model`` with plain modules in place of its adapted ones: their base weights, or with
    ``merge`` the base weights plus the adapters' B A * alpha / r (peft's merge)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    model = copy.deepcopy(model)
    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer):
            if merge:
                module.merge()
            model.set_submodule(name, module.get_base_layer())
    return model
