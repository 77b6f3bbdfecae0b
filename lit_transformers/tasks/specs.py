"""Plain data in, objects out: a task's hyperparameters are plain containers (dicts, lists, numbers,
strings), so a checkpoint loads with ``torch.load(weights_only=True)``; the model configs, optimizers and
schedules are built from them here, on load as on training, and weights are copied strictly."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import torch
from hydra.utils import get_object
from torch import nn

from lit_transformers.utils.checkpoints import read_checkpoint


def model_weights(checkpoint: Mapping) -> dict[str, torch.Tensor]:
    """The primary model's weights from a Lightning checkpoint (keys ``model.*``) or a plain state dict."""
    state = checkpoint.get("state_dict", checkpoint)
    # Lightning checkpoints name weights "<task attribute>.<name>" beside metric states
    if any(k.startswith("model.") for k in state):
        state = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
    return state


def load_weights(
    module: nn.Module, path: str | Path, new: tuple[str, ...] = (), checkpoint: Mapping | None = None
) -> list[str]:
    """Copy the weights at ``path`` (already read: ``checkpoint``) into ``module``; returns the keys left as
    initialised.

    Strict, except that keys under a prefix in ``new`` (heads the receiving task adds, e.g. a reward
    model's scalar head on a GPT checkpoint) may be absent from the checkpoint. Any other missing or
    unexpected key, or a shape mismatch, is an error that lists them.
    """
    state = model_weights(read_checkpoint(path, "init_from") if checkpoint is None else checkpoint)
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    fresh = [k for k in missing if k.startswith(new)] if new else []
    missing = [k for k in missing if k not in fresh]
    unexpected = sorted(set(state) - set(own))
    mismatched = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(v.shape)}"
        for k, v in own.items()
        if k in state and state[k].shape != v.shape
    ]
    if missing or unexpected or mismatched:
        raise ValueError(
            f"init_from={path} does not fit the model.\n  missing keys: {missing}\n  unexpected keys: {unexpected}\n"
            f"  shape mismatches: {mismatched}\nUse a checkpoint trained with the same model config."
        )
    module.load_state_dict(state, strict=False)
    return fresh


def config_spec(config) -> dict:
    """The plain spec of a model config: a dataclass instance becomes ``{_target_: its class, **fields}``,
    so Python callers may pass config objects while checkpoints keep plain data."""
    if dataclasses.is_dataclass(config):
        cls = type(config)
        return {"_target_": f"{cls.__module__}.{cls.__qualname__}", **dataclasses.asdict(config)}
    return dict(config)


def build_config(spec: Mapping, **defaults):
    """A model config dataclass from its plain spec (``_target_`` + fields); ``defaults`` fill the fields
    the spec leaves null (the vocabulary size that the tokenizer decides)."""
    cls = get_object(spec["_target_"])
    if not dataclasses.is_dataclass(cls):
        raise ValueError(f"model _target_ {spec['_target_']!r} is not a model config dataclass")
    fields = {k: v for k, v in spec.items() if not k.startswith("_")}
    fields |= {k: v for k, v in defaults.items() if fields.get(k) is None}
    return cls(**fields)


def build_from_spec(spec: Mapping, base: type, what: str, *args, **kwargs):
    """Call the class or function a ``{_target_: ..., key: value}`` spec names with ``args``, the spec's
    values and ``kwargs``. The target must be a ``base`` subclass or a function of this package: specs
    come from checkpoints too, and calling an arbitrary target would run arbitrary code."""
    target = get_object(spec["_target_"])
    allowed = (isinstance(target, type) and issubclass(target, base)) or (
        callable(target) and target.__module__.startswith("lit_transformers.")
    )
    if not allowed:
        raise ValueError(f"{what}._target_={spec['_target_']!r} is not a {base.__name__}")
    return target(*args, **{k: v for k, v in spec.items() if not k.startswith("_")}, **kwargs)
