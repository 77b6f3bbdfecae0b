"""Data files as records: one reader for the CSV, TSV and JSONL files of every datamodule, and their identity.

A record is a row of a table or an object of a JSONL file, with ``where`` (``file:line``) for its errors: a
malformed line, a missing column or key, a row with the wrong number of fields, or a value that is not text
where text is expected each name the file, the line and the column; so does a byte that is not text in the
file's encoding (``data.encoding``, UTF-8 by default, whose byte-order mark is dropped). Suffixes are matched
case-insensitively.
"""

from __future__ import annotations

import codecs
import csv
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

TABLES = {".csv": ",", ".tsv": "\t"}
JSONL = (".jsonl", ".json")  # .json: one object a line, as JSON Lines


def where(path: Path, line: int) -> str:
    """How every data error names its place: ``file:line``."""
    return f"{path}:{line}"


@dataclass(frozen=True)
class Record:
    where: str  # file:line, or any other name of the record (a dataset row: name[i])
    fields: Mapping
    kind: str = "column"  # what a field is called in errors: column (tables) or key (JSON)

    def text(
        self, name: str, optional: bool = False, numbers: bool = False, empty: bool = False
    ) -> str | None:
        """The text in field ``name``; a missing one (or a blank one, unless ``empty``) is None when ``optional``,
        else an error, and so is a value that is not a string (``numbers``: ints and floats are taken as their
        text, e.g. labels)."""
        value = self.fields.get(name)
        if value is None or (isinstance(value, str) and not empty and not value.strip()):
            if optional:
                return None
            raise ValueError(f"{self.where}: {self.kind} {name!r} is missing or empty")
        accepted = (str, int, float) if numbers else str
        if isinstance(value, bool) or not isinstance(value, accepted):
            raise ValueError(
                f"{self.where}: {self.kind} {name!r} holds {type(value).__name__} {value!r}, where text is "
                "expected; write it as a string"
            )
        return str(value)


def data_file(path: str | Path | None, suffixes: Sequence[str] | None, setting: str) -> Path:
    """``path`` expanded, once it is a file with one of ``suffixes`` (None: any); else an error naming
    ``setting``."""
    if not path:
        raise ValueError(f"No data file is set; set {setting}")
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"Data file {path} not found; set {setting}")
    if suffixes is not None and path.suffix.lower() not in suffixes:
        raise ValueError(
            f"{path}: unknown file type {path.suffix!r}; use {' or '.join(suffixes)} ({setting})"
        )
    return path


def check_encoding(encoding: str, key: str = "data.encoding") -> None:
    """Refuse an ``encoding`` Python has no codec for, naming its config ``key``."""
    try:
        codecs.lookup(encoding)
    except LookupError as err:
        raise ValueError(
            f"Unknown {key}={encoding!r}; set it to a Python codec name such as utf-8 or latin-1"
        ) from err


def text_lines(path: Path, encoding: str = "utf-8") -> Iterator[str]:
    """The lines of a data file in ``encoding``, read as ``open(newline="")`` reads them (line ends kept as they
    are), without a UTF-8 byte-order mark (it would stick to the first field, or make a ``'\ufefftext'``
    header column). A byte that is not text in that encoding is an error naming the line and the fix."""
    check_encoding(encoding)
    # utf-8-sig reads UTF-8 and drops a leading byte-order mark, as Python's own csv examples and pandas do
    codec = "utf-8-sig" if codecs.lookup(encoding).name == "utf-8" else encoding
    with open(path, encoding=codec, newline="") as f:
        try:
            yield from f
        except UnicodeDecodeError as err:
            bad = err.object[err.start : err.start + 1]
            raise ValueError(
                f"{where(path, _undecodable_line(path, codec))}: byte {bad!r} is not {encoding} text; set "
                "data.encoding=<the file's encoding, e.g. latin-1 or cp1252>, or convert the file to UTF-8"
            ) from None


def _undecodable_line(path: Path, codec: str) -> int:
    """The line of the first byte of the file that ``codec`` cannot decode: the text file decodes a block at a
    time, ahead of the line it yields, so the file is decoded again piece by piece, counting line ends."""
    decoder, line = codecs.getincrementaldecoder(codec)(), 1
    with open(path, "rb") as f:
        for piece in f:
            try:
                line += decoder.decode(piece).count("\n")
            except UnicodeDecodeError:
                break
    return line


def read_records(
    path: str | Path | None,
    suffixes: Sequence[str],
    setting: str,
    required: Mapping[str, str] | None = None,
    columns: Sequence[str] | None = None,
    encoding: str = "utf-8",
) -> list[Record]:
    """The records of a .csv / .tsv (first line the header) or .jsonl file (blank lines skipped) among
    ``suffixes``. ``required`` maps each column a table's header (each key a JSON object) must have to the fix
    its absence names ("rename it or set data.label_field").
    ``columns`` names the fields of a table without a header: each line is split on the delimiter as it is
    (no quoting) and must have exactly that many fields. ``encoding``: the file's text encoding."""
    path = data_file(path, suffixes, setting)
    lines = text_lines(path, encoding)
    if path.suffix.lower() in JSONL:
        return list(_json_lines(path, lines, required or {}))
    delimiter = TABLES[path.suffix.lower()]
    if columns is not None:
        return list(
            _fixed_rows(path, csv.reader(lines, delimiter=delimiter, quoting=csv.QUOTE_NONE), columns)
        )
    reader = csv.reader(lines, delimiter=delimiter)
    header = next(reader, [])
    for name, fix in (required or {}).items():
        if name not in header:
            raise ValueError(f"{where(path, 1)}: no column {name!r} (columns: {header}); {fix}")
    return list(_fixed_rows(path, reader, header))


def _fixed_rows(path: Path, reader, columns: Sequence[str]) -> Iterable[Record]:
    for row in reader:
        if not any(field.strip() for field in row):
            continue  # a blank line
        if len(row) != len(columns):
            raise ValueError(
                f"{where(path, reader.line_num)}: expected {len(columns)} fields ({', '.join(columns)}), "
                f"found {len(row)}"
            )
        yield Record(where(path, reader.line_num), dict(zip(columns, row)))


def _json_lines(path: Path, lines: Iterable[str], required: Mapping[str, str]) -> Iterable[Record]:
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where(path, n)}: not valid JSON ({err.msg}, column {err.colno})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where(path, n)}: expected a JSON object, found {type(row).__name__}")
        for name, fix in required.items():
            if name not in row:
                raise ValueError(f"{where(path, n)}: no key {name!r} (keys: {sorted(row)}); {fix}")
        yield Record(where(path, n), row, kind="key")


def file_identity(paths: Iterable[str | Path | None]) -> list:
    """``[path, size, mtime]`` of each file (None for a path that is not a file): keys the caches built from
    data files, so a tokenizer trained on a file is trained again once the file changes."""
    identity = []
    for path in paths:
        path = Path(path).expanduser() if path else None
        stat = path.stat() if path is not None and path.is_file() else None
        identity.append([str(path), stat.st_size, stat.st_mtime_ns] if stat else None)
    return identity
