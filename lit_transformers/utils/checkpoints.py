"""Reading checkpoints safely, with errors that say what is wrong with the file and what to do.

Our checkpoints hold only tensors and plain data (tasks keep their hyperparameters as plain containers), so
they load with ``torch.load(weights_only=True)``, which cannot run code from the file. A checkpoint that
needs arbitrary unpickling is refused unless the user vouches for it with ``trust_checkpoint=true``.
"""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from lit_transformers.text import Tokenizer

log = logging.getLogger(__name__)

# a datamodule's tokenizer arguments, each with the checkpoint hyperparameter holding the tokenizer it gives
TOKENIZER_ARGUMENTS = {"tokenizer_path": "tokenizer", "source_tokenizer_path": "source_tokenizer"}


def read_checkpoint(path: str | Path, key: str = "ckpt_path", trusted: bool = False) -> dict:
    """The checkpoint at ``path`` (named ``key`` on the command line) as a dict."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{key}={path} not found; pass the path of a .ckpt file")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=not trusted, mmap=True)
    except pickle.UnpicklingError as err:
        reason = str(err).strip().splitlines()[-1][:200]
        raise ValueError(
            f"{key}={path} holds pickled Python objects, and loading it could run code from the file "
            f"({reason}). If you trust where it came from, set trust_checkpoint=true."
        ) from err
    except Exception as err:  # noqa: BLE001 - torch raises RuntimeError, EOFError, KeyError... for bad files
        raise ValueError(
            f"{key}={path} is not a readable checkpoint: it is truncated or corrupt ({type(err).__name__}: "
            f"{str(err).strip()[:120]}). Use another one, e.g. <run>/checkpoints/last.ckpt."
        ) from err
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint and not _is_state_dict(checkpoint):
        raise ValueError(f"{key}={path} is not a checkpoint written by train.py (no state_dict in it)")
    return checkpoint


def _is_state_dict(obj: dict) -> bool:
    return bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def written_by(checkpoint: dict, path: str | Path) -> str:
    """'<TaskClass> (experiment <task_name>)' for a checkpoint train.py wrote: the run's saved config sits
    two folders up (<run>/checkpoints/<file>.ckpt, <run>/config_resolved.yaml)."""
    task = checkpoint.get("task_class", "an unknown task")
    config = Path(path).expanduser().resolve().parent.parent / "config_resolved.yaml"
    if config.is_file():
        name = OmegaConf.load(config).get("task_name")
        return f"{task} (run {name!r}, {config.parent})"
    return task


def check_task_fits(checkpoint: dict, path: str | Path, task, key: str = "ckpt_path") -> None:
    """Refuse, naming both sides, a checkpoint written by another task (class or instance ``task``) or, for
    an instance, for another model config."""
    cls = task if isinstance(task, type) else type(task)
    expected = f"{cls.__module__}.{cls.__qualname__}"
    if checkpoint.get("task_class") != expected:
        raise ValueError(
            f"{key}={path} was written by {written_by(checkpoint, path)}, not by {expected}; "
            "pass a checkpoint of the same experiment"
        )
    if isinstance(task, type):
        return
    saved = checkpoint.get("hyper_parameters", {}).get("model") or {}
    ours = task.hparams.get("model") or {}
    differ = [
        f"model.{k}: checkpoint {saved.get(k)!r}, this run {ours.get(k)!r}"
        for k in sorted(set(saved) | set(ours))
        if saved.get(k) != ours.get(k)
    ]
    if differ:
        raise ValueError(
            f"{key}={path} was trained with another model config ({'; '.join(differ)}). Resume with the same "
            "model settings, or start a new run from its weights with init_from=... instead of ckpt_path"
        )


def plain_tokenizers(saved: dict, folder: str | Path) -> Path:
    """``folder``/checkpoint_tokenizers.ckpt: the tokenizers of a checkpoint's hyperparameters ``saved`` alone,
    as plain data, which loads weights-only (the way every datamodule reads a tokenizer_path .ckpt)."""
    copy = Path(folder) / "checkpoint_tokenizers.ckpt"
    copy.parent.mkdir(parents=True, exist_ok=True)
    tmp = copy.with_suffix(f".tmp{os.getpid()}")  # every DDP rank writes the same file: atomically
    torch.save({"hyper_parameters": {held: saved.get(held) for held in TOKENIZER_ARGUMENTS.values()}}, tmp)
    tmp.replace(copy)
    return copy


def use_checkpoint_tokenizers(
    data: DictConfig,
    checkpoint: dict,
    path: str | Path,
    copy_to: str | Path | None = None,
    key: str = "ckpt_path",
) -> None:
    """Make the data of a run resumed or evaluated from ``checkpoint`` (at ``path``) tokenize as it was trained:
    each tokenizer argument of ``data`` (:data:`TOKENIZER_ARGUMENTS`) left unset becomes ``path``, rather than
    a tokenizer trained on data that may have changed since; one set to another tokenizer is refused. With
    ``copy_to`` (a trusted checkpoint, which may need unpickling) it becomes a :func:`plain_tokenizers` copy
    written there instead."""
    saved = checkpoint.get("hyper_parameters", {})
    readable = None
    for argument, held in TOKENIZER_ARGUMENTS.items():
        state = saved.get(held)
        if state is None or argument not in data:
            continue
        if held == "source_tokenizer" and data.get("joint_vocab"):
            raise ValueError(
                f"{key}={path} was trained with a source tokenizer of its own (data.joint_vocab=false), this run "
                "asks for one joint vocabulary; set data.joint_vocab=false"
            )
        given = data[argument]
        if not given:
            readable = readable or (plain_tokenizers(saved, copy_to) if copy_to else path)
            data[argument] = str(readable)
            log.info("%s: the data uses the checkpoint's tokenizer (data.%s=%s)", key, argument, readable)
        elif Tokenizer.from_file(given, checkpoint_key=held) != Tokenizer.from_state(state):
            raise ValueError(
                f"data.{argument}={given} is not the tokenizer that {key}={path} was trained with, and its weights "
                f"only fit that one; drop data.{argument} or set data.{argument}={path} to use the checkpoint's"
            )
