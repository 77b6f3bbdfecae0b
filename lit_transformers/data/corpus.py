"""Text corpora as (document id, text) pairs, and a deterministic split by document.

Every corpus is read one document at a time; each document also has a reference (a topic key, a file of a folder,
the byte range of a paragraph of a single file, a dataset row) from which ``read_document`` reads its text again in
any process. ``load_documents`` keeps the texts (corpora that fit in memory); ``document_index`` keeps only ids,
references and sizes, so that ``lit-prepare`` splits a corpus larger than memory and its workers read the texts.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lit_transformers.data.records import check_encoding, file_identity
from lit_transformers.text import split_by_fractions

Document = tuple[str, str]
SOURCES = ("pydoc", "path", "hub")
HUB_BATCH_ROWS = 1000  # dataset rows decoded at once while a Hub corpus is read row by row

log = logging.getLogger(__name__)


@dataclass
class CorpusSpec:
    """Where the text comes from; ``source`` picks one of the three loaders."""

    source: str = (
        "pydoc"  # pydoc: CPython's bundled reference docs | path: a .txt file or folder | hub: HF datasets
    )
    path: str | None = None  # file or folder, for source=path
    encoding: str = "utf-8"  # text encoding of the source=path files, e.g. latin-1
    name: str | None = None  # dataset name or save_to_disk folder, for source=hub
    subset: str | None = None  # dataset configuration, e.g. wikitext-2-raw-v1 for name=wikitext
    data_files: str | None = None  # optional data_files for load_dataset (e.g. name=text with local files)
    split: str = "train"  # HF split to read
    text_field: str = "text"  # column holding the text


def load_documents(spec: CorpusSpec) -> list[Document]:
    return [(doc_id, text) for doc_id, _, text in _documents(spec)]


def document_index(spec: CorpusSpec) -> list[tuple[str, Any, int]]:
    """(id, reference, characters) of every document of ``load_documents``, in its order, from one pass that holds
    one document at a time: what a split and a fair share of the corpus among workers need, without the text."""
    return [(doc_id, reference, len(text)) for doc_id, reference, text in _documents(spec)]


def read_document(spec: CorpusSpec, reference: Any) -> str:
    """The text of the document that ``document_index`` gave ``reference``, read on its own."""
    if spec.source == "pydoc":
        from pydoc_data.topics import topics

        return topics[reference]
    if spec.source == "hub":
        return _hub_texts(spec)[reference][spec.text_field]
    root = Path(spec.path).expanduser()
    if root.is_dir():
        return _read_text(root / reference, spec.encoding)
    start, end = reference
    with open(root, "rb") as file:
        file.seek(start)
        return _paragraph_text(file.read(end - start), spec.encoding)


def _documents(spec: CorpusSpec) -> Iterator[tuple[str, Any, str]]:
    """(id, reference, text) of each document with text, one at a time."""
    if spec.source == "pydoc":
        from pydoc_data.topics import topics  # ships with every CPython: ~465 KB of real English prose

        docs = ((key, key, text) for key, text in sorted(topics.items()))
    elif spec.source == "path":
        docs = _path_documents(spec)
    elif spec.source == "hub":
        docs = _hub_documents(spec)
    else:
        raise ValueError(f"Unknown corpus source {spec.source!r}; set data.corpus.source to one of {SOURCES}")
    empty = True
    for doc in docs:
        if doc[2].strip():
            empty = False
            yield doc
    if empty:
        raise ValueError(f"Corpus {spec} holds no text; point data.corpus at a non-empty source")


def _path_documents(spec: CorpusSpec) -> Iterator[tuple[str, Any, str]]:
    root = _corpus_path(spec.path, spec.encoding)
    if root.is_dir():  # one document per .txt file
        files = sorted(root.rglob("*.txt"))
        if not files:
            raise FileNotFoundError(
                f"No .txt files under {root}; set data.corpus.path to a folder with .txt files"
            )
        for file in files:
            doc_id = str(file.relative_to(root))
            yield doc_id, doc_id, _read_text(file, spec.encoding)
    else:  # one file: its blank-line separated paragraphs are the documents of the split
        for i, (byte_range, text) in enumerate(_paragraphs(root, spec.encoding)):
            yield f"{root.name}:{i}", byte_range, text


def _corpus_path(path: str | None, encoding: str) -> Path:
    """The file or folder of a ``source=path`` corpus, once its encoding is known to exist."""
    if not path:
        raise ValueError("data.corpus.source=path needs data.corpus.path=<file.txt or folder of .txt files>")
    check_encoding(encoding, "data.corpus.encoding")
    root = Path(path).expanduser()
    if not root.exists():
        raise FileNotFoundError(f"Data file {root} not found; set data.corpus.path=<file.txt or folder>")
    return root


def _paragraphs(file: Path, encoding: str) -> Iterator[tuple[tuple[int, int], str]]:
    """The byte range and text of each paragraph of the file with text, read one line at a time. The paragraphs are
    the pieces that ``re.split(r"\\n\\s*\\n", text)`` cuts from the file's decoded text: a line of whitespace that
    follows another line and ends in a line break ends a paragraph (without the line break before it), and the
    lines of whitespace after it belong to no paragraph."""
    try:
        ascii_line_breaks = b"\r\n \t".decode(encoding) == "\r\n \t"
    except UnicodeDecodeError:
        ascii_line_breaks = False
    if not ascii_line_breaks:
        raise ValueError(
            f"Corpus file {file} is {encoding} text, whose line breaks are not the ASCII bytes a single-file corpus "
            f"is split at; convert it to UTF-8 (iconv -f {encoding} -t utf-8) or move it into a folder and set "
            "data.corpus.path=<folder>"
        )
    check = _DecodingCheck(file, encoding)
    lines: list[str] = []  # the paragraph's lines so far, a character per byte
    start = offset = 0
    # latin-1 reads any byte as one character, and newline="" splits at \n, \r\n and \r without translating them:
    # character offsets are byte offsets, and in an ASCII-compatible encoding those bytes are the line breaks
    with open(file, encoding="latin-1", newline="") as raw:
        for line in raw:
            text = check.decode(line.encode("latin-1"), offset)
            blank = offset > 0 and line[-1] in "\r\n" and not text.strip()
            if blank and lines:
                yield from _paragraph(start, "".join(lines).removesuffix("\n").removesuffix("\r"), encoding)
                lines = []
            elif not blank:
                if not lines:
                    start = offset
                lines.append(line)
            offset += len(line)
    check.finish()
    if lines:
        yield from _paragraph(start, "".join(lines), encoding)


def _paragraph(start: int, raw: str, encoding: str) -> Iterator[tuple[tuple[int, int], str]]:
    """The byte range and text of the paragraph at byte ``start`` (``raw``: its bytes as latin-1 characters), if
    it has text."""
    text = _paragraph_text(raw.encode("latin-1"), encoding)
    if text.strip():
        yield (start, start + len(raw)), text


def _paragraph_text(data: bytes, encoding: str) -> str:
    """A paragraph's bytes as the document the split sees: decoded (checked by the pass that found it), line breaks
    as in ``_read_text``, and a blank line after it."""
    return _universal_newlines(data.decode(encoding, errors="replace")) + "\n\n"


def _universal_newlines(text: str) -> str:
    """\r\n and \r as \n, as Python's text files read them."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _read_text(file: Path, encoding: str) -> str:
    """The file's text, checked by ``_DecodingCheck``."""
    check = _DecodingCheck(file, encoding)
    text = check.decode(file.read_bytes())
    check.finish()
    return _universal_newlines(text)


class _DecodingCheck:
    """Decodes a file's bytes, whole or piece by piece, and refuses binary files and text in another encoding,
    naming the file and the fix."""

    def __init__(self, file: Path, encoding: str):
        self.file, self.encoding = file, encoding
        self.replaced = self.non_ascii = 0
        self.first_bad: int | None = None  # byte offset of the first byte that is not valid text

    def decode(self, data: bytes, offset: int = 0) -> str:
        """The text of ``data``, the file's bytes from ``offset`` on."""
        try:
            text = data.decode(self.encoding)
        except UnicodeDecodeError as err:
            text = data.decode(self.encoding, errors="replace")
            if self.first_bad is None:
                self.first_bad = offset + err.start
        if "\x00" in text:  # text never holds NUL; binaries (and UTF-16 read as UTF-8) are full of them
            raise ValueError(
                f"Corpus file {self.file} is not text: it contains NUL bytes, as binary files do; point "
                "data.corpus.path at text files (for UTF-16 text, set data.corpus.encoding=utf-16)"
            )
        self.replaced += text.count("\ufffd")
        self.non_ascii += len(text) - len(text.encode("ascii", errors="ignore"))
        return text

    def finish(self) -> None:
        """Judges the whole file once it is decoded. A wrong encoding garbles most non-ASCII characters (latin-1
        accents are single bytes, invalid in UTF-8); a few stray bytes in otherwise valid text (common in scraped
        corpora) are kept as U+FFFD, with a warning."""
        if self.first_bad is None:
            return
        if 2 * self.replaced > self.non_ascii:
            raise ValueError(
                f"Corpus file {self.file} is not {self.encoding} text: {self.replaced} of its {self.non_ascii} "
                f"non-ASCII characters cannot be decoded (the first at byte {self.first_bad}); set "
                "data.corpus.encoding=latin-1 (or the file's encoding, e.g. cp1252)"
            )
        log.warning(
            "Corpus file %s: %d byte(s) that are not valid %s were replaced by U+FFFD",
            self.file,
            self.replaced,
            self.encoding,
        )


def load_hub_dataset(
    name: str,
    subset: str | None,
    split: str,
    data_files=None,
    name_key: str = "data.corpus.name",
    files_key: str = "data.corpus.data_files",
):
    """A Hugging Face dataset split: a ``Dataset.save_to_disk`` folder, or ``load_dataset`` (Hub or local
    files). Offline or missing datasets are one message naming the overrides that fix it."""
    try:
        import datasets
    except ImportError as err:
        raise ImportError("Hugging Face datasets are an extra: pip install 'lit-transformers[hub]'") from err
    if Path(name).is_dir() and (Path(name) / "dataset_info.json").exists():
        dataset = datasets.load_from_disk(name)
        return dataset[split] if isinstance(dataset, datasets.DatasetDict) else dataset
    try:
        return datasets.load_dataset(name, subset, data_files=data_files, split=split)
    except ConnectionError as err:  # what load_dataset raises offline, HF_HUB_OFFLINE=1 included
        raise FileNotFoundError(
            f"Dataset {name!r} could not be reached on the Hugging Face Hub ({err}); use a local copy: "
            f"{name_key}=<folder written by Dataset.save_to_disk>, or {name_key}=text "
            f"{files_key}=<your .txt files>"
        ) from err
    except FileNotFoundError as err:  # datasets.exceptions.DatasetNotFoundError, missing data_files
        raise FileNotFoundError(
            f"Dataset {name!r} not found ({err}); check {name_key} (a Hub dataset or a "
            f"Dataset.save_to_disk folder) and {files_key}"
        ) from err


def _hub_documents(spec: CorpusSpec) -> Iterator[tuple[str, int, str]]:
    """One document per row, read a batch of rows at a time from the memory-mapped dataset."""
    rows = _hub_texts(spec).iter(batch_size=HUB_BATCH_ROWS)
    texts = (text for batch in rows for text in batch[spec.text_field])
    for i, text in enumerate(texts):
        yield f"{spec.name}:{i}", i, text


def _hub_texts(spec: CorpusSpec):
    """The text column of the corpus's dataset, loaded once per process (the rows stay on disk)."""
    if not spec.name:
        raise ValueError(
            "data.corpus.source=hub needs data.corpus.name=<dataset name or save_to_disk folder>"
        )
    return _hub_column(spec.name, spec.subset, spec.split, spec.data_files, spec.text_field)


@functools.cache
def _hub_column(name: str, subset: str | None, split: str, data_files: str | None, text_field: str):
    dataset = load_hub_dataset(name, subset, split, data_files)
    if text_field not in dataset.column_names:
        raise KeyError(
            f"Dataset {name} has no column {text_field!r}; set data.corpus.text_field to one of "
            f"{dataset.column_names}"
        )
    return dataset.select_columns([text_field])


def fingerprint(spec: CorpusSpec) -> str:
    """Changes whenever the corpus may have changed: keys the tokenizer cache."""
    if spec.source == "pydoc":
        identity = sys.version
    elif spec.source == "path" and spec.path and Path(spec.path).exists():
        root = Path(spec.path)
        identity = file_identity(sorted(root.rglob("*.txt")) if root.is_dir() else [root])
    else:
        identity = None
    payload = json.dumps([spec.__dict__, identity], sort_keys=True, default=str)
    return hashlib.sha1(payload.encode()).hexdigest()[:16]


def split_documents(
    docs: list[Document], val_fraction: float, test_fraction: float, seed: int = 0
) -> dict[str, list[Document]]:
    """Whole documents per split, by a seeded hash of their id: the same every run and rank."""
    parts = split_by_fractions([doc_id for doc_id, _ in docs], val_fraction, test_fraction, seed, "documents")
    return {name: [docs[i] for i in idx] for name, idx in parts.items()}
