"""Word-labelled text for token classification (NER, POS) in CoNLL format.

One word per line, its label in the last column (``EU B-ORG``, or CoNLL-2003's ``EU NNP B-NP B-ORG``); a
blank line ends a sentence; ``-DOCSTART-`` lines are skipped. Each word is split into WordPieces; its label
goes on the first piece, the other pieces (and [CLS], [SEP], padding) get IGNORE_INDEX.
"""

from __future__ import annotations

import logging
from functools import cached_property
from pathlib import Path

from lit_transformers.data.base import TextDataModule
from lit_transformers.data.bert import EncoderCollator
from lit_transformers.data.records import data_file, file_identity, text_lines, where
from lit_transformers.text import IGNORE_INDEX, split_by_fractions

log = logging.getLogger(__name__)
Sentence = dict  # {"words": [str], "labels": [str], "where": "file:line"}


def read_conll(
    path: str | Path | None, setting: str = "data.path", encoding: str = "utf-8"
) -> list[Sentence]:
    """Sentences of a CoNLL file (``setting`` names the key that gives it). Columns are separated by tabs when
    the file's first word line has one (a word may then hold spaces: ``New York<TAB>B-LOC``), else by spaces;
    every word line has as many columns as that first one, at least two. A line with another count is an error
    naming the file and the line, as is a byte that is not text in ``encoding``."""
    path = data_file(path, None, f"{setting}=<CoNLL file: word ... label per line>")
    sentences, words, labels, start = [], [], [], 1
    tabbed, first = False, None  # the file's separator and its first word line: (line number, column count)
    for n, line in enumerate([*text_lines(path, encoding), "\n"], 1):
        if not line.strip() or line.split()[0] == "-DOCSTART-":
            if words:
                sentences.append({"words": words, "labels": labels, "where": where(path, start)})
            words, labels, start = [], [], n + 1
            continue
        if first is None:
            tabbed = "\t" in line.strip()
        columns = [c.strip() for c in line.strip().split("\t")] if tabbed else line.split()
        if len(columns) < 2:
            raise ValueError(f"{where(path, n)}: {line.strip()!r} has no label column; write 'word label'")
        if first is None:
            first = n, len(columns)
        elif len(columns) != first[1]:
            separator = "tabs" if tabbed else "spaces (a word holding a space needs tab-separated columns)"
            raise ValueError(
                f"{where(path, n)}: {line.strip()!r} has {len(columns)} columns where the file's first word "
                f"line ({where(path, first[0])}) has {first[1]}; every word line needs the same columns, the "
                f"label last, separated by {separator}"
            )
        words.append(columns[0])
        labels.append(columns[-1])
    if not sentences:
        raise ValueError(f"{path} holds no sentences")
    return sentences


def align_labels(
    word_pieces: list[list[int]], labels: list[int], cls_id: int, sep_id: int, unk_id: int, max_len: int
) -> tuple[list[int], list[int]]:
    """``[CLS] pieces... [SEP]`` ids and per-piece labels: each word's label on its first piece, IGNORE_INDEX
    on the rest and on the specials. A word the tokenizer drops entirely becomes [UNK]; words that do not
    fit in ``max_len`` are cut (whole words only)."""
    ids, piece_labels = [cls_id], [IGNORE_INDEX]
    for pieces, label in zip(word_pieces, labels):
        pieces = pieces or [unk_id]
        if len(ids) + len(pieces) > max_len - 1:
            break
        ids += pieces
        piece_labels += [label] + [IGNORE_INDEX] * (len(pieces) - 1)
    return ids + [sep_id], piece_labels + [IGNORE_INDEX]


class TokenClassificationDataModule(TextDataModule):
    """Args: ``path`` (CoNLL file, split by fractions unless ``val_path``/``test_path`` are given);
    ``tokenizer_path`` or a WordPiece trained on the training words (``vocab_size``, ``lowercase``);
    ``max_seq_len``; the split fractions; ``encoding``, the files' text encoding. Labels found only in
    val/test files are an error naming them."""

    tokenizer_kind = "wordpiece"
    length_key = "max_seq_len"
    tokenizer_independent = TextDataModule.tokenizer_independent | {"max_seq_len"}

    def __init__(
        self,
        path: str | None = None,
        val_path: str | None = None,
        test_path: str | None = None,
        vocab_size: int = 4096,
        lowercase: bool = False,
        max_seq_len: int = 128,
        batch_size: int = 32,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        encoding: str = "utf-8",
        **shared,
    ):
        super().__init__(val_fraction=val_fraction, test_fraction=test_fraction, **shared)

    @cached_property
    def splits(self) -> dict[str, list[Sentence]]:
        h = self.hparams
        sentences = read_conll(h.path, "data.path", h.encoding)
        keys = [" ".join(s["words"]) + f"\t{i}" for i, s in enumerate(sentences)]
        fractions = (0.0 if h.val_path else h.val_fraction, 0.0 if h.test_path else h.test_fraction)
        parts = split_by_fractions(keys, *fractions, h.seed, "sentences")
        splits = {name: [sentences[i] for i in idx] for name, idx in parts.items()}
        for name, path in (("val", h.val_path), ("test", h.test_path)):
            if path:
                splits[name] = read_conll(path, f"data.{name}_path", h.encoding)
        known = {label for s in splits["train"] for label in s["labels"]}
        for name in ("val", "test"):
            for s in splits[name]:
                unknown = sorted(set(s["labels"]) - known)
                if unknown:
                    raise ValueError(
                        f"{s['where']}: labels {unknown} never occur in the training sentences; the classifier "
                        "cannot predict them (add training examples, or map them to known labels)"
                    )
        return splits

    @cached_property
    def class_names(self) -> list[str]:
        return sorted({label for s in self.splits["train"] for label in s["labels"]})

    def data_identity(self) -> list:
        return file_identity([self.hparams.path])

    def tokenizer_texts(self) -> list[str]:
        return [" ".join(s["words"]) for s in self.splits["train"]]

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        h = self.hparams
        self.tokenizer = tok = self.load_tokenizer()
        label_id = {name: i for i, name in enumerate(self.class_names)}
        specials = [tok.special_id(role) for role in ("cls", "sep", "unk")]
        for name, sentences in self.splits.items():
            if not sentences:
                raise ValueError(f"The {name} split has no sentences; add data or raise data.{name}_fraction")
            self.datasets[name], cut = [], 0
            for s in sentences:
                pieces = tok.encode_batch(s["words"])
                ids, labels = align_labels(
                    pieces, [label_id[x] for x in s["labels"]], *specials, h.max_seq_len
                )
                cut += sum(label != IGNORE_INDEX for label in labels) < len(s["words"])
                self.datasets[name].append(
                    {"input_ids": ids, "token_type_ids": [0] * len(ids), "labels": labels}
                )
            if (
                cut
            ):  # as Hugging Face's run_ner truncates, but said, with the count: the cut words are not scored
                log.warning(
                    "%d of %d %s sentences are longer than data.max_seq_len=%d WordPieces: their last words are "
                    "cut (neither trained on nor scored); raise data.max_seq_len to keep them",
                    cut,
                    len(sentences),
                    name,
                    h.max_seq_len,
                )
        self.collate = EncoderCollator(tok, label_key="labels")
        log.info("Sentences: %s, labels %s", {n: len(d) for n, d in self.datasets.items()}, self.class_names)
