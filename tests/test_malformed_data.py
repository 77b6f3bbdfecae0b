"""Malformed data files are refused at setup, naming the file, the line and the fix: CoNLL lines with another
column count, bytes that are not text in ``data.encoding`` (whose UTF-8 byte-order mark is dropped), a JSONL
value that is not text, and validation or test pairs longer than the model takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_transformers.data.captions import read_caption_table
from lit_transformers.data.instructions import InstructionDataModule, read_jsonl
from lit_transformers.data.text_classification import TextClassificationDataModule, read_labeled_table
from lit_transformers.data.token_classification import TokenClassificationDataModule, read_conll
from lit_transformers.data.translation import TranslationDataModule, read_parallel_file

from conftest import assert_short_error, assert_user_error, train_main

# one reader per family, each given a file of one record holding "Hallé" (in the first field) and the key it uses
READERS = {
    "classification": (".csv", "text,label\n{}\n", "Hallé,de", lambda p, **kw: read_labeled_table(p, **kw)),
    "translation": (".tsv", "{}\n", "Hallé\tHallo", lambda p, **kw: read_parallel_file(p, **kw)),
    "conll": (".conll", "{}\n", "Hallé B-PER", lambda p, **kw: read_conll(p, **kw)),
    "instructions": (
        ".jsonl",
        "{}\n",
        '{"prompt": "Hallé", "completion": " x"}',
        lambda p, **kw: read_jsonl(p, ("prompt", "completion"), **kw),
    ),
    "captions": (".csv", "image,caption\n{}\n", "Hallé,a cat", lambda p, **kw: read_caption_table(p, **kw)),
}


def _first_field(records) -> str:
    if isinstance(records, dict):  # a caption table: {image path: captions}
        return next(iter(records)).name
    first = records[0]
    if isinstance(first, tuple):  # a sentence pair
        return first[0]
    return first.get("text") or first.get("prompt") or first["words"][0]


@pytest.mark.parametrize("family", list(READERS))
def test_every_reader_names_the_line_of_a_byte_that_is_not_text_and_reads_it_in_data_encoding(
    tmp_path, family
):
    suffix, layout, record, read = READERS[family]
    path = tmp_path / f"data{suffix}"
    path.write_bytes(layout.format(record).encode("latin-1"))
    if family == "captions":
        (tmp_path / "Hallé").write_bytes(b"")  # the listed image exists
    line = layout.split("{}")[0].count("\n") + 1
    with pytest.raises(
        ValueError, match=rf"data{suffix}:{line}: byte b'\\xe9' is not utf-8 text; set data.encoding="
    ):
        read(path)
    assert _first_field(read(path, encoding="latin-1")).endswith("Hallé")
    # a UTF-8 byte-order mark (Excel, Notepad) is no part of the first field or header column
    path.write_bytes(b"\xef\xbb\xbf" + layout.format(record).encode("utf-8"))
    assert _first_field(read(path)).endswith("Hallé") and "\ufeff" not in str(_first_field(read(path)))
    with pytest.raises(ValueError, match=r"Unknown data.encoding='klingon'; set it to a Python codec name"):
        read(path, encoding="klingon")


def test_conll_lines_with_another_column_count_are_refused_and_tab_separated_words_keep_their_spaces(
    tmp_path,
):
    path = tmp_path / "train.conll"
    path.write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP\n\n")  # a 3-column line
    with pytest.raises(ValueError, match=r"train.conll:4: 'rejects VBZ B-VP' has 3 columns where the file's first word "
                       r"line \(.*train.conll:3\) has 4"):  # fmt: skip
        read_conll(path)
    path.write_text(
        "EU B-ORG\nNew York B-LOC\n\n"
    )  # a space-separated file: "York" would become the label column
    with pytest.raises(ValueError, match=r"train.conll:2: .* has 3 columns .* tab-separated columns"):
        read_conll(path)
    path.write_text("EU\tB-ORG\nNew York\tB-LOC\n\nLondon\t\tB-LOC \n\n")
    with pytest.raises(ValueError, match=r"train.conll:4: .* has 3 columns where .* has 2"):
        read_conll(path)
    path.write_text("EU\tB-ORG\nNew York\tB-LOC\r\n\nLondon\tB-LOC \n\n")
    assert [(s["words"], s["labels"]) for s in read_conll(path)] == [
        (["EU", "New York"], ["B-ORG", "B-LOC"]),
        (["London"], ["B-LOC"]),
    ]


def test_missing_separate_val_and_test_files_name_their_own_keys(tmp_path):
    conll = tmp_path / "train.conll"
    conll.write_text("".join(f"w{i} B-X\nx O\n\n" for i in range(20)))
    dm = TokenClassificationDataModule(path=str(conll), val_path=str(tmp_path / "dev.conll"))
    assert_user_error(lambda: dm.splits, "dev.conll not found; set data.val_path=")
    table = tmp_path / "train.csv"
    table.write_text("text,label\n" + "".join(f"text {i},{'ab'[i % 2]}\n" for i in range(20)))
    dm = TextClassificationDataModule(source="file", path=str(table), test_path=str(tmp_path / "test.csv"))
    assert_user_error(lambda: dm.splits, "test.csv not found; set data.test_path=")


def test_a_tokenizer_path_that_is_not_there_names_its_key(tmp_path):
    missing = tmp_path / "tokenizer.json"
    dm = TextClassificationDataModule(
        source="file", path=str(tmp_path / "train.csv"), tokenizer_path=str(missing)
    )
    assert_user_error(dm.load_tokenizer, f"data.tokenizer_path={missing} does not exist")
    dm = TranslationDataModule(
        source_tokenizer_path=str(missing), tokenizer_path=str(missing), joint_vocab=False
    )
    assert_user_error(dm.load_tokenizers, f"data.source_tokenizer_path={missing} does not exist")


def test_jsonl_instructions_without_a_path_name_the_key():
    dm = InstructionDataModule(source="jsonl")
    assert_user_error(dm.records, "set data.path=<file.jsonl>")


def test_an_integer_sft_answer_is_one_paragraph_naming_its_line(tmp_path, cache_dir):
    """It used to pass the reader and fail, 58 lines deep, in the judge of the first validation."""
    path = tmp_path / "sft.jsonl"
    rows = [{"prompt": f"Count: {'a ' * i}\nAnswer:", "completion": f" {i}", "answer": i} for i in range(40)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = train_main(
        "experiment=gpt_sft", "data.source=jsonl", f"data.path={path}", f"hydra.run.dir={tmp_path / 'run'}",
        f"paths.cache_dir={cache_dir}", "model.n_layer=1", "model.n_head=2", "model.d_model=32",
        "data.vocab_size=300", "trainer.max_steps=2",
    )  # fmt: skip
    assert_short_error(result, f"{path}:1: key 'answer' holds int 0, where text is expected")
    assert not list((tmp_path / "run").rglob("*.ckpt"))  # refused before the first step


def _pairs_file(path: Path, n: int = 60) -> Path:
    path.write_text("".join(f"Open file {i}\tDatei {i} öffnen\n" for i in range(n)))
    return path


def test_a_validation_pair_longer_than_the_model_is_refused_at_setup_naming_its_line(tmp_path):
    path = _pairs_file(tmp_path / "pairs.tsv")
    settings = dict(
        source="file", path=str(path), vocab_size=300, max_length=16, max_positions=24,
        val_fraction=0.2, test_fraction=0.2, cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    source = TranslationDataModule(**settings).splits["val"][0][0]  # the split goes by source sentence
    lines = path.read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if text.startswith(f"{source}\t"))
    lines[line - 1] = f"{source}\t{' '.join(['Datei'] * 40)}"  # a target of 40 or more tokens
    path.write_text("\n".join(lines) + "\n")
    dm = TranslationDataModule(**settings)
    assert_user_error(
        dm.setup, f"pairs.tsv:{line}: the val pair {source!r}", "data.max_positions=24", "model.max_len"
    )
    # a training pair that long is left out of training (data.max_length), as before
    source = dm.splits["train"][0][0]
    lines[line - 1] = f"{source}\t{' '.join(['Datei'] * 40)}"
    path.write_text("\n".join(lines) + "\n")
    dm = TranslationDataModule(**settings)
    dm.setup()
    assert sum(map(len, dm.datasets["train"])) == len(dm.splits["train"]) - 1


def test_max_positions_follows_the_model_and_max_length_may_not_exceed_it(compose_cfg):
    assert compose_cfg("experiment=translation", "model.max_len=64").data.max_positions == 64
    assert_user_error(
        lambda: TranslationDataModule(max_length=300, max_positions=256),
        "data.max_length=300",
        "lower data.max_length or raise model.max_len",
    )


def test_conll_sentences_cut_at_max_seq_len_are_counted_in_the_log(tmp_path, caplog):
    path = tmp_path / "train.conll"
    long_sentence = "".join(f"word{i} O\n" for i in range(20))  # 20 words: more than 8 WordPieces
    path.write_text("".join(f"w{i} B-X\nx O\n\n" for i in range(30)) + long_sentence + "\n")
    dm = TokenClassificationDataModule(path=str(path), max_seq_len=8, cache_dir=str(tmp_path / "cache"))
    with caplog.at_level("WARNING", logger="lit_transformers.data.token_classification"):
        dm.setup()
    (message,) = [r.getMessage() for r in caplog.records if "max_seq_len" in r.getMessage()]
    split = next(
        name for name, sentences in dm.splits.items() if any(len(s["words"]) == 20 for s in sentences)
    )
    assert message.startswith(
        f"1 of {len(dm.splits[split])} {split} sentences are longer than data.max_seq_len=8"
    )
