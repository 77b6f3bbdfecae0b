"""Causal-LM data: corpus -> tokenizer (trained once and cached, or given) -> token stream -> windows."""

from __future__ import annotations

import logging
import os
from functools import cached_property
from pathlib import Path

import torch
from torch.utils.data import Dataset

from lit_transformers.data.checks import check_batch_size
from lit_transformers.data.corpus import CorpusSpec, fingerprint, load_documents, split_documents
from lit_transformers.data.loaders import CollatedSplits
from lit_transformers.text import Tokenizer

log = logging.getLogger(__name__)


class TokenWindows(Dataset):
    """Non-overlapping windows of block_size + 1 tokens: inputs and next-token labels (B, T) each."""

    def __init__(self, tokens: torch.Tensor, block_size: int):
        self.tokens, self.block_size = tokens, block_size

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.block_size)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        window = self.tokens[i * self.block_size : (i + 1) * self.block_size + 1]
        return {"input_ids": window[:-1], "labels": window[1:]}


class CausalLMDataModule(CollatedSplits):
    def __init__(
        self,
        corpus: dict | None = None,
        tokenizer: str = "bpe",
        vocab_size: int = 4096,
        tokenizer_path: str | None = None,
        block_size: int = 256,
        batch_size: int = 32,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        num_workers: int = 0,
        seed: int = 0,
        cache_dir: str = "~/.cache/lit_transformers",
    ):
        super().__init__()
        check_batch_size(batch_size)
        self.save_hyperparameters(logger=False)  # the run logs its whole config once, in train.py
        self.corpus = CorpusSpec(**(corpus or {}))
        self.tokenizer: Tokenizer | None = None
        self.datasets: dict[str, TokenWindows] = {}

    @cached_property
    def tokenizer_cache(self) -> Path:  # cached: the fingerprint stats every file of a path corpus
        h = self.hparams
        key = f"{fingerprint(self.corpus)}-{h.tokenizer}-{h.vocab_size}-{h.val_fraction}-{h.test_fraction}-{h.seed}"
        return Path(os.path.expanduser(h.cache_dir)) / "tokenizers" / f"{key}.json"

    @cached_property
    def splits(self) -> dict[str, list[tuple[str, str]]]:
        """Documents per split, loaded once even when prepare_data and setup run in the same process."""
        h = self.hparams
        return split_documents(load_documents(self.corpus), h.val_fraction, h.test_fraction, h.seed)

    def load_tokenizer(self) -> Tokenizer:
        """``tokenizer_path`` (a tokenizer.json, or a parent checkpoint's tokenizer), else the one trained on
        the training split and cached under ``cache_dir``."""
        h = self.hparams
        if h.tokenizer_path:
            return Tokenizer.from_file(h.tokenizer_path)
        return Tokenizer.load_or_train(
            self.tokenizer_cache,
            lambda: [text for _, text in self.splits["train"]],
            h.tokenizer,
            h.vocab_size,
        )

    def prepare_data(self) -> None:
        """Train and cache the tokenizer once (rank 0); every rank loads it in ``setup``."""
        self.load_tokenizer()

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        self.tokenizer = self.load_tokenizer()
        block_size, tok = self.hparams.block_size, self.tokenizer
        for name, docs in self.splits.items():
            if not docs:
                raise ValueError(
                    f"The {name} split has no documents; raise data.val_fraction/data.test_fraction above 0"
                )
            # BOS ... EOS around each document: generation starts prompts with BOS, so the model must see it
            encoded = tok.encode_batch([text for _, text in docs])
            ids = [i for doc in encoded for i in (tok.bos_id, *doc, tok.eos_id)]
            self.datasets[name] = TokenWindows(torch.tensor(ids, dtype=torch.long), block_size)
            if len(self.datasets[name]) == 0:
                raise ValueError(
                    f"The {name} split has {len(ids)} tokens, fewer than block_size + 1 = {block_size + 1}; "
                    "add text or lower model.block_size"
                )
        del self.splits  # the raw text is encoded; keep only the token windows in memory
        log.info("Token windows: %s", {name: len(ds) for name, ds in self.datasets.items()})
