"""Reading checkpoints safely, with errors that say what is wrong with the file and what to do.

Our checkpoints hold only tensors and plain data (tasks keep their hyperparameters as plain containers), so
they load with ``torch.load(weights_only=True)``, which cannot run code from the file. A checkpoint that
needs arbitrary unpickling is refused unless the user vouches for it with ``trust_checkpoint=true``.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from lit_transformers.text import Tokenizer

log = logging.getLogger(__name__)

# a datamodule's tokenizer arguments, each with the checkpoint hyperparameter holding the tokenizer it gives
TOKENIZER_ARGUMENTS = {"tokenizer_path": "tokenizer", "source_tokenizer_path": "source_tokenizer"}


TRUST_FIX = "If you trust where it came from, set trust_checkpoint=true"
CORRUPT_CHECKPOINT_FIX = "Use another one, e.g. <run>/checkpoints/last.ckpt"


def read_weights(
    path: str | Path,
    named: str,
    trusted: bool = False,
    pickled_fix: str = TRUST_FIX,
    corrupt_fix: str = CORRUPT_CHECKPOINT_FIX,
) -> Any:
    """What the file at ``path`` holds: tensors and plain data (``torch.load(weights_only=True)``, unless
    ``trusted``; safetensors for ``.safetensors``). A file that needs arbitrary unpickling, or that is truncated
    or corrupt, is refused in one paragraph beginning with ``named`` (how the command line names the file) and
    ending with ``pickled_fix`` or ``corrupt_fix``, instead of torch's advice to load it with
    ``weights_only=False``."""
    path = Path(path).expanduser()
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(path)
        # mmap reads tensors only when used; it needs the zip format that torch.save writes since torch 1.6
        return torch.load(path, map_location="cpu", weights_only=not trusted, mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError as err:
        # torch's own reason, after the advice to load with weights_only=False that we do not pass on
        refused = re.search(r"WeightsUnpickler error:\s*(.+)", str(err), re.DOTALL)
        reason = _first_sentence(refused.group(1) if refused else str(err))
        # a broken file rather than a refused one: a trusted load failed, or the bytes are no pickle at all
        if trusted or refused is None or reason.startswith("Unsupported operand"):
            raise _corrupt(named, f"{type(err).__name__}: {reason}", corrupt_fix) from err
        raise ValueError(
            f"{named} holds pickled Python objects, and loading it could run code from the file ({reason}). "
            f"{pickled_fix}."
        ) from err
    except Exception as err:  # noqa: BLE001 - torch and safetensors raise RuntimeError, EOFError... for bad files
        raise _corrupt(named, f"{type(err).__name__}: {_first_sentence(str(err))}", corrupt_fix) from err


def _corrupt(named: str, reason: str, fix: str) -> ValueError:
    return ValueError(f"{named} is not readable: it is truncated or corrupt ({reason}). {fix}.")


def _first_sentence(text: str, limit: int = 150) -> str:
    sentence = text.strip().split(". ")[0].split("\n")[0]
    return sentence if len(sentence) <= limit else sentence[:limit] + "..."


def read_checkpoint(path: str | Path, key: str = "ckpt_path", trusted: bool = False) -> dict:
    """The checkpoint at ``path`` (named ``key`` on the command line) as a dict."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{key}={path} not found; pass the path of a .ckpt file")
    checkpoint = read_weights(path, f"{key}={path}", trusted)
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


def plain_tokenizers(saved: dict, folder: str | Path, name: str = "checkpoint_tokenizers.ckpt") -> Path:
    """``folder``/``name``: the tokenizers of a checkpoint's hyperparameters ``saved`` alone, as plain data,
    which loads weights-only (the way every datamodule reads a tokenizer_path .ckpt)."""
    copy = Path(folder) / name
    copy.parent.mkdir(parents=True, exist_ok=True)
    tmp = copy.with_suffix(f".tmp{os.getpid()}")  # every DDP rank writes the same file: atomically
    torch.save({"hyper_parameters": {held: saved.get(held) for held in TOKENIZER_ARGUMENTS.values()}}, tmp)
    tmp.replace(copy)
    return copy


def read_tokenizer_checkpoints(data: DictConfig, trusted: bool, copy_to: str | Path) -> None:
    """Read each tokenizer argument of ``data`` (:data:`TOKENIZER_ARGUMENTS`) that names a ``.ckpt`` file as
    checkpoints are read (:func:`read_weights`), so that a truncated or pickled one is refused naming
    ``data.<argument>`` rather than by a traceback from inside the datamodule. A ``trusted`` one, which may need
    unpickling, becomes its :func:`plain_tokenizers` copy in ``copy_to``, which the data's weights-only reading
    takes."""
    for argument in TOKENIZER_ARGUMENTS:
        given = data.get(argument)
        if not given or Path(given).suffix != ".ckpt" or not Path(given).expanduser().is_file():
            continue  # a tokenizer.json, vocab.txt or folder; a missing file is named by Tokenizer.from_file
        checkpoint = read_weights(given, f"data.{argument}={given}", trusted)
        if trusted:
            saved = checkpoint.get("hyper_parameters", {}) if isinstance(checkpoint, dict) else {}
            data[argument] = str(plain_tokenizers(saved, copy_to, f"{argument}.ckpt"))
            log.info(
                "data.%s=%s: the data reads its tokenizers from a plain copy, %s",
                argument,
                given,
                data[argument],
            )


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
