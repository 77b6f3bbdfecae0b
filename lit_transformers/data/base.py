"""The base of the text datamodules: their shared arguments, one hparams record, the tokenizer and its cache key."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path

from lit_transformers.data.checks import check_batch_size
from lit_transformers.data.corpus import CorpusSpec, Document, fingerprint, load_documents, split_documents
from lit_transformers.data.loaders import CollatedSplits
from lit_transformers.text import Tokenizer


class TextDataModule(CollatedSplits):
    """What every text family shares: the split fractions and seed, the loader workers, one hparams record
    (saved here, not logged) and the tokenizer: ``tokenizer_path``, else one trained on ``tokenizer_texts()``
    and cached under ``cache_dir`` by ``tokenizer_identity``.

    A family's ``__init__`` takes its own arguments and ``**shared`` (these, passed on to this one; a family
    whose defaults differ names them and passes them on too). Its ``tokenizer_independent`` names the arguments
    that cannot change the trained tokenizer; every other argument keys the tokenizer cache, so an argument
    added later retrains the tokenizer rather than silently reusing a stale one."""

    tokenizer_kind = "bpe"  # the kind trained when the family has no ``tokenizer`` argument to choose it
    # arguments that change how examples are batched or where files go, never the texts a tokenizer learns from
    tokenizer_independent = frozenset(
        {"batch_size", "eval_batch_size", "num_workers", "cache_dir", "tokenizer_path"}
    )
    length_key: str | None = (
        None  # the argument bounding every split's sequences, in tokens (e.g. max_seq_len)
    )

    def __init__(
        self,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        num_workers: int = 0,
        seed: int = 0,
        cache_dir: str = "~/.cache/lit_transformers",
        tokenizer_path: str | None = None,
    ):
        super().__init__()
        # the family's arguments too (Lightning collects every __init__ of the hierarchy). Not logged: the run
        # logs its whole config once, in train.py, and a datamodule's data.seed would overwrite the run's seed
        self.save_hyperparameters(logger=False)
        if "batch_size" in self.hparams:
            check_batch_size(self.hparams.batch_size)
        self.tokenizer: Tokenizer | None = None
        self.datasets: dict = {}

    @property
    def longest_sequence(self) -> tuple[str, int] | None:
        """(``data.<length_key>``, its value): the longest sequence of every split, which a task checks against
        its model's context before training; None when the family sets no such bound."""
        if self.length_key is None:
            return None
        return f"data.{self.length_key}", self.hparams[self.length_key]

    @cached_property
    def tokenizer_identity(self) -> dict:
        """What a trained tokenizer depends on: every argument but ``tokenizer_independent`` ones, and the
        identity of the data (``data_identity``). Cached: it may stat every file of a corpus."""
        h = self.hparams
        settings = {key: _plain(h[key]) for key in sorted(h) if key not in self.tokenizer_independent}
        return {"settings": settings, "data": self.data_identity()}

    def data_identity(self) -> object:
        """What changes when the data behind the arguments changes, e.g. the files' sizes and times
        (:func:`lit_transformers.data.records.file_identity`); None where the arguments say it all."""
        return None

    def tokenizer_texts(self) -> Iterable[str]:
        """The texts a tokenizer is trained on (the training split's), read only when one is trained."""
        raise NotImplementedError(f"{type(self).__name__} trains its tokenizers on its own texts")

    def load_tokenizer(self, texts: Callable[[], Iterable[str]] | None = None) -> Tokenizer:
        """``tokenizer_path`` (a tokenizer.json, vocab.txt, Hugging Face directory or a parent .ckpt), else one
        trained on ``texts()`` (by default ``tokenizer_texts``) and cached under ``cache_dir``."""
        h = self.hparams
        return self.tokenizer_for(h.tokenizer_path, texts or self.tokenizer_texts, h.vocab_size)

    def tokenizer_for(
        self, path: str | None, texts: Callable[[], Iterable[str]], vocab_size: int, part: str | None = None
    ) -> Tokenizer:
        """``path``, else a tokenizer trained on ``texts()`` with ``vocab_size``; ``part`` tells apart the
        tokenizers of one datamodule (a source and a target side)."""
        h = self.hparams
        check_tokenizer_path(
            path, "data.source_tokenizer_path" if part == "source" else "data.tokenizer_path"
        )
        return Tokenizer.for_data(
            path,
            h.cache_dir,
            lambda: [self.tokenizer_identity, part],
            texts,
            h.get("tokenizer", self.tokenizer_kind),
            vocab_size,
            lowercase=h.get("lowercase", False),
        )

    def prepare_data(self) -> None:
        """Train and cache the tokenizer once (rank 0); every rank loads it in ``setup``."""
        self.load_tokenizer()


class CorpusDataModule(TextDataModule):
    """A text family whose documents come from ``corpus`` (the fields of a :class:`CorpusSpec`), split by
    document; its tokenizer is keyed by the corpus's fingerprint (its files' sizes and times)."""

    def __init__(self, corpus: dict | None = None, **shared):
        super().__init__(**shared)
        self.corpus = CorpusSpec(**(corpus or {}))

    def data_identity(self) -> str:
        return fingerprint(self.corpus)

    @cached_property
    def splits(self) -> dict[str, list[Document]]:
        """Documents per split, loaded once even when prepare_data and setup run in the same process."""
        h = self.hparams
        return split_documents(load_documents(self.corpus), h.val_fraction, h.test_fraction, h.seed)


def _plain(value):
    """Config values as plain JSON data, so a list and a tuple (or a DictConfig and a dict) give one key."""
    if isinstance(value, Mapping):
        return {str(key): _plain(value[key]) for key in sorted(value, key=str)}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_plain(item) for item in value]
    return value


def check_tokenizer_path(path: str | None, key: str) -> None:
    """Refuse a tokenizer file that is not there, naming the setting (``from_file`` cannot: it serves every caller)."""
    if path and not Path(path).expanduser().exists():
        raise FileNotFoundError(
            f"{key}={path} does not exist; pass a tokenizer.json, vocab.txt, Hugging Face directory or .ckpt, "
            f"or drop {key} to train a tokenizer on the data"
        )
