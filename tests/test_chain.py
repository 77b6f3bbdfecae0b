"""The InstructGPT chain (lit-instructgpt): stages feeding each other, refusals before any stage runs, resume."""

from __future__ import annotations

import csv
import json
import logging
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf
from test_lifecycle import ENDLESS, _stop_after_steps, _train_steps

from lit_transformers.instructgpt import chain
from lit_transformers.text.instructions import judge
from lit_transformers.train import train

from conftest import REPO, assert_user_error, cli_env
from test_instructgpt import TINY, TINY_DATA, TINY_TASK


def _chain_config(*overrides: str) -> DictConfig:
    """The chain's config as lit-instructgpt composes it, without Hydra's own keys."""
    GlobalHydra.instance().clear()
    with initialize_config_module("lit_transformers.conf", version_base="1.3"):
        return compose("instructgpt", overrides=list(overrides))


def _tiny_chain(run_dir, stages: list[str], cache_dir, *chain_overrides: str):
    """The chain's config at tiny sizes: two steps a stage, writing into ``run_dir``; the model shape is the chain's
    (at its own block size), which pretrain builds and the later stages take from their parent."""
    shape = [o for o in TINY if o.startswith("model.") and not o.startswith("model.block_size")]
    cfg = _chain_config(*shape, *chain_overrides)
    cfg.run_dir = str(run_dir)
    cfg.stages = stages
    cfg.label.max_new_tokens = 4
    cfg.common = [
        *(o for o in TINY if not o.startswith("model.")),
        f"paths.cache_dir={cache_dir}",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
    ]
    cfg.stage_configs.pretrain = [*cfg.stage_configs.pretrain, "data.vocab_size=300"]
    for stage in ("sft", "label", "reward", "ppo", "dpo"):
        cfg.stage_configs[stage] = [*cfg.stage_configs[stage], "data.n_examples=120"]
        if stage in ("sft", "ppo", "dpo"):
            cfg.stage_configs[stage].append("task.max_new_tokens=4")
    return cfg


def test_chain_runs_every_stage_feeds_the_next_and_resumes(tmp_path, cache_dir, capsys):
    cfg = _tiny_chain(
        tmp_path / "run",
        ["pretrain", "sft", "label", "reward", "ppo", "dpo"],
        cache_dir,
        "data.kinds=[sort,last]",
    )
    summary = chain(cfg)
    for stage in (
        "sft",
        "label",
        "reward",
        "ppo",
        "dpo",
    ):  # the chain's data keys reach every instruction stage
        kinds = OmegaConf.load(tmp_path / "run" / stage / "config_resolved.yaml").data.kinds
        assert kinds == ["sort", "last"], stage
    assert list(summary) == ["pretrain", "sft", "label", "reward", "ppo", "dpo"]
    assert {"judge_score", "judge_exact"} <= set(summary["sft"]) and "accuracy" in summary["reward"]
    # the judge ranked the SFT policy's samples: every pair prefers the better verdict; RM and DPO train on them
    comparisons = tmp_path / "run" / "label" / "comparisons.jsonl"
    pairs = [json.loads(line) for line in comparisons.read_text().splitlines()]
    assert len(pairs) == summary["label"]["pairs"] and {p["split"] for p in pairs} == {"train", "val", "test"}
    assert all(judge(p["chosen"], p["answer"])[1] > judge(p["rejected"], p["answer"])[1] for p in pairs)
    for stage in ("reward", "dpo"):
        data = OmegaConf.load(tmp_path / "run" / stage / "config_resolved.yaml").data
        assert data.source == "jsonl" and data.path == str(comparisons)
    assert {"rm_score", "kl", "judge_score"} <= set(summary["ppo"])
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
    ppo_config = OmegaConf.load(tmp_path / "run" / "ppo" / "config_resolved.yaml")
    sft_ckpt = str(
        tmp_path / "run" / json.loads((tmp_path / "run" / "sft" / "stage.json").read_text())["checkpoint"]
    )
    assert ppo_config.init_from.policy == sft_ckpt and ppo_config.data.tokenizer_path == sft_ckpt
    # every stage has pretrain's model: the chain's block size, the tiny shape given to pretrain alone
    for stage in ("sft", "reward", "ppo", "dpo"):
        model = OmegaConf.load(tmp_path / "run" / stage / "config_resolved.yaml").model
        assert (model.block_size, model.n_layer, model.d_model) == (64, 1, 32), stage
    assert "reward" in ppo_config.init_from.reward
    # resume after an unfinished ppo: finished stages are skipped, ppo runs again in a fresh folder
    (tmp_path / "run" / "ppo" / "stage.json").unlink()
    cfg.stages = ["pretrain", "sft", "label", "reward", "ppo"]
    again = chain(cfg)
    assert again["sft"] == summary["sft"] and "ppo" in again and "dpo" not in again
    assert len(list((tmp_path / "run").glob("ppo.incomplete-*"))) == 1
    assert "ppo judge_score" in capsys.readouterr().out  # the printed table


def test_the_chains_lora_reaches_every_stage_after_pretrain_that_trains(tmp_path, cache_dir):
    cfg = _tiny_chain(tmp_path / "run", ["pretrain", "sft", "dpo"], cache_dir, "lora={r: 2, alpha: 4}")
    chain(cfg)
    for stage, lora in (("pretrain", None), ("sft", {"r": 2, "alpha": 4}), ("dpo", {"r": 2, "alpha": 4})):
        config = OmegaConf.load(tmp_path / "run" / stage / "config_resolved.yaml")
        assert (OmegaConf.to_container(config.task.lora) if config.task.lora else None) == lora, stage
    sft = json.loads((tmp_path / "run" / "sft" / "stage.json").read_text())["checkpoint"]
    weights = torch.load(tmp_path / "run" / sft, map_location="cpu", weights_only=False)["state_dict"]
    assert any("lora_A" in key for key in weights)  # adapters trained, from pretrain's frozen weights


@pytest.mark.parametrize(
    "value",
    [None, True, 64, 1e-5, float("inf"), "rmsnorm", "val/judge_exact", "/tmp/a-b/c.ckpt", "true", "1", "a b", "x,y",
     'say "hi"', ["sort", "last"], {"r": 16, "alpha": 32, "target_modules": ["attn.qkv", "mlp fc"]},
     {"type": "linear", "factor": 2.0}],
)  # fmt: skip
def test_overrides_written_for_stages_read_back_as_their_value_in_hydras_grammar(value):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from lit_transformers.utils.config import as_override

    parsed = OverridesParser.create().parse_override(f"key={as_override(value)}").value()
    assert parsed == value and type(parsed) is type(value)


def test_chain_feeds_on_the_checkpoint_judged_best_not_the_latest(tmp_path, cache_dir):
    # two checkpoints kept, "best" by the highest val/loss: the earlier one, unless the loss rose
    cfg = _chain_config()
    cfg.run_dir = str(tmp_path / "run")
    cfg.stages = ["pretrain"]
    cfg.common = [
        *TINY,
        f"paths.cache_dir={cache_dir}",
        "data.vocab_size=300",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        "callbacks.model_checkpoint.save_top_k=2",
        "callbacks.model_checkpoint.mode=max",
        "test=false",
    ]
    chain(cfg)
    stage = tmp_path / "run" / "pretrain"
    with open(stage / "csv" / "metrics.csv") as f:
        losses = {
            int(row["step"]): float(row["val/loss"]) for row in csv.DictReader(f) if row.get("val/loss")
        }
    worst = max(losses, key=losses.get) + 1  # the CSV's step of a validation is the checkpoint's step - 1
    expected = stage / "checkpoints" / f"step_{worst:06d}.ckpt"
    assert expected.is_file() and len(list((stage / "checkpoints").glob("step_*.ckpt"))) == 2
    stored = json.loads((stage / "stage.json").read_text())["checkpoint"]
    assert stored == str(
        expected.relative_to(tmp_path / "run")
    )  # relative to run_dir: valid from any directory


def test_chain_resumes_from_another_directory(tmp_path, cache_dir, monkeypatch):
    # started with a relative run_dir in a clone, continued from elsewhere with the run folder's absolute path
    clone, elsewhere = tmp_path / "clone", tmp_path / "elsewhere"
    clone.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(clone)
    chain(_tiny_chain("logs/x", ["pretrain", "sft", "label"], cache_dir))
    monkeypatch.chdir(elsewhere)
    run = clone / "logs" / "x"
    summary = chain(_tiny_chain(run, ["pretrain", "sft", "label", "reward"], cache_dir))
    assert list(summary) == ["pretrain", "sft", "label", "reward"]
    reward_config = OmegaConf.load(run / "reward" / "config_resolved.yaml")
    assert Path(reward_config.data.path) == run / "label" / "comparisons.jsonl"
    assert [Path(reward_config.init_from)] == list((run / "sft" / "checkpoints").glob("step_*.ckpt"))
    assert not (elsewhere / "logs").exists()


def test_label_stage_samples_the_trained_sft_policy_without_a_random_weights_warning(
    tmp_path, cache_dir, caplog
):
    with caplog.at_level(logging.WARNING, logger="lit_transformers"):
        chain(_tiny_chain(tmp_path / "run", ["pretrain", "sft", "label"], cache_dir))
    assert (tmp_path / "run" / "label" / "comparisons.jsonl").is_file()
    assert "random weights" not in caplog.text


def test_a_stage_trained_without_its_parent_says_it_starts_from_random_weights(compose_cfg, caplog):
    # the chain refuses that (below); a stage run on its own may, and says so
    with caplog.at_level(logging.WARNING, logger="lit_transformers"):
        train(compose_cfg("experiment=gpt_sft", *TINY, *TINY_DATA, *TINY_TASK, "debug=fdr"))
    assert "SFTTask starts from random weights" in caplog.text


def test_a_finished_stage_whose_file_is_gone_is_refused_naming_what_to_delete(tmp_path, cache_dir):
    # e.g. a stage.json of an older version, its path relative to the directory the chain was started in
    marker = tmp_path / "run" / "label" / "stage.json"
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"comparisons": "logs/x/label/comparisons.jsonl", "test": {}}))
    cfg = _tiny_chain(tmp_path / "run", ["label"], cache_dir)
    missing = tmp_path / "run" / "logs" / "x" / "label" / "comparisons.jsonl"
    assert_user_error(lambda: chain(cfg), str(missing), f"delete {marker}")


def test_a_stage_without_a_source_for_its_model_is_refused_before_any_stage_runs(tmp_path, cache_dir):
    run = tmp_path / "run"
    assert_user_error(
        lambda: chain(_tiny_chain(run, ["pretrain", "ppo"], cache_dir)),
        "Chain stage ppo starts from the SFT policy (init_from.policy) and the reward model (init_from.reward)",
        "put sft and reward before ppo in stages, e.g. 'stages=[pretrain,sft,reward,ppo]'",
        """stage_configs.ppo=["experiment=gpt_ppo",""",
        """"+init_from.policy=<sft.ckpt>","+init_from.reward=<reward.ckpt>"]""",
    )
    assert not run.exists()  # pretrain did not run first
    assert_user_error(
        lambda: chain(_tiny_chain(run, ["sft", "label"], cache_dir)),
        "Chain stage sft starts from the pretrained GPT (init_from)",
        "'stages=[pretrain,sft,label]'",
        """"init_from=<pretrain.ckpt>"]""",
    )
    cfg = _tiny_chain(run, ["sft"], cache_dir)
    cfg.stage_configs.sft.append(f"init_from={tmp_path / 'gone.ckpt'}")
    assert_user_error(lambda: chain(cfg), f"init_from model {tmp_path / 'gone.ckpt'} not found")
    assert not run.exists()


def test_a_stage_given_its_parent_checkpoint_takes_the_parents_model_config_and_tokenizer(
    tmp_path, cache_dir, tiny_lm_run
):
    parent = tiny_lm_run / "checkpoints" / "last.ckpt"  # a GPT of another shape than the chain's
    cfg = _tiny_chain(tmp_path / "run", ["reward"], cache_dir)
    # its 32-token context leaves no room after the default 32-token prompts
    cfg.stage_configs.reward += [f"init_from={parent}", "data.max_prompt_length=16"]
    assert "reward" in chain(cfg)
    config = OmegaConf.load(tmp_path / "run" / "reward" / "config_resolved.yaml")
    saved = torch.load(parent, weights_only=True)["hyper_parameters"]["model"]
    shape = ("block_size", "n_layer", "d_model")
    assert [config.model[k] for k in shape] == [saved[k] for k in shape] != [64, 1, 32]
    assert config.data.max_length == saved["block_size"] and config.data.tokenizer_path == str(parent)


def test_init_from_a_checkpoint_of_another_model_config_names_the_overrides(compose_cfg, tiny_lm_run):
    parent = (
        tiny_lm_run / "checkpoints" / "last.ckpt"
    )  # 1 layer, 32 wide, 32 tokens; gpt_sft's GPT-nano is not
    cfg = compose_cfg(
        "experiment=gpt_sft", f"init_from={parent}", f"data.tokenizer_path={parent}", *TINY_DATA, "debug=fdr"
    )
    assert_user_error(
        lambda: train(cfg),
        f"init_from={parent} was trained with another model config",
        "(model.block_size=128, model.n_layer=4, model.n_head=4, model.d_model=128)",
        "add model.block_size=32 model.n_layer=1 model.n_head=2 model.d_model=32",
    )


@pytest.mark.cli
def test_a_signal_during_a_stage_prints_the_resume_command_and_a_rerun_resumes_the_stage(tmp_path, cache_dir):
    run, logs = tmp_path / "run", tmp_path / "log"
    common = [*ENDLESS, f"paths.cache_dir={cache_dir}"]
    arguments = [
        "stages=[pretrain]",
        "stage_configs.pretrain=[]",
        f"common=[{','.join(json.dumps(o) for o in common)}]",
        f"run_dir={run}",
    ]
    command = [sys.executable, "-m", "lit_transformers.instructgpt", *arguments]
    with open(logs.with_suffix(".out"), "w") as out, open(logs.with_suffix(".err"), "w") as err:
        process = subprocess.Popen(command, cwd=REPO, env=cli_env(), stdout=out, stderr=err)
    assert _stop_after_steps(process, run / "pretrain" / "csv", signal.SIGTERM) == 143
    stderr = logs.with_suffix(".err").read_text()
    last = run / "pretrain" / "checkpoints" / "last.ckpt"
    assert "Stopped by SIGTERM after step" in stderr and f"saved {last}" in stderr, stderr[-3000:]
    resume = shlex.split(stderr.split("Resume with:\n", 1)[1].splitlines()[0])
    assert resume == ["python", *command[1:]]  # the same chain in the same run_dir
    stopped_at = torch.load(last, weights_only=True)["global_step"]

    # rerun (two steps further): the stage continues from its last.ckpt, in its folder, keeping the metrics before
    cfg = _tiny_chain(run, ["pretrain"], cache_dir)
    cfg.stage_configs.pretrain, cfg.common = [], [*common, f"trainer.max_steps={stopped_at + 2}"]
    chain(cfg)
    metrics = run / "pretrain" / "csv"
    assert _train_steps(metrics / "metrics.csv") == list(range(stopped_at))
    assert _train_steps(metrics / "resume_1" / "metrics.csv") == [stopped_at, stopped_at + 1]
    assert (run / "pretrain" / "stage.json").is_file() and not (
        run / "pretrain" / "interrupted.json"
    ).exists()
    assert not list(tmp_path.glob("run/pretrain.incomplete-*"))


# ---- the chain's model: a preset, or a Hugging Face decoder --------------------------------------------

TRAINED_STAGES = ("pretrain", "sft", "reward", "ppo", "dpo")


def _stage_models(run) -> dict[str, dict]:
    """The model config each trained stage's best checkpoint was built with, by stage."""
    models = {}
    for stage in TRAINED_STAGES:
        if (run / stage / "stage.json").is_file():
            checkpoint = run / json.loads((run / stage / "stage.json").read_text())["checkpoint"]
            models[stage] = torch.load(checkpoint, weights_only=True)["hyper_parameters"]["model"]
    return models


def test_the_chain_on_the_llama_preset_builds_the_llama_layout_in_every_stage(tmp_path, cache_dir):
    stages = ["pretrain", "sft", "label", "reward", "ppo", "dpo"]
    llama = ["model=llama_nano", "model.n_kv_head=1", "model.d_ff=48"]  # multi-query at the tiny shape
    summary = chain(_tiny_chain(tmp_path / "run", stages, cache_dir, *llama))
    assert list(summary) == stages
    preset = OmegaConf.load(REPO / "lit_transformers" / "conf" / "model" / "llama_nano.yaml")
    layout = ("norm", "gated_mlp", "activation", "position", "bias", "tie_embeddings")
    models = _stage_models(tmp_path / "run")
    assert list(models) == list(TRAINED_STAGES)
    for stage, model in models.items():
        assert [model[k] for k in layout] == [preset[k] for k in layout], stage
        assert (model["n_kv_head"], model["d_ff"], model["n_layer"], model["d_model"]) == (1, 48, 1, 32), (
            stage
        )
        assert model["block_size"] == 64, stage  # the chain's context, not the preset's 128


def test_the_chain_starts_from_a_hugging_face_decoder_and_its_tokenizer_without_pretrain(
    tmp_path, cache_dir, caplog
):
    transformers = pytest.importorskip("transformers")
    from test_hub_stages import _hub_model

    from test_hub_tokenizers import _llama3

    hub_dir = tmp_path / "hub"
    tokenizer = _llama3(hub_dir)
    _hub_model(tokenizer).save_pretrained(hub_dir)
    hf = transformers.AutoConfig.from_pretrained(hub_dir)
    run = tmp_path / "run"
    cfg = _tiny_chain(run, ["sft", "label", "reward", "ppo"], cache_dir, f"init_from_hf={hub_dir}")
    with caplog.at_level(logging.INFO, logger="lit_transformers"):
        assert list(chain(cfg)) == ["sft", "label", "reward", "ppo"]
    assert f"init_from_hf: loaded the GPT in {hub_dir}" in caplog.text
    sft = OmegaConf.load(run / "sft" / "config_resolved.yaml")
    assert sft.task.init_from_hf == str(hub_dir) and sft.data.tokenizer_path == str(hub_dir)
    assert sft.data.max_length == 64  # the chain's block size sizes the first stage's data
    # every stage holds the directory's architecture (not the chain's GPT-nano) and its tokenizer's vocabulary
    models = _stage_models(run)
    assert list(models) == ["sft", "reward", "ppo"]
    for stage, model in models.items():
        shape = [model[k] for k in ("n_layer", "n_head", "n_kv_head", "d_model", "d_ff", "block_size")]
        assert shape == [
            hf.num_hidden_layers,
            hf.num_attention_heads,
            hf.num_key_value_heads,
            hf.hidden_size,
            hf.intermediate_size,
            hf.max_position_embeddings,
        ], stage
        assert (model["norm"], model["vocab_size"]) == ("rmsnorm", len(tokenizer)), stage


def test_init_from_hf_is_refused_where_the_first_stage_cannot_start_from_it(tmp_path, cache_dir):
    run = tmp_path / "run"
    gone = tmp_path / "no_such_model"
    cfg = _tiny_chain(run, ["sft", "label"], cache_dir, f"init_from_hf={gone}")
    assert_user_error(lambda: chain(cfg), f"init_from_hf={gone} is not a directory")
    cfg = _tiny_chain(run, ["label", "reward"], cache_dir, f"init_from_hf={tmp_path}")
    assert_user_error(
        lambda: chain(cfg), "label samples a trained SFT checkpoint", "'stages=[sft,label,reward,ppo]'"
    )
    assert not run.exists()
