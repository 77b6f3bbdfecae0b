"""Reproducible runs: every stage of the InstructGPT chain trains bit-identically twice with the same seed (no
``trainer.deterministic`` needed on CPU), and validating (with its sample tables and generated text) never changes what a
run trains."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch
from test_chain import _tiny_chain

from lit_transformers.instructgpt import chain

CHAIN = ["pretrain", "sft", "label", "reward", "ppo", "grpo", "dpo"]
TRAINED = [stage for stage in CHAIN if stage != "label"]
PPO_STEPS_PER_ITERATION = 4  # the tiny PPO's optimizer steps per batch of prompts (epochs x minibatches)


def _run_chain(run_dir: Path, cache_dir: Path, stages: list[str], *common: str, **stage_extras: list[str]):
    """The tiny chain (tests/test_chain.py) on ``stages`` with the default ``trainer.deterministic=false``,
    validated every 2 of its 4 steps unless ``common`` says otherwise; ``stage_extras``: more overrides of one
    stage."""
    cfg = _tiny_chain(run_dir, stages, cache_dir)
    cfg.common = [*cfg.common, "trainer.max_steps=4", *common]
    for stage, extras in stage_extras.items():
        cfg.stage_configs[stage] = [*cfg.stage_configs[stage], *extras]
    return chain(cfg)


@pytest.fixture(scope="module")
def tiny_chain_run(tmp_path_factory, cache_dir) -> Path:
    """The run folder of one tiny chain through every stage. Shared by the module: read it, never change it."""
    run_dir = tmp_path_factory.mktemp("reproducible") / "run"
    _run_chain(run_dir, cache_dir, CHAIN)
    return run_dir


def _best_weights(run_dir: Path, stage: str) -> tuple[str, dict[str, torch.Tensor]]:
    """The checkpoint a stage handed to the next (its stage.json), by name, and its state_dict."""
    checkpoint = run_dir / json.loads((run_dir / stage / "stage.json").read_text())["checkpoint"]
    return checkpoint.name, torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]


def _final_weights(stage_dir: Path) -> dict[str, torch.Tensor]:
    """A stage's weights after its last step, without the best-metric trackers that its validations set."""
    state = torch.load(stage_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    return {key: value for key, value in state["state_dict"].items() if "_best." not in key}


def _validated_steps(stage_dir: Path) -> set[int]:
    """The steps at which a stage logged validation metrics."""
    with open(stage_dir / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    return {int(row["step"]) for row in rows if any(k.startswith("val/") and v for k, v in row.items())}


def _unequal(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> list[str]:
    assert first.keys() == second.keys()
    return [key for key in first if not torch.equal(first[key], second[key])]


def test_every_chain_stage_trains_bit_identically_when_run_again(tiny_chain_run, tmp_path, cache_dir):
    summary = _run_chain(tmp_path / "run", cache_dir, CHAIN)
    assert summary == json.loads((tiny_chain_run / "summary.json").read_text())
    comparisons = Path("label", "comparisons.jsonl")
    assert (tmp_path / "run" / comparisons).read_bytes() == (tiny_chain_run / comparisons).read_bytes()
    for stage in TRAINED:
        (name, first), (name_again, again) = (
            _best_weights(run, stage) for run in (tiny_chain_run, tmp_path / "run")
        )
        assert name == name_again, stage
        assert not _unequal(first, again), stage


def test_validation_and_its_samples_leave_pretraining_unchanged(tmp_path, cache_dir):
    # dropout is on in pretraining: a validation that drew from the global random stream moved every later mask
    # validated after every step, with text samples (callbacks.text_samples), or once at the end without them
    _run_chain(tmp_path / "often", cache_dir, ["pretrain"], "trainer.val_check_interval=1")
    no_samples = ["callbacks.text_samples=null"]
    _run_chain(
        tmp_path / "once", cache_dir, ["pretrain"], "trainer.val_check_interval=4", pretrain=no_samples
    )
    assert len(_validated_steps(tmp_path / "often" / "pretrain")) == 4
    often, once = (_final_weights(tmp_path / run / "pretrain") for run in ("often", "once"))
    assert not _unequal(often, once)


def test_validation_and_its_sample_tables_leave_ppo_unchanged(tiny_chain_run, tmp_path, cache_dir):
    # PPO samples its rollouts from the global random stream; its validations judge greedy responses into tables
    stages = CHAIN[: CHAIN.index("ppo") + 1]
    steps = f"trainer.max_steps={2 * PPO_STEPS_PER_ITERATION}"  # two iterations: a validation between them
    for run, interval in (("often", 1), ("once", 2)):
        shutil.copytree(tiny_chain_run, tmp_path / run, ignore=shutil.ignore_patterns("ppo", "grpo", "dpo"))
        _run_chain(tmp_path / run, cache_dir, stages, steps, f"trainer.val_check_interval={interval}")
    assert len(_validated_steps(tmp_path / "often" / "ppo")) == 2  # the first iteration's end was validated
    often, once = (_final_weights(tmp_path / run / "ppo") for run in ("often", "once"))
    assert not _unequal(often, once)


def test_learned_position_gradients_are_identical_run_after_run():
    """The RL stages and the reward model train through explicit position ids (``padded_forward``): summing the
    gradient of a repeated position in a thread-dependent order (indexing's accumulating backward) made two runs
    of one chain command differ from their first steps; F.embedding's backward sums in a fixed order."""
    from lit_transformers.nn.positions import LearnedPositions

    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))
    try:
        torch.manual_seed(0)
        positions = LearnedPositions(64, 128)
        position_ids = torch.arange(40).expand(64, 40)  # every row repeats every position
        upstream = torch.randn(64, 40, 128)
        grads = []
        for _ in range(10):
            positions.zero_grad()
            (positions(position_ids) * upstream).sum().backward()
            grads.append(positions.weight.grad.clone())
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(grad, grads[0]) for grad in grads[1:])
