"""The command line end to end: composition, every experiment, resume, loggers, bad config, trainer configs."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
import torch
from hydra.utils import get_class, instantiate
from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.strategies import SingleDeviceStrategy
from omegaconf import OmegaConf

from lit_transformers.generate import main as generate_entry_point
from lit_transformers.tasks import CausalLMTask
from lit_transformers.text import Tokenizer
from lit_transformers.train import train
from lit_transformers.utils.checkpoint_io import AtomicCheckpointIO
from lit_transformers.utils.config import ConfigError, check_required, check_types, instantiate_group

from conftest import (
    EXPERIMENTS,
    LM_EXPERIMENTS,
    TINY_LM,
    assert_short_error,
    assert_user_error,
    run_cli,
    run_main,
    train_main,
)


def _metrics(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_default_config_composes_with_every_group(compose_cfg):
    cfg = compose_cfg()
    for group in ("data", "model", "task", "callbacks", "logger", "trainer", "paths"):
        assert group in cfg, group
    assert cfg.data.block_size == cfg.model.block_size


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_instantiates(compose_cfg, experiment):
    cfg = compose_cfg(f"experiment={experiment}")
    check_types(cfg)
    missing = OmegaConf.missing_keys(cfg)
    if missing:  # experiments on the user's own data leave its location required
        assert all(key.startswith("data.") for key in missing), missing
        with pytest.raises(ConfigError, match="Missing required"):
            check_required(cfg)
        return
    instantiate(cfg.data, _convert_="all")
    instantiate(cfg.task, _recursive_=False, _convert_="all")
    instantiate_group(cfg.callbacks, "callbacks")
    instantiate_group(cfg.logger, "logger")


@pytest.mark.parametrize("experiment", LM_EXPERIMENTS)
def test_every_lm_experiment_runs_fast_dev_run(compose_cfg, experiment):
    cfg = compose_cfg(f"experiment={experiment}", "debug=fdr", "sample=null")
    metrics = train(cfg).metrics
    assert metrics and all(torch.isfinite(torch.tensor(v)) for v in metrics.values())


def test_tiny_run_logs_namespaced_metrics_checkpoints_and_samples(compose_cfg, tmp_path, capsys):
    metrics = train(compose_cfg(*TINY_LM, "callbacks.throughput.peak_flops=1e9")).metrics
    rows = _metrics(tmp_path)
    logged = {k for row in rows for k, v in row.items() if v}
    for key in (
        "train/loss",
        "train/grad_norm",
        "train/tokens_per_sec",
        "train/mfu",
        "train/lr/pg1",
        "val/loss",
        "val/ppl",
        "val/loss_best",
        "test/loss",
        "test/ppl",
    ):
        assert key in logged, key
    # MFU = tokens/s x training FLOPs per token (6 per weight + attention, 12 L T d) / peak, recomputed here:
    # 1 layer of width 32 at context 32, vocabulary 300 (tied), learned positions left out
    n_weights = 300 * 32 + 12 * 32 * 32 + 13 * 32 + 2 * 32
    flops = 6 * n_weights + 12 * 1 * 32 * 32
    row = next(r for r in rows if r.get("train/mfu"))
    assert float(row["train/mfu"]) == pytest.approx(
        float(row["train/tokens_per_sec"]) * flops / 1e9, rel=1e-5
    )
    # perplexity (torchmetrics, token-weighted) is exp of the mean token loss
    assert metrics["val/ppl"] == pytest.approx(torch.tensor(metrics["val/loss"]).exp().item(), rel=1e-3)
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    # the table of the validation after step 2, at the step of its scalars (Lightning logs it at 1)
    val_steps = {r["step"] for r in rows if r.get("val/loss")}
    assert "\n1," in (tmp_path / "csv" / "val_samples.csv").read_text() and "1" in val_steps
    assert "--- sample ---" in capsys.readouterr().out
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["state_dict"]["model.tok_emb.weight"].shape[0] == 300  # the model takes the tokenizer's size
    assert Tokenizer.from_state(ckpt["hyper_parameters"]["tokenizer"]).vocab_size == 300


def test_resume_continues_step_optimizer_and_schedule(compose_cfg, tmp_path, tiny_lm_run):
    last = tiny_lm_run / "checkpoints" / "last.ckpt"
    first = torch.load(last, weights_only=False)
    assert first["global_step"] == 4
    resumed_dir = tmp_path / "resumed"
    cfg = compose_cfg(*TINY_LM, "test=false", "sample=null", "trainer.max_steps=8", f"ckpt_path={last}")
    cfg.paths.output_dir = str(resumed_dir)
    cfg.callbacks.model_checkpoint.dirpath = str(resumed_dir / "checkpoints")
    cfg.logger.csv.save_dir = str(resumed_dir)
    cfg.trainer.default_root_dir = str(resumed_dir)
    train(cfg)
    steps = [int(r["step"]) for r in _metrics(resumed_dir) if r.get("train/loss")]
    assert steps == [4, 5, 6, 7]  # continues at step 4: nothing trained twice or skipped
    final = torch.load(resumed_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert final["global_step"] == 8
    adam_steps = {float(s["step"]) for s in final["optimizer_states"][0]["state"].values()}
    assert adam_steps == {8.0}  # Adam moments carried over, not restarted
    assert final["lr_schedulers"][0]["last_epoch"] == 8
    best_before = first["state_dict"]["val_loss_best.min_value"]
    assert final["state_dict"]["val_loss_best.min_value"] <= best_before  # the best survives the resume


def test_init_from_loads_weights_and_the_child_no_longer_needs_the_parent(compose_cfg, tmp_path, tiny_lm_run):
    parent_dir = shutil.copytree(tiny_lm_run / "checkpoints", tmp_path / "parent")  # a copy, to delete below
    parent = parent_dir / "last.ckpt"
    parent_weights = torch.load(parent, weights_only=False)["state_dict"]
    # lr=0: the child trains without moving, so its weights must be exactly the parent's
    child_cfg = compose_cfg(
        *TINY_LM,
        "test=false",
        "sample=null",
        f"init_from={parent}",
        "task.optimizer.lr=0",
        "task.optimizer.weight_decay=0",
    )
    train(child_cfg)
    child = tmp_path / "checkpoints" / "last.ckpt"
    child_weights = torch.load(child, weights_only=False)["state_dict"]
    assert all(torch.equal(child_weights[k], v) for k, v in parent_weights.items() if k.startswith("model."))
    parent.unlink()
    reloaded = CausalLMTask.load_from_checkpoint(child, weights_only=False)
    assert reloaded.tokenizer is not None and (tmp_path / "checkpoints" / "tokenizer.json").is_file()


def test_test_only_run_evaluates_the_given_checkpoint(compose_cfg, tmp_path):
    trained = train(compose_cfg(*TINY_LM, "sample=null")).metrics
    # test=true after training evaluates the best checkpoint; evaluating last.ckpt alone must give its loss,
    # not the loss of freshly initialised weights (~ln(vocab) = 5.70)
    last = tmp_path / "checkpoints" / "last.ckpt"
    again = train(compose_cfg(*TINY_LM, "sample=null", "train=false", f"ckpt_path={last}")).metrics
    assert again["test/loss"] == pytest.approx(trained["test/loss"], rel=1e-4)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("experiment=nope", "gpt_pretrain"),  # Hydra's own error, listing the available experiments
        ("model.n_layer=abc", "n_layer"),  # ours, from the checks train.py runs before training
    ],
)
def test_bad_config_fails_fast_with_a_short_message(override, expected, tmp_path):
    result = train_main(override, f"hydra.run.dir={tmp_path / 'run'}")
    listed = len(EXPERIMENTS) if override.startswith("experiment=") else 0  # Hydra lists every experiment
    assert_short_error(result, expected, max_lines=20 + listed)
    assert not (tmp_path / "run").exists()  # a run that failed before producing anything leaves no folder


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.n_layerz=3", "n_layerz"),
        ("+model.n_layerz=3", "n_layerz"),
        ("ckpt_path=/does/not/exist.ckpt", "ckpt_path"),
        ("data.batch_size=abc", "data.batch_size"),
        ("train=maybe", "train"),
    ],
)
def test_bad_config_is_a_user_error_naming_the_key(override, expected, compose_cfg):
    """What train.py composes and checks before training, in this process: each raises an error that the
    command line reports in a few lines (Hydra's errors, and ours through report_user_errors: the test above)."""

    def compose_and_check():
        cfg = compose_cfg(override, "debug=fdr", resolve=False)  # Hydra hands main the unresolved config
        check_required(cfg)
        check_types(cfg)
        train(cfg)  # a missing ckpt_path is refused before any data is prepared

    assert_user_error(compose_and_check, expected)


def test_missing_required_value_is_reported(compose_cfg):
    cfg = compose_cfg(resolve=False)
    cfg.data.corpus.path = "???"
    with pytest.raises(ConfigError, match="data.corpus.path"):
        check_required(cfg)


def test_logger_or_callback_without_target_is_an_error(compose_cfg):
    cfg = compose_cfg()
    cfg.callbacks.throughput = {"peak_flops": None}
    with pytest.raises(ConfigError, match="callbacks.throughput has no _target_"):
        instantiate_group(cfg.callbacks, "callbacks")


@pytest.mark.cli
def test_lit_train_prints_config_from_any_directory(tmp_path):
    result = run_cli("lit-train", "--cfg", "job", "model.n_layer=3", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    printed = OmegaConf.create(result.stdout)
    assert printed.model.n_layer == 3 and printed.data._target_.endswith("CausalLMDataModule")


def test_generate_command_continues_a_prompt(tiny_lm_run):
    result = run_main(
        generate_entry_point,
        f"ckpt={tiny_lm_run / 'checkpoints' / 'last.ckpt'}",
        "prompt=The for",
        "max_new_tokens=5",
    )
    assert result.returncode == 0, result.stderr
    assert "The for" in result.stdout


def test_multirun_gives_each_job_its_own_config_and_wandb_run(tmp_path):
    result = train_main(
        "-m",
        "seed=1,2",
        "logger=wandb",
        *TINY_LM,
        "trainer.max_steps=2",
        "test=false",
        "sample=null",
        f"paths.log_dir={tmp_path}",
        f"paths.cache_dir={tmp_path / 'cache'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted((tmp_path / "train" / "multiruns").glob("*/[01]"))
    assert [OmegaConf.load(job / "config_resolved.yaml").seed for job in jobs] == [1, 2]
    assert all(len(list((job / "wandb").glob("offline-run-*"))) == 1 for job in jobs)
    groups = {OmegaConf.load(job / "config_resolved.yaml").logger.wandb.group for job in jobs}
    assert groups == {f"train-{jobs[0].parent.name}"}  # one dashboard group for the multirun


# one task of a one-node SLURM job: what SLURMEnvironment reads when the Trainer is built
SLURM_ONE_TASK = {"SLURM_NTASKS": "1", "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}


@pytest.mark.parametrize("trainer", ["default", "cpu", "gpu", "ddp", "ddp_cpu", "fsdp", "slurm"])
def test_every_trainer_config_builds_the_trainer_it_asks_for(compose_cfg, trainer, monkeypatch):
    """Precision, strategy, process-group backend, atomic checkpoints and the SLURM environment reach the Trainer.
    A GPU config is built on the GPUs there are, or on one CPU device where there are none; FSDP, which Lightning
    refuses on CPUs, then builds its strategy alone."""
    asked = compose_cfg(f"trainer={trainer}").trainer
    strategy = asked.get("strategy")
    if trainer == "fsdp":  # one FSDP unit per Transformer block
        assert "TransformerBlock" in repr(instantiate(strategy).kwargs["auto_wrap_policy"])
    gpus, wants_gpu = torch.cuda.device_count(), asked.accelerator == "gpu"
    if wants_gpu and not gpus:
        if trainer == "fsdp":
            return
        fit = {"accelerator": "cpu", "devices": 1}
    else:
        fit = {"devices": gpus} if wants_gpu and asked.devices > gpus else {}
    for key, value in SLURM_ONE_TASK.items() if trainer == "slurm" else ():
        monkeypatch.setenv(key, value)
    built = instantiate(asked, **fit)
    on_gpu = gpus and asked.accelerator in ("gpu", "auto")
    assert isinstance(built.accelerator, CUDAAccelerator if on_gpu else CPUAccelerator)
    assert built.num_devices == fit.get("devices", gpus if asked.devices == -1 else asked.devices)
    assert built.precision == asked.precision
    assert isinstance(built.strategy.checkpoint_io, AtomicCheckpointIO)
    if strategy is None:
        assert isinstance(built.strategy, SingleDeviceStrategy)
    else:
        assert isinstance(built.strategy, get_class(strategy._target_))
        assert built.strategy._process_group_backend == strategy.get("process_group_backend")
    if trainer == "slurm":
        environment = built.strategy.cluster_environment
        assert isinstance(environment, SLURMEnvironment) and environment.auto_requeue
