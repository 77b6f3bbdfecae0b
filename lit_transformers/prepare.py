"""``lit-prepare data.shards_dir=<folder> [overrides]`` (or ``python -m lit_transformers.prepare``): tokenize a
corpus once into token shards, in parallel worker processes. The overrides are those of training (``experiment=``,
``data.corpus.*``, ``data.vocab_size``, ...); training with the same ``data.shards_dir`` then reads the shards."""

from __future__ import annotations

import sys
import time

from hydra import compose, initialize_config_module
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

from lit_transformers.data import CausalLMDataModule
from lit_transformers.utils.config import ConfigError, check_required, check_types
from lit_transformers.utils.errors import report_user_errors


def prepare(overrides: list[str]) -> dict:
    """Compose the train config with ``overrides`` and write its LM data's shards; returns their index."""
    with initialize_config_module("lit_transformers.conf", version_base="1.3"):
        composed = compose("train", overrides=overrides)
    cfg = OmegaConf.masked_copy(composed, ["data", "model", "paths"])  # what the data needs
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
    with report_user_errors():
        start = time.perf_counter()
        index = prepare(sys.argv[1:])
        tokens = {split: sum(s["tokens"] for s in shards) for split, shards in index["splits"].items()}
        print(
            f"Token shards written in {time.perf_counter() - start:.1f} s: {tokens} tokens ({index['dtype']})"
        )


if __name__ == "__main__":
    main()
