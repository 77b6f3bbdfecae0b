"""Print continuations from a trained checkpoint:
``python -m lit_transformers.generate ckpt=<run>/checkpoints/last.ckpt prompt="The for statement"``."""

from __future__ import annotations

import hydra
import torch
from omegaconf import DictConfig

from lit_transformers.tasks import CausalLMTask
from lit_transformers.utils.checkpoints import check_task_fits, read_checkpoint
from lit_transformers.utils.config import check_required
from lit_transformers.utils.errors import report_user_errors


def continuations(cfg: DictConfig) -> list[tuple[str, str]]:
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={cfg.device} but no CUDA GPU is visible; use device=cpu")
    check_task_fits(read_checkpoint(cfg.ckpt, "ckpt", cfg.trust_checkpoint), cfg.ckpt, CausalLMTask, "ckpt")
    task = CausalLMTask.load_from_checkpoint(
        cfg.ckpt, map_location=cfg.device, weights_only=not cfg.trust_checkpoint
    )
    prompts = list(cfg.prompts) if cfg.prompts else [cfg.prompt]
    texts = task.sample(prompts, cfg.max_new_tokens, cfg.temperature, cfg.top_k, cfg.top_p, seed=cfg.seed)
    return list(zip(prompts, texts))


@hydra.main(version_base="1.3", config_path="pkg://lit_transformers.conf", config_name="generate")
def main(cfg: DictConfig) -> None:
    with report_user_errors():
        check_required(cfg)
        for prompt, text in continuations(cfg):
            print(f"--- {prompt!r}\n{prompt}{text}\n")


if __name__ == "__main__":
    main()
