"""Causal-LM data: corpus -> tokenizer (trained once and cached, or given) -> token stream -> windows.

The token stream is built in memory by default; with ``shards_dir`` it is read from token shards that
``lit-prepare`` wrote (``data/token_stream.py``), so corpora larger than memory train with constant memory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from functools import partial

import torch
from torch.utils.data import Dataset

from lit_transformers.data.base import CorpusDataModule, TextDataModule
from lit_transformers.data.corpus import (
    document_index,
    read_document,
)
from lit_transformers.data.token_stream import ShardedTokens, document_tokens, read_shards, write_shards
from lit_transformers.text import Tokenizer, split_by_fractions

log = logging.getLogger(__name__)


class TokenWindows(Dataset):
    """Non-overlapping windows of block_size + 1 tokens: inputs and next-token labels (B, T) each. ``tokens`` is a
    tensor, or the ``ShardedTokens`` of a split on disk."""

    def __init__(self, tokens: torch.Tensor | ShardedTokens, block_size: int):
        self.tokens, self.block_size = tokens, block_size

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.block_size)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        window = self.tokens[i * self.block_size : (i + 1) * self.block_size + 1]
        return {"input_ids": window[:-1], "labels": window[1:]}


class CausalLMDataModule(CorpusDataModule):
    length_key = "block_size"
    tokenizer_independent = TextDataModule.tokenizer_independent | {
        "block_size",
        "shards_dir",
        "prepare_workers",
    }

    def __init__(
        self,
        tokenizer: str = "bpe",
        vocab_size: int = 2048,
        tokenizer_train_chars: int = 100_000_000,
        block_size: int = 128,
        batch_size: int = 32,
        shards_dir: str | None = None,
        prepare_workers: int = 2,
        **shared,
    ):
        super().__init__(**shared)

    def tokenizer_texts(self, texts: Iterable[str] | None = None) -> list[str]:
        """Training documents up to ``tokenizer_train_chars`` characters (of ``texts``, by default the training
        split's): a BPE learns its merges from a sample as well as from the whole of a large corpus, at a
        bounded cost in time and memory."""
        if texts is None:
            texts = (text for _, text in self.splits["train"])
        sample, chars = [], 0
        for text in texts:
            if chars >= self.hparams.tokenizer_train_chars:
                break
            sample.append(text)
            chars += len(text)
        return sample

    def prepare_data(self) -> None:
        if self.hparams.shards_dir is None:  # shards carry their tokenizer
            self.load_tokenizer()

    def write_shards(self) -> dict:
        """``lit-prepare``: tokenize every split once, in ``prepare_workers`` processes, into ``shards_dir``."""
        h = self.hparams
        if not h.shards_dir:
            raise ValueError(
                "lit-prepare writes token shards into data.shards_dir; set data.shards_dir=<folder>"
            )
        settings = {key: h[key] for key in ("val_fraction", "test_fraction", "seed")}
        # a document is a reference (a file, a paragraph's byte range, a dataset row) that the workers read: the
        # split needs only the ids, and this process never holds the corpus
        index = document_index(self.corpus)
        parts = split_by_fractions(
            [doc_id for doc_id, _, _ in index], h.val_fraction, h.test_fraction, h.seed, "documents"
        )
        documents = {name: [index[i][1:] for i in idx] for name, idx in parts.items()}
        del index  # the ids: only the split needs them
        read = partial(read_document, self.corpus)
        tokenizer = self.load_tokenizer(
            lambda: self.tokenizer_texts(read(reference) for reference, _ in documents["train"])
        )
        return write_shards(documents, read, tokenizer, h.shards_dir, h.prepare_workers, settings)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        streams = self._read_shards() if self.hparams.shards_dir else self._encode_splits()
        block_size = self.hparams.block_size
        for name, tokens in streams.items():
            self.datasets[name] = TokenWindows(tokens, block_size)
            if len(self.datasets[name]) == 0:
                raise ValueError(
                    f"The {name} split has {len(tokens)} tokens, fewer than block_size + 1 = {block_size + 1}; "
                    "add text or lower model.block_size"
                )
        log.info("Token windows: %s", {name: len(ds) for name, ds in self.datasets.items()})

    def _encode_splits(self) -> dict[str, torch.Tensor]:
        self.tokenizer = self.load_tokenizer()
        streams = {}
        for name, docs in self.splits.items():
            if not docs:
                raise ValueError(
                    f"The {name} split has no documents; raise data.val_fraction/data.test_fraction above 0"
                )
            tokens = document_tokens(self.tokenizer, [text for _, text in docs])
            streams[name] = torch.tensor(tokens, dtype=torch.long)
        del self.splits  # the raw text is encoded; keep only the token windows in memory
        return streams

    def _read_shards(self) -> dict[str, ShardedTokens]:
        h = self.hparams
        streams, self.tokenizer, settings = read_shards(h.shards_dir)
        # the shards' tokenizer and split are fixed when they are written: a different one asked for now is an error
        if h.tokenizer_path and Tokenizer.from_file(h.tokenizer_path) != self.tokenizer:
            # the path is the user's, or the checkpoint of ckpt_path=, whose weights fit only its own tokenizer
            raise ValueError(
                f"data.tokenizer_path={h.tokenizer_path} is not the tokenizer of the shards in {h.shards_dir}. "
                f"If you set it, drop it (the shards carry theirs); if it is the checkpoint being resumed or "
                f"evaluated (ckpt_path=), write shards with its tokenizer: lit-prepare "
                f"data.shards_dir=<new folder> data.tokenizer_path={h.tokenizer_path}"
            )
        asked = {key: h[key] for key in settings}
        if asked != settings:
            raise ValueError(
                f"The shards in {h.shards_dir} were split with {settings}, this run asks for {asked}; pass the "
                "shards' values or re-run lit-prepare with these"
            )
        return streams
