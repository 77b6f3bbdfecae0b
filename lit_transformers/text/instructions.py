"""Instruction tasks made from words, with a judge: the embedded, download-free data of the InstructGPT stages.

Each example is a prompt ("Reverse the words: ash oak elm\\nAnswer:"), its correct completion (" elm oak ash")
and a plausible wrong one (a wrong word, wrong order, truncated, extra text, a word repeated) for reward-model
and DPO pairs.
The judge (exact match, and a graded score in [0, 1]) is the ground truth that a reward model only learns
to approximate; the stages report both. Records that teach nothing (an empty SFT completion, a pair with
the same responses) are skipped with a count, or refused when a split holds nothing else. Pure Python: the
datamodule makes and screens examples, the tasks judge.
"""

from __future__ import annotations

import difflib
import logging
import random
from collections.abc import Sequence

log = logging.getLogger(__name__)

# kind -> (instruction, answer from the word list); chosen to be learnable by a small GPT on CPU in minutes
TASKS = {
    "reverse": ("Reverse the words", lambda words: list(reversed(words))),
    "sort": ("Sort the words", lambda words: sorted(words)),
    "count": ("Count the words in", lambda words: [str(len(words))]),
    "last": ("Repeat the last word of", lambda words: [words[-1]]),
    "first": ("Repeat the first word of", lambda words: [words[0]]),
}


def make_prompt(kind: str, words: Sequence[str]) -> str:
    return f"{TASKS[kind][0]}: {' '.join(words)}\nAnswer:"


def make_example(kind: str, words: Sequence[str], vocabulary: Sequence[str], rng: random.Random) -> dict:
    """One record: prompt, completion (correct), chosen (= completion), rejected (a corruption), answer, kind."""
    answer = TASKS[kind][1](list(words))
    rejected = corrupt(answer, kind, words, vocabulary, rng)
    completion = " " + " ".join(answer)
    return {
        "prompt": make_prompt(kind, words),
        "completion": completion,
        "chosen": completion,
        "rejected": " " + " ".join(rejected),
        "answer": " ".join(answer),
        "kind": kind,
    }


def corrupt(
    answer: list[str], kind: str, words: Sequence[str], vocabulary: Sequence[str], rng: random.Random
) -> list[str]:
    """A plausible wrong answer, never equal to the right one. Besides the easy mistakes (a word that is not in
    the prompt, extra text, truncation) the corruptions include the ones a small model makes: a similar word
    ("method" for "methods"), another word of the prompt in a word's place, a swapped pair, a word on repeat.
    A reward model that never saw those as rejected scores them high, and PPO learns to produce them."""
    if kind == "count":
        n = int(answer[0])
        return [str(n + rng.choice([d for d in (-2, -1, 1, 2) if n + d > 0]))]
    choices = ["wrong_word", "similar_word", "extra_text", "repeated"]
    if any(w != answer[0] for w in words):
        choices += ["prompt_word"]
    if len(set(answer)) > 1:
        choices += ["wrong_order"]
    if len(answer) > 1:
        choices += ["truncated"]
    how = rng.choice(choices)
    out = list(answer)
    i = rng.randrange(len(out))
    if how == "wrong_word":
        out[i] = rng.choice([w for w in vocabulary if w != out[i]])
    elif how == "similar_word":
        others = [w for w in vocabulary if w != out[i]]
        out[i] = rng.choice(difflib.get_close_matches(out[i], others, n=3, cutoff=0.5) or others)
    elif how == "prompt_word":  # another word of the prompt takes this one's place (one doubled, one missing)
        out[i] = rng.choice([w for w in words if w != out[i]])
    elif how == "wrong_order":
        while out == answer:
            j = rng.randrange(len(out) - 1)
            out[j], out[j + 1] = out[j + 1], out[j]
    elif how == "truncated":
        out = out[: rng.randrange(1, len(out))]
    elif how == "repeated":  # a word stuck on repeat: the reward hack PPO found when this was missing
        out += [rng.choice(out)] * rng.randint(1, 4)
    else:
        out.append(rng.choice(vocabulary))
    return out


def make_examples(
    vocabulary: Sequence[str],
    n: int,
    kinds: Sequence[str] = ("reverse", "sort", "count", "last"),
    min_words: int = 2,
    max_words: int = 4,
    seed: int = 0,
) -> list[dict]:
    """``n`` distinct examples (distinct prompts), kinds in turn, words drawn from ``vocabulary``."""
    unknown = [k for k in kinds if k not in TASKS]
    if unknown:
        raise ValueError(f"Unknown instruction task(s) {unknown}; choose from {sorted(TASKS)}")
    if len(vocabulary) < max_words:
        raise ValueError(f"The word list has {len(vocabulary)} words, fewer than max_words={max_words}")
    rng, seen, examples = random.Random(seed), set(), []
    for attempt in range(20 * n):
        if len(examples) == n:
            break
        kind = kinds[attempt % len(kinds)]
        words = [rng.choice(vocabulary) for _ in range(rng.randint(min_words, max_words))]
        prompt = make_prompt(kind, words)
        if prompt not in seen:
            seen.add(prompt)
            examples.append(make_example(kind, words, vocabulary, rng))
    return examples


def judge(response: str, answer: str) -> tuple[float, float]:
    """(exact, score) of a response against the right answer: exact is 1.0 for the same words; the graded
    score is the share of positions holding the right word (over the longer of the two), or for numbers
    ``max(0, 1 - |error| / answer)``."""
    got, want = response.split(), answer.split()
    exact = float(got == want)
    if len(want) == 1 and want[0].isdigit():
        if len(got) >= 1 and got[0].isdigit():
            return exact, max(0.0, 1 - abs(int(got[0]) - int(want[0])) / int(want[0])) / max(1, len(got))
        return exact, 0.0
    hits = sum(g == w for g, w in zip(got, want))
    return exact, hits / max(len(got), len(want), 1)


# records that teach nothing, per TRL format: (what they have, what training on only them does, the fix)
USELESS = {
    "sft": (
        "an empty completion",
        "SFT on them learns only to end every response at once",
        "Give the records their completions (data.format=sft reads prompt and completion)",
    ),
    "pairs": (
        "the same chosen and rejected response (within data.max_length tokens)",
        "a reward model or DPO on them learns nothing: the loss stays ln 2 and its gradient 0",
        "Give every pair a rejected response that differs from its chosen one in its first data.max_length"
        " tokens (data.format=pairs reads prompt, chosen and rejected)",
    ),
}


def useless(format: str, record: dict, item: dict) -> bool:
    """Whether a record teaches nothing (:data:`USELESS`): an SFT record without a completion, a pair whose
    responses are the same tokens once encoded and cut to ``max_length`` (both empty included)."""
    if format == "sft":
        return not record["completion"].strip()
    return format == "pairs" and item["chosen"] == item["rejected"]


def informative(format: str, split: str, records: list[dict], items: list[dict], source: str) -> list[int]:
    """Indices of the records that teach something; the others are skipped with a warning naming how many and
    the first, or refused when the whole split is such records."""
    bad = [i for i, (record, item) in enumerate(zip(records, items)) if useless(format, record, item)]
    if not bad:
        return list(range(len(records)))
    has, effect, fix = USELESS[format]
    # the first in the file: the records of one source are named alike but for their line (or row) number
    first = min((records[i].get("where", source) for i in bad), key=lambda where: (len(where), where))
    if len(bad) == len(records):
        raise ValueError(
            f"Every one of the {len(records)} {split} records of {source} has {has} (the first: {first}), and "
            f"{effect}. {fix}."
        )
    log.warning(
        "Skipping %d of %d %s records with %s (the first: %s): %s",
        len(bad),
        len(records),
        split,
        has,
        first,
        effect,
    )
    skipped = set(bad)
    return [i for i in range(len(records)) if i not in skipped]
