"""Instruction data for the InstructGPT stages, in TRL's record formats:

- ``format=sft``: ``prompt`` + ``completion`` (supervised fine-tuning; loss on the completion only),
- ``format=pairs``: ``prompt`` + ``chosen`` + ``rejected`` (reward model, DPO),
- ``format=prompts``: ``prompt`` (PPO rollouts).

``source=embedded`` generates word tasks ("Reverse the words: ...") from the commonest words of CPython's
bundled docs, with the right ``answer`` that the judge scores generations against (no download).
``source=jsonl`` reads the user's records (one JSON object a line; an optional ``answer`` enables the judge),
``source=hub`` a Hugging Face dataset with the same column names (``pip install 'lit-transformers[hub]'``).
Every batch also carries its prompts, left-padded for generation, so any stage can judge or roll out.
"""

from __future__ import annotations

import logging
import random
import re
from collections import Counter
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch

from lit_transformers.data.base import TextDataModule
from lit_transformers.data.corpus import CorpusSpec, fingerprint, load_documents, load_hub_dataset
from lit_transformers.data.records import JSONL, Record, file_identity, read_records
from lit_transformers.text import (
    IGNORE_INDEX,
    hashed_order,
    left_pad,
    pad_pairs,
    right_pad,
    split_by_fractions,
)
from lit_transformers.text.instructions import informative, make_examples

log = logging.getLogger(__name__)

DATA_VERSION = 3  # bump when the embedded examples change: keys the cached tokenizer
FIELDS = {"sft": ("prompt", "completion"), "pairs": ("prompt", "chosen", "rejected"), "prompts": ("prompt",)}


def common_words(corpus: CorpusSpec, n: int, min_len: int = 3, max_len: int = 7) -> list[str]:
    """The ``n`` commonest lowercase words of the corpus (ties alphabetical): the embedded tasks' words."""
    counts = Counter(
        w
        for _, text in load_documents(corpus)
        for w in re.findall(rf"\b[a-z]{{{min_len},{max_len}}}\b", text)
    )
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def read_jsonl(path: str | Path, fields: tuple[str, ...], encoding: str = "utf-8") -> list[dict]:
    """Records of a JSONL file in ``encoding`` (:func:`lit_transformers.data.records.read_records`): a malformed
    line, a missing field or one that is not text is an error naming the file, the line and the field."""
    required = dict.fromkeys(fields, f"records need {list(fields)}")
    records = read_records(path, JSONL, "data.path=<file.jsonl>", required, encoding=encoding)
    return text_records(records, fields, str(path))


def text_records(records: list[Record], fields: tuple[str, ...], source: str) -> list[dict]:
    """The fields of every record, once each of ``fields`` holds text (an empty string is text), and its
    ``where`` (``file:line``) for the messages of
    :func:`lit_transformers.text.instructions.informative`."""
    if not records:
        raise ValueError(f"{source} holds no records")
    for record in records:
        for name in fields:
            record.text(name, empty=True)
        record.text("answer", optional=True, empty=True)  # the judge compares it with generated text
    return [dict(record.fields) | {"where": record.where} for record in records]


def read_hub(name: str, subset: str | None, split: str, fields: tuple[str, ...]) -> list[dict]:
    """Records of a Hugging Face dataset (Hub name or ``save_to_disk`` folder) with TRL's column names."""
    dataset = load_hub_dataset(name, subset, split, name_key="data.path", files_key="data.path")
    missing = [f for f in fields if f not in dataset.column_names]
    if missing:
        raise KeyError(
            f"Dataset {name} has no column(s) {missing} (it has {dataset.column_names}); need {list(fields)}"
        )
    return text_records([Record(f"{name}[{i}]", row) for i, row in enumerate(dataset)], fields, name)


SPLITS = ("train", "val", "test")


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
        prompts_of = {name: sorted({r["prompt"] for r in records if r["split"] == name}) for name in SPLITS}
    else:
        prompts = sorted({r["prompt"] for r in records})
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
    return {name: [r for r in records if split_of.get(r["prompt"]) == name] for name in SPLITS}


def pack(
    sequences: list[list[int]], labels: list[list[int]], width: int, pad_id: int
) -> dict[str, torch.Tensor]:
    """Several samples per row (first fit, in order) for SFT packing: ``input_ids``/``labels`` (R, width),
    ``position_ids`` restarting at 0 in each sample, and ``attention_mask`` (R, 1, width, width), True where
    query and key belong to the same sample, so packed samples never attend to each other (the model adds
    the causal mask). Padding gets its own segment per row."""
    rows: list[list[int]] = []  # sample indices per row
    used: list[int] = []
    for i, seq in enumerate(sequences):
        n = min(len(seq), width)
        for r, u in enumerate(used):
            if u + n <= width:
                rows[r].append(i)
                used[r] += n
                break
        else:
            rows.append([i])
            used.append(n)
    R = len(rows)
    ids = torch.full((R, width), pad_id, dtype=torch.long)
    targets = torch.full((R, width), IGNORE_INDEX, dtype=torch.long)
    positions = torch.zeros(R, width, dtype=torch.long)
    segment = torch.full((R, width), -1, dtype=torch.long)
    for r, members in enumerate(rows):
        start = 0
        for i in members:
            n = min(len(sequences[i]), width)
            ids[r, start : start + n] = torch.tensor(sequences[i][:n])
            targets[r, start : start + n] = torch.tensor(labels[i][:n])
            positions[r, start : start + n] = torch.arange(n)
            segment[r, start : start + n] = i
            start += n
    mask = segment[:, None, :, None] == segment[:, None, None, :]  # (R, 1, T, T) same sample
    return {"input_ids": ids, "labels": targets, "position_ids": positions, "attention_mask": mask}


def collate(items: list[dict], format: str, pad_id: int, packing: bool = False, width: int = 0) -> dict:
    """Token lists -> tensors: always ``prompt_ids``/``prompt_mask`` (left-padded) and ``answers`` (for the
    judge; None without), ``index`` (each item's position in its split) when the items carry one, plus
    ``input_ids``/``labels`` (sft, prompt labels IGNORE_INDEX) or ``pair_ids``/``pair_mask``/``response_mask``
    (pairs: chosen rows first, then rejected)."""
    batch: dict = {}
    batch["prompt_ids"], batch["prompt_mask"] = left_pad([it["prompt"] for it in items], pad_id)
    answers = [it.get("answer") for it in items]
    batch["answers"] = answers if all(a is not None for a in answers) else None
    if all("index" in it for it in items):
        batch["index"] = torch.tensor([it["index"] for it in items])
    if format == "sft" and packing:
        sequences = [(it["prompt"] + it["completion"])[:-1] for it in items]
        labels = [
            [IGNORE_INDEX] * (len(it["prompt"]) - 1) + list(it["completion"]) for it in items
        ]  # label t is token t+1; the prompt's are ignored
        batch |= pack(sequences, labels, width, pad_id)
    elif format == "sft":
        ids, valid = right_pad([it["prompt"] + it["completion"] for it in items], pad_id)
        labels = ids[:, 1:].masked_fill(~valid[:, 1:], IGNORE_INDEX)  # (B, T-1): label t is token t+1
        for row, it in enumerate(items):
            labels[row, : len(it["prompt"]) - 1] = (
                IGNORE_INDEX  # only completion tokens (and EOS) are targets
            )
        batch["input_ids"], batch["labels"] = ids[:, :-1], labels
    elif format == "pairs":
        ids, valid = pad_pairs(
            [it["prompt"] + it["chosen"] for it in items],
            [it["prompt"] + it["rejected"] for it in items],
            pad_id,
        )
        prompt_len = torch.tensor([len(it["prompt"]) for it in items] * 2)
        response = valid & (torch.arange(ids.size(1))[None] >= prompt_len[:, None])
        batch["pair_ids"], batch["pair_mask"], batch["response_mask"] = ids, valid, response
    return batch


class InstructionDataModule(TextDataModule):
    length_key = "max_length"
    tokenizer_independent = TextDataModule.tokenizer_independent | {
        "max_prompt_length",
        "max_length",
        "packing",
    }

    def __init__(
        self,
        format: str = "sft",
        source: str = "embedded",
        path: str | None = None,
        subset: str | None = None,
        split: str = "train",
        kinds: Sequence[str] = ("reverse", "sort", "count", "last"),
        n_examples: int = 32000,
        pool: str = "all",
        pool_shares: dict[str, float] | None = None,
        min_words: int = 2,
        max_words: int = 4,
        n_words: int = 48,
        corpus: dict | None = None,
        tokenizer: str = "bpe",
        vocab_size: int = 512,
        max_prompt_length: int = 32,
        max_length: int = 128,
        packing: bool = False,
        batch_size: int = 32,
        encoding: str = "utf-8",
        **shared,
    ):
        super().__init__(**shared)
        if format not in FIELDS:
            raise ValueError(f"data.format={format!r}: choose one of {sorted(FIELDS)}")
        shares = pool_shares or {}
        if pool != "all" and pool not in shares:
            raise ValueError(f"data.pool={pool!r}: choose all or one of data.pool_shares {sorted(shares)}")
        if shares and abs(sum(shares.values()) - 1) > 1e-6:
            raise ValueError(f"data.pool_shares {dict(shares)} must add up to 1")
        if source not in ("embedded", "jsonl", "hub"):
            raise ValueError(
                f"data.source={source!r}: choose embedded, jsonl (with data.path=<file.jsonl>) or hub"
            )
        if not 2 <= max_prompt_length < max_length:
            raise ValueError(
                f"data.max_prompt_length={max_prompt_length} must be at least 2 (BOS and a token) and below"
                f" data.max_length={max_length} (model.block_size by default), which holds prompt and response"
                " together; lower data.max_prompt_length or raise model.block_size"
            )
        self._records: dict[str, list[dict]] | None = None

    def records(self) -> dict[str, list[dict]]:
        """Text records per split (:func:`split_records`: the same on every rank and run)."""
        if self._records is None:
            h = self.hparams
            if h.source == "embedded":
                words = common_words(CorpusSpec(**(h.corpus or {})), h.n_words)
                records = make_examples(words, h.n_examples, list(h.kinds), h.min_words, h.max_words, h.seed)
                records = [r | {"where": f"embedded example {i}"} for i, r in enumerate(records)]
            elif h.source == "jsonl":
                records = read_jsonl(h.path, FIELDS[h.format], h.encoding)
            else:
                if not h.path:
                    raise ValueError("data.source=hub needs data.path=<dataset name or save_to_disk folder>")
                records = read_hub(h.path, h.subset, h.split, FIELDS[h.format])
            parts = split_records(records, h.val_fraction, h.test_fraction, h.seed, h.pool, h.pool_shares)
            # each split in a seeded random order: a prefix (limit_val_batches) mixes every kind of task
            order = random.Random(h.seed)
            self._records = {name: order.sample(part, len(part)) for name, part in parts.items()}
        return self._records

    def data_identity(self) -> list:
        h = self.hparams
        if h.source == "embedded":
            return [DATA_VERSION, fingerprint(CorpusSpec(**(h.corpus or {})))]
        return file_identity([h.path])

    def tokenizer_texts(self) -> list[str]:
        """The training records' prompts and completions (pairs: their chosen responses)."""
        return [r["prompt"] + r.get("completion", r.get("chosen", "")) for r in self.records()["train"]]

    def encode(self, record: dict) -> tuple[dict, bool]:
        """Token lists of a record, and whether they were cut: the prompt to its last ``max_prompt_length``
        tokens (BOS kept), each response to the room left within ``max_length``."""
        tok, h = self.tokenizer, self.hparams
        full = [tok.bos_id, *tok.encode(record["prompt"])]
        prompt = full[:1] + full[1:][-(h.max_prompt_length - 1) :]  # keep BOS and the prompt's end
        item, cut = {"prompt": prompt, "answer": record.get("answer")}, len(prompt) < len(full)
        room = h.max_length - len(prompt)  # at least 1: max_prompt_length < max_length
        for field in FIELDS[h.format][1:]:
            response = [*tok.encode(record[field]), tok.eos_id]
            item[field], cut = response[:room], cut or len(response) > room
        return item, cut

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        self.tokenizer = self.load_tokenizer()
        h = self.hparams
        source = f"data.source=embedded ({h.n_examples} examples)" if h.source == "embedded" else h.path
        n_cut = {}
        for name, records in self.records().items():
            if not records:
                raise ValueError(f"The {name} split is empty; raise data.val_fraction/data.test_fraction")
            encoded = [self.encode(r) for r in records]
            items = [item for item, _ in encoded]
            kept = informative(h.format, name, records, items, source)
            self._records[name] = [records[i] for i in kept]  # what the label stage pairs with the items
            self.datasets[name] = [items[i] | {"index": j} for j, i in enumerate(kept)]
            n_cut[name] = sum(encoded[i][1] for i in kept)
        self.collate = partial(
            collate, format=h.format, pad_id=self.tokenizer.pad_id, packing=h.packing, width=h.max_length
        )
        log.info("Instruction records (%s): %s", h.format, {k: len(v) for k, v in self.datasets.items()})
        if any(n_cut.values()):
            log.info(
                "Records cut to data.max_prompt_length=%d prompt and data.max_length=%d tokens in all: %s",
                h.max_prompt_length,
                h.max_length,
                n_cut,
            )
