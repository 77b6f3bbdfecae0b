"""Print continuations from a trained causal LM: ``lit-generate ckpt=<run>/checkpoints/last.ckpt prompt="The for
statement"`` (or ``python -m lit_transformers.generate``), from a GPT, SFT, PPO, GRPO or DPO checkpoint (the policy of
the last two) or a Hugging Face decoder directory (``ckpt=<dir>``, with its own tokenizer); ``chat=true``
renders each prompt as a user turn with the tokenizer's chat template, for instruct checkpoints.
``lit-generate --help`` lists the keys (conf/generate.yaml)."""

from __future__ import annotations

from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, ListConfig

from lit_transformers.nn.generation import check_sampling
from lit_transformers.tasks import CausalLMTask, DPOTask, GRPOTask, PPOTask, SFTTask
from lit_transformers.text import Tokenizer
from lit_transformers.utils.checkpoints import read_checkpoint, written_by
from lit_transformers.utils.config import ConfigError, check_required, check_types
from lit_transformers.utils.errors import report_user_errors

FLAG_TYPES = {
    "ckpt": str,
    "max_new_tokens": int,
    "temperature": float,
    "top_k": int,
    "top_p": float,
    "seed": int,
    "device": str,
    "trust_checkpoint": bool,
    "chat": bool,
}

# the tasks whose checkpoints hold a causal LM (a GPT), with the attribute that holds it: its state-dict prefix
CAUSAL_LMS = {
    CausalLMTask: "model",
    SFTTask: "model",
    PPOTask: "policy",
    GRPOTask: "policy",
    DPOTask: "policy",
}


def check_settings(cfg: DictConfig) -> None:
    """Refuse, before the slow load, what would print nothing or fail at the first sampled token."""
    check_required(cfg)
    check_types(cfg, flags=FLAG_TYPES)
    if cfg.max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={cfg.max_new_tokens} generates nothing; set it to at least 1")
    check_sampling(cfg.temperature, cfg.top_k, cfg.top_p)
    if cfg.prompts is not None and not isinstance(cfg.prompts, ListConfig):
        raise ConfigError(
            f"prompts={cfg.prompts!r} is not a list; write 'prompts=[first prompt,second prompt]'"
        )
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={cfg.device} but no CUDA GPU is visible; use device=cpu")


def hub_language_model(path: str, trust_checkpoint: bool) -> CausalLMTask:
    """The Hugging Face decoder directory ``path`` (``GPT.from_hf``: GPT-2, Llama, Qwen2, Mistral) with the
    tokenizer saved beside it, as a :class:`CausalLMTask`."""
    tokenizer = Tokenizer.from_file(path)
    task = CausalLMTask(
        model={},  # replaced by the directory's config.json
        init_from_hf=path,
        optimizer={},  # never built: generation does not train
        tokenizer=tokenizer.state(),
        trust_checkpoint=trust_checkpoint,
    )
    task.configure_model()
    return task


def language_model(ckpt: str, trust_checkpoint: bool = False) -> CausalLMTask:
    """The causal LM of checkpoint ``ckpt`` as a :class:`CausalLMTask` (its GPT and tokenizer), on the CPU: a GPT
    or SFT checkpoint's model, a PPO, GRPO or DPO checkpoint's policy (the same GPT, built from the same model
    config), a LoRA checkpoint's base with its adapters merged, or a Hugging Face directory's decoder
    (:func:`hub_language_model`)."""
    if Path(ckpt).expanduser().is_dir():
        return hub_language_model(ckpt, trust_checkpoint)
    checkpoint = read_checkpoint(ckpt, "ckpt", trust_checkpoint)
    names = {f"{cls.__module__}.{cls.__qualname__}": attribute for cls, attribute in CAUSAL_LMS.items()}
    attribute = names.get(checkpoint.get("task_class"))
    if attribute is None:
        accepted = ", ".join(cls.__name__ for cls in CAUSAL_LMS)
        raise ValueError(
            f"ckpt={ckpt} was written by {written_by(checkpoint, ckpt)}, which holds no language model "
            f"to generate with (a reward model scores text, it does not write it); pass a checkpoint of "
            f"{accepted} (a gpt_pretrain, gpt_sft, gpt_ppo, gpt_grpo or gpt_dpo run)"
        )
    saved = checkpoint["hyper_parameters"]
    task = CausalLMTask(model=saved["model"], optimizer=saved["optimizer"], tokenizer=saved["tokenizer"])
    task.configure_model()
    if (
        "lora_base" in checkpoint
    ):  # adapters only: their task rebuilds the base it names, then they are merged
        from lit_transformers.tasks.lora import merged_weights

        weights = merged_weights(checkpoint, ckpt, trust_checkpoint)
    else:
        prefix = f"{attribute}."
        weights = {
            k.removeprefix(prefix): v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)
        }
    task.model.load_state_dict(weights)
    return task


def continuations(cfg: DictConfig) -> list[tuple[str, str]]:
    check_settings(cfg)
    task = language_model(cfg.ckpt, cfg.trust_checkpoint).to(cfg.device)
    if cfg.chat and task.tokenizer.chat_template is None:
        raise ConfigError(
            f"chat=true but the tokenizer of ckpt={cfg.ckpt} has no chat_template to render the prompt with; "
            "drop chat=true to continue the prompt as plain text, or pass an instruct checkpoint (a Hugging Face "
            "directory whose tokenizer_config.json or chat_template.jinja carries a template, or a run trained "
            "with such a tokenizer)"
        )
    prompts = [str(p) for p in cfg.prompts] if cfg.prompts else [str(cfg.prompt)]  # prompt=1984 is text too
    texts = task.sample(
        prompts, cfg.max_new_tokens, cfg.temperature, cfg.top_k, cfg.top_p, seed=cfg.seed, chat=cfg.chat
    )
    return list(zip(prompts, texts))


@hydra.main(version_base="1.3", config_path="pkg://lit_transformers.conf", config_name="generate")
def main(cfg: DictConfig) -> None:
    with report_user_errors():
        for prompt, text in continuations(cfg):
            print(f"--- {prompt!r}\n{text if cfg.chat else prompt + text}\n")  # chat: the reply alone


if __name__ == "__main__":
    main()
