"""Instruction records as read from a JSONL file or a Hugging Face dataset, in TRL's fields (:data:`FIELDS`):
each checked to hold text, or, in TRL's conversational form, message lists (a file holds one form), and named
by ``where`` (``file:line``) in every error; then split by prompt, the same on every rank and run.
"""

from __future__ import annotations

import json
from pathlib import Path

from lit_transformers.data.corpus import load_hub_dataset
from lit_transformers.data.records import JSONL, Record, read_records
from lit_transformers.text import hashed_order, split_by_fractions
from lit_transformers.text.chat import check_messages
from lit_transformers.text.instructions import is_conversational

FIELDS = {"sft": ("prompt", "completion"), "pairs": ("prompt", "chosen", "rejected"), "prompts": ("prompt",)}


def read_jsonl(path: str | Path, fields: tuple[str, ...], encoding: str = "utf-8") -> list[dict]:
    """Records of a JSONL file in ``encoding`` (:func:`lit_transformers.data.records.read_records`): a malformed
    line, a missing field or one that is not text (or not a conversation) is an error naming the file, the
    line and the field."""
    records = read_records(path, JSONL, "data.path=<file.jsonl>", encoding=encoding)
    return text_records(records, fields, str(path))


def fields_of(fields: tuple[str, ...], names) -> tuple[str, ...]:
    """The fields a record with keys ``names`` needs: ``fields``, or for SFT a conversation in ``messages``."""
    return ("messages",) if fields == FIELDS["sft"] and "messages" in names else fields


def text_records(records: list[Record], fields: tuple[str, ...], source: str) -> list[dict]:
    """The fields of every record, once each of ``fields`` holds text (an empty string is text), or each a
    conversation (:func:`lit_transformers.text.chat.check_messages`) when the first record's are, and its
    ``where`` (``file:line``) for the messages of
    :func:`lit_transformers.text.instructions.informative`."""
    if not records:
        raise ValueError(f"{source} holds no records")
    first, checked = records[0], []
    conversational = is_conversational(first.fields)
    for record in records:
        needed = fields_of(fields, record.fields)
        for name in needed:
            if name not in record.fields:
                raise ValueError(
                    f"{record.where}: no {record.kind} {name!r} (keys: {sorted(record.fields)}); records need "
                    f"{list(needed)}"
                )
        if is_conversational(record.fields) != conversational:
            kinds = ("plain-text", "conversational") if conversational else ("conversational", "plain-text")
            raise ValueError(
                f"{record.where}: a {kinds[0]} record in a file of {kinds[1]} ones (the first: {first.where}). "
                "The format is read from the records, so all must be conversations (role/content message lists "
                f"in {list(needed)}) or all text; convert this record to the others' form"
            )
        values = {name: _field(record, name, conversational) for name in needed}
        record.text("answer", optional=True, empty=True)  # the judge compares it with generated text
        checked.append(dict(record.fields) | values | {"where": record.where})
    return checked


def _field(record: Record, name: str, conversational: bool) -> str | list[dict]:
    """A record's text field, or in a conversational record its message list, checked."""
    if not conversational:
        return record.text(name, empty=True)
    value = record.fields[name]
    if not isinstance(value, list):
        raise ValueError(
            f"{record.where}: {record.kind} {name!r} holds {type(value).__name__} {value!r} in a conversational "
            "record; give every field of it as a list of role/content messages"
        )
    try:
        return check_messages(value)
    except ValueError as err:
        raise ValueError(f"{record.where}: {record.kind} {name!r}: {err}") from None


def read_hub(name: str, subset: str | None, split: str, fields: tuple[str, ...]) -> list[dict]:
    """Records of a Hugging Face dataset (Hub name or ``save_to_disk`` folder) with TRL's column names."""
    dataset = load_hub_dataset(name, subset, split, name_key="data.path", files_key="data.path")
    needed = fields_of(fields, dataset.column_names)
    missing = [f for f in needed if f not in dataset.column_names]
    if missing:
        raise KeyError(
            f"Dataset {name} has no column(s) {missing} (it has {dataset.column_names}); need {list(needed)}"
        )
    return text_records([Record(f"{name}[{i}]", row) for i, row in enumerate(dataset)], fields, name)


SPLITS = ("train", "val", "test")


def prompt_key(record: dict) -> str:
    """What a split keeps together: a record's prompt, or a conversation's messages before its first assistant
    turn (as JSON)."""
    prompt = record.get("prompt")
    if prompt is None:
        messages = record["messages"]
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        prompt = messages[:first]
    return prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False, sort_keys=True)


def split_records(
    records: list[dict],
    val_fraction: float,
    test_fraction: float,
    seed: int,
    pool: str = "all",
    pool_shares: dict[str, float] | None = None,
) -> dict[str, list[dict]]:
    """Records per split: by their ``split`` field when every record has one, else by a seeded hash of the
    prompt (all records of a prompt in one split). ``pool`` keeps that share of the training prompts: ranked by
    another hash and cut in the order of ``pool_shares``, the pools are disjoint and the same in every stage, as
    InstructGPT's separate SFT, reward-model and PPO prompt sets (PPO then trains on prompts SFT never saw)."""
    given = [r.get("split") for r in records]
    if any(g is not None for g in given):
        bad = next((i for i, g in enumerate(given) if g not in SPLITS), None)
        if bad is not None:
            raise ValueError(
                f"record {bad}: split={given[bad]!r}; give every record a split in {SPLITS}, or none"
            )
        prompts_of = {name: sorted({prompt_key(r) for r in records if r["split"] == name}) for name in SPLITS}
    else:
        prompts = sorted({prompt_key(r) for r in records})
        parts = split_by_fractions(prompts, val_fraction, test_fraction, seed, what="prompts")
        prompts_of = {name: [prompts[i] for i in idx] for name, idx in parts.items()}
    if pool != "all":
        train, start = prompts_of["train"], 0.0
        ranked = [train[i] for i in hashed_order(train, f"pool:{seed}")]
        for name, share in (pool_shares or {}).items():
            if name == pool:
                prompts_of["train"] = ranked[
                    round(start * len(ranked)) : round((start + share) * len(ranked))
                ]
            start += share
        if not prompts_of["train"]:
            raise ValueError(
                f"data.pool={pool} holds no training prompts; raise data.n_examples or its share"
            )
    split_of = {p: name for name, prompts in prompts_of.items() for p in prompts}
    return {name: [r for r in records if split_of.get(prompt_key(r)) == name] for name in SPLITS}
