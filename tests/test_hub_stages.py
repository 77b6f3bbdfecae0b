"""Every GPT stage on a decoder that ``transformers`` wrote (a random tiny Llama and a Llama-3-style tokenizer with a
chat template, both ``save_pretrained``): ``init_from_hf`` for SFT, the reward model, PPO and DPO, the chain SFT ->
reward -> PPO -> DPO -> ``lit-export``, whose directory ``transformers`` generates from exactly as we do, and
``lit-generate`` on Hub directories with ``chat=true``."""

import json
import subprocess
import sys

import pytest
import torch
from test_cli_commands import _generate_config

from lit_transformers.export import main as export_entry_point
from lit_transformers.generate import continuations, language_model
from lit_transformers.tasks import CausalLMTask, DPOTask, PPOTask, RewardTask
from lit_transformers.tasks.base import as_override
from lit_transformers.tasks.instruct import rollout
from lit_transformers.text import Tokenizer, left_pad
from lit_transformers.train import train

from conftest import assert_user_error, cli_env, compose_train_cfg, run_main
from test_hub_tokenizers import _llama3, _llama3_backend, _save
from test_instructgpt import TINY, TINY_DATA

transformers = pytest.importorskip("transformers")
PROMPTS = ["Reverse the words: class value list", "Sort the words: b a"]
# the stages at test size: the model is the directory's (model.block_size sizes the data, under its 64 positions)
STAGE = [o for o in TINY if not o.startswith("model.")] + [
    "model=llama_nano",
    "model.block_size=48",
    *TINY_DATA,
]


def _hub_model(tokenizer):
    """A random tiny LlamaForCausalLM for a saved transformers ``tokenizer`` (grouped-query, every weight moved off
    its init so greedy tokens are clear winners), with the tokenizer's special ids and a generation config
    stopping at its end-of-turn tokens, as instruct models ship."""
    stops = [
        tokenizer.convert_tokens_to_ids(t) for t in ("<|end_of_text|>", "<|eot_id|>") if t in tokenizer.vocab
    ]
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.3)
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=stops
    )
    return model


def _ends_turns_early(model, hf_tokenizer) -> int:
    """Make <|end_of_text|> (the second end-of-turn id, not EOS) win wherever the token that the first prompt's
    third greedy step picks would: generation stops there, at a stop id that is not EOS. Returns that id."""
    ids = torch.tensor(_chat_ids(hf_tokenizer, PROMPTS[:1]))
    third = model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=3, eos_token_id=None
    )[0, -1]
    stop = hf_tokenizer.convert_tokens_to_ids("<|end_of_text|>")
    assert stop != hf_tokenizer.eos_token_id
    with torch.no_grad():
        model.lm_head.weight[stop] = model.lm_head.weight[third] * 1.5
    return stop


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """(directory, its transformers model, its transformers tokenizer, the stop id its greedy turns end at)."""
    directory = tmp_path_factory.mktemp("hub")
    tokenizer = _llama3(directory)
    model = _hub_model(tokenizer)
    stop = _ends_turns_early(model, tokenizer)
    model.save_pretrained(directory)
    return directory, model, tokenizer, stop


def _chat_ids(hf_tokenizer, prompts):
    """The prompts as user turns with the assistant's generation prompt, rendered and tokenized by transformers."""
    return [
        hf_tokenizer(
            hf_tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            ),
            add_special_tokens=False,
        ).input_ids
        for p in prompts
    ]


def _hf_generate(hf_model, ids, valid, **kwargs):
    return hf_model.generate(ids, attention_mask=valid.long(), do_sample=False, max_new_tokens=12, **kwargs)


# ---- init_from_hf: every stage's models are the directory's decoder -------------------------------------


def _task(cls, hub_dir, **args):
    task = cls(model={}, optimizer={}, tokenizer=Tokenizer.from_file(hub_dir).state(), **args)
    task.configure_model()
    return task


def test_reward_ppo_and_dpo_start_from_the_hub_decoder_with_new_heads(hub, caplog):
    hub_dir, hf_model, _, _ = hub
    ids = torch.randint(0, hf_model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf_model(ids).logits

    def assert_is_hub_decoder(gpt):
        with torch.no_grad():
            torch.testing.assert_close(gpt(ids), expected, atol=1e-4, rtol=0)

    with caplog.at_level("INFO"):
        reward = _task(RewardTask, hub_dir, init_from_hf=str(hub_dir))
    assert_is_hub_decoder(reward.model.body)
    assert "new: its scalar head" in caplog.text
    assert reward.hparams.init_from_hf is None and reward.hparams.model["n_kv_head"] == 2  # reloads alone
    dpo = _task(DPOTask, hub_dir, init_from_hf=str(hub_dir))
    for gpt in (dpo.policy, dpo.reference):
        assert_is_hub_decoder(gpt)
    ppo = _task(PPOTask, hub_dir, init_from_hf=str(hub_dir))
    for gpt in (ppo.policy, ppo.reference, ppo.value.body):
        assert_is_hub_decoder(gpt)
    random_reward = ppo.reward.body(ids)  # the reward model comes from a reward checkpoint (init_from.reward)
    assert not torch.allclose(random_reward, expected, atol=1e-2)
    # the mapping form, init_from's shape: the value model alone from the directory
    ppo = _task(PPOTask, hub_dir, init_from_hf={"value": str(hub_dir)})
    assert_is_hub_decoder(ppo.value.body)
    assert not torch.allclose(ppo.policy(ids), expected, atol=1e-2)
    with pytest.raises(ValueError, match="PPO's models are policy, reference, reward, value"):
        _task(PPOTask, hub_dir, init_from_hf={"critic": str(hub_dir)})
    with pytest.raises(
        ValueError, match="PPO's value would come from both task.init_from and task.init_from_hf"
    ):
        _task(PPOTask, hub_dir, init_from_hf={"value": str(hub_dir)}, init_from={"value": "value.ckpt"})


def test_a_tokenizer_larger_than_the_hub_decoders_embeddings_is_refused_naming_the_fix(hub, tmp_path):
    """Ids past the embedding matrix would index out of range at the first batch (or, padded, train rows the
    checkpoint never had): refused when the model loads, naming the checkpoint's own tokenizer as the fix."""
    hub_dir, _, hf_tokenizer, _ = hub
    small = transformers.LlamaConfig(
        vocab_size=16, hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2
    )
    transformers.LlamaForCausalLM(small).save_pretrained(tmp_path)
    assert_user_error(
        lambda: _task(CausalLMTask, hub_dir, init_from_hf=str(tmp_path)),
        f"init_from_hf={tmp_path} has 16 word embeddings but this run's tokenizer has {len(hf_tokenizer)} tokens",
        f"set data.tokenizer_path={tmp_path}",
    )


# ---- the chain on a Hub decoder, exported back ---------------------------------------------------------


def _stage(tmp_path, cache_dir, name: str, experiment: str, *overrides: str):
    """Train one stage into tmp_path/name; its last checkpoint."""
    extra = ["task.max_new_tokens=4"] if experiment != "gpt_reward" else []
    cfg = compose_train_cfg(
        f"experiment={experiment}", *STAGE, *extra, "test=false", *overrides,
        output_dir=tmp_path / name, cache_dir=cache_dir,
    )  # fmt: skip
    train(cfg)
    return tmp_path / name / "checkpoints" / "last.ckpt"


def _parent_model(checkpoint) -> list[str]:
    """The model config overrides of the stage a checkpoint comes from (as lit-instructgpt passes them)."""
    model = torch.load(checkpoint, weights_only=True)["hyper_parameters"]["model"]
    return [f"model.{k}={as_override(v)}" for k, v in model.items() if not k.startswith("_")]


def test_a_hub_decoder_goes_sft_reward_ppo_dpo_and_exports_what_transformers_generates_alike(
    hub, tmp_path, cache_dir
):
    hub_dir, _, _, _ = hub
    sft = _stage(
        tmp_path,
        cache_dir,
        "sft",
        "gpt_sft",
        f"task.init_from_hf={hub_dir}",
        f"data.tokenizer_path={hub_dir}",
        "model.activation_checkpointing=true",  # kept beside the directory's architecture, and by every stage
    )
    parent = [*_parent_model(sft), f"data.tokenizer_path={sft}"]
    assert {"model.n_kv_head=2", "model.norm=rmsnorm", "model.activation_checkpointing=true"} <= set(parent)
    reward = _stage(tmp_path, cache_dir, "reward", "gpt_reward", f"init_from={sft}", *parent)
    _stage(
        tmp_path,
        cache_dir,
        "ppo",
        "gpt_ppo",
        f"+init_from.policy={sft}",
        f"+init_from.reward={reward}",
        *parent,
    )
    dpo = _stage(tmp_path, cache_dir, "dpo", "gpt_dpo", f"init_from={sft}", *parent)

    out = tmp_path / "exported"
    command = [sys.executable, "-m", "lit_transformers.export", f"ckpt={dpo}", f"out={out}"]
    result = subprocess.run(command, cwd=tmp_path, env=cli_env(), capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    ours = language_model(str(dpo))
    tokenizer = ours.tokenizer
    generation = json.loads((out / "generation_config.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert generation["eos_token_id"] == tokenizer.end_of_turn_ids and len(tokenizer.end_of_turn_ids) == 2
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (
        tokenizer.bos_id,
        tokenizer.eos_id,
        tokenizer.pad_id,
    )

    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    prompts = _chat_ids(hf_tokenizer, PROMPTS)
    ids, valid = left_pad(prompts, tokenizer.pad_id)
    expected = _hf_generate(hf_model, ids, valid)  # its generation_config: stop at either end-of-turn id
    sampled = rollout(
        ours.model, tokenizer, ids, valid, max_new_tokens=12
    )  # PPO's and DPO's sampling, greedy
    assert torch.equal(sampled.sequences, expected)


# ---- lit-generate on Hub directories ---------------------------------------------------------------------


def test_lit_generate_chats_with_a_hub_directory_as_transformers_generate(hub):
    hub_dir, hf_model, hf_tokenizer, stop = hub
    settings = ["chat=true", "temperature=0", "max_new_tokens=12", f"prompts=[{','.join(PROMPTS)}]"]
    texts = [text for _, text in continuations(_generate_config(f"ckpt={hub_dir}", *settings))]
    ours = language_model(str(hub_dir))
    tokenizer = ours.tokenizer
    prompts = _chat_ids(hf_tokenizer, PROMPTS)
    assert ours.encode_prompts(PROMPTS, chat=True) == prompts  # no BOS of ours before the template's
    ids, valid = left_pad(prompts, tokenizer.pad_id)
    stops = tokenizer.end_of_turn_ids
    expected = _hf_generate(hf_model, ids, valid, eos_token_id=stops, pad_token_id=tokenizer.pad_id)
    ended = expected[0, ids.size(1) :].tolist()
    assert (
        stop != tokenizer.eos_id and stop in ended
    )  # a turn ended at <|end_of_text|>, a stop id besides EOS
    assert texts == [tokenizer.decode(row[ids.size(1) :].tolist()) for row in expected]


def test_lit_generate_refuses_chat_without_a_chat_template(tmp_path):
    tokenizer = _save(tmp_path, _llama3_backend(), bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    _hub_model(tokenizer).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="chat=true but the tokenizer of ckpt=.* has no chat_template"):
        continuations(_generate_config(f"ckpt={tmp_path}", "chat=true"))


def test_lit_export_help_says_what_it_takes():
    # in this process (the command as a fresh process: lit-export of the chain's DPO stage, above)
    result = run_main(export_entry_point, "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    for needle in (
        "lit-export ckpt=<run>/checkpoints/last.ckpt out=exported/",
        "generation_config.json",
        "out: ???",
    ):
        assert needle in result.stdout, result.stdout
