"""BERT pretraining data: corpus -> documents of sentences -> WordPiece -> next-sentence pairs -> batches.

Masking is not done here: the task draws masks per batch (dynamic masking), from the ``eligible`` and
``word_starts`` tensors each batch carries.
"""

from __future__ import annotations

import logging
import random

import torch

from lit_transformers.data.base import CorpusDataModule, TextDataModule
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


class MaskedLMDataModule(CorpusDataModule):
    """Sentence pairs for MLM + NSP. Documents come from ``corpus`` (CPython's docs by default, one topic a
    document), are split into sentences by :func:`lit_transformers.text.split_sentences`, and paired by
    :func:`lit_transformers.text.build_nsp_pairs`, ``dupe_factor`` times over the training documents with
    different draws (Google's recipe: each pass gives other segment boundaries and NotNext partners), and
    ``eval_dupe_factor`` times over the validation and test documents: a few held-out documents then give
    enough pairs that NSP accuracy is not dominated by the draw of boundaries and partners."""

    tokenizer_kind = "wordpiece"
    length_key = "max_seq_len"
    tokenizer_independent = TextDataModule.tokenizer_independent | {
        "max_seq_len",
        "short_seq_prob",
        "dupe_factor",
        "eval_dupe_factor",
    }

    def __init__(
        self,
        vocab_size: int = 8192,
        lowercase: bool = True,
        max_seq_len: int = 128,
        short_seq_prob: float = 0.1,
        dupe_factor: int = 5,
        eval_dupe_factor: int = 1,
        batch_size: int = 32,
        **shared,
    ):
        super().__init__(**shared)

    def tokenizer_texts(self) -> list[str]:
        return [text for _, text in self.splits["train"]]

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
