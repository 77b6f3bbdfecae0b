"""Image backbones by timm name: the one entry point ViT classification and the CLIP image tower share."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import timm
from torch import nn

from lit_transformers.nn import TRAINING_FLOPS_PER_WEIGHT, attention_flops, linear_weights
from lit_transformers.utils.checkpoints import read_weights


@dataclass
class ImageClassifierConfig:
    """An image classifier: any timm model by name, its class count taken from the data."""

    backbone: dict = field(default_factory=lambda: {"name": "vit_tiny_patch16_224"})  # create_backbone kwargs


def _file_classes(name: str, path: str, num_classes: int | None) -> int:
    """The rows of a checkpoint file's classifier (0: it has none). timm keeps a file's classifier when
    ``num_classes`` equals its preset's class count (ImageNet's 1000, whatever the file holds) and drops it
    otherwise; told the file's own count instead, it keeps a matching one and starts a different one anew
    (logged here)."""
    from timm.models import get_pretrained_cfg, load_state_dict

    classifier = getattr(get_pretrained_cfg(name), "classifier", None) or "head"
    if not isinstance(classifier, str):  # distilled DeiT: (head, head_dist)
        classifier = classifier[0]
    head = load_state_dict(str(path)).get(f"{classifier}.weight")
    file_classes = 0 if head is None else head.shape[0]
    if num_classes and num_classes != file_classes:  # 0: features only (a CLIP image tower), no classifier
        logging.getLogger(__name__).warning(
            "%s holds a %d-class classifier; the model's %d-class %s is new (randomly initialised)",
            path,
            file_classes,
            num_classes,
            classifier,
        )
    return file_classes


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
        kwargs["pretrained_cfg_overlay"] = {"file": str(pretrained_file)}
        # JAX .npz weights are read by timm's models themselves, classifier included
        if Path(pretrained_file).suffix not in (".npz", ".npy"):
            read_weights(  # refused here in a paragraph, not in a traceback from inside timm
                pretrained_file,
                f"model.backbone.pretrained_file={pretrained_file}",
                pickled_fix="If you trust where it came from, save its state dict alone (torch.save("
                "model.state_dict(), path) or a .safetensors file), which holds tensors only",
                corrupt_fix="Download or save the weights again",
            )
            # the file's own class count, not the preset's (ImageNet's 1000)
            kwargs["pretrained_cfg_overlay"]["num_classes"] = _file_classes(
                name, pretrained_file, kwargs.get("num_classes")
            )
    if not timm.is_model(name):
        raise ValueError(f"Unknown timm model {name!r}; see timm.list_models('vit_*') for names")
    try:
        return timm.create_model(name, pretrained=pretrained, **kwargs)
    except RuntimeError as err:
        if pretrained_file is None or not str(err).startswith("Error(s) in loading state_dict"):
            raise
        first = str(err).split("\n")[1].strip()  # "size mismatch for <name>: ...", "Missing key(s) ..."
        raise ValueError(
            f"model.backbone.pretrained_file={pretrained_file} does not fit timm model {name!r} as configured "
            f"({first[:200]}); pass weights of that model, or set model.backbone.name and its sizes (img_size, "
            "patch_size, depth, ...) to those the weights were trained with"
        ) from err


def vit_flops_per_image(model: nn.Module) -> int | None:
    """Training FLOPs per image of a timm Vision Transformer (``nn.flops``); None for other backbones. timm has
    no FLOPs counter of its own (its benchmark script borrows fvcore's or DeepSpeed's), so this counts the
    matmuls of the model as built: for each of the N tokens (patches + class/register tokens) 6 per block
    weight and attention over N, 12 * depth * N * d; the patch projection once per patch, the head(s) once.
    """
    if not all(hasattr(model, name) for name in ("patch_embed", "blocks", "num_prefix_tokens", "embed_dim")):
        return None
    patches = model.patch_embed.num_patches
    tokens = patches + model.num_prefix_tokens
    blocks = linear_weights(model.blocks)
    heads = linear_weights(model) - blocks  # the classifier(s), and any other matmul outside the blocks
    per_image_weights = blocks * tokens + model.patch_embed.proj.weight.numel() * patches + heads
    attention = attention_flops(len(model.blocks), tokens, model.embed_dim) * tokens
    return TRAINING_FLOPS_PER_WEIGHT * per_image_weights + attention
