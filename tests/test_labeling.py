"""The label stage on TRL's conversational records: a random tiny Llama and a Llama-3-style tokenizer with a chat
template, both written by ``transformers``, go SFT (on ``messages``) -> label -> reward model. The policy is asked
each conversation before its last assistant turn, as ``apply_chat_template(..., add_generation_prompt=True)``
renders it; the pairs come back as conversational ``prompt``/``chosen``/``rejected``, which the reward stage reads
with the same prompt ids."""

import json

import pytest
import torch
from hydra.utils import instantiate
from test_hub_stages import STAGE, _parent_model
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from lit_transformers import labeling
from lit_transformers.labeling import label_comparisons
from lit_transformers.text.instructions import judge, make_examples
from lit_transformers.train import train

from conftest import compose_train_cfg
from test_hub_tokenizers import LLAMA3, LLAMA3_TEMPLATE, _save

transformers = pytest.importorskip("transformers")
WORDS = ["oak", "elm", "ash", "fir", "yew", "bay", "box", "fig"]
SYSTEM = {"role": "system", "content": "Answer with the words only."}


def _conversations(examples: list[dict]) -> tuple[list[dict], list[dict]]:
    """The examples as ``messages`` records (every third after an earlier exchange: the policy answers the
    last turn) and as conversational ``prompt``/``completion`` records, each with its ``answer``."""
    messages, prompt_completion = [], []
    for i, example in enumerate(examples):
        user = {"role": "user", "content": example["prompt"]}
        reply = {"role": "assistant", "content": example["completion"]}
        earlier = examples[i - 1]
        history = [
            {"role": "user", "content": earlier["prompt"]},
            {"role": "assistant", "content": earlier["completion"]},
        ]
        turns = [SYSTEM, *(history if i % 3 == 0 else []), user, reply]
        messages.append({"messages": turns, "answer": example["answer"]})
        prompt_completion.append(
            {"prompt": [SYSTEM, user], "completion": [reply], "answer": example["answer"]}
        )
    return messages, prompt_completion


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _tokenizer(directory, texts: list[str]):
    """A byte-level BPE trained on ``texts`` with Llama-3's special tokens, BOS, template and two stop tokens,
    saved by transformers."""
    backend = HFTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500, special_tokens=LLAMA3, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(texts, trainer=trainer)
    backend.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)]
    )
    return _save(
        directory,
        backend,
        ["<|end_of_text|>", "<|eot_id|>"],
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        chat_template=LLAMA3_TEMPLATE,
    )


def _model(hf_tokenizer):
    """A random tiny LlamaForCausalLM for the tokenizer (grouped-query), with room for multi-turn prompts and a
    generation config stopping at either end-of-turn token."""
    config = transformers.LlamaConfig(
        vocab_size=len(hf_tokenizer), hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        bos_token_id=hf_tokenizer.bos_token_id, eos_token_id=hf_tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    stops = hf_tokenizer.convert_tokens_to_ids(["<|end_of_text|>", "<|eot_id|>"])
    model.generation_config = transformers.GenerationConfig(eos_token_id=stops)  # as instruct models ship
    return model


def _hf_prompt_ids(hf_tokenizer, messages: list[dict]) -> list[int]:
    text = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return hf_tokenizer(text, add_special_tokens=False).input_ids


def _pair_prompt_ids(comparisons, hf_tokenizer) -> set[tuple[int, ...]]:
    """transformers' ids of every pair's prompt in a comparisons file."""
    pairs = [json.loads(line) for line in comparisons.read_text().splitlines()]
    return {tuple(_hf_prompt_ids(hf_tokenizer, p["prompt"])) for p in pairs}


def _asked(monkeypatch, stop_ids: list[int]) -> list[list[int]]:
    """Records the (unpadded) prompt ids of every rollout the label stage samples, and checks that it stops at
    each of ``stop_ids``."""
    asked = []

    def recording(policy, tokenizer, ids, mask, *args):
        assert sorted(tokenizer.end_of_turn_ids) == sorted(stop_ids)
        asked.extend(row[keep].tolist() for row, keep in zip(ids, mask.bool()))
        out = rollout(policy, tokenizer, ids, mask, *args)
        stops = torch.isin(out.responses, torch.tensor(tokenizer.end_of_turn_ids))
        after_stop = (stops.cumsum(dim=1) - stops.int()) > 0  # positions after a response's first stop id
        assert not (out.response_mask & after_stop).any()  # sampling ended at any end-of-turn id
        return out

    rollout = labeling.rollout
    monkeypatch.setattr(labeling, "rollout", recording)
    return asked


def test_label_stage_on_conversations_asks_with_the_template_and_writes_pairs_reward_reads(
    tmp_path, cache_dir, monkeypatch
):
    examples = make_examples(WORDS, 80, ["reverse", "sort"], seed=0)
    messages, prompt_completion = _conversations(examples)
    hub = tmp_path / "hub"
    texts = [e[key] for e in examples for key in ("prompt", "completion")]
    hf_tokenizer = _tokenizer(hub, [*texts, SYSTEM["content"], "system user assistant"] * 20)
    _model(hf_tokenizer).save_pretrained(hub)
    stop_ids = hf_tokenizer.convert_tokens_to_ids(["<|end_of_text|>", "<|eot_id|>"])  # EOS and another
    sft_data = _write(tmp_path / "sft.jsonl", messages)
    jsonl = ["data.source=jsonl", "data.max_prompt_length=96", "model.block_size=128"]

    def stage(name, experiment, *overrides):
        extra = ["task.max_new_tokens=4"] if experiment != "gpt_reward" else []
        cfg = compose_train_cfg(
            f"experiment={experiment}", *STAGE, *jsonl, *extra, "test=false", *overrides,
            output_dir=tmp_path / name, cache_dir=cache_dir,
        )  # fmt: skip
        return cfg

    sft_cfg = stage(
        "sft", "gpt_sft", f"data.path={sft_data}", f"task.init_from_hf={hub}", f"data.tokenizer_path={hub}"
    )
    train(sft_cfg)
    sft = tmp_path / "sft" / "checkpoints" / "last.ckpt"
    parent = [*_parent_model(sft), f"data.tokenizer_path={sft}"]

    # the label stage as the chain runs it: the reward experiment's data, sampled with the SFT policy
    asked = _asked(monkeypatch, stop_ids)
    for data_file, name in ((sft_data, "messages"), (_write(tmp_path / "pc.jsonl", prompt_completion), "pc")):
        label_cfg = stage(f"label_{name}", "gpt_reward", f"data.path={data_file}", *parent)
        out = tmp_path / f"comparisons_{name}.jsonl"
        counts = label_comparisons(str(sft), label_cfg.data, out, 2, 1.0, 4, seed=0)
        pairs = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(pairs) == counts["pairs"] > 0
        # each record is asked the conversation before its last assistant turn (an earlier exchange included)
        records = messages if name == "messages" else prompt_completion
        answers = {
            json.dumps(r["messages"][:-1] if "messages" in r else r["prompt"]): r["answer"] for r in records
        }
        for pair in pairs:
            assert answers[json.dumps(pair["prompt"])] == pair["answer"]
            chosen, rejected = pair["chosen"], pair["rejected"]
            assert [m["role"] for m in chosen] == [m["role"] for m in rejected] == ["assistant"]
            assert (
                judge(chosen[0]["content"], pair["answer"])[1]
                > judge(rejected[0]["content"], pair["answer"])[1]
            )
        # every prompt the policy sampled from is transformers' rendering with the generation prompt
        assert {tuple(ids) for ids in asked} == _pair_prompt_ids(out, hf_tokenizer)
        multi_turn = any(len(p["prompt"]) == 4 for p in pairs)  # system, user, assistant, user
        assert multi_turn == (name == "messages")
        asked.clear()

    comparisons = tmp_path / "comparisons_messages.jsonl"
    reward_overrides = [f"data.path={comparisons}", "data.pool=all", f"init_from={sft}", *parent]
    reward_cfg = stage("reward", "gpt_reward", *reward_overrides)
    data = instantiate(reward_cfg.data, _convert_="all")
    data.setup()
    read_back = {tuple(item["prompt"]) for part in data.datasets.values() for item in part}
    assert read_back == _pair_prompt_ids(comparisons, hf_tokenizer)  # the reward model sees what was sampled
    train(reward_cfg)
    assert (tmp_path / "reward" / "checkpoints" / "last.ckpt").is_file()
