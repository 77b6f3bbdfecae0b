"""Instruction tasks made from words, with a judge: the embedded, download-free data of the InstructGPT stages.

Each example is a prompt ("Reverse the words: ash oak elm\\nAnswer:"), its correct completion (" elm oak ash")
and a plausible wrong one (a wrong word, wrong order, truncated, extra text, a word repeated) for reward-model
and DPO pairs. Besides the one-step kinds (reverse, sort, count, last, first) there are multi-step ones that
imitation does not saturate (the k-th word once sorted, a letter's count, numbers in words added, only the first
k words reversed); ``data.kinds`` lists kinds or names a mix (:data:`MIXES`).
The judge (exact match, and a graded score in [0, 1]) is the ground truth that a reward model only learns
to approximate; the stages report both. Records that teach nothing (an empty SFT completion, a pair with
the same responses) are skipped with a count, or refused when a split holds nothing else. No tensors: the
datamodule makes and screens examples (and encodes TRL's conversational records), the tasks judge.
"""

from __future__ import annotations

import difflib
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lit_transformers.nn.losses import IGNORE_INDEX
from lit_transformers.text.chat import encode_chat, encode_prompt_completion, render_chat

if TYPE_CHECKING:
    from lit_transformers.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Task:
    """A kind of instruction: its text (``{arg}`` stands for the example's argument), the answer (a word list)
    from the prompt's words and that argument, how the argument is drawn for the words (none by default), and
    the words a prompt draws from (by default the corpus's commonest words)."""

    instruction: str
    answer: Callable[[list[str], str | None], list[str]]
    argument: Callable[[list[str], random.Random], str] | None = None
    words: tuple[str, ...] | None = None


NUMBERS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine")

TASKS = {
    # one step each: learnable by a small GPT on CPU in minutes (a fully trained SFT nears 0.9 on them)
    "reverse": Task("Reverse the words", lambda words, _: list(reversed(words))),
    "sort": Task("Sort the words", lambda words, _: sorted(words)),
    "count": Task("Count the words in", lambda words, _: [str(len(words))]),
    "last": Task("Repeat the last word of", lambda words, _: [words[-1]]),
    "first": Task("Repeat the first word of", lambda words, _: [words[0]]),
    # two steps, or an argument to read: headroom that imitation does not close, for RL to find
    "kth_sorted": Task(
        "Sort the words and repeat word {arg} of",
        lambda words, k: [sorted(words)[int(k) - 1]],
        lambda words, rng: str(rng.randint(1, len(words))),
    ),
    "count_letter": Task(
        "Count the letter {arg} in",
        lambda words, letter: [str("".join(words).count(letter))],
        lambda words, rng: rng.choice(sorted(set("".join(words)))),  # a letter of the words: never 0
    ),
    "add": Task(
        "Add the numbers", lambda words, _: [str(sum(NUMBERS.index(w) + 1 for w in words))], words=NUMBERS
    ),
    "reverse_first": Task(
        "Reverse the first {arg} words of",
        lambda words, k: [*reversed(words[: int(k)]), *words[int(k) :]],
        lambda words, rng: str(rng.randint(2, len(words))),
    ),
}
# named mixes for data.kinds; the default, basic, is the one every measured number so far used
MIXES = {
    "basic": ("reverse", "sort", "count", "last"),
    "hard": ("sort", "kth_sorted", "count_letter", "add", "reverse_first", "last"),
}


def make_prompt(kind: str, words: Sequence[str], arg: str | None = None) -> str:
    return f"{TASKS[kind].instruction.format(arg=arg)}: {' '.join(words)}\nAnswer:"


def make_example(
    kind: str, words: Sequence[str], vocabulary: Sequence[str], rng: random.Random, arg: str | None = None
) -> dict:
    """One record: prompt, completion (correct), chosen (= completion), rejected (a corruption), answer, kind."""
    answer = TASKS[kind].answer(list(words), arg)
    rejected = corrupt(answer, kind, words, TASKS[kind].words or vocabulary, rng)
    completion = " " + " ".join(answer)
    return {
        "prompt": make_prompt(kind, words, arg),
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
    if len(answer) == 1 and answer[0].isdigit():  # a number: off by one or two
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


def task_kinds(kinds: str | Sequence[str]) -> list[str]:
    """The task kinds of ``data.kinds``: a list of kinds, or the name of a mix (:data:`MIXES`)."""
    if isinstance(kinds, str):
        if kinds not in MIXES:
            raise ValueError(
                f"data.kinds={kinds!r}: name a mix of {sorted(MIXES)}, or list kinds of {sorted(TASKS)}"
            )
        return list(MIXES[kinds])
    unknown = [k for k in kinds if k not in TASKS]
    if unknown:
        raise ValueError(
            f"Unknown instruction task(s) {unknown}; choose from {sorted(TASKS)}, or a mix of {sorted(MIXES)}"
        )
    return list(kinds)


def make_examples(
    vocabulary: Sequence[str],
    n: int,
    kinds: str | Sequence[str] = MIXES["basic"],
    min_words: int = 2,
    max_words: int = 4,
    seed: int = 0,
) -> list[dict]:
    """``n`` distinct examples (distinct prompts), kinds (a list, or a mix's name) in turn, words drawn from
    ``vocabulary`` (or the kind's own words: numbers to add)."""
    kinds = task_kinds(kinds)
    if len(vocabulary) < max_words:
        raise ValueError(f"The word list has {len(vocabulary)} words, fewer than max_words={max_words}")
    rng, seen, examples = random.Random(seed), set(), []
    for attempt in range(20 * n):
        if len(examples) == n:
            break
        kind = kinds[attempt % len(kinds)]
        task = TASKS[kind]
        words = [rng.choice(task.words or vocabulary) for _ in range(rng.randint(min_words, max_words))]
        arg = task.argument(words, rng) if task.argument else None
        prompt = make_prompt(kind, words, arg)
        if prompt not in seen:
            seen.add(prompt)
            examples.append(make_example(kind, words, vocabulary, rng, arg))
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


def with_correct_chosen(records: list[dict]) -> list[dict]:
    """The pairs whose chosen response is the right answer (judge exact): a pair of two wrong responses teaches
    DPO to raise one wrong answer over another. Refused when a record has no ``answer`` or none is left."""
    missing = next((r for r in records if r.get("answer") is None), None)
    if missing is not None:
        raise ValueError(
            f"{missing.get('where', 'a record')}: no answer, and data.correct_chosen_only=true keeps the pairs whose"
            " chosen response the judge finds right; give every pair an answer (the label stage's comparisons"
            " have one) or set data.correct_chosen_only=false"
        )
    kept = [r for r in records if judge(response_text(r["chosen"]), r["answer"])[0]]
    if not kept:
        raise ValueError(
            f"None of the {len(records)} pairs has a chosen response equal to its answer, so"
            " data.correct_chosen_only=true leaves nothing; set data.correct_chosen_only=false"
        )
    log.info(
        "Kept the %d of %d pairs whose chosen response is right (data.correct_chosen_only)",
        len(kept),
        len(records),
    )
    return kept


# the fields that hold a message list in TRL's conversational records
CONVERSATION_FIELDS = ("messages", "prompt", "completion", "chosen", "rejected")


def is_conversational(record: Mapping) -> bool:
    """Whether a record is in TRL's conversational form: a field of it holds a list of messages, not text."""
    return any(isinstance(record.get(name), list) for name in CONVERSATION_FIELDS)


def encode_conversation(
    tokenizer: Tokenizer, record: dict, format: str
) -> tuple[list[int], dict[str, list[int]]]:
    """The prompt's ids and each response's (by field) of a conversational record, as TRL renders them:

    - ``sft``: ``messages`` rendered whole (``apply_chat_template``'s ids), trained on its assistant turns only
      (``assistant_only_loss``), or a ``prompt`` + ``completion`` rendered together and trained on the
      completion's assistant turns; the prompt is everything before the first trained token, the response the
      rest, with its ``targets`` (IGNORE_INDEX on the tokens of the other turns);
    - ``pairs``: the prompt ending in the generation prompt, each of ``chosen`` and ``rejected`` through its
      end of turn (:func:`lit_transformers.text.chat.encode_prompt_completion`);
    - ``prompts``: the prompt with the generation prompt, where a rollout starts.
    """
    if format == "pairs":
        encoded = {
            field: encode_prompt_completion(tokenizer, record["prompt"], record[field])
            for field in ("chosen", "rejected")
        }  # the prompt's ids are the same for both: its text is
        return encoded["chosen"][0], {field: response for field, (_, response) in encoded.items()}
    if format == "prompts":
        return tokenizer.encode(render_chat(tokenizer, record["prompt"], add_generation_prompt=True)), {}
    if "messages" in record:
        chat = encode_chat(tokenizer, record["messages"])
        labels = chat.labels
    else:
        chat = encode_chat(tokenizer, [*record["prompt"], *record["completion"]])
        n_prompt = len(tokenizer.encode(render_chat(tokenizer, record["prompt"], add_generation_prompt=True)))
        labels = [IGNORE_INDEX] * n_prompt + chat.labels[n_prompt:]  # TRL's completion_only_loss too
    # the first token is never a target (nothing predicts it): at least it is prompt
    first = max(1, next((i for i, label in enumerate(labels) if label != IGNORE_INDEX), len(labels)))
    return chat.ids[:first], {"completion": chat.ids[first:], "targets": labels[first:]}


def response_text(response: str | list[dict]) -> str:
    """A response's text: itself, or the text of a conversation's assistant turns."""
    if isinstance(response, str):
        return response
    return "".join(m["content"] for m in response if m["role"] == "assistant")


def completion_text(record: Mapping) -> str:
    """What an SFT record teaches: its completion, or the text of its conversation's assistant turns."""
    return response_text(record.get("completion", record.get("messages")))


# records that teach nothing, per TRL format: (what they have, what training on only them does, the fix)
USELESS = {
    "sft": (
        "an empty completion",
        "SFT on them learns only to end every response at once",
        "Give the records their completions (data.format=sft reads prompt and completion, or messages whose"
        " assistant turns are the completion)",
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
        return not completion_text(record).strip()
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
