"""CLIP contrastive image-text training, with zero-shot classification and retrieval evaluation."""

from __future__ import annotations

import logging
import math

import torch
from torchmetrics.functional.classification import multiclass_accuracy

from lit_transformers.contract import RetrievalTargets
from lit_transformers.models import hf_clip, hf_convert
from lit_transformers.models.clip import CLIP, CLIPConfig
from lit_transformers.models.open_clip_convert import config_from_open_clip, read_open_clip_dir
from lit_transformers.nn import ClipLoss
from lit_transformers.tasks.base import Task
from lit_transformers.tasks.evaluation import recall_at_k, zero_shot_classifier
from lit_transformers.tasks.specs import config_spec
from lit_transformers.text import Tokenizer, eos_terminated
from lit_transformers.utils.dashboards import log_image
from lit_transformers.utils.figures import class_label, image_grid_figure, similarity_figure

log = logging.getLogger(__name__)


class ContrastiveTask(Task):
    """Args: ``model``, the CLIP config spec (vocabulary and EOS id come from the tokenizer);
    ``init_from_hf`` (a Hugging Face CLIP directory) or ``init_from_open_clip`` (a directory laid out as
    open_clip's Hub repositories): a published CLIP whose config replaces the spec and whose weights initialise
    the model (with its tokenizer: ``data.tokenizer_path=<a CLIP tokenizer directory>``);
    ``max_logit_scale``: logit_scale is clamped to [0, this] after every step (temperature between 1/100
    and 1, as open_clip); ``local_loss``/``gather_with_grad``: see ``nn.ClipLoss``; ``recall_ks``: retrieval
    recall@k reported in both directions; ``num_retrievals`` captions of the first evaluation batch shown
    with the ``num_retrieved`` images that match them best; the rest as in :class:`Task`."""

    data_needs = (RetrievalTargets,)

    def __init__(
        self,
        model: dict | CLIPConfig,
        init_from_hf: str | None = None,
        init_from_open_clip: str | None = None,
        max_logit_scale: float = math.log(100),
        local_loss: bool = True,
        gather_with_grad: bool = True,
        recall_ks: tuple[int, ...] = (1, 5, 10),
        num_retrievals: int = 4,
        num_retrieved: int = 5,
        **task_args,
    ):
        if init_from_hf and init_from_open_clip:
            raise ValueError("Set one of task.init_from_hf and task.init_from_open_clip, not both")
        if init_from_hf or init_from_open_clip:  # the checkpoint's architecture, recorded for resumed runs
            model = pretrained_clip_config(init_from_hf, init_from_open_clip)
        model = config_spec(model)  # before the base records the arguments as hyperparameters
        super().__init__(**task_args)
        self.loss = ClipLoss(local_loss, gather_with_grad)
        self._eval: dict[str, list[torch.Tensor]] = {}
        self._seen: dict[str, set[int]] = {}  # per stage: the image indices evaluated so far (_first_seen)
        self._first_batch: dict | None = None  # this evaluation's first batch and its features, for pictures

    def build_model(self) -> CLIP:
        h = self.hparams
        if h.init_from_hf or h.init_from_open_clip:
            model = pretrained_clip(h.init_from_hf, h.init_from_open_clip)
            check_clip_tokenizer(
                self.attach_tokenizer(), model.config, h.init_from_hf or h.init_from_open_clip
            )
            # checkpoints of this task rebuild it from hparams.model (set in __init__) without the directory
            h.init_from_hf = h.init_from_open_clip = None
            return model
        return CLIP(
            self.text_model_config(vocab_size=lambda tok: tok.vocab_size, eos_id=lambda tok: tok.eos_id)
        )

    def forward(self, images: torch.Tensor, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model(images, input_ids)

    def _loss(
        self, batch: dict, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        image_features, text_features = self.model(batch["image"], batch["input_ids"])  # (B, E) each
        world = self.trainer.world_size if self._trainer is not None else 1
        loss = self.loss(
            image_features,
            text_features,
            self.model.logit_scale.exp(),
            self.all_gather,
            self.global_rank,
            world,
            valid,
        )
        return loss, image_features, text_features

    def training_step(self, batch, batch_idx):
        loss, _, _ = self._loss(batch)
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        self.log("train/logit_scale", self.model.logit_scale.exp(), on_step=True, on_epoch=False)
        return loss

    def optimizer_step(self, *args, **kwargs):
        super().optimizer_step(*args, **kwargs)
        with torch.no_grad():  # temperature between 1/100 and 1, as open_clip clamps it
            self.model.logit_scale.clamp_(0, self.hparams.max_logit_scale)

    def _first_seen(self, image_index: torch.Tensor, stage: str) -> torch.Tensor | None:
        """(B,) bool: which rows of this rank's batch hold images no rank has evaluated before in this
        evaluation; None in one process. Under DDP, Lightning's DistributedSampler repeats a few images at the end
        so that every rank runs as many batches; the repeats must not count twice."""
        if self._trainer is None or self.trainer.world_size == 1:
            return None
        every_rank = self.all_gather(image_index)  # (W, B)
        seen = self._seen.setdefault(stage, set())
        first = []
        for index in every_rank.flatten().tolist():
            first.append(index not in seen)
            seen.add(index)
        return torch.tensor(first, device=self.device).view(every_rank.shape)[self.global_rank]

    def _eval_step(self, batch, batch_idx: int, stage: str) -> None:
        valid = self._first_seen(batch["image_index"], stage)
        loss, image_features, text_features = self._loss(batch, valid)
        # the mean over this rank's rows (local_loss) or over all (then equal on every rank): weighted by its rows
        rows = batch["image"].size(0) if valid is None else valid.sum()
        self.log_mean(f"{stage}/loss", loss, rows, prog_bar=stage == "val")
        store = self._eval.setdefault(stage, [])
        index_label = torch.stack([batch["image_index"], batch["label"]], dim=1).float()  # (B, 2)
        store.append(torch.cat([image_features.float(), index_label], dim=1))  # gathered as one tensor
        if batch_idx == 0 and not self.trainer.sanity_checking:
            self._first_batch = {**batch, "image_features": image_features, "text_features": text_features}

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, batch_idx, "val")

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, batch_idx, "test")

    def on_validation_epoch_end(self):
        self._evaluate("val")

    def on_test_epoch_end(self):
        self._evaluate("test")

    @torch.no_grad()
    def encode_texts(self, texts: list[str], batch_size: int = 256) -> torch.Tensor:
        """(N, E) normalised embeddings of raw strings, tokenized like the training captions."""
        return clip_text_features(self.model, self.require_tokenizer(), texts, batch_size)

    def _evaluate(self, stage: str) -> None:
        """Zero-shot accuracy (digits: class names x prompt templates) and retrieval recall@k in both
        directions, over the whole split: image features are gathered from every rank and de-duplicated."""
        self._seen.pop(stage, None)
        rows = (
            self.all_gather(torch.cat(self._eval.pop(stage))).flatten(0, -2) if stage in self._eval else None
        )
        if rows is None or self.data is None:
            return
        datamodule = self.data
        # DistributedSampler repeats a few images to even out ranks; limit_*_batches may skip some
        index, inverse = torch.unique(rows[:, -2].long(), return_inverse=True)  # the N distinct images seen
        pick = torch.zeros_like(index).scatter_(0, inverse, torch.arange(len(rows), device=rows.device))
        features, labels = rows[pick, :-2], rows[pick, -1].long()  # (N, E), (N,); repeats are identical
        texts, relevant = datamodule.retrieval_targets(stage)
        relevant = relevant[:, index.cpu()]  # (n_texts, N)
        similarity = features @ self.encode_texts(texts).T  # (N, n_texts)
        ks = self.hparams.recall_ks
        metrics = {f"{stage}/i2t_recall@{k}": v for k, v in recall_at_k(similarity, relevant.T, ks).items()}
        metrics |= {f"{stage}/t2i_recall@{k}": v for k, v in recall_at_k(similarity.T, relevant, ks).items()}
        if datamodule.class_names:
            weights = zero_shot_classifier(
                self.encode_texts, datamodule.class_names, datamodule.templates[stage]
            )
            logits = features @ weights
            n = len(datamodule.class_names)
            for k in (1, min(5, n)):
                metrics[f"{stage}/zeroshot_top{k}"] = multiclass_accuracy(
                    logits, labels, n, top_k=k, average="micro"
                ).item()
        self.log_dict(metrics, sync_dist=True)  # already equal on every rank (gathered features)
        if self._first_batch is not None:
            self._log_first_batch(stage, self._first_batch, datamodule.class_names)
            self._first_batch = None

    def _log_first_batch(self, stage: str, batch: dict, class_names: list[str]) -> None:
        """Pictures of the evaluation's first batch, whose caption j describes image j: the (images,
        captions) similarity sorted by class (a bright diagonal is a good sign), and for its first
        ``num_retrievals`` captions the ``num_retrieved`` images of the batch that match them best."""
        tok = self.require_tokenizer()
        captions = [tok.decode(ids) for ids in batch["input_ids"].tolist()]
        labels = batch["label"].tolist()
        similarity = batch["image_features"] @ batch["text_features"].T  # (B, B) cosine: normalised features
        title = f"{stage}: similarity of the first batch's images and captions"
        figure = similarity_figure(similarity, labels, class_names, captions, title)
        log_image(self.trainer, f"{stage}/similarity", figure)
        queries = min(self.hparams.num_retrievals, len(captions))
        k = min(self.hparams.num_retrieved, len(captions))
        if not queries or not k:
            return
        scores, top = similarity[:, :queries].T.topk(k, dim=1)  # (queries, k): images per caption
        marks = [
            f"{'✓' if i == q else '✗'} {class_label(labels[i], class_names)} ({score:.2f})"
            for q, (row, row_scores) in enumerate(zip(top.tolist(), scores.tolist()))
            for i, score in zip(row, row_scores)
        ]
        title = f"{stage}: top-{k} of the first batch's {len(captions)} images per caption (✓: its own image)"
        images = batch["image"][top.flatten()]
        figure = image_grid_figure(images, marks, title, columns=k, row_titles=captions[:queries])
        log_image(self.trainer, f"{stage}/retrieval", figure)


def clip_text_features(
    model: CLIP, tokenizer: Tokenizer, texts: list[str], batch_size: int = 256
) -> torch.Tensor:
    """(N, E) normalised text embeddings of raw strings, tokenized as captions are (EOS-terminated)."""
    ids = eos_terminated(
        tokenizer.encode_batch(texts), tokenizer.eos_id, tokenizer.pad_id, model.config.context_length
    )
    ids = ids.to(model.logit_scale.device)
    return torch.cat([model.encode_text(chunk) for chunk in ids.split(batch_size)]).float()


def pretrained_clip_config(init_from_hf: str | None, init_from_open_clip: str | None) -> CLIPConfig:
    """The architecture of the CLIP in a Hugging Face or an open_clip directory (see :class:`ContrastiveTask`)."""
    if init_from_hf:
        return hf_clip.config_from_hf(hf_convert.read_hf_config(init_from_hf, hf_clip.FAMILY))
    return config_from_open_clip(read_open_clip_dir(init_from_open_clip)[0])


def pretrained_clip(init_from_hf: str | None, init_from_open_clip: str | None) -> CLIP:
    """The CLIP in a Hugging Face or an open_clip directory, weights loaded."""
    if init_from_hf:
        return CLIP.from_hf(init_from_hf)
    config, weights = read_open_clip_dir(init_from_open_clip)
    return CLIP.from_open_clip(weights, config)


def check_clip_tokenizer(tokenizer: Tokenizer | None, config: CLIPConfig, path: str) -> None:
    """A pretrained text tower reads its features at its own EOS id, over its own vocabulary: the run's
    tokenizer must share both."""
    if tokenizer is not None and (
        tokenizer.eos_id != config.eos_id or tokenizer.vocab_size > config.vocab_size
    ):
        raise ValueError(
            f"The CLIP in {path} reads text features at EOS id {config.eos_id} over {config.vocab_size} tokens, "
            f"but this run's tokenizer has EOS id {tokenizer.eos_id} and {tokenizer.vocab_size} tokens; set "
            "data.tokenizer_path to the CLIP's tokenizer directory (the Hub's tokenizer.json and "
            "tokenizer_config.json)"
        )
    log.info("Loaded the pretrained CLIP in %s", path)
