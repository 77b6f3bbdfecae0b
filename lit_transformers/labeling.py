"""The chain's label stage, InstructGPT's labelers: the SFT policy samples several responses to every prompt, the
judge ranks them (with the right answer and a corrupted one), and every pair of different verdicts becomes a TRL
preference record (``prompt``/``chosen``/``rejected``) in ``<run>/label/comparisons.jsonl``, which the reward model
and DPO train on. Pairs made only from synthetic corruptions teach a reward model the corruptions, not the policy's
own mistakes, and PPO then has nothing true to climb (docs/instructgpt.md).

On TRL's conversational records (SFT on ``messages``, or on a ``prompt`` and ``completion`` of messages) the policy
answers the conversation before its last assistant turn, rendered with the tokenizer's chat template and its
generation prompt, and stops at any end-of-turn token; the pairs are conversational too (the prompt's messages,
each response an assistant message), which the reward and DPO stages render with the same template.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from lit_transformers.tasks import SFTTask
from lit_transformers.tasks.instruct import decode_responses, rollout
from lit_transformers.text import left_pad
from lit_transformers.text.instructions import is_conversational, judge, response_text

PROMPTS_PER_ROLLOUT = 64  # the label stage samples this many prompts (x samples_per_prompt) at once


def label_prompt(record: dict) -> tuple[str | list[dict], list[str]]:
    """What the policy answers for an SFT record, and the record's own responses that the judge ranks beside its
    samples (the completion, and the corruption the embedded tasks carry as ``rejected``): a text prompt, or a
    conversation's messages before its last assistant turn, whose text is the completion."""
    if "messages" in record:
        messages = record["messages"]
        last = max(i for i, message in enumerate(messages) if message["role"] == "assistant")
        prompt, own = messages[:last], [messages[last]["content"]]
    else:
        prompt, own = record["prompt"], [response_text(record["completion"])]
    if record.get("rejected") is not None:
        own.append(response_text(record["rejected"]))
    return prompt, own


def _as_response(text: str) -> list[dict]:
    """A response as TRL's conversational pairs hold it: one assistant message."""
    return [{"role": "assistant", "content": text}]


def ranked_pairs(scores: dict[str, float]) -> Iterator[tuple[str, str]]:
    """(better, worse) for every two candidates whose scores differ."""
    return ((b, w) for b, s_b in scores.items() for w, s_w in scores.items() if s_b > s_w)


@torch.no_grad()
def label_comparisons(
    policy_ckpt: str,
    data_cfg: DictConfig,
    out: Path,
    samples_per_prompt: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
) -> dict[str, float]:
    """The judge ranks ``samples_per_prompt`` responses of the policy to every prompt of every split, with the
    record's right answer and its corruption; each two candidates with different graded scores make a pair.
    Writes the pairs to ``out`` (JSONL, TRL's fields plus ``answer`` and ``split``) and returns their count, how
    many of them have the right answer as chosen (what DPO's ``data.correct_chosen_only`` keeps; the others
    prefer one wrong answer to another) and the samples' mean judge scores."""
    data = instantiate(data_cfg, format="sft", _convert_="all")
    data.setup()
    tok = data.tokenizer
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    policy = SFTTask.load_from_checkpoint(policy_ckpt, map_location=device, weights_only=True).model
    generator = torch.Generator(device).manual_seed(seed)
    stats = {"pairs": 0.0, "pairs_correct_chosen": 0.0, "sample_judge_exact": 0.0, "sample_judge_score": 0.0}
    n_samples = 0
    tmp = out.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for split, records in data.records().items():
            if any(r.get("answer") is None for r in records):
                raise ValueError(
                    f"The label stage needs an answer in every record for the judge ({split} split lacks some);"
                    " bring your own comparisons with data.source=jsonl in the reward and dpo stages instead"
                )
            for start in range(0, len(records), PROMPTS_PER_ROLLOUT):
                chunk = records[start : start + PROMPTS_PER_ROLLOUT]
                asked = [label_prompt(record) for record in chunk]
                # each prompt's ids as the reward, DPO and PPO data encode it (conversations: with the template)
                prompts = [
                    data.encode({"prompt": prompt, "where": record["where"]}, "prompts")[0]["prompt"]
                    for (prompt, _), record in zip(asked, chunk)
                ]
                ids, mask = left_pad(prompts * samples_per_prompt, tok.pad_id)
                generated = rollout(
                    policy, tok, ids.to(device), mask.to(device), max_new_tokens, temperature, generator
                )
                texts = decode_responses(tok, generated.responses, generated.response_mask)
                for i, (record, (prompt, own)) in enumerate(zip(chunk, asked)):
                    samples = texts[i :: len(chunk)]
                    verdicts = [judge(t, record["answer"]) for t in samples]
                    stats["sample_judge_exact"] += sum(v[0] for v in verdicts)
                    stats["sample_judge_score"] += sum(v[1] for v in verdicts)
                    n_samples += len(samples)
                    scored = {t: judge(t, record["answer"])[1] for t in own}
                    scored |= {t: v[1] for t, v in zip(samples, verdicts)}
                    as_response = _as_response if is_conversational(record) else str
                    for better, worse in ranked_pairs(scored):
                        pair = {
                            "prompt": prompt,
                            "chosen": as_response(better),
                            "rejected": as_response(worse),
                            "answer": record["answer"],
                            "split": split,
                        }
                        f.write(json.dumps(pair) + "\n")
                        stats["pairs"] += 1
                        stats["pairs_correct_chosen"] += judge(better, record["answer"])[0]
    tmp.replace(out)
    stats["sample_judge_exact"] /= n_samples
    stats["sample_judge_score"] /= n_samples
    return stats
