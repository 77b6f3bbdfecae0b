"""Instruction data that could train without learning: records that teach nothing (an empty SFT completion, a
pair whose responses are the same tokens) are skipped with a count naming the first, a split of nothing else is
refused naming the file; prompt + response always fit in data.max_length, whatever the split. The embedded task
kinds (the multi-step ones worked by hand), their mixes, the DPO data that keeps only a right chosen response, and
a policy judged once per prompt, not once per pair."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lit_transformers.data.instructions import InstructionDataModule
from lit_transformers.tasks.dpo import DPOTask
from lit_transformers.text.instructions import MIXES, TASKS, judge, make_example, make_examples

from conftest import assert_short_error, train_main

WORDS = ["ash", "oak", "elm", "fir", "yew", "bay"]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def pairs() -> list[dict]:
    """24 pairs, each prompt once, split by their split field: every fourth from the first in val, every fourth
    from the third in test, the other 12 in train."""
    split = {0: "val", 2: "test"}
    return [
        {
            "prompt": f"Say {w} {i}:",
            "chosen": f" {w}",
            "rejected": f" not {w}",
            "split": split.get(i % 4, "train"),
        }
        for i, w in enumerate(WORDS * 4)
    ]


def datamodule(path: Path, tmp_path: Path, format: str = "pairs", **kwargs) -> InstructionDataModule:
    dm = InstructionDataModule(
        format=format, source="jsonl", path=str(path), tokenizer="char", cache_dir=str(tmp_path), **kwargs
    )
    dm.setup()
    return dm


def test_pairs_with_the_same_responses_or_none_are_skipped_with_a_count_naming_the_first(tmp_path, caplog):
    records = pairs()
    records[9] |= {"chosen": "", "rejected": ""}  # train, line 10
    records[5] |= {"rejected": records[5]["chosen"]}  # train, line 6
    records[4] |= {"rejected": records[4]["chosen"]}  # val, line 5
    path = write_jsonl(tmp_path / "pairs.jsonl", records)
    with caplog.at_level(logging.WARNING):
        dm = datamodule(path, tmp_path)
    assert "Skipping 2 of 12 train records with the same chosen and rejected response" in caplog.text
    assert f"(the first: {path}:6)" in caplog.text
    assert "Skipping 1 of 6 val records" in caplog.text and f"{path}:5)" in caplog.text
    assert "test records" not in caplog.text
    kept = [r for i, r in enumerate(records) if i not in (4, 5, 9)]
    for split in ("train", "val", "test"):
        tok = dm.tokenizer
        expected = sorted([*tok.encode(r["chosen"]), tok.eos_id] for r in kept if r["split"] == split)
        assert sorted(it["chosen"] for it in dm.datasets[split]) == expected
        assert [it["index"] for it in dm.datasets[split]] == list(range(len(expected)))
        # the records stay beside their items (the label stage pairs them)
        assert [tok.encode(r["chosen"]) for r in dm.records()[split]] == [
            it["chosen"][:-1] for it in dm.datasets[split]
        ]


def test_pairs_that_differ_only_past_max_length_teach_nothing(tmp_path, caplog):
    records = pairs()
    long = " " + " ".join(WORDS * 4)
    records[1] |= {"prompt": "P:", "chosen": long + " yes", "rejected": long + " no"}  # same first 40 chars
    path = write_jsonl(tmp_path / "pairs.jsonl", records)
    with caplog.at_level(logging.WARNING):
        datamodule(path, tmp_path, max_length=40, max_prompt_length=16)
    has = "the same chosen and rejected response (within data.max_length tokens)"
    assert f"Skipping 1 of 12 train records with {has} (the first: {path}:2)" in caplog.text


def test_a_split_of_pairs_that_teach_nothing_is_refused_naming_the_file_and_the_fix(tmp_path):
    records = [r | {"rejected": r["chosen"]} if r["split"] == "train" else r for r in pairs()]
    path = write_jsonl(tmp_path / "pairs.jsonl", records)
    with pytest.raises(ValueError) as error:
        datamodule(path, tmp_path)
    message = str(error.value)
    assert f"Every one of the 12 train records of {path} has the same chosen and rejected" in message
    assert f"the first: {path}:2" in message and "ln 2" in message
    assert "Give every pair a rejected response that differs from its chosen one" in message


def test_sft_records_without_a_completion_are_skipped_and_a_split_of_them_refused(tmp_path, caplog):
    records = [{"prompt": r["prompt"], "completion": r["chosen"], "split": r["split"]} for r in pairs()]
    records[3]["completion"] = ""
    records[7]["completion"] = "  "  # blank is empty too
    path = write_jsonl(tmp_path / "sft.jsonl", records)
    with caplog.at_level(logging.WARNING):
        dm = datamodule(path, tmp_path, format="sft")
    assert f"Skipping 2 of 12 train records with an empty completion (the first: {path}:4)" in caplog.text
    assert len(dm.datasets["train"]) == 10
    write_jsonl(path, [r | {"completion": ""} for r in records])
    with pytest.raises(
        ValueError, match=rf"Every one of the 12 train records of {path} has an empty completion"
    ):
        datamodule(path, tmp_path / "again", format="sft")


def test_a_reward_run_on_pairs_that_teach_nothing_exits_1_before_training(tmp_path):
    records = [r | {"rejected": r["chosen"]} for r in pairs()]
    path = write_jsonl(tmp_path / "same.jsonl", records)
    result = train_main(
        "experiment=gpt_reward",
        "data.source=jsonl",
        f"data.path={path}",
        "data.pool=all",
        "data.tokenizer=char",
        "model.n_layer=1",
        "model.n_head=2",
        "model.d_model=32",
        "trainer.max_steps=2",  # were the pairs taken, a short run (that ends with checkpoints)
        "trainer.limit_val_batches=1",
        "trainer.limit_test_batches=1",
        f"paths.cache_dir={tmp_path / 'cache'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert_short_error(result, f"records of {path} has the same chosen and rejected response", "ln 2")
    assert not list((tmp_path / "run").rglob("*.ckpt"))


@pytest.mark.parametrize("fmt", ["sft", "pairs", "prompts"])
def test_every_split_fits_max_length_and_the_cut_records_are_counted(tmp_path, caplog, fmt):
    """Prompts and responses longer than the model's context in every split: each item fits in max_length
    (SFT: its inputs, which drop the last token), and the log counts the records cut per split."""
    long = " ".join(WORDS * 10)
    long_prompt, long_completion, long_rejected = {0, 5, 6}, {1, 2}, {4}
    records = [
        {
            "prompt": f"Say {w} {i}{' ' + long if i in long_prompt else ''}:",
            "completion": f" {w}{' ' + long if i in long_completion else ''}",
            "chosen": f" {w}",
            "rejected": f" {long} {w}" if i in long_rejected else f" not {w}",
            "split": ["train", "val", "test"][i % 3],
        }
        for i, w in enumerate(WORDS * 4)
    ]
    path = write_jsonl(tmp_path / "long.jsonl", records)
    with caplog.at_level(logging.INFO):
        dm = datamodule(path, tmp_path, format=fmt, max_length=24, max_prompt_length=16)
    for items in dm.datasets.values():
        for item in items:
            assert len(item["prompt"]) <= 16
            for field in {"sft": ["completion"], "pairs": ["chosen", "rejected"], "prompts": []}[fmt]:
                assert len(item["prompt"]) + len(item[field]) <= 24
    # a prompt cut to 16 tokens leaves 8 for the response: " not <word>" and EOS no longer fit
    cut_rows = long_prompt | {"sft": long_completion, "pairs": long_rejected, "prompts": set()}[fmt]
    cut = {split: sum(records[i]["split"] == split for i in cut_rows) for split in ("train", "val", "test")}
    assert f"tokens in all: {cut}" in caplog.text


def test_a_prompt_limit_that_leaves_no_room_for_the_response_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"data.max_prompt_length=32 must be .* below data.max_length=24"):
        InstructionDataModule(max_length=24, max_prompt_length=32, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"data.max_prompt_length=1 must be at least 2"):
        InstructionDataModule(max_prompt_length=1, cache_dir=str(tmp_path))


# ---- the embedded task kinds ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, words, arg, prompt, answer",
    [
        ("kth_sorted", ["oak", "ash", "elm"], "2", "Sort the words and repeat word 2 of: oak ash elm", "elm"),
        ("kth_sorted", ["yew", "bay", "yew"], "3", "Sort the words and repeat word 3 of: yew bay yew", "yew"),
        ("count_letter", ["ash", "oak", "elm"], "a", "Count the letter a in: ash oak elm", "2"),
        ("count_letter", ["yew", "elm", "fir", "bay"], "e", "Count the letter e in: yew elm fir bay", "2"),
        ("add", ["three", "five"], None, "Add the numbers: three five", "8"),
        ("add", ["nine", "nine", "one"], None, "Add the numbers: nine nine one", "19"),
        (
            "reverse_first",
            ["ash", "oak", "elm", "fir"],
            "3",
            "Reverse the first 3 words of: ash oak elm fir",
            "elm oak ash fir",
        ),
        ("reverse_first", ["ash", "oak"], "2", "Reverse the first 2 words of: ash oak", "oak ash"),
    ],
)
def test_each_multi_step_kind_answers_as_worked_by_hand(kind, words, arg, prompt, answer):
    example = make_example(kind, words, WORDS, random.Random(0), arg)
    assert example["prompt"] == prompt + "\nAnswer:"
    assert example["answer"] == answer and example["completion"] == example["chosen"] == " " + answer
    assert judge(example["completion"], answer) == (1.0, 1.0)


@pytest.mark.parametrize("kind", ["kth_sorted", "count_letter", "add", "reverse_first"])
def test_a_multi_step_kinds_corruption_is_never_its_answer(kind):
    examples = make_examples(WORDS, 300, [kind], max_words=5, seed=3)
    assert len({e["prompt"] for e in examples}) == 300
    for e in examples:
        assert judge(e["completion"], e["answer"]) == (1.0, 1.0)
        assert judge(e["rejected"], e["answer"])[0] == 0.0, e
    if TASKS[kind].argument is not None:  # the argument varies, so the model must read it
        assert len({e["prompt"].split(":")[0] for e in examples}) > 1


def test_the_default_mix_makes_the_examples_it_made_before_the_new_kinds():
    """Byte for byte what the basic mix made before (copied from main), so no measured number moves."""
    examples = make_examples(WORDS, 4, seed=0)
    assert [(e["prompt"], e["completion"], e["rejected"]) for e in examples] == [
        ("Reverse the words: fir ash elm\nAnswer:", " elm ash fir", " elm elm fir"),
        ("Sort the words: fir elm yew\nAnswer:", " elm fir yew", " elm fir oak"),
        ("Count the words in: oak ash yew\nAnswer:", " 3", " 4"),
        ("Repeat the last word of: bay yew oak elm\nAnswer:", " elm", " fir"),
    ]
    assert InstructionDataModule().hparams.kinds == MIXES["basic"] == ("reverse", "sort", "count", "last")


def test_data_kinds_names_a_mix_or_lists_kinds_and_an_unknown_one_is_refused(tmp_path):
    hard = make_examples(WORDS, 12, "hard", seed=0)
    assert [e["kind"] for e in hard[: len(MIXES["hard"])]] == list(MIXES["hard"])
    assert make_examples(WORDS, 12, list(MIXES["hard"]), seed=0) == hard
    dm = InstructionDataModule(kinds="hard", n_examples=120, tokenizer="char", cache_dir=str(tmp_path))
    dm.setup()
    assert {r["kind"] for part in dm.records().values() for r in part} == set(MIXES["hard"])
    with pytest.raises(ValueError, match=r"data.kinds='harder': name a mix of \['basic', 'hard'\]"):
        InstructionDataModule(kinds="harder", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"Unknown instruction task\(s\) \['sum'\]"):
        InstructionDataModule(kinds=["sort", "sum"], cache_dir=str(tmp_path))


def test_eval_batch_size_batches_validation_and_test_and_leaves_training_at_batch_size(tmp_path):
    dm = InstructionDataModule(
        format="prompts",
        n_examples=400,
        tokenizer="char",
        cache_dir=str(tmp_path),
        batch_size=4,
        eval_batch_size=7,
    )
    dm.setup()
    assert len(next(iter(dm.train_dataloader()))["prompt_ids"]) == 4
    for split, loader in (("val", dm.val_dataloader()), ("test", dm.test_dataloader())):
        sizes = [len(batch["prompt_ids"]) for batch in loader]
        assert set(sizes[:-1]) == {7} and sum(sizes) == len(dm.records()[split]), split  # every prompt once


# ---- DPO's data and judged prompts ---------------------------------------------------------------------------


def labelled_pairs() -> list[dict]:
    """The label stage's kind of pairs: per prompt, the right answer over wrong ones, and wrong over worse."""
    records = []
    for i, (w, v) in enumerate(zip(WORDS, reversed(WORDS))):
        split = ["train", "test", "val"][i % 3]
        base = {"prompt": f"Say {w} {v}:", "answer": f"{w} {v}", "split": split}
        records += [
            base | {"chosen": f" {w} {v}", "rejected": f" {w}"},
            base | {"chosen": f" {w}", "rejected": f" {v} {v} {v}"},  # two wrong ones
            base | {"chosen": f" {w} {v}", "rejected": f" {v} {w}"},
        ]
    return records


def test_correct_chosen_only_keeps_the_pairs_whose_chosen_is_the_answer(tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", labelled_pairs())
    dm = datamodule(path, tmp_path, correct_chosen_only=True)
    kept = [r for part in dm.records().values() for r in part]
    assert len(kept) == 2 * len(WORDS) and all(r["chosen"].split() == r["answer"].split() for r in kept)
    assert sum(len(part) for part in datamodule(path, tmp_path / "all").records().values()) == 3 * len(WORDS)
    records = labelled_pairs()
    del records[4]["answer"]
    path = write_jsonl(tmp_path / "no_answer.jsonl", records)
    with pytest.raises(ValueError, match=rf"{path}:5: no answer, and data.correct_chosen_only=true"):
        datamodule(path, tmp_path, correct_chosen_only=True)
    with pytest.raises(
        ValueError, match="data.correct_chosen_only=true screens preference pairs, but data.format=sft"
    ):
        InstructionDataModule(format="sft", correct_chosen_only=True, cache_dir=str(tmp_path))


def test_dpo_judges_each_prompt_once_whatever_its_number_of_pairs(tmp_path):
    """The label stage gives a prompt as many pairs as its samples differ (1 to 15): a hard prompt has many, so
    judging every pair's prompt weighs the hard ones up (0.387 on the chain's DPO test pairs against 0.635 on its
    1600 test prompts, each once). Only the first pair of each prompt in its split is judged."""
    path = write_jsonl(tmp_path / "pairs.jsonl", labelled_pairs())
    dm = datamodule(path, tmp_path, batch_size=4)
    batches = list(dm.test_dataloader())
    judged = torch.cat([b["judged"] for b in batches])
    items = dm.datasets["test"]
    assert [it["judged"] for it in items] == judged.tolist()
    first = {}
    for it in items:
        first.setdefault(tuple(it["prompt"]), it["index"])
    assert [it["index"] for it in items if it["judged"]] == sorted(first.values())
    seen = []
    task = SimpleNamespace(evaluate_policy=lambda batch, stage, i: seen.append((batch, stage, i)))
    for i, batch in enumerate(batches):
        DPOTask._evaluate_prompts(task, batch, "test", i)
    prompts = [
        tuple(p[m].tolist())
        for batch, _, _ in seen
        for p, m in zip(batch["prompt_ids"], batch["prompt_mask"])
    ]
    assert sorted(prompts) == sorted(first) and len(prompts) == len(set(prompts))
    answers = [a for batch, _, _ in seen for a in batch["answers"]]
    assert answers == [r["answer"] for r, it in zip(dm.records()["test"], items) if it["judged"]]
