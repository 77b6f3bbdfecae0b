"""CLIP contrastive image-text training, with zero-shot classification and retrieval evaluation."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.functional.classification import multiclass_accuracy

from lit_transformers.data.captions import tokenize
from lit_transformers.models.clip import CLIP, CLIPConfig
from lit_transformers.tasks.base import Task
from lit_transformers.tasks.evaluation import log_image, matrix_image, recall_at_k, zero_shot_classifier

AllGather = Callable[..., torch.Tensor]  # (B, ...) -> (world_size, B, ...), as LightningModule.all_gather


class ClipLoss(nn.Module):
    """Symmetric InfoNCE: mean of image->text and text->image cross-entropy (open_clip's ``ClipLoss``).

    With several ranks, features are gathered from all of them. ``gather_with_grad`` sends gradients back
    through the gather to the rank that made each feature; without it, only the local slice carries gradient.
    ``local_loss`` scores only this rank's B rows against all W*B columns (labels offset by rank * B) instead
    of the full (W*B, W*B) matrix; DDP's gradient averaging then gives the gradient of the global-batch loss.
    """

    def __init__(self, local_loss: bool = True, gather_with_grad: bool = True):
        super().__init__()
        self.local_loss, self.gather_with_grad = local_loss, gather_with_grad

    def gather(self, x: torch.Tensor, all_gather: AllGather, rank: int) -> torch.Tensor:
        if self.gather_with_grad:
            return all_gather(x, sync_grads=True).flatten(0, 1)  # (W*B, E)
        parts = list(all_gather(x.detach()).unbind(0))
        parts[rank] = x  # the local slice keeps its graph
        return torch.cat(parts)

    def forward(
        self,
        image_features: torch.Tensor,
        text_features: torch.Tensor,
        logit_scale: torch.Tensor,
        all_gather: AllGather | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> torch.Tensor:
        """image_features, text_features: (B, E) normalised; logit_scale: exp(learned log-scale)."""
        B = image_features.size(0)
        if world_size == 1:
            logits_image = logit_scale * image_features @ text_features.T  # (B, B)
            logits_text, labels = logits_image.T, torch.arange(B, device=image_features.device)
        else:
            all_image = self.gather(image_features, all_gather, rank)  # (W*B, E)
            all_text = self.gather(text_features, all_gather, rank)
            if self.local_loss:
                logits_image = logit_scale * image_features @ all_text.T  # (B, W*B)
                logits_text = logit_scale * text_features @ all_image.T
                labels = torch.arange(B, device=image_features.device) + rank * B
            else:
                logits_image = logit_scale * all_image @ all_text.T  # (W*B, W*B)
                logits_text, labels = (
                    logits_image.T,
                    torch.arange(world_size * B, device=image_features.device),
                )
        return (
            F.cross_entropy(logits_image.float(), labels) + F.cross_entropy(logits_text.float(), labels)
        ) / 2


class ContrastiveTask(Task):
    def __init__(
        self,
        model: CLIPConfig,
        optimizer: partial,
        scheduler: partial | None = None,
        init_from: str | None = None,
        compile: bool = False,
        max_logit_scale: float = math.log(100),
        local_loss: bool = True,
        gather_with_grad: bool = True,
        recall_ks: tuple[int, ...] = (1, 5, 10),
    ):
        super().__init__(optimizer, scheduler, init_from, compile)
        self.save_hyperparameters(logger=False)
        self.loss = ClipLoss(local_loss, gather_with_grad)
        self._eval: dict[str, list[torch.Tensor]] = {}
        self._similarity: torch.Tensor | None = None

    def build_model(self) -> CLIP:
        self.fit_config_to_tokenizer(vocab_size=lambda tok: tok.vocab_size, eos_id=lambda tok: tok.eos_id)
        return CLIP(self.hparams.model)

    def forward(self, images: torch.Tensor, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model(images, input_ids)

    def _loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        image_features, text_features = self.model(batch["image"], batch["input_ids"])  # (B, E) each
        world = self.trainer.world_size if self._trainer is not None else 1
        loss = self.loss(
            image_features,
            text_features,
            self.model.logit_scale.exp(),
            self.all_gather,
            self.global_rank,
            world,
        )
        return loss, image_features, text_features

    def training_step(self, batch, batch_idx):
        loss, _, _ = self._loss(batch)
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        self.log("train/logit_scale", self.model.logit_scale.exp(), on_step=True, on_epoch=False)
        return loss

    def optimizer_step(self, *args, **kwargs):
        super().optimizer_step(*args, **kwargs)
        with torch.no_grad():  # temperature floor of 1/100, as in CLIP
            self.model.logit_scale.clamp_(max=self.hparams.max_logit_scale)

    def _eval_step(self, batch, batch_idx: int, stage: str) -> None:
        loss, image_features, text_features = self._loss(batch)
        self.log(f"{stage}/loss", loss, on_epoch=True, prog_bar=stage == "val", sync_dist=True)
        store = self._eval.setdefault(stage, [])
        index_label = torch.stack([batch["image_index"], batch["label"]], dim=1).float()  # (B, 2)
        store.append(torch.cat([image_features.float(), index_label], dim=1))  # gathered as one tensor
        if batch_idx == 0:
            self._similarity = image_features @ text_features.T  # (B, B): a bright diagonal is a good sign

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
        ids = tokenize(self.tokenizer, texts, self.model.config.context_length).to(self.device)
        return torch.cat([self.model.encode_text(chunk) for chunk in ids.split(batch_size)]).float()

    def _evaluate(self, stage: str) -> None:
        """Zero-shot accuracy (digits: class names x prompt templates) and retrieval recall@k in both
        directions, over the whole split: image features are gathered from every rank and de-duplicated."""
        rows = (
            self.all_gather(torch.cat(self._eval.pop(stage))).flatten(0, -2) if stage in self._eval else None
        )
        if rows is None or self._trainer.datamodule is None:
            return
        datamodule = self._trainer.datamodule
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
        if self._similarity is not None:
            log_image(self.trainer, f"{stage}/similarity", matrix_image(self._similarity))
            self._similarity = None
