"""Instruction tasks made from words, with a judge: the embedded, download-free data of the InstructGPT stages.

Each example is a prompt ("Reverse the words: ash oak elm\\nAnswer:"), its correct completion (" elm oak ash")
and a plausible wrong one (a wrong word, wrong order, truncated, extra text, a word repeated) for reward-model
and DPO pairs.
The judge (exact match, and a graded score in [0, 1]) is the ground truth that a reward model only learns
to approximate; the stages report both. Pure Python: the datamodule makes examples, the tasks judge.
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Sequence

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
