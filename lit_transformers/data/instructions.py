"""Instruction data for the InstructGPT stages, in TRL's record formats:

- ``format=sft``: ``prompt`` + ``completion`` (supervised fine-tuning; loss on the completion only),
- ``format=pairs``: ``prompt`` + ``chosen`` + ``rejected`` (reward model, DPO),
- ``format=prompts``: ``prompt`` (PPO rollouts).

Each also in TRL's conversational form, told from the records themselves (a file holds one form): SFT on
``messages`` (role/content lists, trained on the assistant turns only) or on a ``prompt`` and ``completion`` of
messages, ``prompt``/``chosen``/``rejected`` as message lists, PPO prompts as message lists; all rendered
with the tokenizer's ``chat_template`` (:mod:`lit_transformers.text.chat`).

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

import torch

from lit_transformers.data.base import TextDataModule
from lit_transformers.data.corpus import CorpusSpec, fingerprint, load_documents
from lit_transformers.data.instruction_records import FIELDS, read_hub, read_jsonl, split_records
from lit_transformers.data.records import file_identity
from lit_transformers.text import IGNORE_INDEX, left_pad, pad_pairs, right_pad
from lit_transformers.text.chat import no_chat_template
from lit_transformers.text.instructions import (
    MIXES,
    encode_conversation,
    informative,
    is_conversational,
    make_examples,
    task_kinds,
    with_correct_chosen,
)

log = logging.getLogger(__name__)

DATA_VERSION = 3  # bump when the embedded examples change: keys the cached tokenizer


def common_words(corpus: CorpusSpec, n: int, min_len: int = 3, max_len: int = 7) -> list[str]:
    """The ``n`` commonest lowercase words of the corpus (ties alphabetical): the embedded tasks' words."""
    counts = Counter(
        w
        for _, text in load_documents(corpus)
        for w in re.findall(rf"\b[a-z]{{{min_len},{max_len}}}\b", text)
    )
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


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
    judge; None without), ``index`` (each item's position in its split) and ``judged`` (whether it is the first
    pair of its prompt, which a policy's judged evaluation takes) when the items carry them, plus
    ``input_ids``/``labels`` (sft, prompt labels IGNORE_INDEX, and so the completion's tokens that an item's
    ``targets`` mark IGNORE_INDEX: a conversation's other turns) or ``pair_ids``/``pair_mask``/``response_mask``
    (pairs: chosen rows first, then rejected)."""
    batch: dict = {}
    batch["prompt_ids"], batch["prompt_mask"] = left_pad([it["prompt"] for it in items], pad_id)
    answers = [it.get("answer") for it in items]
    batch["answers"] = answers if all(a is not None for a in answers) else None
    if all("index" in it for it in items):
        batch["index"] = torch.tensor([it["index"] for it in items])
    if all("judged" in it for it in items):
        batch["judged"] = torch.tensor([it["judged"] for it in items])
    if format == "sft":
        sequences = [it["prompt"] + it["completion"] for it in items]
        # label t is token t+1: only completion tokens (and EOS, or a turn's end) are targets
        targets = [[IGNORE_INDEX] * len(it["prompt"]) + it.get("targets", it["completion"]) for it in items]
        if packing:
            batch |= pack([s[:-1] for s in sequences], [t[1:] for t in targets], width, pad_id)
        else:
            batch["input_ids"] = right_pad(sequences, pad_id)[0][:, :-1]
            batch["labels"] = right_pad(targets, IGNORE_INDEX)[0][:, 1:]
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
        kinds: str | Sequence[str] = MIXES["basic"],
        n_examples: int = 32000,
        correct_chosen_only: bool = False,
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
        eval_batch_size: int | None = None,
        encoding: str = "utf-8",
        **shared,
    ):
        super().__init__(**shared)
        if format not in FIELDS:
            raise ValueError(f"data.format={format!r}: choose one of {sorted(FIELDS)}")
        task_kinds(kinds)  # a list of known kinds, or a mix's name
        if correct_chosen_only and format != "pairs":
            raise ValueError(
                f"data.correct_chosen_only=true screens preference pairs, but data.format={format}; set"
                " data.format=pairs or data.correct_chosen_only=false"
            )
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
                records = make_examples(words, h.n_examples, h.kinds, h.min_words, h.max_words, h.seed)
                records = [r | {"where": f"embedded example {i}"} for i, r in enumerate(records)]
            elif h.source == "jsonl":
                records = read_jsonl(h.path, FIELDS[h.format], h.encoding)
            else:
                if not h.path:
                    raise ValueError("data.source=hub needs data.path=<dataset name or save_to_disk folder>")
                records = read_hub(h.path, h.subset, h.split, FIELDS[h.format])
            if h.correct_chosen_only:
                records = with_correct_chosen(records)
            parts = split_records(records, h.val_fraction, h.test_fraction, h.seed, h.pool, h.pool_shares)
            # each split in a seeded random order: a prefix (limit_val_batches) mixes every kind of task
            order = random.Random(h.seed)
            self._records = {name: order.sample(part, len(part)) for name, part in parts.items()}
        return self._records

    def conversational_records(self) -> bool:
        """Whether the records are TRL's conversations (role/content message lists) rather than text."""
        return is_conversational(next((r for part in self.records().values() for r in part), {}))

    def data_identity(self) -> list:
        h = self.hparams
        if h.source == "embedded":
            return [DATA_VERSION, fingerprint(CorpusSpec(**(h.corpus or {})))]
        return file_identity([h.path])

    def tokenizer_texts(self) -> list[str]:
        """The training records' prompts and completions (pairs: their chosen responses); conversations need a
        tokenizer with a chat template, which one trained here has not."""
        if self.conversational_records():
            raise no_chat_template()
        return [r["prompt"] + r.get("completion", r.get("chosen", "")) for r in self.records()["train"]]

    def encode(self, record: dict, format: str | None = None) -> tuple[dict, bool]:
        """Token lists of a record in ``format`` (default data.format), and whether they were cut: the prompt to
        its last ``max_prompt_length`` tokens (a leading BOS kept), each response to the room left within
        ``max_length``. Text gets BOS (when the tokenizer has one) and EOS here; a conversation's come from its
        chat template (:func:`lit_transformers.text.instructions.encode_conversation`)."""
        tok, h = self.tokenizer, self.hparams
        format = format or h.format
        if is_conversational(record):
            try:
                full, responses = encode_conversation(tok, record, format)
            except ValueError as err:
                raise ValueError(f"{record['where']}: {err}") from None
        else:
            bos = (
                [tok.bos_id] if "bos" in tok.ids else []
            )  # Qwen's tokenizers have none (transformers adds none)
            full = [*bos, *tok.encode(record["prompt"])]
            responses = {field: [*tok.encode(record[field]), tok.eos_id] for field in FIELDS[format][1:]}
        keep = int(full[:1] == [tok.ids.get("bos")])  # keep BOS and the prompt's end
        prompt = full[:keep] + full[keep:][-(h.max_prompt_length - keep) :]
        item, cut = {"prompt": prompt, "answer": record.get("answer")}, len(prompt) < len(full)
        room = h.max_length - len(prompt)  # at least 1: max_prompt_length < max_length
        for field, response in responses.items():
            item[field], cut = response[:room], cut or len(response) > room
        return item, cut

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        self.tokenizer = self.load_tokenizer()
        h = self.hparams
        if self.conversational_records() and self.tokenizer.chat_template is None:
            raise no_chat_template()
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
            if h.format == "pairs":  # a policy is judged once per prompt, on the first of its pairs
                seen: set[tuple[int, ...]] = set()
                for item in self.datasets[name]:
                    item["judged"] = tuple(item["prompt"]) not in seen
                    seen.add(tuple(item["prompt"]))
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
