"""TRL's conversational records as instruction data: SFT on ``messages`` (and a prompt + completion of messages),
preference pairs and PPO prompts as message lists, rendered with a Hub tokenizer's chat template. Every id and
every trained position is checked against ``transformers`` itself (``apply_chat_template``, its
``return_assistant_tokens_mask``), not against our own rendering; bad records are refused naming their line."""

from __future__ import annotations

import json
import logging
import math
import sys
import types
from pathlib import Path

import pytest

from lit_transformers.data.instruction_records import FIELDS, read_hub
from lit_transformers.data.instructions import InstructionDataModule, collate
from lit_transformers.text import IGNORE_INDEX
from lit_transformers.train import train

from conftest import assert_short_error, assert_user_error, train_cli
from test_hub_tokenizers import CHATML, CHATML_GENERATION, CHATML_TEMPLATE, _bpe, _chatml, _save
from test_instructgpt import TINY

transformers = pytest.importorskip("transformers")

SPLITS = ["train"] * 6 + ["val", "test"]  # every split non-empty, whatever the hash would do


def _conversation(i: int) -> list[dict]:
    """Multi-turn, with a system message in every other one (ChatML adds its default to the others)."""
    system = [{"role": "system", "content": "You are terse."}] if i % 2 else []
    return [
        *system,
        {"role": "user", "content": f"Hello, how are you today? {i}"},
        {"role": "assistant", "content": f"I am fine, thank you {i}."},
        {"role": "user", "content": "Tell me a joke about tokenizers."},
        {"role": "assistant", "content": "A man is eating padding."},
    ]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def datamodule(
    path: Path, tmp_path: Path, format: str, tokenizer_path=None, **kwargs
) -> InstructionDataModule:
    dm = InstructionDataModule(
        format=format,
        source="jsonl",
        path=str(path),
        tokenizer_path=str(tokenizer_path) if tokenizer_path else None,
        tokenizer="char",
        cache_dir=str(tmp_path / "cache"),
        **{"max_prompt_length": 200, "max_length": 256, **kwargs},
    )
    dm.setup()
    return dm


def _items_with_records(dm: InstructionDataModule):
    """(item, its record) of every split: the datamodule keeps them aligned."""
    for split, items in dm.datasets.items():
        yield from zip(items, dm.records()[split])


def _trained(item: dict) -> list[bool]:
    """Which of an SFT item's tokens are targets (unshifted)."""
    return [False] * len(item["prompt"]) + [t != IGNORE_INDEX for t in item["targets"]]


def _shifted_labels(ids: list[int], mask: list[bool | int]) -> list[int]:
    """Next-token labels of a sequence whose trained tokens are ``mask``: label t is token t+1."""
    return [ids[t + 1] if mask[t + 1] else IGNORE_INDEX for t in range(len(ids) - 1)]


def _generation_prompt_ids(hf, messages: list[dict]) -> list[int]:
    """transformers' ids of a conversation rendered to where the assistant's reply starts."""
    rendered = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)
    return rendered["input_ids"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """transformers' tokenizer on the ChatML template with {% generation %} blocks: the reference mask."""
    return _chatml(tmp_path_factory.mktemp("generation"), template=CHATML_GENERATION)


@pytest.mark.parametrize("template", [CHATML_GENERATION, CHATML_TEMPLATE], ids=["generation", "plain"])
def test_sft_on_messages_is_transformers_ids_trained_on_its_assistant_tokens_mask(
    tmp_path, reference, template
):
    """Qwen's ChatML, with and without {% generation %} blocks (the two render the same text): the ids are
    apply_chat_template's and the trained tokens exactly transformers' assistant mask, in the batch too."""
    hf = _chatml(tmp_path / "tok", template=template)
    records = [{"messages": _conversation(i), "split": s} for i, s in enumerate(SPLITS)]
    dm = datamodule(write_jsonl(tmp_path / "chat.jsonl", records), tmp_path, "sft", tmp_path / "tok")
    items = []
    for item, record in _items_with_records(dm):
        ids = item["prompt"] + item["completion"]
        assert ids == hf.apply_chat_template(record["messages"], tokenize=True, return_dict=True)["input_ids"]
        expected = reference.apply_chat_template(
            record["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        assert expected["input_ids"] == ids
        assert _trained(item) == [bool(m) for m in expected["assistant_masks"]]
        assert sum(expected["assistant_masks"]) > 0
        items.append((item, ids, expected["assistant_masks"]))
    batch = collate([it for it, _, _ in items], "sft", pad_id=dm.tokenizer.pad_id)
    for row, (_, ids, mask) in enumerate(items):
        labels = _shifted_labels(ids, mask)
        assert batch["labels"][row].tolist() == labels + [IGNORE_INDEX] * (
            batch["labels"].size(1) - len(labels)
        )
        assert batch["input_ids"][row, : len(ids) - 1].tolist() == ids[:-1]
    packed = collate([it for it, _, _ in items], "sft", pad_id=dm.tokenizer.pad_id, packing=True, width=256)
    assert sorted(packed["labels"][packed["labels"] != IGNORE_INDEX].tolist()) == sorted(
        batch["labels"][batch["labels"] != IGNORE_INDEX].tolist()
    )


def test_sft_on_a_conversational_prompt_and_completion_trains_the_completion_only(tmp_path, reference):
    """TRL's conversational prompt-completion: ids of the whole conversation, targets the completion's
    assistant tokens (not an assistant turn of the prompt's history: completion_only_loss)."""
    _chatml(tmp_path / "tok", template=CHATML_GENERATION)
    records = [
        {"prompt": _conversation(i)[:-1], "completion": _conversation(i)[-1:], "split": s}
        for i, s in enumerate(SPLITS)
    ]
    dm = datamodule(write_jsonl(tmp_path / "pc.jsonl", records), tmp_path, "sft", tmp_path / "tok")
    for item, record in _items_with_records(dm):
        whole = record["prompt"] + record["completion"]
        expected = reference.apply_chat_template(
            whole, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        n = len(_generation_prompt_ids(reference, record["prompt"]))
        mask = [bool(m) and i >= n for i, m in enumerate(expected["assistant_masks"])]
        assert item["prompt"] + item["completion"] == expected["input_ids"]
        assert _trained(item) == mask and any(mask)
        assert sum(expected["assistant_masks"]) > sum(mask)  # the prompt's assistant turn is not trained


def _trl_split(hf, prompt: list[dict], completion: list[dict]) -> tuple[list[int], list[int]]:
    """TRL's DPO / reward recipe (``maybe_apply_chat_template`` then tokenizing each text): the prompt rendered with
    the generation prompt; the completion, the full rendering minus that prefix, here less its trailing newline
    (ChatML's after <|im_end|>, which generation never produces: it stops at the end of turn)."""
    prompt_text = hf.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full = hf.apply_chat_template(prompt + completion, tokenize=False)
    assert full.startswith(prompt_text)
    ids = lambda text: hf(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    return ids(prompt_text), ids(full[len(prompt_text) :].rstrip())


def test_conversational_pairs_follow_trls_recipe_and_identical_ones_are_skipped(tmp_path, caplog):
    hf = _chatml(tmp_path / "tok")
    records = [
        {
            "prompt": _conversation(i)[:-1],
            "chosen": [{"role": "assistant", "content": f"A man is eating padding {i}."}],
            "rejected": [{"role": "assistant", "content": "No."}],
            "split": s,
        }
        for i, s in enumerate(SPLITS)
    ]
    records[3]["rejected"] = records[3]["chosen"]
    path = write_jsonl(tmp_path / "pairs.jsonl", records)
    with caplog.at_level(logging.WARNING):
        dm = datamodule(path, tmp_path, "pairs", tmp_path / "tok")
    assert (
        f"Skipping 1 of 6 train records with the same chosen and rejected response (within data.max_length "
        f"tokens) (the first: {path}:4)" in (caplog.text)
    )
    for item, record in _items_with_records(dm):
        for field in ("chosen", "rejected"):
            prompt, response = _trl_split(hf, record["prompt"], record[field])
            assert (item["prompt"], item[field]) == (prompt, response)
        assert item["chosen"][-1] == hf.convert_tokens_to_ids("<|im_end|>")
    batch = dm.collate(dm.datasets["train"])
    assert batch["pair_ids"].size(0) == 2 * len(dm.datasets["train"]) == 10


def test_conversational_ppo_prompts_end_in_the_generation_prompt(tmp_path):
    hf = _chatml(tmp_path / "tok")
    records = [{"prompt": _conversation(i)[:-1], "split": s} for i, s in enumerate(SPLITS)]
    dm = datamodule(write_jsonl(tmp_path / "prompts.jsonl", records), tmp_path, "prompts", tmp_path / "tok")
    for item, record in _items_with_records(dm):
        assert item["prompt"] == _generation_prompt_ids(hf, record["prompt"])
        assert hf.decode(item["prompt"]).endswith("<|im_start|>assistant\n")


def test_a_long_conversation_is_cut_as_text_is(tmp_path):
    """The prompt keeps its end (where the generation prompt is), the response the room left."""
    _chatml(tmp_path / "tok")
    records = [{"messages": _conversation(i), "split": s} for i, s in enumerate(SPLITS)]
    dm = datamodule(
        write_jsonl(tmp_path / "chat.jsonl", records),
        tmp_path,
        "sft",
        tmp_path / "tok",
        max_prompt_length=8,
        max_length=24,
    )
    for item, _ in _items_with_records(dm):
        assert len(item["prompt"]) <= 8 and len(item["prompt"]) + len(item["completion"]) <= 24
        assert len(item["targets"]) == len(item["completion"])
        assert dm.tokenizer.decode(item["prompt"], skip_special_tokens=False).endswith("assistant\n")


def test_a_hub_dataset_of_messages_is_read_with_its_null_message_keys_dropped(monkeypatch):
    """datasets gives every message the keys of all (a struct column): those set to None are dropped, as
    transformers drops them before rendering; a bad row is named by its index."""

    class Dataset(list):
        column_names = ["messages"]

    as_struct = lambda messages: [m | {"tool_calls": None} for m in messages]  # noqa: E731
    rows = Dataset([{"messages": as_struct(_conversation(i))} for i in range(2)])
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda *a, **k: rows))
    records = read_hub("me/chat", None, "train", FIELDS["sft"])
    assert [r["messages"] for r in records] == [_conversation(0), _conversation(1)]
    rows[1]["messages"][0]["role"] = "gpt"
    with pytest.raises(ValueError, match=r"me/chat\[1\]: column 'messages': Message 0 .* role 'gpt'"):
        read_hub("me/chat", None, "train", FIELDS["sft"])


def test_the_embedded_tasks_take_a_hub_tokenizer_without_bos_or_chat_template(tmp_path):
    """Qwen's tokenizers have no BOS: text prompts are their ids as transformers encodes them (no BOS added),
    responses end in EOS; no chat template is needed for text."""
    hf = _save(tmp_path / "tok", _bpe(CHATML), eos_token="<|im_end|>", pad_token="<|endoftext|>")
    dm = InstructionDataModule(
        format="pairs",
        n_examples=60,
        tokenizer_path=str(tmp_path / "tok"),
        cache_dir=str(tmp_path / "cache"),
        max_prompt_length=200,
        max_length=256,
    )
    dm.setup()
    for item, record in _items_with_records(dm):
        assert item["prompt"] == hf(record["prompt"])["input_ids"]
        assert item["chosen"] == [*hf(record["chosen"])["input_ids"], hf.eos_token_id]


# ---- refusals --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("hub_dir", [True, False], ids=["hub dir without one", "trained here"])
def test_a_conversational_dataset_without_a_chat_template_is_refused_naming_the_fix(tmp_path, hub_dir):
    """A Hub directory without a template, and a tokenizer trained here (which has none)."""
    _save(tmp_path / "plain", _bpe(CHATML), eos_token="<|im_end|>", pad_token="<|endoftext|>")
    records = [{"messages": _conversation(i), "split": s} for i, s in enumerate(SPLITS)]
    path = write_jsonl(tmp_path / "chat.jsonl", records)
    assert_user_error(
        lambda: datamodule(path, tmp_path, "sft", tmp_path / "plain" if hub_dir else None),
        "no chat_template",
        "data.tokenizer_path=<a Hub dir with a chat template>",
    )


def test_a_run_on_conversations_without_a_chat_template_exits_1_with_the_fix(tmp_path):
    records = [{"messages": _conversation(i)} for i in range(8)]
    path = write_jsonl(tmp_path / "chat.jsonl", records)
    result = train_cli(
        "experiment=gpt_sft",
        "data.source=jsonl",
        f"data.path={path}",
        "data.pool=all",
        f"paths.cache_dir={tmp_path / 'cache'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert_short_error(result, "no chat_template", "data.tokenizer_path=<a Hub dir with a chat template>")


def test_an_unknown_role_names_the_records_line(tmp_path):
    _chatml(tmp_path / "tok")
    records = [{"messages": _conversation(i), "split": s} for i, s in enumerate(SPLITS)]
    records[2]["messages"][1]["role"] = "human"
    path = write_jsonl(tmp_path / "chat.jsonl", records)
    assert_user_error(
        lambda: datamodule(path, tmp_path, "sft", tmp_path / "tok"), f"{path}:3", "role 'human'", "'user'"
    )


@pytest.mark.parametrize("format", ["sft", "pairs"])
def test_text_and_conversational_records_in_one_file_are_refused_at_the_first_odd_line(tmp_path, format):
    _chatml(tmp_path / "tok")
    conversational = {
        "sft": {"messages": _conversation(0)},
        "pairs": {
            "prompt": _conversation(0)[:-1],
            "chosen": _conversation(0)[-1:],
            "rejected": _conversation(1)[-1:],
        },
    }[format]
    text = {"prompt": "Hi", "completion": " there", "chosen": " there", "rejected": " no"}
    records = [conversational, conversational, text, conversational]
    path = write_jsonl(tmp_path / "mixed.jsonl", [r | {"split": s} for r, s in zip(records, SPLITS)])
    assert_user_error(
        lambda: datamodule(path, tmp_path, format, tmp_path / "tok"),
        f"{path}:3: a plain-text record in a file of conversational ones (the first: {path}:1)",
    )
    path = write_jsonl(tmp_path / "mixed.jsonl", [r | {"split": s} for r, s in zip(records[2:], SPLITS)])
    assert_user_error(
        lambda: datamodule(path, tmp_path, format, tmp_path / "tok"), f"{path}:2: a conversational record"
    )


# ---- a run -----------------------------------------------------------------------------------------------


def _records_for(format: str, n: int) -> list[dict]:
    """``n`` conversational records of a format: SFT on messages, pairs, PPO prompts."""
    if format == "sft":
        return [{"messages": _conversation(i)} for i in range(n)]
    no = [{"role": "assistant", "content": "No."}]
    if format == "pairs":
        return [
            {"prompt": _conversation(i)[:-1], "chosen": _conversation(i)[-1:], "rejected": no}
            for i in range(n)
        ]
    return [{"prompt": _conversation(i)[:-1]} for i in range(n)]


@pytest.mark.parametrize(
    "experiment, format",
    [("gpt_sft", "sft"), ("gpt_reward", "pairs"), ("gpt_dpo", "pairs"), ("gpt_ppo", "prompts")],
)
def test_every_stage_trains_a_llama_on_conversations_with_a_hub_tokenizer(
    tmp_path, compose_cfg, experiment, format
):
    """A few steps of each stage, on TRL's conversational records and a transformers-written tokenizer
    directory: the tasks take the batches as they are (same keys as text records')."""
    _chatml(tmp_path / "tok", template=CHATML_GENERATION)
    path = write_jsonl(tmp_path / "chat.jsonl", _records_for(format, 40))
    cfg = compose_cfg(
        f"experiment={experiment}",
        "model=llama_nano",
        *TINY,
        "model.n_kv_head=1",
        "model.d_ff=64",
        "model.block_size=128",
        "data.source=jsonl",
        f"data.path={path}",
        f"data.tokenizer_path={tmp_path / 'tok'}",
        "data.pool=all",
        "data.max_prompt_length=96",
        "data.val_fraction=0.2",
        "data.test_fraction=0.2",
        "trainer.max_steps=3" if experiment == "gpt_sft" else "debug=fdr",
        *([] if experiment == "gpt_reward" else ["task.max_new_tokens=4"]),
    )
    metrics = train(cfg).metrics
    assert metrics and all(math.isfinite(v) for v in metrics.values()), metrics
    if experiment == "gpt_sft":
        assert metrics["train/loss"] > 0, metrics
