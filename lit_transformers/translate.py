"""Translate with a trained checkpoint: ``lit-translate ckpt=<run>/checkpoints/last.ckpt text="Open file"``, or
one sentence per line on stdin (``lit-translate ckpt=... < sentences.txt > translations.txt``), batched."""

from __future__ import annotations

import sys

import hydra
import torch
from omegaconf import DictConfig

from lit_transformers.tasks import TranslationTask
from lit_transformers.utils.checkpoints import check_task_fits, read_checkpoint
from lit_transformers.utils.config import check_required
from lit_transformers.utils.errors import report_user_errors


def translations(cfg: DictConfig, sentences: list[str]) -> list[str]:
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={cfg.device} but no CUDA GPU is visible; use device=cpu")
    if cfg.beam < 1 or cfg.batch_size < 1:
        raise ValueError(f"beam={cfg.beam} and batch_size={cfg.batch_size} must be at least 1")
    check_task_fits(
        read_checkpoint(cfg.ckpt, "ckpt", cfg.trust_checkpoint), cfg.ckpt, TranslationTask, "ckpt"
    )
    task = TranslationTask.load_from_checkpoint(
        cfg.ckpt, map_location=cfg.device, weights_only=not cfg.trust_checkpoint
    )
    return task.translate_texts(sentences, cfg.beam, cfg.batch_size)


@hydra.main(version_base="1.3", config_path="pkg://lit_transformers.conf", config_name="translate")
def main(cfg: DictConfig) -> None:
    with report_user_errors():
        check_required(cfg)
        sentences = [cfg.text] if cfg.text is not None else sys.stdin.read().splitlines()
        for line in translations(cfg, sentences):
            print(line)


if __name__ == "__main__":
    main()
