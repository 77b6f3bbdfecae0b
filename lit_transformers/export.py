"""Write a trained causal LM as a Hugging Face model directory: ``lit-export ckpt=<run>/checkpoints/last.ckpt
out=<dir>`` (or ``python -m lit_transformers.export``), for a GPT, SFT, PPO, GRPO or DPO checkpoint (the policy of the
last two). The directory is what ``transformers`` loads and serves: the model (``GPT.to_hf``: GPT-2, Llama, Qwen2
or Mistral), its tokenizer files, and a ``generation_config.json`` that stops at the tokenizer's end-of-turn ids.
``lit-export --help`` lists the keys (conf/export.yaml)."""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from lit_transformers.generate import language_model
from lit_transformers.tasks import CausalLMTask
from lit_transformers.utils.config import ConfigError, check_required, check_types
from lit_transformers.utils.errors import report_user_errors

FLAG_TYPES = {"ckpt": str, "out": str, "trust_checkpoint": bool}


def export_hf(task: CausalLMTask, out: str | Path) -> Path:
    """``task``'s GPT and tokenizer as a Hugging Face directory ``out``; config.json carries the tokenizer's
    bos/eos/pad ids, generation_config.json stops at any of its ``end_of_turn_ids`` (as instruct models ship)."""
    tokenizer = task.require_tokenizer()
    out = Path(out).expanduser()
    task.model.to_hf(out, tokenizer)
    tokenizer.save_pretrained(out)
    return out


@hydra.main(version_base="1.3", config_path="pkg://lit_transformers.conf", config_name="export")
def main(cfg: DictConfig) -> None:
    with report_user_errors():
        check_required(cfg)
        check_types(cfg, flags=FLAG_TYPES)
        if Path(cfg.out).expanduser().is_file():
            raise ConfigError(f"out={cfg.out} is a file; pass a directory to write the model into")
        out = export_hf(language_model(cfg.ckpt, cfg.trust_checkpoint), cfg.out)
        print(
            f"Wrote the Hugging Face model directory {out} (transformers.AutoModelForCausalLM.from_pretrained)"
        )


if __name__ == "__main__":
    main()
