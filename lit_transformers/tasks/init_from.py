"""``init_from``: a task's models initialised from parent checkpoints, one submodule each. A parent must share
the run's tokenizer; a LoRA parent is merged into its base first; heads the task does not build are dropped and
its new heads left fresh; weights that do not fit are explained by the model config fields that differ."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from lit_transformers.tasks import lora as lora_adapters
from lit_transformers.tasks.specs import load_weights, model_weights
from lit_transformers.text import Tokenizer
from lit_transformers.utils.checkpoints import read_checkpoint
from lit_transformers.utils.config import as_override

log = logging.getLogger(__name__)

# model config fields that say how a model trains, not what it is: a run may set them apart from its init_from parent
TRAINING_FIELDS = ("dropout", "attn_dropout", "activation_checkpointing")


def parent_model_config(checkpoint: Mapping, ours: Mapping) -> dict:
    """The fields of the model config that ``checkpoint`` was trained with which its weights depend on (all but
    :data:`TRAINING_FIELDS`) and which differ from ``ours``; none for another kind of model (``_target_``)."""
    theirs = checkpoint.get("hyper_parameters", {}).get("model") or {}
    if theirs.get("_target_") != ours.get("_target_"):
        return {}
    return {
        k: v
        for k, v in theirs.items()
        if k not in TRAINING_FIELDS and not k.startswith("_") and ours.get(k) != v
    }


def load_parent(task, target: str, path: str) -> None:
    """The checkpoint at ``path`` into ``task``'s submodule ``target`` (``model``, ``policy``, ``reward.body``):
    its weights under ``target``'s name, less the task's ``dropped_heads``; the task's ``new_heads`` stay fresh."""
    prefix = f"{target}."
    new = tuple(h.removeprefix(prefix) for h in task.new_heads if h.startswith(prefix))
    checkpoint = read_checkpoint(path, "init_from", task.hparams.trust_checkpoint)
    parent_state = checkpoint.get("hyper_parameters", {}).get("tokenizer")
    parent = Tokenizer.from_state(parent_state) if parent_state else None
    if parent is not None and task.tokenizer is not None and parent != task.tokenizer:
        raise ValueError(
            f"init_from={path} was trained with a different tokenizer ({parent.vocab_size} tokens) than "
            f"this run's data ({task.tokenizer.vocab_size} tokens); set data.tokenizer_path={path} "
            "to train with the parent's tokenizer"
        )
    weights = checkpoint
    if "lora_base" in checkpoint:  # adapters only: the parent's model rebuilt on its base, merged
        weights = lora_adapters.merged_weights(checkpoint, path, task.hparams.trust_checkpoint)
    dropped = tuple(h.removeprefix(prefix) for h in task.dropped_heads if h.startswith(prefix))
    if dropped:  # e.g. a classifier fine-tuned from a pretraining checkpoint leaves its MLM/NSP heads
        weights = {k: v for k, v in model_weights(weights).items() if not k.startswith(dropped)}
    try:
        fresh = load_weights(task.get_submodule(target), path, new, weights)
    except ValueError as err:
        ours = task.hparams.get("model") or {}
        differ = parent_model_config(checkpoint, ours)
        if not differ:
            raise
        raise ValueError(
            f"init_from={path} was trained with another model config than this run's "
            f"({', '.join(f'model.{k}={as_override(ours.get(k))}' for k in differ)}), and its weights fit "
            f"only its own: add {' '.join(f'model.{k}={as_override(v)}' for k, v in differ.items())}"
        ) from err
    log.info(
        "init_from: loaded %s into %s%s",
        path,
        target,
        f"; new (not in the checkpoint): {', '.join(prefix + k for k in fresh)}" if fresh else "",
    )
