"""data/records.py: the one reader of CSV, TSV and JSONL data files, and the errors it names at file:line."""

from __future__ import annotations

import json
import os

import pytest

from lit_transformers.data.captions import read_caption_table
from lit_transformers.data.records import JSONL, file_identity, read_records

TABLES_AND_JSONL = (".csv", ".tsv", *JSONL)
SETTING = "data.path=<file>"


def _fields(records) -> list[dict]:
    return [dict(r.fields) for r in records]


def test_csv_tsv_and_jsonl_give_the_rows_of_the_file_whatever_the_suffix_case(tmp_path):
    (tmp_path / "a.CSV").write_text('text,label\n"Hello, ""world""\nagain",en\n\nHallo,de\n', newline="")
    records = read_records(tmp_path / "a.CSV", TABLES_AND_JSONL, SETTING)
    assert _fields(records) == [
        {"text": 'Hello, "world"\nagain', "label": "en"},
        {"text": "Hallo", "label": "de"},
    ]
    assert [r.where.rsplit(":", 1)[1] for r in records] == ["3", "5"]  # a quoted newline: the row's last line
    (tmp_path / "a.Tsv").write_text("text\tlabel\nHola\tes\r\n")
    assert _fields(read_records(tmp_path / "a.Tsv", TABLES_AND_JSONL, SETTING)) == [
        {"text": "Hola", "label": "es"}
    ]
    rows = [{"text": "Ciao", "label": "it"}, {"text": "Hej", "label": 3}]
    (tmp_path / "a.JSONL").write_text(f"{json.dumps(rows[0])}\n\n{json.dumps(rows[1])}\n")
    records = read_records(tmp_path / "a.JSONL", TABLES_AND_JSONL, SETTING)
    assert _fields(records) == rows and records[1].where == f"{tmp_path / 'a.JSONL'}:3"


def test_a_table_without_header_is_split_on_the_delimiter_as_it_is(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text('"Quoted" text\tsein "Text"\n\nsecond\tzweite\n')
    records = read_records(path, (".tsv",), SETTING, columns=("src", "tgt"))
    assert _fields(records) == [
        {"src": '"Quoted" text', "tgt": 'sein "Text"'},
        {"src": "second", "tgt": "zweite"},
    ]
    path.write_text("one\ttwo\nno tab here\n")
    with pytest.raises(ValueError, match=r"pairs.tsv:2: expected 2 fields \(src, tgt\), found 1"):
        read_records(path, (".tsv",), SETTING, columns=("src", "tgt"))


@pytest.mark.parametrize(
    ("name", "content", "error"),
    [
        (
            "bad.jsonl",
            '{"text": "a"}\n{"text": oops}\n',
            r"bad.jsonl:2: not valid JSON \(Expecting value, column 10\)",
        ),
        ("list.jsonl", '{"text": "a"}\n["text"]\n', r"list.jsonl:2: expected a JSON object, found list"),
        (
            "nokey.jsonl",
            '{"text": "a"}\n{"txt": "b"}\n',
            r"nokey.jsonl:2: no key 'text' \(keys: \['txt'\]\); set it",
        ),
        (
            "nocol.csv",
            "txt,label\na,b\n",
            r"nocol.csv:1: no column 'text' \(columns: \['txt', 'label'\]\); set it",
        ),
        (
            "ragged.csv",
            "text,label\na,b\nc,d,e\n",
            r"ragged.csv:3: expected 2 fields \(text, label\), found 3",
        ),
        ("data.txt", "text\n", r"data.txt: unknown file type '.txt'; use .csv or .tsv or .jsonl or .json"),
    ],
)
def test_bad_files_are_errors_naming_the_file_the_line_and_the_column(tmp_path, name, content, error):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=error):
        read_records(tmp_path / name, TABLES_AND_JSONL, SETTING, required={"text": "set it"})


def test_a_missing_file_names_the_setting(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing.csv not found; set data.path=<file>"):
        read_records(tmp_path / "missing.csv", TABLES_AND_JSONL, SETTING)
    with pytest.raises(ValueError, match=r"No data file is set; set data.path=<file>"):  # not Path(None)
        read_records(None, TABLES_AND_JSONL, SETTING)


def test_text_fields_refuse_missing_empty_and_non_text_values_by_name(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "a", "label": 3, "flag": true, "empty": " ", "list": ["x"]}\n')
    (record,) = read_records(path, JSONL, SETTING)
    assert record.text("text") == "a" and record.text("label", numbers=True) == "3"
    assert record.text("pair", optional=True) is None and record.text("empty", optional=True) is None
    assert record.text("empty", empty=True) == " "
    for name, problem in [
        ("pair", "is missing or empty"),
        ("empty", "is missing or empty"),
        ("label", "holds int 3, where text is expected"),
        ("list", r"holds list \['x'\], where text is expected"),
    ]:
        with pytest.raises(ValueError, match=rf"rows.jsonl:1: key '{name}' {problem}"):
            record.text(name)
    with pytest.raises(ValueError, match=r"key 'flag' holds bool True"):  # a bool is no number either
        record.text("flag", numbers=True)


def test_caption_jsonl_errors_name_file_and_line(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"image": "a.png", "caption": "a cat"}\n{"image": "b.png", "caption": \n')
    with pytest.raises(ValueError, match=r"pairs.jsonl:2: not valid JSON"):
        read_caption_table(path)
    path.write_text('{"image": "a.png", "caption": "a cat"}\n{"img": "b.png", "caption": "a dog"}\n')
    with pytest.raises(ValueError, match=r"pairs.jsonl:2: no key 'image' .*data.image_key"):
        read_caption_table(path)


def test_file_identity_is_the_files_size_and_modification_time(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("text\n")
    stat = os.stat(path)
    assert file_identity([path, tmp_path, None]) == [[str(path), stat.st_size, stat.st_mtime_ns], None, None]
    path.write_text("text\nmore\n")
    assert file_identity([path])[0][1] == len("text\nmore\n")


def test_a_byte_that_is_not_text_is_named_at_its_line_even_blocks_into_the_file(tmp_path):
    path = tmp_path / "data.csv"
    rows = [f"row {i} with some text,label\n".encode() for i in range(2000)]
    rows[1499] = "row 1499 Hallé,label\n".encode("latin-1")  # text files decode ahead, a block at a time
    path.write_bytes(b"text,label\n" + b"".join(rows))
    with pytest.raises(
        ValueError, match=r"data.csv:1501: byte b'\\xe9' is not utf-8 text; set data.encoding="
    ):
        read_records(path, TABLES_AND_JSONL, SETTING)
    assert (
        read_records(path, TABLES_AND_JSONL, SETTING, encoding="latin-1")[1499].fields["text"]
        == "row 1499 Hallé"
    )
