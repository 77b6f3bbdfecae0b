"""The inference and utility commands as a user runs them (the installed command's function, given its argv, in this
process): what each one's --help says, which checkpoints lit-generate takes, and one-paragraph errors for its bad
settings. (lit-translate's own: tests/test_translation.py; lit-train in a fresh process: tests/test_train.py.)"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from lit_transformers.generate import continuations
from lit_transformers.tasks import CausalLMTask, DPOTask, PPOTask, RewardTask, SFTTask

from conftest import assert_short_error, assert_user_error, run_main

PROMPTS = ["The for statement", "def"]
SAMPLING = [f"prompts=[{','.join(PROMPTS)}]", "max_new_tokens=8", "temperature=0.8", "top_k=50", "seed=0"]


@pytest.fixture(scope="module")
def stage_checkpoints(tiny_lm_run, tmp_path_factory) -> dict[str, Path]:
    """A checkpoint of each InstructGPT task (state dict, hyperparameters, task class: what train.py's checkpoints
    hold), started from the tiny GPT by the task's own init_from. The PPO and DPO references are perturbed, so a
    command that read them instead of the policy would print other text."""
    gpt = str(tiny_lm_run / "checkpoints" / "last.ckpt")
    saved = torch.load(gpt, weights_only=True)["hyper_parameters"]
    args = {"model": saved["model"], "optimizer": saved["optimizer"], "tokenizer": saved["tokenizer"]}
    tasks = {
        "sft": SFTTask(**args, init_from=gpt),
        "ppo": PPOTask(**args, init_from={"policy": gpt, "reward": gpt}),
        "dpo": DPOTask(**args, init_from=gpt),
        "reward": RewardTask(**args, init_from=gpt),
    }
    folder = tmp_path_factory.mktemp("stage_checkpoints")
    for name, task in tasks.items():
        task.configure_model()
        for parameter in task.reference.parameters() if hasattr(task, "reference") else ():
            parameter.data.add_(torch.randn_like(parameter))
        checkpoint = {"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams)}
        task.on_save_checkpoint(checkpoint)
        torch.save(checkpoint, folder / f"{name}.ckpt")
    return {name: folder / f"{name}.ckpt" for name in tasks}


def command(name: str) -> Callable[[], object]:
    """The function that the installed command ``name`` runs (pyproject.toml's [project.scripts])."""
    (entry_point,) = entry_points(group="console_scripts", name=name)
    return entry_point.load()


def _generate_config(*overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_module("lit_transformers.conf", version_base="1.3"):
        return compose("generate", overrides=list(overrides))


def test_lit_generate_continues_with_the_policy_of_sft_ppo_and_dpo_checkpoints(
    tiny_lm_run, stage_checkpoints
):
    """Their policy is the tiny GPT they started from, so the same seed gives the GPT's own text (sampled from it as
    a reloaded task samples); a reward model's checkpoint is refused, saying what it is and what to pass."""
    gpt = CausalLMTask.load_from_checkpoint(tiny_lm_run / "checkpoints" / "last.ckpt", weights_only=True)
    expected = list(zip(PROMPTS, gpt.sample(PROMPTS, 8, temperature=0.8, top_k=50, seed=0)))
    for stage in ("sft", "ppo"):
        assert continuations(_generate_config(f"ckpt={stage_checkpoints[stage]}", *SAMPLING)) == expected, (
            stage
        )
    result = run_main(command("lit-generate"), f"ckpt={stage_checkpoints['dpo']}", *SAMPLING)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = "".join(f"--- {prompt!r}\n{prompt}{text}\n\n" for prompt, text in expected)
    assert result.stdout.splitlines() == printed.splitlines()  # (a sampled \r ends a line too)
    reward = _generate_config(f"ckpt={stage_checkpoints['reward']}")
    assert_user_error(
        lambda: continuations(reward), "RewardTask", "a reward model scores text", "gpt_dpo run"
    )


def test_lit_generate_refuses_settings_that_would_print_nothing_or_fail_before_loading(tmp_path):
    """Each is named before the checkpoint is read (there is none here); a mistyped value too, in one paragraph."""
    assert_short_error(
        run_main(command("lit-generate"), f"ckpt={tmp_path / 'none.ckpt'}", "max_new_tokens=abc"),
        "max_new_tokens='abc'",
        "expected int",
    )
    for override, needle in [
        ("max_new_tokens=-3", "max_new_tokens=-3 generates nothing"),
        ("temperature=-1", "temperature=-1"),
        ("top_k=-2", "top_k=-2"),
        ("top_p=1.5", "top_p=1.5"),
        ("top_p=abc", "top_p='abc' has the wrong type: expected float"),
        ("prompts=abc", "prompts='abc' is not a list"),
    ]:
        cfg = _generate_config(f"ckpt={tmp_path / 'none.ckpt'}", override)
        assert_user_error(lambda: continuations(cfg), needle)  # noqa: B023 - called at once


@pytest.mark.parametrize(
    "name, needles",
    [
        (
            "lit-translate",
            ["lit-translate ckpt=<run>/checkpoints/last.ckpt", "printed as an empty line", "beam: 4"],
        ),
        ("lit-generate", ["lit-generate ckpt=<run>/checkpoints/last.ckpt", "gpt_ppo", "max_new_tokens: 100"]),
        (
            "lit-prepare",
            ["lit-prepare data.shards_dir=<folder>", "data.prepare_workers", "prepare_workers: 2"],
        ),
        (
            "lit-instructgpt",
            ["lit-instructgpt run_dir=logs/igpt", "stage_configs.X", "samples_per_prompt: 4"],
        ),
    ],
)
def test_each_command_help_says_what_it_takes(name, needles):
    """Its examples, keys and defaults; not the training config groups, which it does not take."""
    result = run_main(command(name), "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Configuration groups" not in result.stdout and "experiment:" not in result.stdout, result.stdout
    for needle in needles:
        assert needle in result.stdout, (needle, result.stdout)
