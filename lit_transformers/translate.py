"""Translate with a trained checkpoint: ``lit-translate ckpt=<run>/checkpoints/last.ckpt text="Open file"``, or
one sentence per line on stdin (``lit-translate ckpt=... < sentences.txt > translations.txt``), batched; each
batch's translations print as it finishes. ``lit-translate --help`` lists the keys (conf/translate.yaml)."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Iterator

import hydra
import torch
from omegaconf import DictConfig

from lit_transformers.tasks import TranslationTask
from lit_transformers.utils.checkpoints import check_task_fits, read_checkpoint
from lit_transformers.utils.config import ConfigError, check_required, check_types
from lit_transformers.utils.errors import report_user_errors

FLAG_TYPES = {
    "ckpt": str,
    "beam": int,
    "batch_size": int,
    "encoding": str,
    "device": str,
    "trust_checkpoint": bool,
}


def load_task(cfg: DictConfig) -> TranslationTask:
    """The checkpoint's task, after checking the decoding settings (before the slow load)."""
    check_required(cfg)
    check_types(cfg, flags=FLAG_TYPES)
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={cfg.device} but no CUDA GPU is visible; use device=cpu")
    if cfg.beam < 1 or cfg.batch_size < 1:
        raise ValueError(f"beam={cfg.beam} and batch_size={cfg.batch_size} must be at least 1")
    try:
        newline = "\n".encode(cfg.encoding)
    except LookupError as err:
        raise ConfigError(
            f"encoding={cfg.encoding} is not a text encoding Python knows; e.g. encoding=latin-1"
        ) from err
    if newline != b"\n":  # stdin is split into lines before it is decoded, so that each line fails on its own
        raise ConfigError(
            f"encoding={cfg.encoding} does not write a newline as the byte \\n, and stdin is read line by line: "
            f"convert the input first (iconv -f {cfg.encoding} -t utf-8)"
        )
    check_task_fits(
        read_checkpoint(cfg.ckpt, "ckpt", cfg.trust_checkpoint), cfg.ckpt, TranslationTask, "ckpt"
    )
    return TranslationTask.load_from_checkpoint(
        cfg.ckpt, map_location=cfg.device, weights_only=not cfg.trust_checkpoint
    )


def input_lines(cfg: DictConfig) -> Iterator[str | ValueError]:
    """The sentences to translate, in order, as they arrive: ``text``, or stdin's lines (split at ``\\n`` only,
    so they stay aligned with ``wc -l``), each decoded with ``encoding``; an undecodable line is its error."""
    if cfg.text is not None:
        yield str(cfg.text)  # text=42 is a sentence too
        return
    for raw in sys.stdin.buffer:
        try:
            yield raw.rstrip(b"\r\n").decode(cfg.encoding)
        except UnicodeDecodeError as err:
            yield ValueError(
                f"it is not {cfg.encoding} text (byte {raw[err.start]:#04x} at column {err.start + 1}); set "
                "encoding= to the input's (e.g. encoding=latin-1) or convert the input to UTF-8"
            )


def translated(task: TranslationTask, sentences: list[str], cfg: DictConfig) -> list[str | ValueError]:
    """The translations of ``sentences`` decoded together or, when that fails (say, one is longer than the model
    takes), one by one: a sentence that cannot be translated gets its error instead."""
    try:
        return task.translate_texts(sentences, cfg.beam, cfg.batch_size)
    except ValueError as err:
        if len(sentences) == 1:
            return [err]
        return [result for sentence in sentences for result in translated(task, [sentence], cfg)]


def chunks(items: Iterable, size: int) -> Iterator[list]:
    items = iter(items)
    while chunk := list(itertools.islice(items, size)):
        yield chunk


def translate_lines(task: TranslationTask, cfg: DictConfig) -> None:
    """Print one line per input line, a batch at a time as each finishes; a line that cannot be translated is
    named on stderr and printed empty, and the run then ends with an error counting them."""
    failed, total = [], 0
    for chunk in chunks(enumerate(input_lines(cfg), start=1), cfg.batch_size):
        readable = [(number, line) for number, line in chunk if isinstance(line, str)]
        results = dict(zip((n for n, _ in readable), translated(task, [line for _, line in readable], cfg)))
        for number, line in chunk:
            result = results.get(number, line)
            if isinstance(result, ValueError):
                failed.append(number)
                print(f"line {number} not translated: {result}. Its output line is empty.", file=sys.stderr)
                result = ""
            print(result, flush=True)
        total += len(chunk)
    if failed:
        named = ", ".join(map(str, failed[:10])) + (", ..." if len(failed) > 10 else "")
        raise ValueError(
            f"{len(failed)} of {total} input lines were not translated (line {named}; why is said above); "
            "their output lines are empty, the others are translated"
        )


@hydra.main(version_base="1.3", config_path="pkg://lit_transformers.conf", config_name="translate")
def main(cfg: DictConfig) -> None:
    with report_user_errors():
        translate_lines(load_task(cfg), cfg)


if __name__ == "__main__":
    main()
