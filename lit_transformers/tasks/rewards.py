"""The RL stages' reward functions (GRPO's and PPO's ``task.rewards``), weighted and summed as TRL's ``reward_funcs``
with ``reward_weights``: verifiable ones (the judge against each prompt's right answer, a format pattern) and the
reward model.

``task.rewards`` lists them, one ``{name: weight}`` (or ``{name: {weight: w, <options>}}``) each:

- ``judge``: 1 for the right answer, else 0 (``graded: true``: the judge's graded score in [0, 1]);
- ``format``: 1 when the stripped response matches ``pattern`` (a regular expression, whole response), else 0;
- ``reward_model``: the reward model's score of prompt + response.

e.g. ``[{judge: 1.0}, {reward_model: 0.5}]``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from lit_transformers.text.instructions import judge

OPTIONS = {"judge": {"graded"}, "format": {"pattern"}, "reward_model": set()}


@dataclass(frozen=True)
class Reward:
    name: str  # judge | format | reward_model
    weight: float
    graded: bool = False  # judge: the graded score instead of exact match
    pattern: str | None = None  # format: the regular expression a whole response must match


def parse_rewards(rewards: Sequence[Mapping]) -> list[Reward]:
    """``task.rewards`` -> one :class:`Reward` per entry, refused with the fix when an entry is not
    ``{name: weight}`` or ``{name: {weight: w, ...options}}`` of a known name and its options."""
    example = "e.g. task.rewards='[{judge: 1.0}, {reward_model: 0.5}]'"
    if not rewards:
        raise ValueError(f"task.rewards is empty: RL needs at least one reward function, {example}")
    parsed = []
    for entry in rewards:
        if not isinstance(entry, Mapping) or len(entry) != 1:
            raise ValueError(f"task.rewards entry {entry!r} is not one {{name: weight}}; {example}")
        ((name, spec),) = entry.items()
        if name not in OPTIONS:
            raise ValueError(f"task.rewards names {name!r}; the reward functions are {', '.join(OPTIONS)}")
        spec = dict(spec) if isinstance(spec, Mapping) else {"weight": spec}
        unknown = sorted(set(spec) - OPTIONS[name] - {"weight"})
        if unknown:
            raise ValueError(
                f"task.rewards entry {name} has unknown options {unknown}; it takes weight"
                + "".join(f", {option}" for option in sorted(OPTIONS[name]))
            )
        if name == "format" and not spec.get("pattern"):
            raise ValueError(
                "task.rewards entry format needs a pattern, the regular expression a whole response must match: "
                "{format: {weight: 0.2, pattern: '[a-z0-9]+( [a-z0-9]+)*'}}"
            )
        parsed.append(
            Reward(name, float(spec.get("weight", 1.0)), bool(spec.get("graded", False)), spec.get("pattern"))
        )
    return parsed


def score_completions(
    rewards: Sequence[Reward],
    texts: Sequence[str],
    answers: Sequence[str] | None,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    reward_model=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) the weighted sum of the reward functions for each completion ``texts`` (N), and (N, len(rewards))
    float32 each function's (unweighted) value; ``answers`` (N) for the judge, ``reward_model`` scores
    ``sequences`` (prompt + completion) under ``attention_mask``."""
    columns = []
    for reward in rewards:
        if reward.name == "judge":
            if answers is None:
                raise ValueError(
                    "task.rewards has the judge, but the prompts carry no right answers (records without an "
                    "'answer' field): use the embedded tasks or records with answers, or reward with the reward "
                    "model alone, task.rewards='[{reward_model: 1.0}]'"
                )
            values = [judge(text, answer)[1 if reward.graded else 0] for text, answer in zip(texts, answers)]
        elif reward.name == "format":
            pattern = re.compile(reward.pattern)
            values = [float(pattern.fullmatch(text.strip()) is not None) for text in texts]
        else:
            columns.append(reward_model.score(sequences, attention_mask).float())
            continue
        columns.append(torch.tensor(values, dtype=torch.float32, device=sequences.device))
    per_function = torch.stack(columns, dim=1)
    weights = torch.tensor([r.weight for r in rewards], device=per_function.device)
    return (per_function * weights).sum(1), per_function


def uses_reward_model(rewards: Sequence[Reward]) -> bool:
    """Whether a reward model scores any of ``rewards`` (the task then holds one, from ``init_from.reward``)."""
    return any(r.name == "reward_model" for r in rewards)
