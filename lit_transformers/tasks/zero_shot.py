"""Zero-shot image classification with a pretrained CLIP: no training, class names and prompt templates as data."""

from __future__ import annotations

import torch

from lit_transformers.models.clip import ZeroShotClassifier
from lit_transformers.tasks.contrastive import (
    check_clip_tokenizer,
    clip_text_features,
    pretrained_clip,
    pretrained_clip_config,
)
from lit_transformers.tasks.evaluation import zero_shot_classifier
from lit_transformers.tasks.image_classification import ImageClassificationTask
from lit_transformers.tasks.specs import config_spec
from lit_transformers.text import Tokenizer


class ZeroShotTask(ImageClassificationTask):
    """A published CLIP classifying an image datamodule's classes (``experiment=clip_zero_shot``): each class is
    the normalised mean of the text embeddings of ``templates`` filled with its name (open_clip's zero-shot
    classifier), and the test reports :class:`ImageClassificationTask`'s metrics (top-1/top-5, per-class
    accuracy, confusion matrix).

    Args: ``init_from_hf`` (a Hugging Face CLIP directory) or ``init_from_open_clip`` (an open_clip Hub-layout
    directory), as in :class:`~lit_transformers.tasks.contrastive.ContrastiveTask`; ``tokenizer_path``: the
    CLIP's tokenizer directory; ``templates``: prompts with one ``{}`` for the class name; the rest as in
    :class:`ImageClassificationTask` (``model`` is replaced by the checkpoint's architecture)."""

    def __init__(
        self,
        templates: list[str],
        tokenizer_path: str | None = None,
        init_from_hf: str | None = None,
        init_from_open_clip: str | None = None,
        model: dict | None = None,
        **task_args,
    ):
        if init_from_hf or init_from_open_clip:  # the checkpoint's architecture (checked again when built)
            model = config_spec(pretrained_clip_config(init_from_hf, init_from_open_clip))
        super().__init__(model=model, **task_args)

    @torch.no_grad()
    def build_model(self) -> ZeroShotClassifier:
        h = self.hparams
        if bool(h.init_from_hf) == bool(h.init_from_open_clip):
            raise ValueError(
                "Zero-shot needs one pretrained CLIP: set task.init_from_hf or task.init_from_open_clip"
            )
        if not h.tokenizer_path:
            raise ValueError("Zero-shot needs the CLIP's tokenizer: set task.tokenizer_path=<its directory>")
        bad = [t for t in h.templates if t.count("{}") != 1]
        if not h.templates or bad:
            raise ValueError(
                "task.templates need one '{}' each for the class name, e.g. 'a photo of a {}.'; got "
                f"{bad or list(h.templates)}"
            )
        names = self.attach_class_names()
        self.build_metrics(len(names))
        self.tokenizer = Tokenizer.from_file(h.tokenizer_path)
        clip = pretrained_clip(h.init_from_hf, h.init_from_open_clip).eval()
        check_clip_tokenizer(self.tokenizer, clip.config, h.init_from_hf or h.init_from_open_clip)
        texts = lambda prompts: clip_text_features(clip, self.tokenizer, prompts)  # noqa: E731
        return ZeroShotClassifier(clip, zero_shot_classifier(texts, names, list(h.templates)))
