"""Text corpora as (document id, text) pairs, and a deterministic split by document."""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lit_transformers.text import split_by_fractions

Document = tuple[str, str]
SOURCES = ("pydoc", "path", "hub")

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
    if spec.source == "pydoc":
        from pydoc_data.topics import topics  # ships with every CPython: ~465 KB of real English prose

        docs = sorted(topics.items())
    elif spec.source == "path":
        docs = _documents_from_path(spec.path, spec.encoding)
    elif spec.source == "hub":
        docs = _documents_from_hub(spec)
    else:
        raise ValueError(f"Unknown corpus source {spec.source!r}; set data.corpus.source to one of {SOURCES}")
    docs = [(doc_id, text) for doc_id, text in docs if text.strip()]
    if not docs:
        raise ValueError(f"Corpus {spec} holds no text; point data.corpus at a non-empty source")
    return docs


def _documents_from_path(path: str | None, encoding: str) -> list[Document]:
    root = _corpus_path(path, encoding)
    if root.is_dir():
        return list(_folder_documents(root, encoding))
    # one file: its blank-line separated paragraphs are the documents of the split
    text = _read_text(root, encoding)
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    return [(f"{root.name}:{i}", p + "\n\n") for i, p in enumerate(paragraphs)]


def _corpus_path(path: str | None, encoding: str) -> Path:
    """The file or folder of a ``source=path`` corpus, once its encoding is known to exist."""
    if not path:
        raise ValueError("data.corpus.source=path needs data.corpus.path=<file.txt or folder of .txt files>")
    try:
        codecs.lookup(encoding)
    except LookupError as err:
        raise ValueError(
            f"Unknown data.corpus.encoding={encoding!r}; set it to a Python codec name such as utf-8 or latin-1"
        ) from err
    root = Path(path).expanduser()
    if not root.exists():
        raise FileNotFoundError(f"Data file {root} not found; set data.corpus.path=<file.txt or folder>")
    return root


def _folder_documents(root: Path, encoding: str) -> Iterator[Document]:
    """One document per .txt file of the folder, read one at a time."""
    files = sorted(root.rglob("*.txt"))
    if not files:
        raise FileNotFoundError(
            f"No .txt files under {root}; set data.corpus.path to a folder with .txt files"
        )
    for file in files:
        yield str(file.relative_to(root)), _read_text(file, encoding)


def folder_document_ids(spec: CorpusSpec) -> list[str] | None:
    """The ids of a folder corpus's documents (as ``load_documents`` keeps them), reading one file at a time: with
    them ``lit-prepare``'s workers read the files themselves, and the corpus is never in memory at once. None for
    the other kinds of corpus, which are loaded whole."""
    if spec.source != "path" or not spec.path or not Path(spec.path).expanduser().is_dir():
        return None
    return [
        doc_id
        for doc_id, text in _folder_documents(_corpus_path(spec.path, spec.encoding), spec.encoding)
        if text.strip()
    ]


def read_folder_document(spec: CorpusSpec, doc_id: str) -> str:
    return _read_text(Path(spec.path).expanduser() / doc_id, spec.encoding)


def folder_document_size(spec: CorpusSpec, doc_id: str) -> int:
    return (Path(spec.path).expanduser() / doc_id).stat().st_size


def _read_text(file: Path, encoding: str) -> str:
    """The file's text; refuses binary files and text in another encoding, naming the file and the fix."""
    try:
        text, bad = file.read_text(encoding=encoding), None
    except UnicodeDecodeError as err:
        text, bad = file.read_text(encoding=encoding, errors="replace"), err
    if "\x00" in text:  # text never holds NUL; binaries (and UTF-16 read as UTF-8) are full of them
        raise ValueError(
            f"Corpus file {file} is not text: it contains NUL bytes, as binary files do; point "
            "data.corpus.path at text files (for UTF-16 text, set data.corpus.encoding=utf-16)"
        )
    if bad is None:
        return text
    # A wrong encoding garbles most non-ASCII characters (latin-1 accents are single bytes, invalid in UTF-8);
    # a few stray bytes in otherwise valid text (common in scraped corpora) are kept as U+FFFD, with a warning.
    replaced = text.count("\ufffd")
    non_ascii = len(text) - len(text.encode("ascii", errors="ignore"))
    if 2 * replaced > non_ascii:
        raise ValueError(
            f"Corpus file {file} is not {encoding} text: {replaced} of its {non_ascii} non-ASCII characters "
            f"cannot be decoded (the first at byte {bad.start}); set data.corpus.encoding=latin-1 "
            "(or the file's encoding, e.g. cp1252)"
        )
    log.warning(
        "Corpus file %s: %d byte(s) that are not valid %s were replaced by U+FFFD", file, replaced, encoding
    )
    return text


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


def _documents_from_hub(spec: CorpusSpec) -> list[Document]:
    if not spec.name:
        raise ValueError(
            "data.corpus.source=hub needs data.corpus.name=<dataset name or save_to_disk folder>"
        )
    dataset = load_hub_dataset(spec.name, spec.subset, spec.split, spec.data_files)
    if spec.text_field not in dataset.column_names:
        raise KeyError(
            f"Dataset {spec.name} has no column {spec.text_field!r}; set data.corpus.text_field to one of "
            f"{dataset.column_names}"
        )
    return [(f"{spec.name}:{i}", text) for i, text in enumerate(dataset[spec.text_field])]


def fingerprint(spec: CorpusSpec) -> str:
    """Changes whenever the corpus may have changed: keys the tokenizer cache."""
    if spec.source == "pydoc":
        identity = sys.version
    elif spec.source == "path" and spec.path and Path(spec.path).exists():
        root = Path(spec.path)
        files = sorted(root.rglob("*.txt")) if root.is_dir() else [root]
        identity = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
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
