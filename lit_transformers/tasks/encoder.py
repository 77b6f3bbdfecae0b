"""What the BERT tasks share: a BERT body from the model spec, or from a Hugging Face BERT directory."""

from __future__ import annotations

import dataclasses
import zlib

import torch
from torch import nn

from lit_transformers.contract import ClassNames, TokenizedText
from lit_transformers.models import BERT, BERTConfig
from lit_transformers.nn import ClassifierHead
from lit_transformers.tasks.base import Task
from lit_transformers.tasks.specs import config_spec


class EncoderTask(Task):
    """Base of the BERT tasks. Args: ``model``, the BERT config spec (``vocab_size: null`` takes the
    tokenizer's); ``init_from_hf``: a Hugging Face BERT directory whose config replaces the spec and whose
    weights initialise the body (train with its tokenizer: ``data.tokenizer_path=<the same directory>``);
    the rest as in :class:`Task`."""

    pretraining_heads = False  # MaskedLMTask builds the MLM and NSP heads; fine-tuning tasks the body alone
    data_needs = (TokenizedText,)
    context_field = "max_position"
    # a fine-tuning task initialised from a pretraining checkpoint leaves its heads behind
    dropped_heads = ("model.mlm_head", "model.nsp_head")

    def __init__(self, model: dict | BERTConfig, init_from_hf: str | None = None, **task_args):
        if init_from_hf:  # the architecture is the checkpoint's: recorded now, so a resumed run matches it
            from lit_transformers.models.hf_bert import config_from_hf, read_hf_config

            model = config_from_hf(read_hf_config(init_from_hf), self.pretraining_heads)
        model = config_spec(model)  # before the base records the arguments as hyperparameters
        super().__init__(**task_args)

    def build_bert(self) -> BERT:
        if self.hparams.init_from_hf:
            bert = BERT.from_hf(
                self.hparams.init_from_hf,
                self.pretraining_heads,
                trust_checkpoint=self.hparams.trust_checkpoint,
            )
            self.check_hf_vocabulary(bert.config.vocab_size, "BERT")
            # checkpoints of this task rebuild the same architecture (hparams.model, set in __init__) without
            # the Hugging Face directory
            self.hparams.init_from_hf = None
            return bert
        config = self.text_model_config(vocab_size=lambda tok: tok.vocab_size)
        return BERT(dataclasses.replace(config, pretraining_heads=self.pretraining_heads))

    def encode(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, T, d) hidden states of a batch with ``input_ids``, ``attention_mask``, ``token_type_ids``."""
        return self.model(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))

    def generator(self, *key) -> torch.Generator:
        """A random generator on this task's device seeded by ``key`` (plus the rank): draws that are the
        same on every rerun and resume, and differ between ranks."""
        rank = self.global_rank if self._trainer is not None else 0
        seed = zlib.crc32(repr((*key, rank)).encode())
        return torch.Generator(device=self.device).manual_seed(seed)


class EncoderClassifierTask(EncoderTask):
    """Base of the BERT fine-tuning classifiers: two named models, ``model``, the BERT body (what ``init_from``
    / ``init_from_hf`` load), and ``classifier``, dropout + linear over the class names.

    Args: ``model``, the BERT config spec; ``class_names``: taken from the datamodule and kept in
    checkpoints; ``classifier_dropout``; the rest as in :class:`EncoderTask`."""

    data_needs = (TokenizedText, ClassNames)

    def __init__(
        self, model: dict, class_names: list[str] | None = None, classifier_dropout: float = 0.1, **task_args
    ):
        super().__init__(model, **task_args)

    def build_models(self) -> dict[str, nn.Module]:
        n = len(self.attach_class_names())
        bert = self.build_bert()
        return {
            "model": bert,
            "classifier": ClassifierHead(bert.config.d_model, n, self.hparams.classifier_dropout),
        }
