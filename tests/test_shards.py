"""Token shards (``lit-prepare``): the same windows as the in-memory path, exact resume, constant memory."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra

from lit_transformers.data import CausalLMDataModule, CorpusSpec, load_documents, token_stream
from lit_transformers.data.corpus import document_index, read_document
from lit_transformers.data.loaders import ResumableSampler, make_loader
from lit_transformers.prepare import prepare
from lit_transformers.utils.config import ConfigError

from test_resume import _assert_same_training, _train_in

# several shards per split, so that windows span shard boundaries, each encoded in several parts
SMALL_SHARDS, SMALL_PARTS = 20_000, 5_000


def _prepare(shards: Path, cache: Path, *overrides: str) -> Path:
    """lit-prepare with the tiny LMs' vocabulary, 2 workers, and small shards encoded in small parts."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(token_stream, "SHARD_CHARS", SMALL_SHARDS)
        patch.setattr(token_stream, "ENCODE_CHARS", SMALL_PARTS)
        GlobalHydra.instance().clear()
        prepare([f"data.shards_dir={shards}", "data.vocab_size=300", f"paths.cache_dir={cache}", *overrides])
    return shards


@pytest.fixture(scope="module")
def pydoc_shards(tmp_path_factory) -> Path:
    """CPython's docs (the default corpus, loaded whole) as shards."""
    return _prepare(tmp_path_factory.mktemp("shards"), tmp_path_factory.mktemp("shard_cache"))


def _datamodule(**settings) -> CausalLMDataModule:
    datamodule = CausalLMDataModule(vocab_size=300, block_size=32, batch_size=8, **settings)
    datamodule.setup()
    return datamodule


def _corpus(source: str, root: Path) -> dict:
    """CPython's docs written as a corpus of ``source``: a folder of files, one file of paragraphs (line breaks
    \r\n, which reading translates), or a dataset saved to disk."""
    docs = load_documents(CorpusSpec())
    if source == "folder":
        root.mkdir()
        for name, text in docs:
            (root / f"{name}.txt").write_text(text, encoding="utf-8")
        return {"source": "path", "path": str(root)}
    if source == "file":
        path = root.with_suffix(".txt")
        path.write_bytes("\n\n".join(text for _, text in docs).replace("\n", "\r\n").encode())
        return {"source": "path", "path": str(path)}
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": [text for _, text in docs]}).save_to_disk(str(root))
    return {"source": "hub", "name": str(root)}


@pytest.mark.parametrize("source", ["pydoc", "folder", "file", "hub"])
def test_shards_give_the_windows_and_tokenizer_of_the_in_memory_path(source, pydoc_shards, tmp_path):
    if source == "pydoc":
        corpus, shards = {}, pydoc_shards
    else:  # a corpus the workers read document by document
        corpus = _corpus(source, tmp_path / "corpus")
        overrides = [f"data.corpus.{key}={value}" for key, value in corpus.items()]
        shards = _prepare(tmp_path / "shards", tmp_path / "cache", *overrides)
    index = json.loads((shards / "index.json").read_text())
    assert len(index["splits"]["train"]) > 5 and index["dtype"] == "uint16"
    in_memory = _datamodule(corpus=corpus, cache_dir=str(tmp_path / "in_memory_cache"))
    sharded = _datamodule(corpus=corpus, shards_dir=str(shards))
    assert (
        sharded.tokenizer == in_memory.tokenizer
    )  # trained on the same sample, once in memory, once from files
    for split in ("train", "val", "test"):
        expected, got = in_memory.datasets[split], sharded.datasets[split]
        assert len(got) == len(expected) > 0
        for i in range(len(expected)):
            for key in ("input_ids", "labels"):
                assert torch.equal(got[i][key], expected[i][key]), (split, i, key)


def _refusing_to_read(path: Path, read_whole):
    """``Path.read_bytes`` or ``read_text`` (how a file is read whole), failing for ``path``."""

    def read(self, *args, **kwargs):
        assert self != path, f"{path} was read whole"
        return read_whole(self, *args, **kwargs)

    return read


def test_prepare_reads_a_single_file_by_paragraph_byte_ranges_never_whole(tmp_path, monkeypatch):
    corpus = _corpus("file", tmp_path / "corpus")
    path = Path(corpus["path"])
    data = path.read_bytes()
    paragraphs = [text for _, text in load_documents(CorpusSpec(**corpus))]
    for method in ("read_bytes", "read_text"):
        monkeypatch.setattr(Path, method, _refusing_to_read(path, getattr(Path, method)))
    tasks = []  # what the workers would get
    monkeypatch.setattr(token_stream, "_write_shard", lambda task: tasks.append(task) or 0)
    overrides = [f"data.corpus.{key}={value}" for key, value in corpus.items()]
    _prepare(tmp_path / "shards", tmp_path / "cache", *overrides, "data.prepare_workers=0")
    ranges = sorted(reference for _, documents, _ in tasks for reference, _ in documents)
    texts = [data[start:end].decode().replace("\r\n", "\n") + "\n\n" for start, end in ranges]
    assert texts == paragraphs and len(paragraphs) > 100


def test_a_single_file_read_line_by_line_has_the_paragraphs_of_its_whole_text(tmp_path):
    path = tmp_path / "book.txt"
    # blank lines of spaces, tabs, form feeds and no-break spaces; \r\n and lone \r; blank lines first and last
    text = "\n \nOne\r\nline two  \n\t\n\n two\r\r\x0c\r\nthree\xa0\n\xa0\n\u00e9t\u00e9 \u6771\n\nfour\n \n"
    path.write_bytes(text.encode())
    whole = path.read_text(encoding="utf-8")  # as Python reads text: \r\n and \r become \n
    paragraphs = [p + "\n\n" for p in re.split(r"\n\s*\n", whole) if p.strip()]
    assert len(paragraphs) == 5
    assert [text for _, text in load_documents(CorpusSpec(source="path", path=str(path)))] == paragraphs


def test_a_single_file_whose_line_breaks_are_not_ascii_bytes_is_refused_naming_the_fix(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("One.\n\nTwo.\n", encoding="utf-16")
    with pytest.raises(
        ValueError, match="convert it to UTF-8 .iconv -f utf-16 -t utf-8. or move it into a folder"
    ):
        load_documents(CorpusSpec(source="path", path=str(path), encoding="utf-16"))


def test_a_hub_corpus_is_read_row_by_row_never_as_a_whole_column(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    texts = [f"Row {i}." if i % 7 else "  " for i in range(2500)]  # a few batches of rows, some without text
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "saved"))
    column_or_rows = datasets.Dataset.__getitem__

    def rows_only(self, key):
        assert not isinstance(key, str), f"the whole {key!r} column was read"
        return column_or_rows(self, key)

    monkeypatch.setattr(datasets.Dataset, "__getitem__", rows_only)
    spec = CorpusSpec(source="hub", name=str(tmp_path / "saved"))
    index = document_index(spec)
    assert [doc_id for doc_id, _, _ in index] == [f"{spec.name}:{i}" for i in range(2500) if i % 7]
    assert [read_document(spec, row) for _, row, _ in index] == [t for t in texts if t.strip()]


def test_each_rank_reads_a_disjoint_part_of_every_epoch_and_workers_read_the_same_batches(pydoc_shards):
    windows = _datamodule(shards_dir=str(pydoc_shards)).datasets["train"]
    first, second = (set(ResumableSampler(windows, 2, rank, seed=0)) for rank in (0, 1))
    assert first | second == set(range(len(windows)))
    assert len(first & second) == len(windows) % 2  # the sampler repeats a window to even out an odd count
    in_process, in_workers = (
        [b["input_ids"] for _, b in zip(range(6), make_loader(windows, 8, train=True, num_workers=workers))]
        for workers in (0, 2)
    )
    assert all(torch.equal(a, b) for a, b in zip(in_process, in_workers, strict=True))


def test_prepare_names_what_it_needs():
    GlobalHydra.instance().clear()
    with pytest.raises(ValueError, match="set data.shards_dir="):
        prepare([])
    with pytest.raises(ConfigError, match="not LM data"):
        prepare(["experiment=vit"])


def test_missing_shards_name_the_prepare_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="lit-prepare data.shards_dir="):
        _datamodule(shards_dir=str(tmp_path / "nowhere"))


def test_shards_refuse_another_split_than_they_were_written_with(pydoc_shards):
    with pytest.raises(ValueError, match="re-run lit-prepare"):
        _datamodule(shards_dir=str(pydoc_shards), val_fraction=0.1)


def test_resume_from_shards_trains_exactly_as_the_run_that_went_on(compose_cfg, tmp_path, pydoc_shards):
    # a validation and a checkpoint every 2 steps (test_resume's runs): one validation between the checkpoint and the
    # steps compared
    common = [f"data.shards_dir={pydoc_shards}"]
    _train_in(compose_cfg, tmp_path / "straight", *common)
    step_4 = tmp_path / "straight" / "checkpoints" / "step_000004.ckpt"
    _train_in(compose_cfg, tmp_path / "resumed", *common, f"ckpt_path={step_4}")
    _assert_same_training(tmp_path / "straight", tmp_path / "resumed", range(4, 8))


PEAK_RSS = textwrap.dedent(
    """
    import resource, sys
    from lit_transformers.data import CausalLMDataModule
    datamodule = CausalLMDataModule(shards_dir=sys.argv[1], block_size=256, batch_size=32)
    datamodule.setup()
    loader = datamodule.train_dataloader()
    for _, batch in zip(range(200), loader):
        pass
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)  # MB
    """
)


@pytest.mark.slow
def test_shard_datamodule_memory_stays_flat_when_the_corpus_grows_tenfold(tmp_path):
    paragraph = (Path(token_stream.__file__).read_text() + "\n\n") * 4  # ~30 KB of prose and code
    peak_mb = {}
    for copies in (700, 7000):  # ~21 MB and ~210 MB of text, one file per part
        corpus = tmp_path / f"corpus_{copies}"
        corpus.mkdir()
        for i in range(copies):
            (corpus / f"part_{i:05d}.txt").write_text(f"Part {i}.\n\n{paragraph}")
        assert sum(f.stat().st_size for f in corpus.iterdir()) > copies * 25_000
        shards = tmp_path / f"shards_{copies}"
        GlobalHydra.instance().clear()
        prepare(
            [
                f"data.shards_dir={shards}",
                "data.corpus.source=path",
                f"data.corpus.path={corpus}",
                "data.vocab_size=1024",
                "data.tokenizer_train_chars=2_000_000",
                f"paths.cache_dir={tmp_path / 'cache'}",
            ]
        )
        run = subprocess.run(
            [sys.executable, "-c", PEAK_RSS, str(shards)], capture_output=True, text=True, check=True
        )
        peak_mb[copies] = int(run.stdout.split()[-1])
    assert peak_mb[7000] - peak_mb[700] < 50, peak_mb
