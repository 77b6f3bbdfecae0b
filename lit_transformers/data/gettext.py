"""GNU gettext ``.mo`` catalogs: the translated UI messages every Linux system ships in ``/usr/share/locale``.

One reader for the tasks that use them: language identification (``bert_classify``) reads the translated
messages labelled with their language; translation reads (msgid, msgstr) pairs.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Sequence
from pathlib import Path

MO_MAGIC = 0x950412DE
DEFAULT_LOCALE_DIR = "/usr/share/locale"


def read_mo(path: str | Path, plurals: bool = True) -> dict[str, str]:
    """msgid -> msgstr of a ``.mo`` file (either byte order), decoded with the charset its header names.

    Plural entries keep their first forms (singular msgid -> first msgstr), or are left out with
    ``plurals=False``; the header (empty msgid) and untranslated entries (empty msgstr) are left out (fuzzy
    entries never reach a ``.mo``: msgfmt drops them). A file that is not a catalog is a ValueError naming it.
    """
    path = Path(path)
    data = path.read_bytes()
    if len(data) < 28:
        raise ValueError(f"{path} is not a gettext .mo catalog: {len(data)} bytes")
    for order in ("<", ">"):
        if struct.unpack(f"{order}I", data[:4])[0] == MO_MAGIC:
            break
    else:
        raise ValueError(f"{path} is not a gettext .mo catalog (bad magic number {data[:4].hex()})")
    _, count, ids_at, strs_at = struct.unpack(f"{order}4I", data[4:20])

    def entry(table: int, i: int) -> bytes:
        length, offset = struct.unpack(f"{order}2I", data[table + 8 * i : table + 8 * i + 8])
        if offset + length > len(data):
            raise ValueError(f"{path} is a truncated .mo catalog (entry {i} ends past the file)")
        return data[offset : offset + length]

    raw = [(entry(ids_at, i), entry(strs_at, i)) for i in range(count)]
    charset = "utf-8"
    for msgid, msgstr in raw:
        if msgid == b"":
            found = re.search(rb"charset=([\w.-]+)", msgstr)
            charset = found.group(1).decode("ascii") if found else charset
    catalog = {}
    for msgid, msgstr in raw:
        if msgid == b"" or msgstr == b"" or (not plurals and b"\x00" in msgid):
            continue
        msgid = msgid.split(b"\x00")[0]
        if b"\x04" in msgid:  # "context\x04message"
            msgid = msgid.split(b"\x04", 1)[1]
        catalog[msgid.decode(charset, errors="replace")] = msgstr.split(b"\x00")[0].decode(
            charset, errors="replace"
        )
    return catalog


def catalog_files(locale_dir: str | Path, language: str) -> list[Path]:
    """``<locale_dir>/<language>/LC_MESSAGES/*.mo``, sorted."""
    return sorted((Path(locale_dir) / language / "LC_MESSAGES").glob("*.mo"))


_PLACEHOLDER = re.compile(
    r"%(\d+\$)?[-+ #0]*\d*(\.\d+)?[lhqjzt]*[sdiufFeEgGxXoc%]|\{[^}]*\}|<[^>]+>|[_&](?=\w)"
)


def clean_message(text: str) -> str:
    """A UI message as a plain sentence: without printf/brace placeholders, markup, and the ``_``/``&``
    keyboard accelerators; whitespace collapsed."""
    return " ".join(_PLACEHOLDER.sub(" ", text).split())


def language_samples(
    locale_dir: str | Path,
    languages: Sequence[str],
    max_per_language: int | None = None,
    min_letters: int = 10,
) -> list[tuple[str, str]]:
    """(message, language) pairs from the catalogs of each language, for language identification.

    Messages are cleaned (:func:`clean_message`); kept when they have ``min_letters`` letters and differ
    from their English msgid (untranslated strings would teach "English" under every label); a message found
    under two languages is ambiguous and dropped. Deterministic: with ``max_per_language``, the messages
    kept are the first in the order of a hash of their text (a sample across catalogs, the same every run).
    """
    locale_dir = Path(locale_dir).expanduser()
    missing = [lang for lang in languages if not catalog_files(locale_dir, lang)]
    if missing:
        raise FileNotFoundError(
            f"No gettext catalogs (.mo) for {missing} under {locale_dir}/<language>/LC_MESSAGES; install your "
            "system's translations (Debian/Ubuntu: language packs), point data.path= at a locale directory, "
            "or use your own labelled data: data.source=file data.path=<file.csv|.tsv|.jsonl>"
        )
    per_language: dict[str, set[str]] = {}
    for lang in languages:
        texts = set()
        for file in catalog_files(locale_dir, lang):
            try:
                catalog = read_mo(file)
            except ValueError:
                continue  # a damaged catalog among hundreds is not worth stopping for
            for msgid, msgstr in catalog.items():
                text = clean_message(msgstr)
                if text != clean_message(msgid) and sum(c.isalpha() for c in text) >= min_letters:
                    texts.add(text)
        per_language[lang] = texts
    seen: dict[str, int] = {}
    for texts in per_language.values():
        for text in texts:
            seen[text] = seen.get(text, 0) + 1
    samples = []
    for lang in languages:
        texts = sorted(
            (t for t in per_language[lang] if seen[t] == 1), key=lambda t: hashlib.sha1(t.encode()).digest()
        )
        samples += [(text, lang) for text in texts[:max_per_language]]
    return samples
