"""BERT pretraining data: corpus -> documents of sentences -> WordPiece -> next-sentence pairs -> batches.

Masking is not done here: the task draws masks per batch (dynamic masking), from the ``eligible`` and
``word_starts`` tensors each batch carries.
"""

from __future__ import annotations

import logging
import random
from functools import cached_property

import torch

from lit_transformers.data.checks import check_batch_size
from lit_transformers.data.corpus import CorpusSpec, fingerprint, load_documents, split_documents
from lit_transformers.data.loaders import CollatedSplits
from lit_transformers.text import (
    IGNORE_INDEX,
    Tokenizer,
    build_nsp_pairs,
    pack_pair,
    right_pad,
    split_sentences,
)

log = logging.getLogger(__name__)


class EncoderCollator:
    """Examples ``{"input_ids": [...], "token_type_ids": [...], optional label}`` -> right-padded batch
    with ``attention_mask``, ``eligible`` (maskable: real and not special) and ``word_starts`` (False on
    ``##`` continuation pieces, for whole-word masking); ``label_key`` names a label per example, or a list
    of labels per token (padded with IGNORE_INDEX). A class, so DataLoader workers can pickle it."""

    def __init__(self, tokenizer: Tokenizer, label_key: str | None = None):
        self.pad_id = tokenizer.pad_id
        self.special_ids = torch.tensor(sorted(tokenizer.ids.values()))
        vocab = tokenizer.backend.get_vocab()
        self.continuation = torch.zeros(tokenizer.vocab_size, dtype=torch.bool)
        self.continuation[[i for t, i in vocab.items() if t.startswith("##")]] = True
        self.label_key = label_key

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        ids, valid = right_pad([e["input_ids"] for e in examples], self.pad_id)
        types, _ = right_pad([e["token_type_ids"] for e in examples], 0)
        batch = {
            "input_ids": ids,
            "token_type_ids": types,
            "attention_mask": valid,
            "eligible": valid & ~torch.isin(ids, self.special_ids),
            "word_starts": ~self.continuation[ids],
        }
        if self.label_key is not None:
            labels = [e[self.label_key] for e in examples]
            if isinstance(labels[0], list):  # one label per token: padded with IGNORE_INDEX
                batch[self.label_key] = right_pad(labels, IGNORE_INDEX, width=ids.size(1))[0]
            else:
                batch[self.label_key] = torch.tensor(labels, dtype=torch.long)
        return batch


class MaskedLMDataModule(CollatedSplits):
    """Sentence pairs for MLM + NSP. Documents come from ``corpus`` (CPython's docs by default, one topic a
    document), are split into sentences by :func:`lit_transformers.text.split_sentences`, and paired by
    :func:`lit_transformers.text.build_nsp_pairs`, ``dupe_factor`` times over the training documents with
    different draws (Google's recipe: each pass gives other segment boundaries and NotNext partners), and
    ``eval_dupe_factor`` times over the validation and test documents: a few held-out documents then give
    enough pairs that NSP accuracy is not dominated by the draw of boundaries and partners."""

    def __init__(
        self,
        corpus: dict | None = None,
        vocab_size: int = 8192,
        lowercase: bool = True,
        tokenizer_path: str | None = None,
        max_seq_len: int = 128,
        short_seq_prob: float = 0.1,
        dupe_factor: int = 5,
        eval_dupe_factor: int = 1,
        batch_size: int = 32,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        num_workers: int = 0,
        seed: int = 0,
        cache_dir: str = "~/.cache/lit_transformers",
    ):
        super().__init__()
        check_batch_size(batch_size)
        self.save_hyperparameters()
        self.corpus = CorpusSpec(**(corpus or {}))
        self.tokenizer: Tokenizer | None = None
        self.datasets: dict[str, list[dict]] = {}

    @cached_property
    def tokenizer_identity(self) -> list:  # cached: the fingerprint stats every file of a path corpus
        h = self.hparams
        return [fingerprint(self.corpus), h.val_fraction, h.test_fraction, h.seed]

    @cached_property
    def splits(self) -> dict[str, list[tuple[str, str]]]:
        h = self.hparams
        return split_documents(load_documents(self.corpus), h.val_fraction, h.test_fraction, h.seed)

    def load_tokenizer(self) -> Tokenizer:
        """``tokenizer_path`` (tokenizer.json, vocab.txt, a Hugging Face BERT directory or a parent .ckpt),
        else a WordPiece trained on the training split and cached under ``cache_dir``."""
        h = self.hparams
        return Tokenizer.for_data(
            h.tokenizer_path,
            h.cache_dir,
            lambda: self.tokenizer_identity,
            lambda: [text for _, text in self.splits["train"]],
            "wordpiece",
            h.vocab_size,
            lowercase=h.lowercase,
        )

    def prepare_data(self) -> None:
        self.load_tokenizer()

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        h = self.hparams
        self.tokenizer = tok = self.load_tokenizer()
        for role in ("cls", "sep", "mask"):
            tok.special_id(role)  # a clear error for a tokenizer without BERT's special tokens
        for name, docs in self.splits.items():
            if len(docs) < 2:
                raise ValueError(
                    f"The {name} split has {len(docs)} document(s); next-sentence prediction draws NotNext segments "
                    f"from another document, so every split needs two. Add documents (a folder of .txt files, or a "
                    f"file with blank-line separated paragraphs) or raise data.{name}_fraction"
                )
            documents = [tok.encode_batch(split_sentences(text)) for _, text in docs]
            passes = h.dupe_factor if name == "train" else h.eval_dupe_factor
            pairs = [
                pair
                for i in range(passes)
                for pair in build_nsp_pairs(
                    documents, h.max_seq_len, random.Random(f"{h.seed}:{name}:{i}"), h.short_seq_prob
                )
            ]
            examples = []
            for pair in pairs:
                ids, types = pack_pair(pair.a, pair.b, tok.special_id("cls"), tok.special_id("sep"))
                # HF's convention: 0 = B is the next segment, 1 = B is random
                examples.append(
                    {"input_ids": ids, "token_type_ids": types, "next_sentence_label": int(not pair.is_next)}
                )
            self.datasets[name] = examples
        del self.splits  # the raw text is encoded; keep only the pairs
        self.collate = EncoderCollator(tok, label_key="next_sentence_label")
        log.info("Sentence pairs: %s", {name: len(ds) for name, ds in self.datasets.items()})
