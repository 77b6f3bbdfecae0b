"""Package exports load lazily: a GPT run imports its own files, not timm, torchvision or scikit-learn (which
only the image families need), and the public names still resolve as before."""

from __future__ import annotations

import importlib
import sys

import pytest
from hydra.utils import get_object

from conftest import REPO, run_cli

PACKAGES = ["callbacks", "data", "models", "nn", "tasks", "text"]
IMAGE_STACK = {"timm", "torchvision", "sklearn"}

# the default experiment composed and built as train.py builds it; Lightning's own imports are measured first
BUILD_DEFAULT_RUN = """
import sys, tempfile
import lightning
preloaded = set(sys.modules)
from hydra.utils import instantiate
from conftest import compose_train_cfg
from lit_transformers.utils.config import instantiate_group
out = tempfile.mkdtemp()
cfg = compose_train_cfg(output_dir=out, cache_dir=out)
instantiate(cfg.data, _convert_="all")
instantiate(cfg.task, _recursive_=False, _convert_="all")
callbacks = instantiate_group(cfg.get("callbacks"), "callbacks")
loggers = instantiate_group(cfg.get("logger"), "logger")
instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
print(" ".join(sorted(sys.modules)))
print(" ".join(sorted(set(sys.modules) - preloaded)))
"""


@pytest.mark.cli
def test_building_the_default_gpt_run_imports_no_timm_torchvision_or_sklearn():
    done = run_cli(sys.executable, "-c", BUILD_DEFAULT_RUN, cwd=REPO / "tests")
    assert done.returncode == 0, done.stderr
    loaded, ours = (set(line.split()) for line in done.stdout.splitlines()[-2:])
    assert "lit_transformers.tasks.causal_lm" in ours  # the run was built
    roots = {name.split(".")[0] for name in ours}
    assert not roots & IMAGE_STACK, f"imported by the GPT run: {sorted(roots & IMAGE_STACK)}"
    # torchmetrics (under Lightning) may import torchvision itself; timm and scikit-learn nothing of theirs
    assert not {"timm", "sklearn"} & loaded


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_resolves_to_its_submodules_object(package):
    module = importlib.import_module(f"lit_transformers.{package}")
    assert module.__all__ and set(module.__all__) <= set(dir(module))
    for name in module.__all__:
        value = getattr(module, name)
        home = getattr(value, "__module__", None)
        if home is not None:  # classes and functions: the submodule named in the table defines them
            assert getattr(importlib.import_module(home), name) is value
    with pytest.raises(AttributeError, match="has no attribute 'Missing'"):
        module.Missing  # noqa: B018


def test_old_checkpoint_targets_still_resolve():
    # hyperparameters saved before the config tree named module paths hold the package-level names
    from lit_transformers.models.gpt import GPTConfig
    from lit_transformers.tasks.optim import warmup_cosine

    assert get_object("lit_transformers.models.GPTConfig") is GPTConfig
    assert get_object("lit_transformers.tasks.warmup_cosine") is warmup_cosine


def test_every_benchmark_script_imports_what_it_names(monkeypatch):
    # a function moved between modules once broke benchmarks/lora_step.py without a test noticing
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    before = set(sys.modules)
    try:
        for script in sorted((REPO / "benchmarks").glob("*.py")):
            importlib.import_module(script.stem)
    finally:
        for name in (
            set(sys.modules) - before
        ):  # the scripts' generic names (timing, generate) leave with them
            if getattr(sys.modules[name], "__file__", "") and "benchmarks" in sys.modules[name].__file__:
                del sys.modules[name]
