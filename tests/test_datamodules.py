"""What every datamodule shares: Python defaults equal to its home YAML, and a tokenizer cache key that no
argument can be left out of."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import get_class
from omegaconf import DictConfig, ListConfig, OmegaConf

from lit_transformers.data.base import TextDataModule
from lit_transformers.data.bert import MaskedLMDataModule
from lit_transformers.data.captions import CaptionDataModule
from lit_transformers.data.images import ImageClassificationDataModule
from lit_transformers.data.instructions import InstructionDataModule
from lit_transformers.data.lm import CausalLMDataModule
from lit_transformers.data.text_classification import TextClassificationDataModule
from lit_transformers.data.token_classification import TokenClassificationDataModule
from lit_transformers.data.translation import TranslationDataModule

from conftest import REPO

DATA_FILES = sorted(p.stem for p in (REPO / "lit_transformers" / "conf" / "data").glob("*.yaml"))
# A datamodule's home is the conf/data file of its family's first experiment (python train.py, bert_pretrain,
# bert_classify, bert_token_classify, translation, the InstructGPT stages, clip, vit), composed with that
# experiment's model where an interpolation reads it. Other files that name the class (captions, cifar10,
# imagenet) are variants for another dataset: they override the defaults.
HOMES = {
    CausalLMDataModule: ("lm", []),
    MaskedLMDataModule: ("bert", ["model=bert_tiny"]),
    TextClassificationDataModule: ("gettext_language_id", []),
    TokenClassificationDataModule: ("conll", []),
    TranslationDataModule: ("translation", ["model=transformer_tiny"]),
    InstructionDataModule: ("instructions", []),
    CaptionDataModule: ("digit_captions", []),
    ImageClassificationDataModule: ("digits", []),
}
TEXT_DATAMODULES = [cls for cls in HOMES if issubclass(cls, TextDataModule)]


def _data_config(name: str, *overrides: str) -> DictConfig:
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module("lit_transformers.conf", version_base="1.3"):
            return compose("train", overrides=[f"data={name}", *overrides]).data
    finally:
        GlobalHydra.instance().clear()


def _defaults(cls: type) -> dict:
    """Each __init__ argument's default: the class's own, else that of the base it is passed on to."""
    defaults = {}
    for klass in reversed(cls.__mro__):
        for name, parameter in inspect.signature(klass.__init__).parameters.items():
            if name != "self" and parameter.kind is parameter.POSITIONAL_OR_KEYWORD:
                defaults[name] = parameter.default
    return defaults


def _plain(value):
    return OmegaConf.to_container(value) if isinstance(value, DictConfig | ListConfig) else value


def test_every_data_file_names_a_datamodule_that_has_a_home():
    targets = {
        get_class(OmegaConf.load(REPO / f"lit_transformers/conf/data/{n}.yaml")._target_) for n in DATA_FILES
    }
    assert targets == set(HOMES)
    for cls, (name, _) in HOMES.items():  # a module path: the package does not import every family for one
        assert _data_config(name)._target_ == f"{cls.__module__}.{cls.__name__}"


@pytest.mark.parametrize("cls", list(HOMES), ids=lambda cls: cls.__name__)
def test_python_defaults_equal_the_home_yaml(cls, monkeypatch):
    """Scalars and lists; a nested group (corpus, transform, mixup, pool_shares) is its component's settings,
    whose Python default None means that component's own defaults."""
    monkeypatch.delenv("LIT_CACHE_DIR", raising=False)  # paths.cache_dir is then its default
    name, overrides = HOMES[cls]
    data, defaults = _data_config(name, *overrides), _defaults(cls)
    assert set(data) - {"_target_"} <= set(defaults), f"{name}.yaml has keys {cls.__name__} does not take"
    assert set(defaults) <= set(data), f"{name}.yaml leaves {cls.__name__} arguments undocumented"
    for key in defaults:
        if OmegaConf.is_missing(data, key):  # ??? in the home file: a value only the user has
            continue
        yaml_value = _plain(data[key])
        if isinstance(yaml_value, dict):
            continue
        python_value = defaults[key]
        if isinstance(python_value, tuple):
            python_value = list(python_value)
        assert yaml_value == python_value, (
            f"{cls.__name__}({key}={python_value!r}) but {name}.yaml: {yaml_value!r}"
        )


@pytest.mark.parametrize("cls", TEXT_DATAMODULES, ids=lambda cls: cls.__name__)
def test_the_tokenizer_key_holds_every_argument_but_the_named_independent_ones(cls):
    arguments = set(_defaults(cls))
    added = cls.tokenizer_independent - TextDataModule.tokenizer_independent  # the base's hold for any family
    assert added <= arguments, "tokenizer_independent names an argument that does not exist"
    settings = cls().tokenizer_identity["settings"]
    assert set(settings) == arguments - cls.tokenizer_independent


def test_an_argument_added_later_keys_the_tokenizer_without_being_listed(tmp_path):
    class WithVariant(TokenClassificationDataModule):
        def __init__(self, variant: str = "a", **kwargs):
            super().__init__(**kwargs)

    assert WithVariant(variant="a").tokenizer_identity != WithVariant(variant="b").tokenizer_identity
    assert WithVariant(batch_size=8).tokenizer_identity == WithVariant(batch_size=16).tokenizer_identity


def _conll(path: Path, sentences: int) -> Path:
    path.write_text("".join(f"word{i} B-X\nother{i % 3} O\n\n" for i in range(sentences)))
    return path


def test_a_changed_data_file_retrains_the_tokenizer_and_batching_settings_reuse_it(tmp_path):
    path, cache = _conll(tmp_path / "a.conll", 40), tmp_path / "cache"

    def cached_after(**kwargs) -> list[str]:
        args = dict(path=str(path), vocab_size=120, cache_dir=str(cache), **kwargs)
        TokenClassificationDataModule(**args).prepare_data()
        return sorted(p.name for p in (cache / "tokenizers").iterdir())

    first = cached_after(batch_size=4)
    assert len(first) == 1
    assert cached_after(batch_size=16, num_workers=1, max_seq_len=64) == first  # settings after tokenizing
    assert len(cached_after(seed=1)) == 2  # another split: other training texts
    _conll(path, 41)
    assert len(cached_after(seed=1)) == 3  # the file changed: its size and time
