"""Labelled text for fine-tuning: the gettext language-ID demo, or your own CSV / TSV / JSONL file.

Each example is a text (and optionally a second text, ``text_pair``) with a label; it becomes
``[CLS] text [SEP] (text_pair [SEP])`` with token types, as in BERT's sentence(-pair) classification.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path

from lit_transformers.data.base import TextDataModule
from lit_transformers.data.bert import EncoderCollator
from lit_transformers.data.gettext import DEFAULT_LOCALE_DIR, language_samples
from lit_transformers.data.records import JSONL, file_identity, read_records
from lit_transformers.text import pack_pair, split_by_fractions

log = logging.getLogger(__name__)
SOURCES = ("gettext", "file")
Example = dict  # {"text": str, "text_pair": str | None, "label": str, "where": "file:line"}


def read_labeled_table(
    path: str | Path,
    text_field: str = "text",
    text_pair_field: str = "text_pair",
    label_field: str = "label",
    setting: str = "data.path",
    encoding: str = "utf-8",
) -> list[Example]:
    """Rows of a .csv, .tsv or .jsonl file (given by the key ``setting``) with a text column, a label column
    and optionally a text-pair column (:func:`lit_transformers.data.records.read_records`: errors name the
    file, the line and the column). JSON labels may be numbers."""
    required = {
        text_field: "rename it or set data.text_field",
        label_field: "rename it or set data.label_field",
    }
    suffixes, setting = (".csv", ".tsv", *JSONL), f"{setting}=<file.csv|.tsv|.jsonl>"
    records = read_records(path, suffixes, setting, required, encoding=encoding)
    if not records:
        raise ValueError(f"{path} holds no examples")
    return [
        {
            "text": r.text(text_field),
            "text_pair": r.text(text_pair_field, optional=True),
            "label": r.text(label_field, numbers=True),
            "where": r.where,
        }
        for r in records
    ]


class TextClassificationDataModule(TextDataModule):
    """Args: ``source``: gettext (language ID from ``path``, a locale directory, default /usr/share/locale)
    or file (``path`` a .csv/.tsv/.jsonl); ``test_path``: an optional separate test file (its labels must be
    among the training labels); ``languages``, ``max_per_language``, ``min_letters``: the gettext demo;
    the column names; ``encoding``, the files' text encoding; ``tokenizer_path`` (a parent .ckpt, a Hugging Face BERT directory) or a WordPiece
    trained on the training texts (``vocab_size``, ``lowercase``); ``max_seq_len``; the split fractions."""

    tokenizer_kind = "wordpiece"
    length_key = "max_seq_len"
    tokenizer_independent = TextDataModule.tokenizer_independent | {"max_seq_len"}

    def __init__(
        self,
        source: str = "gettext",
        path: str | None = None,
        test_path: str | None = None,
        languages: Sequence[str] = ("de", "es", "fr", "it", "nl", "sv"),
        max_per_language: int | None = 1000,
        min_letters: int = 10,
        text_field: str = "text",
        text_pair_field: str = "text_pair",
        label_field: str = "label",
        vocab_size: int = 4096,
        lowercase: bool = False,
        max_seq_len: int = 64,
        batch_size: int = 32,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        encoding: str = "utf-8",
        **shared,
    ):
        super().__init__(val_fraction=val_fraction, test_fraction=test_fraction, **shared)
        if source not in SOURCES:
            raise ValueError(f"Unknown data.source={source!r}; choose one of {SOURCES}")

    @cached_property
    def examples(self) -> list[Example]:
        h = self.hparams
        if h.source == "gettext":
            locale_dir = h.path or DEFAULT_LOCALE_DIR
            pairs = language_samples(locale_dir, list(h.languages), h.max_per_language, h.min_letters)
            return [
                {"text": t, "text_pair": None, "label": lang, "where": f"{locale_dir} ({lang})"}
                for t, lang in pairs
            ]
        if not h.path:
            raise ValueError(
                "data.source=file needs data.path=<file.csv|.tsv|.jsonl> with text and label columns"
            )
        return self._read(h.path, "data.path")

    def _read(self, path: str, setting: str) -> list[Example]:
        h = self.hparams
        return read_labeled_table(path, h.text_field, h.text_pair_field, h.label_field, setting, h.encoding)

    @cached_property
    def class_names(self) -> list[str]:
        return sorted({e["label"] for e in self.examples})

    @cached_property
    def splits(self) -> dict[str, list[Example]]:
        h = self.hparams
        keys = [f"{e['text']}\t{e['text_pair']}" for e in self.examples]
        test_fraction = 0.0 if h.test_path else h.test_fraction
        parts = split_by_fractions(keys, h.val_fraction, test_fraction, h.seed, "examples")
        splits = {name: [self.examples[i] for i in idx] for name, idx in parts.items()}
        if h.test_path:
            splits["test"] = self._read(h.test_path, "data.test_path")
            known = set(self.class_names)
            for e in splits["test"]:
                if e["label"] not in known:
                    raise ValueError(
                        f"{e['where']}: column {h.label_field!r}: label {e['label']!r} is not among the training "
                        f"labels {sorted(known)}; the classifier cannot predict it"
                    )
        return splits

    def data_identity(self) -> list:
        return file_identity([self.hparams.path])

    def tokenizer_texts(self) -> list[str]:
        return [t for e in self.splits["train"] for t in (e["text"], e["text_pair"]) if t]

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        h = self.hparams
        self.tokenizer = tok = self.load_tokenizer()
        cls_id, sep_id = tok.special_id("cls"), tok.special_id("sep")
        label_id = {name: i for i, name in enumerate(self.class_names)}
        for name, examples in self.splits.items():
            if not examples:
                raise ValueError(f"The {name} split has no examples; add data or raise data.{name}_fraction")
            texts = tok.encode_batch([e["text"] for e in examples])
            pairs = [tok.encode(e["text_pair"]) if e["text_pair"] is not None else None for e in examples]
            self.datasets[name] = []
            for e, a, b in zip(examples, texts, pairs):
                ids, types = pack_pair(a, b, cls_id, sep_id, h.max_seq_len)
                self.datasets[name].append(
                    {"input_ids": ids, "token_type_ids": types, "labels": label_id[e["label"]]}
                )
        self.collate = EncoderCollator(tok, label_key="labels")
        log.info(
            "Examples: %s over %d classes",
            {n: len(d) for n, d in self.datasets.items()},
            len(self.class_names),
        )
