"""Training entry point: ``python train.py experiment=gpt_pretrain trainer=ddp logger=wandb`` (or ``lit-train``)."""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import hydra
import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from lit_transformers.tasks.lora import BASE_SOURCES
from lit_transformers.utils.checkpoints import (
    check_task_fits,
    read_checkpoint,
    read_tokenizer_checkpoints,
    use_checkpoint_tokenizers,
)
from lit_transformers.utils.cluster import launcher_rank
from lit_transformers.utils.config import (
    RESOLVED_CONFIG_ENV,
    ConfigError,
    check_required,
    check_types,
    instantiate_group,
    resolve_once,
)
from lit_transformers.utils.errors import report_user_errors
from lit_transformers.utils.loggers import TensorBoardLogger
from lit_transformers.utils.run_folder import (
    keep_earlier_csv_logs,
    remove_if_only_config,
    requeued_checkpoint,
)
from lit_transformers.utils.run_report import checkpoint_lines, report_interruptions, run_summary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainResult:
    """What a run leaves: its final metrics (training's, then the test's) and its best checkpoint."""

    metrics: dict[str, float]
    best_checkpoint: str | None  # see best_checkpoint(); the InstructGPT chain feeds it to the next stage


def best_checkpoint(cfg: DictConfig, trainer: L.Trainer) -> str | None:
    """The checkpoint the checkpoint callback judged best in this training (its ``monitor``), or ``ckpt_path``
    when not training (``train=false ckpt_path=X`` evaluates X); None when there is none."""
    if not cfg.train:
        return cfg.ckpt_path or None
    checkpoints = trainer.checkpoint_callback  # not ckpt_path: that is where a resumed training started
    return (checkpoints.best_model_path or None) if checkpoints else None


def warn_nothing_to_test(cfg: DictConfig, trainer: L.Trainer) -> None:
    """Says why there is no checkpoint to test, so the current weights are tested; a run that trains nothing
    and starts from pretrained weights (experiment=clip_zero_shot) tests those, which needs no warning."""
    checkpoints = trainer.checkpoint_callback
    pretrained = [
        f"task.{key}" for key in BASE_SOURCES if cfg.task.get(key)
    ]  # keys that load pretrained weights
    if not cfg.train and pretrained:
        log.info("Nothing trains: testing the weights that %s loaded", " and ".join(pretrained))
        return
    if not cfg.train:
        why = "train=false without ckpt_path; pass ckpt_path=<run>/checkpoints/<name>.ckpt"
    elif trainer.fast_dev_run:
        why = "fast_dev_run saves none"
    elif checkpoints is None:
        why = "checkpointing is off (trainer.enable_checkpointing=false)"
    elif not trainer.enable_validation:
        why = "validation is off, so none was judged best"
    else:
        why = f"none was kept as best (save_top_k={checkpoints.save_top_k})"
    log.warning("No checkpoint to test: %s. Testing the weights as they are", why)


def optimized_value(cfg: DictConfig, metrics: dict[str, float]) -> float | None:
    """The number a Hydra sweeper optimizes. A sweep cannot go on without it; a single run only warns."""
    metric = cfg.get("optimized_metric")
    if not metric:
        return None
    if metric in metrics:
        return metrics[metric]
    message = f"optimized_metric={metric} was not logged; choose one of {sorted(metrics)}"
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        raise ConfigError(message)
    log.warning(message)
    return None


class _DropLightningNotices(logging.Filter):
    NOTICES = (
        "💡 Tip: For seamless cloud logging",  # an advert for Lightning's LitLogger service, at every Trainer
        "Trainer already configured with model summary callbacks",  # ours (callbacks.model_summary) on purpose
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.NOTICES)


_LIGHTNING_NOTICES = _DropLightningNotices()


def quiet_known_noise() -> None:
    """Silence what every run printed before training that says nothing about the run, each where it comes from
    (Lightning's ``limit_*=1.0`` notices: conf/trainer/default.yaml leaves those limits null)."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_LIGHTNING_NOTICES)
    # Lightning 2.6's pytree helper builds torch's LeafSpec, which torch deprecated: a warning at every fit and test
    # that only a newer Lightning can act on
    warnings.filterwarnings(
        "ignore",
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        FutureWarning,
        r"lightning\.pytorch\.utilities",
    )
    # torchdata's StatefulDataLoader calls torch.set_vital, which torch deprecated (a no-op telemetry flag)
    warnings.filterwarnings(
        "ignore", "'set_vital' is deprecated", UserWarning, r"torchdata\.stateful_dataloader"
    )


def train(cfg: DictConfig) -> TrainResult:
    """Fit and/or test as the config says; returns the final metrics (Hydra sweeps optimize one) and the
    best checkpoint."""
    quiet_known_noise()
    L.seed_everything(cfg.seed, workers=True)
    parents = cfg.init_from.values() if isinstance(cfg.init_from, DictConfig) else [cfg.init_from]
    for key, path in [("ckpt_path", cfg.ckpt_path), *(("init_from", p) for p in parents)]:
        if path and not Path(path).is_file():  # before any data preparation
            raise FileNotFoundError(f"{key}={path} not found; pass the path of a .ckpt file")
    read_tokenizer_checkpoints(cfg.data, cfg.trust_checkpoint, cfg.paths.output_dir)

    # the task builds its models, optimizer and schedule from its plain config (kept as its hyperparameters)
    task: L.LightningModule = instantiate(cfg.task, _recursive_=False, _convert_="all")
    # resuming or evaluating: the checkpoint's task and model, and its tokenizer for the data
    if cfg.ckpt_path:
        checkpoint = read_checkpoint(cfg.ckpt_path, "ckpt_path", cfg.trust_checkpoint)
        check_task_fits(checkpoint, cfg.ckpt_path, task)
        # a trusted checkpoint may need unpickling, which the data's weights-only tokenizer loading refuses
        copy_to = cfg.paths.output_dir if cfg.trust_checkpoint else None
        use_checkpoint_tokenizers(cfg.data, checkpoint, cfg.ckpt_path, copy_to)
    datamodule: L.LightningDataModule = instantiate(cfg.data, _convert_="all")
    task.connect_data(datamodule)  # the one way a task gets its data: checked against what it declares
    callbacks = instantiate_group(cfg.get("callbacks"), "callbacks")
    loggers = instantiate_group(cfg.get("logger"), "logger")
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    hyperparameters = OmegaConf.to_container(cfg, resolve=True)
    for logger in loggers:
        logger.log_hyperparams(hyperparameters)

    try:
        if cfg.train:
            # hyperparameters are plain data, so checkpoints load without unpickling arbitrary objects
            trainer.fit(
                task, datamodule=datamodule, ckpt_path=cfg.ckpt_path, weights_only=not cfg.trust_checkpoint
            )
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        # now: testing a checkpoint loads the checkpoint callback's state from it, an older best and last too
        best = best_checkpoint(cfg, trainer)
        checkpoints = checkpoint_lines(trainer)
        if cfg.test:
            if best is None:
                warn_nothing_to_test(cfg, trainer)
            trainer.test(task, datamodule=datamodule, ckpt_path=best, weights_only=not cfg.trust_checkpoint)
            metrics |= {k: float(v) for k, v in trainer.callback_metrics.items()}
        final = {k: v for k, v in metrics.items() if k.startswith(("val/", "test/"))}
        # TensorBoard's HPARAMS tab: this run's row, without where and how it logs (the same in every run)
        compared = {k: v for k, v in hyperparameters.items() if k not in ("callbacks", "logger", "paths")}
        for logger in loggers:
            if isinstance(logger, TensorBoardLogger) and final:
                logger.log_hparams_with_metrics(compared, final)
        if cfg.get("sample") and hasattr(task, "sample"):
            # every rank generates (an FSDP forward needs them all); rank 0 prints
            texts = task.sample(list(cfg.sample.prompts), cfg.sample.max_new_tokens)
            if trainer.is_global_zero:
                for prompt, text in zip(cfg.sample.prompts, texts):
                    print(f"\n--- sample ---\n{prompt}{text}")
        where = run_summary(cfg.paths.output_dir, checkpoints, loggers) if trainer.is_global_zero else ""
    finally:
        for logger in loggers:
            if isinstance(logger, L.pytorch.loggers.WandbLogger):
                import wandb

                wandb.finish()  # also when training raised: one finished run per (multirun) job
    if where:  # last: after wandb's closing report, which would hide it
        print(f"\n{where}", flush=True)
    return TrainResult(metrics, best)


@hydra.main(version_base="1.3", config_path="pkg://lit_transformers.conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    # torchrun and SLURM start every rank, and their rank 0 owns the run folder; Lightning's DDP children inherit it
    job_rank_zero = launcher_rank() == 0
    launched_here = RESOLVED_CONFIG_ENV not in os.environ and job_rank_zero
    try:
        with report_interruptions(), report_user_errors():
            check_required(cfg)
            check_types(cfg)
            if cfg.ckpt_path is None:  # a requeued SLURM job continues where its earlier attempt stopped
                cfg.ckpt_path = requeued_checkpoint(Path(HydraConfig.get().runtime.output_dir))
            if launched_here:
                keep_earlier_csv_logs(cfg)
            cfg = resolve_once(cfg, save=job_rank_zero)
            return optimized_value(cfg, train(cfg).metrics)
    except BaseException:
        if launched_here:  # a run that failed before producing anything leaves no folder behind
            remove_if_only_config(Path(HydraConfig.get().runtime.output_dir))
        raise
    finally:
        if launched_here:  # the next job of a multirun resolves its own config
            os.environ.pop(RESOLVED_CONFIG_ENV, None)


if __name__ == "__main__":
    main()
