"""Instruction data that could train without learning: records that teach nothing (an empty SFT completion, a
pair whose responses are the same tokens) are skipped with a count naming the first, a split of nothing else is
refused naming the file; prompt + response always fit in data.max_length, whatever the split."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from lit_transformers.data.instructions import InstructionDataModule

from conftest import assert_short_error, train_cli

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
    result = train_cli(
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
