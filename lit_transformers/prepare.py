"""``lit-prepare data.shards_dir=<folder> [overrides]`` (or ``python -m lit_transformers.prepare``): tokenize a
corpus once into token shards, in parallel worker processes. The overrides are those of training (``experiment=``,
``data.corpus.*``, ``data.vocab_size``, ...); training with the same ``data.shards_dir`` then reads the shards."""

from __future__ import annotations

import sys
import time

from hydra import compose, initialize_config_module
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from lit_transformers.data import CausalLMDataModule
from lit_transformers.utils.config import ConfigError, check_required, check_types
from lit_transformers.utils.errors import report_user_errors

HELP = """lit-prepare: tokenize a causal-LM corpus once into token shards, in parallel worker processes; training with
the same data.shards_dir then reads its windows from them (constant memory) instead of the corpus.

  lit-prepare data.shards_dir=<folder> [overrides]
  lit-prepare data.shards_dir=/data/shards/books data.corpus.source=path data.corpus.path=/data/books/ data.vocab_size=8192
  lit-train experiment=gpt_pretrain data.shards_dir=/data/shards/books

The overrides are those of training (experiment=, data.corpus.*, data.vocab_size, data.tokenizer_path, ...). The
shards carry their tokenizer and document split: training on them reads neither the corpus nor the tokenizer
keys, and refuses another split or data.tokenizer_path. The keys that matter here:
  data.shards_dir        required: the folder the shards are written to
  data.prepare_workers   tokenizing processes (0: this process alone)
  data.corpus.*          what to read; data.tokenizer, data.vocab_size, data.tokenizer_path: how to tokenize it
  data.val_fraction, data.test_fraction, data.seed: the document split (the shards keep one per split)
Each key is described in conf/data/lm.yaml; lit-train --cfg job <overrides> prints them all.

The data config with these overrides:
"""


def train_config(overrides: list[str]) -> DictConfig:
    with initialize_config_module("lit_transformers.conf", version_base="1.3"):
        return compose("train", overrides=overrides)


def prepare(overrides: list[str]) -> dict:
    """Compose the train config with ``overrides`` and write its LM data's shards; returns their index."""
    cfg = OmegaConf.masked_copy(train_config(overrides), ["data", "model", "paths"])  # what the data needs
    cfg.paths.output_dir = None  # no run folder: prepare writes only the shards
    check_required(cfg)
    check_types(cfg)
    if not issubclass(get_class(cfg.data._target_), CausalLMDataModule):  # before it loads any data
        raise ConfigError(
            f"lit-prepare writes causal-LM token shards, and data._target_={cfg.data._target_} is not LM data; "
            "choose LM data (data=lm, or an experiment on it)"
        )
    return instantiate(cfg.data, _convert_="all").write_shards()


def main() -> None:
    overrides = sys.argv[1:]
    with report_user_errors():
        if {"--help", "-h"} & set(overrides):  # not a Hydra app (it composes the train config): its own help
            overrides = [o for o in overrides if o not in ("--help", "-h")]
            print(HELP + OmegaConf.to_yaml(train_config(overrides).data))
            return
        start = time.perf_counter()
        index = prepare(overrides)
        tokens = {split: sum(s["tokens"] for s in shards) for split, shards in index["splits"].items()}
        print(
            f"Token shards written in {time.perf_counter() - start:.1f} s: {tokens} tokens ({index['dtype']})"
        )


if __name__ == "__main__":
    main()
