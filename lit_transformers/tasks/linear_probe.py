"""Linear probe: a classifier head trained on the frozen image tower of a pretrained CLIP."""

from __future__ import annotations

import torch
from torch import nn

from lit_transformers.models.clip import CLIP, CLIPConfig
from lit_transformers.tasks.contrastive import pretrained_clip, pretrained_clip_config
from lit_transformers.tasks.image_classification import ImageClassificationTask
from lit_transformers.tasks.specs import build_config, config_spec
from lit_transformers.text import Tokenizer
from lit_transformers.utils.checkpoints import read_checkpoint


class LinearProbeTask(ImageClassificationTask):
    """A published CLIP's image features (``CLIP.encode_image``: the projected, L2-normalised embedding that
    zero-shot classification also reads) classified by a trained linear ``head`` (``experiment=clip_linear_probe``);
    the CLIP, ``model``, stays frozen. Reports :class:`ImageClassificationTask`'s metrics (top-1/top-5, per-class
    accuracy, confusion matrix).

    Args: ``init_from_hf`` (a Hugging Face CLIP directory) or ``init_from_open_clip`` (an open_clip Hub-layout
    directory), as in :class:`~lit_transformers.tasks.contrastive.ContrastiveTask`, or ``init_from``, a CLIP
    checkpoint of ours (``experiment=clip`` or ``clip_finetune``): the checkpoint's architecture replaces
    ``model`` and its weights are loaded once (checkpoints of this task rebuild it without the source); ``label_smoothing`` (none by default: a probe is fitted to the labels); the rest as in
    :class:`ImageClassificationTask`, but ``layer_decay``, which scales the lr of
    a fine-tuned backbone, and a frozen one has none."""

    frozen = ("model",)

    def __init__(
        self,
        init_from_hf: str | None = None,
        init_from_open_clip: str | None = None,
        model: dict | None = None,
        label_smoothing: float = 0.0,
        **task_args,
    ):
        if init_from_hf and init_from_open_clip:
            raise ValueError("Set one of task.init_from_hf and task.init_from_open_clip, not both")
        if task_args.get("layer_decay") is not None:
            raise ValueError("A linear probe trains its head only: leave task.layer_decay=null")
        if init_from_hf or init_from_open_clip:  # the checkpoint's architecture, recorded for reloads
            model = config_spec(pretrained_clip_config(init_from_hf, init_from_open_clip))
        elif isinstance(task_args.get("init_from"), str):
            model = clip_checkpoint_spec(task_args["init_from"], task_args.get("trust_checkpoint", False))
        super().__init__(model=model, label_smoothing=label_smoothing, **task_args)

    def build_models(self) -> dict[str, nn.Module]:
        h = self.hparams
        n = len(self.attach_class_names())
        self.build_metrics(n)
        if h.init_from_hf or h.init_from_open_clip:
            clip = pretrained_clip(h.init_from_hf, h.init_from_open_clip)
            h.init_from_hf = h.init_from_open_clip = None  # applied once: checkpoints carry the weights
        elif h.model.get(
            "vocab_size"
        ):  # init_from (a CLIP of ours) or a checkpoint of this task: weights next
            clip = CLIP(build_config(h.model))
        else:
            raise ValueError(
                "A linear probe reads a pretrained CLIP's features: set task.init_from_hf=<Hugging Face CLIP "
                "directory>, task.init_from_open_clip=<open_clip directory> or init_from=<a CLIP .ckpt of ours>"
            )
        return {"model": clip, "head": nn.Linear(clip.config.embed_dim, n)}

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():  # frozen: no activations kept for a backward pass
            features = self.model.encode_image(images)  # (B, embed_dim), L2-normalised
        return self.head(features)  # (B, n_classes)


def clip_checkpoint_spec(path: str, trusted: bool) -> dict:
    """The CLIP config spec a checkpoint of ours was trained with, its vocabulary size and EOS id (null in the
    spec of a run that took them from its tokenizer) from the tokenizer the checkpoint carries."""
    hparams = read_checkpoint(path, "init_from", trusted).get("hyper_parameters", {})
    spec = dict(hparams.get("model") or {})
    if spec.get("_target_") != f"{CLIPConfig.__module__}.{CLIPConfig.__qualname__}":
        raise ValueError(
            f"init_from={path} holds no CLIP (its model is {spec.get('_target_')}); pass a checkpoint of "
            "experiment=clip or clip_finetune, or a published CLIP with task.init_from_hf / task.init_from_open_clip"
        )
    if hparams.get("tokenizer"):
        tokenizer = Tokenizer.from_state(hparams["tokenizer"])
        spec["vocab_size"] = spec.get("vocab_size") or tokenizer.vocab_size
        spec["eos_id"] = tokenizer.eos_id if spec.get("eos_id") is None else spec["eos_id"]
    return spec
