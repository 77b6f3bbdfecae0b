"""Training entry point: ``python train.py experiment=gpt_pretrain trainer=ddp logger=wandb`` (or ``lit-train``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import hydra
import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from lit_transformers.utils.checkpoints import check_task_fits, read_checkpoint
from lit_transformers.utils.config import (
    RESOLVED_CONFIG_ENV,
    ConfigError,
    check_required,
    check_types,
    instantiate_group,
    resolve_once,
)
from lit_transformers.utils.errors import report_user_errors

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit and/or test as the config says; returns the final metrics (used by Hydra sweeps)."""
    L.seed_everything(cfg.seed, workers=True)
    parents = cfg.init_from.values() if isinstance(cfg.init_from, DictConfig) else [cfg.init_from]
    for key, path in [("ckpt_path", cfg.ckpt_path), *(("init_from", p) for p in parents)]:
        if path and not Path(path).is_file():  # before any data preparation
            raise FileNotFoundError(f"{key}={path} not found; pass the path of a .ckpt file")

    datamodule: L.LightningDataModule = instantiate(cfg.data, _convert_="all")
    # the task builds its models, optimizer and schedule from its plain config (kept as its hyperparameters)
    task: L.LightningModule = instantiate(cfg.task, _recursive_=False, _convert_="all")
    if cfg.ckpt_path:
        check_task_fits(
            read_checkpoint(cfg.ckpt_path, "ckpt_path", cfg.trust_checkpoint), cfg.ckpt_path, task
        )
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
        if cfg.test:
            best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
            weights = best or cfg.ckpt_path  # train=false ckpt_path=X evaluates X
            if not weights:
                log.warning(
                    "No checkpoint to test (fast_dev_run, or train=false without ckpt_path): testing the current weights"
                )
            trainer.test(
                task, datamodule=datamodule, ckpt_path=weights or None, weights_only=not cfg.trust_checkpoint
            )
            metrics |= {k: float(v) for k, v in trainer.callback_metrics.items()}
        if cfg.get("sample") and hasattr(task, "sample"):
            # every rank generates (an FSDP forward needs them all); rank 0 prints
            texts = task.sample(list(cfg.sample.prompts), cfg.sample.max_new_tokens)
            if trainer.is_global_zero:
                for prompt, text in zip(cfg.sample.prompts, texts):
                    print(f"\n--- sample ---\n{prompt}{text}")
    finally:
        for logger in loggers:
            if isinstance(logger, L.pytorch.loggers.WandbLogger):
                import wandb

                wandb.finish()  # also when training raised: one finished run per (multirun) job
    return metrics


@hydra.main(version_base="1.3", config_path="pkg://lit_transformers.conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    launched_here = RESOLVED_CONFIG_ENV not in os.environ
    try:
        with report_user_errors():
            check_required(cfg)
            check_types(cfg)
            cfg = resolve_once(cfg)
            metrics = train(cfg)
            metric = cfg.get("optimized_metric")
            if metric and metric not in metrics:
                raise ConfigError(
                    f"optimized_metric={metric} was not logged; choose one of {sorted(metrics)}"
                )
    finally:
        if launched_here:  # the next job of a multirun resolves its own config
            os.environ.pop(RESOLVED_CONFIG_ENV, None)
    return metrics.get(metric) if metric else None


if __name__ == "__main__":
    main()
