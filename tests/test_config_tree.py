"""The config tree says each thing once: every task inherits ``task/_base``, every model group option names a
config dataclass, and the Python defaults of this package's classes equal their YAML.

The rule for defaults: a value that every config file of a class agrees on is that class's default, so a
Python caller (``GPTConfig()``, ``TextSamples(prompts)``) gets what a YAML user gets. Values that differ between
a class's files (the sizes of ``gpt_nano`` and ``gpt_mini``) are those presets' own choice, interpolations
come from the run, and a nested ``_target_`` config is checked in its own group. The data group has its own
rule (each datamodule against its home file, where mandatory paths are set): tests/test_datamodules.py."""

from __future__ import annotations

import dataclasses
import inspect
from collections import defaultdict

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import get_object
from omegaconf import DictConfig, ListConfig, OmegaConf

from conftest import REPO

CONF = REPO / "lit_transformers" / "conf"
# content the YAML brings for its corpus, which a Python caller gives itself (None: no dashboard sentences)
CALLER_GIVEN = {"lit_transformers.tasks.masked_lm.MaskedLMTask.dashboard_sentences"}
# group -> how an override selects one of its files on its own (schedulers sit under task.scheduler in runs)
GROUPS = {
    "model": "model",
    "task": "task",
    "callbacks": "callbacks",
    "scheduler": "+scheduler",
    "trainer": "trainer",
}


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml") if not p.stem.startswith("_"))


@pytest.fixture(scope="module")
def composed():
    """composed(group, option) -> that group's config in a run that selects ``option``."""
    GlobalHydra.instance().clear()
    with initialize_config_module("lit_transformers.conf", version_base="1.3"):
        yield lambda group, option: compose("train", overrides=[f"{GROUPS[group]}={option}"])[group]
    GlobalHydra.instance().clear()


def _our_targets(node):
    """Every config node under ``node`` whose ``_target_`` is an object of this package."""
    if isinstance(node, DictConfig):
        if str(node.get("_target_", "")).startswith("lit_transformers."):
            yield node
        for key in node:
            yield from _our_targets(node._get_node(key))
    elif isinstance(node, ListConfig):
        for item in node:
            yield from _our_targets(item)


def _python_defaults(target) -> dict:
    """Field or keyword defaults of a dataclass, a class (its ``__init__`` and its bases') or a function."""
    if dataclasses.is_dataclass(target):
        return {
            f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(target)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        }
    functions = (
        [c.__init__ for c in reversed(target.__mro__) if "__init__" in vars(c)]
        if inspect.isclass(target)
        else [target]
    )
    return {
        name: p.default
        for function in functions
        for name, p in inspect.signature(function).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def _plain(value):
    """A YAML-comparable value: tuples as lists, nested configs as containers."""
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value)
    return list(value) if isinstance(value, tuple) else value


def _yaml_values(composed) -> dict[str, dict[str, dict[str, object]]]:
    """target -> key -> {where: value} over every option of every checked group; where a file leaves a key
    out, the Python default is its value there."""
    values = defaultdict(lambda: defaultdict(dict))
    for group in GROUPS:
        for option in _options(group):
            for index, node in enumerate(_our_targets(composed(group, option))):
                where = f"{group}/{option}" + (f"[{index}]" if index else "")
                for key, default in _python_defaults(get_object(node._target_)).items():
                    values[node._target_][key][where] = _plain(default)
                for key in node:
                    if key == "_target_":
                        continue
                    set_by_run = OmegaConf.is_interpolation(node, key)
                    value = None if set_by_run else node[key]
                    if set_by_run or (isinstance(value, DictConfig) and "_target_" in value):
                        values[node._target_][key].pop(where, None)  # the run's, or checked in its own group
                    else:
                        values[node._target_][key][where] = _plain(value)
    return values


def test_values_every_config_file_agrees_on_are_the_python_defaults(composed):
    disagreements = []
    for target, keys in sorted(_yaml_values(composed).items()):
        defaults = _python_defaults(get_object(target))
        for key, where in keys.items():
            agreed = {repr(v) for v in where.values()}
            name = f"{target}.{key}"
            if len(agreed) == 1 and key in defaults and name not in CALLER_GIVEN:
                value = next(iter(where.values()))
                if value != _plain(defaults[key]):
                    disagreements.append(
                        f"{name}: YAML {value!r} ({', '.join(where)}), Python {defaults[key]!r}"
                    )
    assert not disagreements, "\n".join(disagreements)


def test_every_model_option_names_a_config_dataclass(composed):
    for option in _options("model"):
        target = composed("model", option).get("_target_")
        assert target and dataclasses.is_dataclass(get_object(target)), f"model={option}"


def test_every_task_inherits_the_shared_task_keys():
    base = OmegaConf.load(CONF / "task" / "_base.yaml")
    for option in _options("task"):
        own = OmegaConf.load(CONF / "task" / f"{option}.yaml")
        assert own.defaults[0] == "_base", f"task/{option}.yaml"
        assert not set(base) & set(own), f"task/{option}.yaml restates {sorted(set(base) & set(own))}"
