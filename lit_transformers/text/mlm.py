"""BERT pretraining inputs as pure, seeded functions: sentence splitting, next-sentence pairs, MLM masking.

Pairs follow Google's ``create_pretraining_data.py``: segments of whole sentences filling a target length
(``max_seq_len - 3``, or shorter with ``short_seq_prob``), B the true continuation half the time and a span
of another document otherwise, the longer segment truncated first from a random end. Masking follows the
paper: 15% of eligible tokens selected, of those 80% -> [MASK], 10% -> a random token, 10% unchanged, and
every selected token is a target.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lit_transformers.nn.losses import IGNORE_INDEX

# A sentence ends at ., ! or ? (optionally followed by closing quotes/brackets) followed by whitespace and
# an upper-case letter, digit or opening quote/bracket; paragraphs (blank lines) always end one.
_PARAGRAPH = re.compile(r"\n\s*\n")
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*(?=\s+[A-Z0-9\"'(\[])")


def split_sentences(text: str) -> list[str]:
    """Deterministic rule-based sentence splitter (no model): paragraphs at blank lines, then sentences at
    ``. ! ?`` + whitespace + a capital, digit or opening quote. Whitespace inside a sentence is collapsed;
    abbreviations such as "e.g. Foo" may split, which only shortens segments."""
    sentences = []
    for paragraph in _PARAGRAPH.split(text):
        cuts = [0, *(m.end() for m in _SENTENCE_END.finditer(paragraph)), len(paragraph)]
        for start, end in zip(cuts, cuts[1:]):
            sentence = " ".join(paragraph[start:end].split())
            if sentence:
                sentences.append(sentence)
    return sentences


@dataclass
class SentencePair:
    """Token ids of segments A and B; ``is_next`` when B is A's continuation. ``a_span``/``b_span``:
    (document, first sentence, end sentence) before truncation, for tests and debugging."""

    a: list[int]
    b: list[int]
    is_next: bool
    a_span: tuple[int, int, int]
    b_span: tuple[int, int, int]


def _truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: random.Random) -> None:
    """Trim the longer segment, one token at a time from a random end, until both fit (in place)."""
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def build_nsp_pairs(
    documents: Sequence[Sequence[Sequence[int]]],
    max_seq_len: int,
    rng: random.Random,
    short_seq_prob: float = 0.1,
) -> list[SentencePair]:
    """Documents (each a list of tokenized sentences) -> sentence pairs whose ``[CLS] A [SEP] B [SEP]``
    fits in ``max_seq_len``. NotNext segments always come from another document."""
    documents = [[list(s) for s in doc if s] for doc in documents]
    nonempty = [i for i, doc in enumerate(documents) if doc]
    if len(nonempty) < 2:
        raise ValueError(
            f"Next-sentence prediction needs at least two documents with text, got {len(nonempty)}; "
            "NotNext segments come from another document. Add documents (a folder of files, or a file "
            "with blank-line separated paragraphs)"
        )
    if max_seq_len < 5:
        raise ValueError(
            f"max_seq_len={max_seq_len} leaves no room for two segments and three special tokens"
        )
    max_tokens = max_seq_len - 3  # [CLS], [SEP], [SEP]
    pairs = []
    for d in nonempty:
        doc = documents[d]
        target = rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens
        chunk_start, chunk_len, i = 0, 0, 0
        while i < len(doc):
            chunk_len += len(doc[i])
            if i == len(doc) - 1 or chunk_len >= target:
                n = i + 1 - chunk_start  # sentences in the chunk
                a_end = chunk_start + (rng.randint(1, n - 1) if n >= 2 else 1)
                a = [t for s in doc[chunk_start:a_end] for t in s]
                if n == 1 or rng.random() < 0.5:  # NotNext: B from a random other document
                    other = rng.choice([j for j in nonempty if j != d])
                    other_doc, start = documents[other], rng.randrange(len(documents[other]))
                    b, end = [], start
                    while end < len(other_doc) and len(b) < target - len(a):
                        b += other_doc[end]
                        end += 1
                    b = b or list(other_doc[start])
                    pair = SentencePair(
                        a, b, False, (d, chunk_start, a_end), (other, start, max(end, start + 1))
                    )
                    i = a_end - 1  # the unused sentences of the chunk start the next one
                else:
                    b = [t for s in doc[a_end : i + 1] for t in s]
                    pair = SentencePair(a, b, True, (d, chunk_start, a_end), (d, a_end, i + 1))
                _truncate_pair(pair.a, pair.b, max_tokens, rng)
                pairs.append(pair)
                chunk_start, chunk_len = i + 1, 0
                target = rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens
            i += 1
    return pairs


def pack_pair(
    a: Sequence[int], b: Sequence[int] | None, cls_id: int, sep_id: int, max_len: int | None = None
) -> tuple[list[int], list[int]]:
    """``[CLS] A [SEP] B [SEP]`` (or ``[CLS] A [SEP]`` when b is None) ids and token types: 0 for
    ``[CLS] A [SEP]``, 1 for ``B [SEP]``. With ``max_len``, the longer segment loses its last tokens until the
    whole fits (Hugging Face's "longest_first"), deterministically."""
    a, b = list(a), None if b is None else list(b)
    if max_len is not None:
        room = max_len - (2 if b is None else 3)
        while len(a) + len(b or []) > room:
            (a if b is None or len(a) >= len(b) else b).pop()
    if b is None:
        return [cls_id, *a, sep_id], [0] * (len(a) + 2)
    return [cls_id, *a, sep_id, *b, sep_id], [0] * (len(a) + 2) + [1] * (len(b) + 1)


def mask_tokens(
    input_ids: torch.Tensor,
    eligible: torch.Tensor,
    mask_id: int,
    vocab_size: int,
    generator: torch.Generator | None = None,
    mask_prob: float = 0.15,
    max_predictions: int | None = None,
    word_starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masked-LM corruption of a (B, T) batch -> (corrupted ids, labels).

    ``eligible`` (B, T) bool: tokens that may be selected (not special, not padding). Each row selects
    ``round(mask_prob * n_eligible)`` of them (at least one, at most ``max_predictions``) uniformly at
    random; with ``word_starts`` (B, T) bool (True where a word begins, False on ``##`` continuations), whole
    words are selected, in random order, while they fit in that budget. Of the selected tokens 80% become
    ``mask_id``, 10% a uniformly random token, 10% stay; labels hold the original id at every selected
    position and IGNORE_INDEX elsewhere.
    """
    B, T = input_ids.shape
    device = input_ids.device
    eligible = eligible.bool()
    n_eligible = eligible.sum(1)
    budget = (n_eligible.float() * mask_prob).round().long().clamp(min=1)  # (B,)
    if max_predictions is not None:
        budget = budget.clamp(max=max_predictions)
    budget = torch.minimum(budget, n_eligible)
    starts = torch.ones_like(eligible) if word_starts is None else word_starts.bool() | ~eligible
    word = starts.long().cumsum(1) - 1  # (B, T) word index of each token (0..T-1)
    score = torch.rand(B, T, generator=generator, device=device).gather(1, word)  # one draw per word
    score = score.masked_fill(~eligible, 2.0)  # never chosen
    order = torch.sort(score, dim=1, stable=True).indices  # words in random order, tokens of a word together
    taken = torch.empty_like(word).scatter_(1, order, eligible.gather(1, order).long().cumsum(1))
    # a word is selected when all its tokens fit: its last token's running count is within the budget
    word_end = torch.zeros_like(word).scatter_reduce(1, word, taken, reduce="amax")
    selected = eligible & (word_end.gather(1, word) <= budget[:, None])
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    draw = torch.rand(B, T, generator=generator, device=device)
    random_ids = torch.randint(0, vocab_size, (B, T), generator=generator, device=device)
    corrupted = torch.where(selected & (draw < 0.8), torch.full_like(input_ids, mask_id), input_ids)
    corrupted = torch.where(selected & (draw >= 0.8) & (draw < 0.9), random_ids, corrupted)
    return corrupted, labels
