"""Corpora, the document split, tokenizers and the causal-LM datamodule."""

from __future__ import annotations

import pytest
import torch

from lit_transformers.data import CausalLMDataModule, CorpusSpec, load_documents, split_documents
from lit_transformers.text import Tokenizer


def test_pydoc_corpus_is_real_prose_available_offline():
    docs = load_documents(CorpusSpec(source="pydoc"))
    assert len(docs) > 50
    assert sum(len(text) for _, text in docs) > 400_000
    assert any("for" in doc_id for doc_id, _ in docs)


def test_split_is_by_document_deterministic_and_disjoint():
    docs = [(f"doc{i}", f"text {i}") for i in range(100)]
    first = split_documents(docs, 0.1, 0.05, seed=0)
    again = split_documents(list(reversed(docs)), 0.1, 0.05, seed=0)
    assert first == again
    ids = {name: {d for d, _ in split} for name, split in first.items()}
    assert (len(ids["train"]), len(ids["val"]), len(ids["test"])) == (85, 10, 5)
    assert (
        not (ids["train"] & ids["val"])
        and not (ids["train"] & ids["test"])
        and not (ids["val"] & ids["test"])
    )
    other_seed = split_documents(docs, 0.1, 0.05, seed=1)
    assert {d for d, _ in other_seed["val"]} != ids["val"]


def test_split_rejects_a_corpus_too_small_to_split():
    with pytest.raises(ValueError, match="too few"):
        split_documents([("a", "x"), ("b", "y")], 0.1, 0.1)


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_tokenizer_round_trips_and_keeps_special_ids_distinct(kind, tmp_path):
    texts = ["def f(x):\n    return x + 1\n", "The for statement loops.\n"] * 20
    tok = Tokenizer.train(texts, kind=kind, vocab_size=300)
    assert len({tok.pad_id, tok.bos_id, tok.eos_id}) == 3
    sample = "def f(x):\n    return x\n"
    assert tok.decode(tok.encode(sample)) == sample
    tok.save(tmp_path / "tok.json")
    reloaded = Tokenizer.from_file(tmp_path / "tok.json")
    assert reloaded.encode(sample) == tok.encode(sample)
    assert Tokenizer.from_state(tok.state()) == tok
    assert tok.decode([*tok.encode("def"), tok.eos_id, tok.pad_id, tok.pad_id]) == "def"


def test_bpe_encodes_unseen_bytes_without_unknown_tokens():
    tok = Tokenizer.train(["plain ascii text"] * 10, kind="bpe", vocab_size=300)
    text = "naïve – 東京 🙂"
    assert tok.decode(tok.encode(text)) == text


def test_for_data_takes_the_given_file_else_trains_once_per_identity_kind_vocab_and_case(tmp_path):
    trained = []

    def texts() -> list[str]:
        trained.append(1)
        return ["Loops and functions, loops and classes."] * 10

    def for_data(identity, kind="bpe", vocab_size=300, lowercase=False, tokenizer_path=None) -> Tokenizer:
        cache = tmp_path / "cache"
        return Tokenizer.for_data(
            tokenizer_path, cache, lambda: identity, texts, kind, vocab_size, lowercase=lowercase
        )

    first = for_data(["corpus", 0.1, 0])
    assert for_data(["corpus", 0.1, 0]) == first and len(trained) == 1  # the same data: the cached file
    for changed in (
        dict(identity=["corpus", 0.2, 0]),
        dict(identity=["corpus", 0.1, 0], kind="char"),
        dict(identity=["corpus", 0.1, 0], vocab_size=400),
        dict(identity=["corpus", 0.1, 0], lowercase=True),
    ):
        for_data(**changed)
    assert len(trained) == 5 and len(list((tmp_path / "cache" / "tokenizers").iterdir())) == 5
    given = tmp_path / "given.json"
    first.save(given)

    def unread() -> None:
        raise AssertionError("a given tokenizer_path reads no data")

    assert Tokenizer.for_data(str(given), tmp_path / "cache", unread, unread, "bpe", 300) == first
    with pytest.raises(FileNotFoundError, match="missing.json"):
        for_data(None, tokenizer_path=str(tmp_path / "missing.json"))


def test_folder_of_txt_files_gives_one_document_per_file(tmp_path):
    for i in range(3):
        (tmp_path / f"f{i}.txt").write_text(f"file {i}")
    (tmp_path / "ignored.md").write_text("not text")
    docs = load_documents(CorpusSpec(source="path", path=str(tmp_path)))
    assert [d for d, _ in docs] == ["f0.txt", "f1.txt", "f2.txt"]


def test_single_file_is_split_into_paragraph_documents(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("first para\nline two\n\nsecond para\n\n\nthird")
    docs = load_documents(CorpusSpec(source="path", path=str(path)))
    assert [t.strip() for _, t in docs] == ["first para\nline two", "second para", "third"]


def test_missing_and_empty_sources_fail_with_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="data.corpus.path"):
        load_documents(CorpusSpec(source="path", path=str(tmp_path / "nope.txt")))
    (tmp_path / "empty.txt").write_text("   \n")
    with pytest.raises(ValueError, match="no text"):
        load_documents(CorpusSpec(source="path", path=str(tmp_path / "empty.txt")))
    with pytest.raises(ValueError, match="data.corpus.source"):
        load_documents(CorpusSpec(source="s3"))


def test_hub_source_reads_local_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    lines = tmp_path / "corpus.txt"
    lines.write_text("alpha line\nbeta line\ngamma line\n")
    via_builder = load_documents(CorpusSpec(source="hub", name="text", data_files=str(lines)))
    assert [t for _, t in via_builder] == ["alpha line", "beta line", "gamma line"]
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"body": ["one", "two"]}).save_to_disk(str(saved))
    docs = load_documents(CorpusSpec(source="hub", name=str(saved), text_field="body"))
    assert [t for _, t in docs] == ["one", "two"]
    with pytest.raises(KeyError, match="text_field"):
        load_documents(CorpusSpec(source="hub", name=str(saved)))


def _datamodule(tmp_path, **kwargs) -> CausalLMDataModule:
    corpus = tmp_path / "corpus"
    corpus.mkdir(exist_ok=True)
    for i in range(20):
        (corpus / f"{i:02d}.txt").write_text(f"Document {i} talks about loops and functions. " * 20)
    defaults = dict(
        corpus={"source": "path", "path": str(corpus)},
        vocab_size=300,
        block_size=16,
        batch_size=4,
        val_fraction=0.1,
        test_fraction=0.1,
        cache_dir=str(tmp_path / "cache"),
    )
    return CausalLMDataModule(**{**defaults, **kwargs})


def test_datamodule_windows_are_next_token_pairs_and_tokenizer_is_cached(tmp_path):
    dm = _datamodule(tmp_path)
    dm.prepare_data()
    (cached,) = (tmp_path / "cache" / "tokenizers").iterdir()
    mtime = cached.stat().st_mtime_ns
    dm.prepare_data()  # second call reuses the cache (what DDP ranks and reruns do)
    assert cached.stat().st_mtime_ns == mtime
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == batch["labels"].shape == (4, 16)
    assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
    window = dm.datasets["val"][0]
    stream = dm.datasets["val"].tokens
    assert torch.equal(window["input_ids"], stream[:16]) and torch.equal(window["labels"], stream[1:17])
    # every document is wrapped in BOS ... EOS, as generation prompts start with BOS
    assert (
        stream.tolist().count(dm.tokenizer.bos_id) == stream.tolist().count(dm.tokenizer.eos_id) == 2
    )  # 2 val documents
    assert stream[0] == dm.tokenizer.bos_id


def test_split_shorter_than_one_window_names_the_fix(tmp_path):
    dm = _datamodule(tmp_path, block_size=4096)
    with pytest.raises(ValueError, match="model.block_size"):
        dm.setup("fit")


def test_shards_refuse_another_tokenizer_naming_both_fixes(tmp_path):
    """data.tokenizer_path may be the user's or the one ckpt_path= set: the message names the fix for each."""
    shards = tmp_path / "shards"
    _datamodule(tmp_path, shards_dir=str(shards), prepare_workers=0).write_shards()
    other = tmp_path / "other.json"
    Tokenizer.train(["another text entirely"] * 20, "char", 64).save(other)
    dm = _datamodule(tmp_path, shards_dir=str(shards), tokenizer_path=str(other))
    with pytest.raises(ValueError) as error:
        dm.setup()
    message = str(error.value)
    assert "If you set it, drop it" in message
    assert f"lit-prepare data.shards_dir=<new folder> data.tokenizer_path={other}" in message
