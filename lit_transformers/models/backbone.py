"""Image backbones by timm name: the one entry point ViT classification and the CLIP image tower share."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import timm
from torch import nn

log = logging.getLogger(__name__)


@dataclass
class ImageClassifierConfig:
    """An image classifier: any timm model by name, its class count taken from the data."""

    backbone: dict = field(default_factory=lambda: {"name": "vit_tiny_patch16_224"})  # create_backbone kwargs


def create_backbone(
    name: str, pretrained: bool = False, pretrained_file: str | None = None, **kwargs
) -> nn.Module:
    """``timm.create_model(name, **kwargs)``; keys set to None are dropped so that ViT-only knobs
    (``patch_size``, ``class_token``, ...) can stay in the config when the name is a CNN.

    Offline fine-tuning: ``pretrained=True`` with ``pretrained_file`` loads that local file through timm's
    own mechanism, which resamples position embeddings to ``img_size`` and drops a classifier of another size.
    """
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    if pretrained_file is not None:
        if not Path(pretrained_file).is_file():
            raise FileNotFoundError(
                f"pretrained_file={pretrained_file} not found; set model.backbone.pretrained_file=..."
            )
        if not pretrained:
            raise ValueError(
                "pretrained_file is set but pretrained=false; set model.backbone.pretrained=true"
            )
        kwargs["pretrained_cfg_overlay"] = _file_overlay(
            name, str(pretrained_file), kwargs.get("num_classes")
        )
    if not timm.is_model(name):
        raise ValueError(f"Unknown timm model {name!r}; see timm.list_models('vit_*') for names")
    return timm.create_model(name, pretrained=pretrained, **kwargs)


def _file_overlay(name: str, path: str, num_classes: int | None) -> dict:
    """timm's ``pretrained_cfg_overlay`` for a local checkpoint: the file, and its own class count, so that timm
    keeps the file's classifier when ``num_classes`` matches it and starts a new one when it differs (timm alone
    compares ``num_classes`` with the preset's, ImageNet's 1000, whatever the file holds)."""
    from timm.models import get_pretrained_cfg, load_state_dict

    classifier = getattr(get_pretrained_cfg(name), "classifier", None) or "head"
    classifier = (
        classifier if isinstance(classifier, str) else classifier[0]
    )  # distilled DeiT: head, head_dist
    head = load_state_dict(path).get(f"{classifier}.weight")
    file_classes = 0 if head is None else head.shape[0]
    if num_classes and num_classes != file_classes:  # 0: features only (a CLIP image tower), no classifier
        log.warning(
            "%s holds a %d-class classifier; the model's %d-class %s is new (randomly initialised)",
            path,
            file_classes,
            num_classes,
            classifier,
        )
    return {"file": path, "num_classes": file_classes}
