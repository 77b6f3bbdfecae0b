"""Parallel text for translation: the system's gettext catalogs (English UI messages and their human
translations, no download), your TSV / JSONL file, or a Hugging Face translation dataset.

Examples are batched by length under a token budget (fairseq's ``--max-tokens``): similar lengths share a
batch, so little of it is padding. The batches are made once and shuffled as units each epoch, which keeps
the exact-resume guarantee of :func:`lit_transformers.data.loaders.make_loader`.
"""

from __future__ import annotations

import logging
import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path

from lit_transformers.data.base import TextDataModule, check_tokenizer_path
from lit_transformers.data.corpus import load_hub_dataset
from lit_transformers.data.gettext import DEFAULT_LOCALE_DIR, catalog_files, read_mo
from lit_transformers.data.loaders import make_loader
from lit_transformers.data.records import file_identity, read_records
from lit_transformers.text import IGNORE_INDEX, Tokenizer, right_pad, split_by_fractions

log = logging.getLogger(__name__)
SOURCES = ("gettext", "file", "hub")
Pair = tuple[str, str]  # (source sentence, target sentence)

_ACCELERATOR = re.compile(r"[_&](?=\w)")  # GTK "_Open", Qt "&Open", German "Ö_ffnen"


def clean_ui_message(text: str) -> str:
    """A UI message without its keyboard-accelerator marker, whitespace collapsed to single spaces.

    Accelerators are stripped on both sides: translators place them on different letters ("_Open" ->
    "Ö_ffnen"), so keeping them would ask the model to guess a UI convention rather than translate.
    Placeholders (``%s``, ``{name}``) and markup stay: they must be copied into the translation.
    """
    return " ".join(_ACCELERATOR.sub("", text).split())


def reads_as_sentence(text: str) -> bool:
    """At least three words, two thirds of them made of letters: "Delete 12 items from the list", not
    "%s: %s" or "Open file 3"."""
    words = text.split()
    lettered = [w for w in words if w.strip(".,:;!?'\"()").isalpha()]
    return len(lettered) >= 3 and 3 * len(lettered) >= 2 * len(words)


def gettext_pairs(locale_dir: str | Path, language: str) -> list[Pair]:
    """(English msgid, translation) pairs of every catalog of ``language``, cleaned
    (:func:`clean_ui_message`), without plural entries; one pair per source sentence (its most frequent
    translation across catalogs, ties broken alphabetically), in sorted order."""
    locale_dir = Path(locale_dir).expanduser()
    files = catalog_files(locale_dir, language)
    if not files:
        raise FileNotFoundError(
            f"No gettext catalogs (.mo) for {language!r} under {locale_dir}/{language}/LC_MESSAGES (this system "
            "ships no translations); use your own parallel text: data.source=file data.path=<file.tsv|.jsonl>, "
            "or data.path=<a locale directory> with .mo catalogs"
        )
    translations: dict[str, Counter] = defaultdict(Counter)
    for file in files:
        try:
            catalog = read_mo(file, plurals=False)
        except ValueError as err:
            log.warning("Skipping %s", err)  # a damaged catalog among dozens is not worth stopping for
            continue
        for msgid, msgstr in catalog.items():
            source, target = clean_ui_message(msgid), clean_ui_message(msgstr)
            if source and target:
                translations[source][target] += 1
    return [
        (source, min(t.items(), key=lambda kv: (-kv[1], kv[0]))[0])
        for source, t in sorted(translations.items())
    ]


def read_parallel_file(
    path: str | Path, src_field: str = "src", tgt_field: str = "tgt", encoding: str = "utf-8"
) -> list[Pair]:
    """``src<TAB>tgt`` lines of a .tsv (no header, no quoting), or ``{"src": ..., "tgt": ...}`` lines of a
    .jsonl, in ``encoding``; errors name the file and the line
    (:func:`lit_transformers.data.records.read_records`)."""
    return [pair for pair, _ in located_parallel_file(path, src_field, tgt_field, encoding)]


def located_parallel_file(
    path: str | Path, src_field: str, tgt_field: str, encoding: str
) -> Iterator[tuple[Pair, str]]:
    """The pairs of :func:`read_parallel_file`, each with its ``file:line``."""
    setting = "data.path=<file.tsv (src<TAB>tgt) | file.jsonl>"
    records = read_records(
        path, (".tsv", ".jsonl"), setting, columns=(src_field, tgt_field), encoding=encoding
    )
    if not records:
        raise ValueError(f"{path} holds no sentence pairs")
    for r in records:
        yield (r.text(src_field).strip(), r.text(tgt_field).strip()), r.where


def hub_pairs(name: str, subset: str | None, split: str, src_lang: str, tgt_lang: str) -> list[Pair]:
    """Pairs of a Hugging Face translation dataset (rows ``{"translation": {src_lang: ..., tgt_lang: ...}}``,
    as WMT and OPUS datasets are)."""
    dataset = load_hub_dataset(name, subset, split, name_key="data.name", files_key="data.data_files")
    if "translation" not in dataset.column_names:
        raise KeyError(f"Dataset {name} has no 'translation' column (columns: {dataset.column_names})")
    pairs = []
    for i, row in enumerate(dataset["translation"]):
        if src_lang not in row or tgt_lang not in row:
            raise KeyError(
                f"Dataset {name}, row {i}: no {src_lang!r}/{tgt_lang!r} translation (has {sorted(row)}); set "
                "data.src_lang and data.lang"
            )
        pairs.append((row[src_lang], row[tgt_lang]))
    return pairs


def token_budget_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Example indices grouped, in order of length, into batches of at most ``max_tokens`` tokens counted
    with padding (examples x the longest one); an example longer than the budget gets a batch of its own."""
    batches, batch, longest = [], [], 0
    for i in sorted(range(len(lengths)), key=lambda i: (lengths[i], i)):
        if batch and max(longest, lengths[i]) * (len(batch) + 1) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, lengths[i])
    return batches + ([batch] if batch else [])


class TranslationCollator:
    """A batch of encoded pairs -> ``src_ids``/``src_valid`` (source + EOS), ``tgt_ids`` (BOS + target, the
    decoder input) and ``labels`` (target + EOS, IGNORE_INDEX on padding), plus the raw texts for BLEU."""

    def __init__(self, tokenizer: Tokenizer):
        self.pad_id, self.bos_id, self.eos_id = tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id

    def __call__(self, batches: list[list[dict]]) -> dict:
        (examples,) = batches  # the loader yields one prepared batch at a time
        src_ids, src_valid = right_pad([[*e["src"], self.eos_id] for e in examples], self.pad_id)
        tgt_ids, tgt_valid = right_pad([[self.bos_id, *e["tgt"]] for e in examples], self.pad_id)
        labels, _ = right_pad([[*e["tgt"], self.eos_id] for e in examples], IGNORE_INDEX)
        return {
            "src_ids": src_ids,
            "src_valid": src_valid,
            "tgt_ids": tgt_ids,
            "tgt_valid": tgt_valid,
            "labels": labels,
            "src_text": [e["src_text"] for e in examples],
            "tgt_text": [e["tgt_text"] for e in examples],
        }


class TranslationDataModule(TextDataModule):
    """Args: ``source``: gettext (``lang`` picks the target language of the English catalogs under ``path``,
    default /usr/share/locale), file (``path`` a .tsv or .jsonl; ``src_field``/``tgt_field`` name the JSONL
    keys) or hub (``name``, ``subset``, ``split``, ``src_lang``, ``lang``); a joint byte-level BPE trained on
    both sides of the training split (``vocab_size``) or ``tokenizer_path``, or with ``joint_vocab=False`` one
    per side (``src_vocab_size`` / ``source_tokenizer_path`` for the source); ``max_tokens`` per batch per
    device (padding included); pairs longer than ``max_length`` tokens on either side are left out of
    training, and a validation or test pair longer than ``max_positions`` (the model's ``max_len``) is an
    error at setup; the split fractions (by source sentence: no source is in two splits); ``encoding``, the
    file's text encoding."""

    tokenizer_independent = TextDataModule.tokenizer_independent | {
        "source_tokenizer_path",
        "max_tokens",
        "max_length",
        "max_positions",
    }

    def __init__(
        self,
        source: str = "gettext",
        lang: str = "de",
        path: str | None = None,
        src_field: str = "src",
        tgt_field: str = "tgt",
        name: str | None = None,
        subset: str | None = None,
        split: str = "train",
        src_lang: str = "en",
        vocab_size: int = 8000,
        joint_vocab: bool = True,
        src_vocab_size: int | None = None,
        source_tokenizer_path: str | None = None,
        max_tokens: int = 4096,
        max_length: int = 128,
        max_positions: int = 256,
        val_fraction: float = 0.03,
        test_fraction: float = 0.03,
        encoding: str = "utf-8",
        **shared,
    ):
        super().__init__(val_fraction=val_fraction, test_fraction=test_fraction, **shared)
        if source not in SOURCES:
            raise ValueError(f"Unknown data.source={source!r}; choose one of {SOURCES}")
        if max_tokens < 1 or max_length < 1:
            raise ValueError(
                f"data.max_tokens={max_tokens} and data.max_length={max_length} must be at least 1"
            )
        if max_length > max_positions:
            raise ValueError(
                f"data.max_length={max_length} keeps training pairs longer than the model takes "
                f"(data.max_positions={max_positions}, the model's max_len); lower data.max_length or raise "
                "model.max_len"
            )
        self.source_tokenizer: Tokenizer | None = (
            None  # self.tokenizer is the target side's (by default joint)
        )

    @cached_property
    def pairs(self) -> list[Pair]:
        h = self.hparams
        if h.source == "gettext":
            return gettext_pairs(h.path or DEFAULT_LOCALE_DIR, h.lang)
        if h.source == "file":
            if not h.path:
                raise ValueError("data.source=file needs data.path=<file.tsv|.jsonl> with source and target")
            return read_parallel_file(h.path, h.src_field, h.tgt_field, h.encoding)
        if not h.name:
            raise ValueError("data.source=hub needs data.name=<dataset name or save_to_disk folder>")
        return hub_pairs(h.name, h.subset, h.split, h.src_lang, h.lang)

    @cached_property
    def splits(self) -> dict[str, list[Pair]]:
        h = self.hparams
        sources = sorted({source for source, _ in self.pairs})
        parts = split_by_fractions(sources, h.val_fraction, h.test_fraction, h.seed, "source sentences")
        split_of = {sources[i]: name for name, idx in parts.items() for i in idx}
        splits: dict[str, list[Pair]] = {name: [] for name in parts}
        for pair in dict.fromkeys(self.pairs):  # duplicates out, first occurrence order kept
            splits[split_of[pair[0]]].append(pair)
        return splits

    def where(self, pair: Pair) -> str:
        """Where ``pair`` was read, for an error naming it (the file is read again: nothing is kept per pair)."""
        h = self.hparams
        if h.source == "file":
            located = located_parallel_file(h.path, h.src_field, h.tgt_field, h.encoding)
            return next(where for read, where in located if read == pair)
        if h.source == "hub":
            return f"{h.name}, row {self.pairs.index(pair)}"
        return f"the {h.lang!r} gettext catalogs under {h.path or DEFAULT_LOCALE_DIR}"

    def data_identity(self) -> list | None:
        return file_identity([self.hparams.path]) if self.hparams.source == "file" else None

    def _load_or_train(self, side: str, path: str | None, sides: tuple[int, ...]) -> Tokenizer:
        """The BPE of ``side`` (joint, source or target): ``path``, or one trained on the training split."""
        h = self.hparams
        vocab_size = (h.src_vocab_size or h.vocab_size) if side == "source" else h.vocab_size
        if side == "source" and path:  # a translation checkpoint's source side is its source_tokenizer
            check_tokenizer_path(path, "data.source_tokenizer_path")
            return Tokenizer.from_file(path, checkpoint_key="source_tokenizer")
        texts = lambda: [pair[i] for pair in self.splits["train"] for i in sides]  # noqa: E731
        return self.tokenizer_for(path, texts, vocab_size, part=side)

    def load_tokenizers(self) -> tuple[Tokenizer, Tokenizer]:
        """(source, target) tokenizers: one joint BPE over both sides by default, the same object twice."""
        h = self.hparams
        if h.joint_vocab:
            joint = self._load_or_train("joint", h.tokenizer_path, (0, 1))
            return joint, joint
        source = self._load_or_train("source", h.source_tokenizer_path, (0,))
        target = self._load_or_train("target", h.tokenizer_path, (1,))
        if (source.pad_id, source.eos_id) != (target.pad_id, target.eos_id):
            raise ValueError(
                "The source and target tokenizers give PAD and EOS different ids; train both here "
                "(data.source_tokenizer_path=null data.tokenizer_path=null) or use data.joint_vocab=true"
            )
        return source, target

    def prepare_data(self) -> None:
        self.load_tokenizers()

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        h = self.hparams
        self.source_tokenizer, self.tokenizer = source_tok, tok = self.load_tokenizers()
        self.collate = TranslationCollator(tok)
        for name, pairs in self.splits.items():
            if not pairs:
                raise ValueError(
                    f"The {name} split has no sentence pairs; add data or raise data.{name}_fraction"
                )
            sources = source_tok.encode_batch([s for s, _ in pairs])
            targets = tok.encode_batch([t for _, t in pairs])
            # the model reads source + EOS and target + EOS (labels) or BOS + target (decoder input)
            lengths = [max(len(s), len(t)) + 1 for s, t in zip(sources, targets)]
            if name == "train":  # training drops the longest pairs, as fairseq's training iterator does
                kept = [i for i, n in enumerate(lengths) if n <= h.max_length]
            else:
                self._check_lengths(name, pairs, lengths)
                kept = range(len(pairs))
            if not kept:
                raise ValueError(
                    f"Every {name} pair is longer than data.max_length={h.max_length} tokens; raise it"
                )
            examples = [
                {"src": sources[i], "tgt": targets[i], "src_text": pairs[i][0], "tgt_text": pairs[i][1]}
                for i in kept
            ]
            self.datasets[name] = [
                [examples[i] for i in b]
                for b in token_budget_batches([lengths[i] for i in kept], h.max_tokens)
            ]
            if name == "train" and len(examples) < len(pairs):
                log.info(
                    "Training on %d of %d pairs (the rest exceed data.max_length)", len(examples), len(pairs)
                )
        log.info("Sentence pairs: %s", {n: sum(map(len, b)) for n, b in self.datasets.items()})

    def _check_lengths(self, name: str, pairs: list[Pair], lengths: list[int]) -> None:
        """Refuse, before the first step, a validation or test pair the model cannot read, rather than fail at
        the validation that reaches it. Evaluation scores every pair (its BLEU must count them all), so none
        is dropped or cut: fairseq refuses such pairs too (unless --skip-invalid-size-inputs-valid-test),
        where HF's run_translation.py would silently score a truncated source."""
        h = self.hparams
        too_long = [i for i, n in enumerate(lengths) if n > h.max_positions]
        if too_long:
            i = too_long[0]
            raise ValueError(
                f"{self.where(pairs[i])}: the {name} pair {pairs[i][0][:60]!r} is {lengths[i]} tokens long (EOS "
                f"included), more than the model takes (data.max_positions={h.max_positions}, the model's max_len); "
                f"{len(too_long)} {name} pair(s) are. Evaluation scores every pair, so raise model.max_len or "
                "remove them from the data"
            )

    def _dataloader(self, split: str, shuffle: bool):
        # batch_size=1: each item is already a batch, made by length under the token budget
        return make_loader(
            self.datasets[split], 1, shuffle, self.hparams.num_workers, self.collate, trainer=self.trainer
        )

    def fixed_examples(self, n: int) -> list[Pair]:
        """``n`` validation pairs shown on dashboards, the same at every validation: spread evenly over the
        pairs whose source reads as a sentence (:func:`reads_as_sentence`), so that the ``%s`` and
        ``{name}`` entries that sort first in gettext catalogs are not all a dashboard shows; over every
        pair when too few read so."""
        pairs = self.splits["val"]
        sentences = [pair for pair in pairs if reads_as_sentence(pair[0])]
        pool = sentences if len(sentences) >= n else pairs
        return [pool[i * len(pool) // n] for i in range(n)] if len(pool) > n else pool
