"""Lazy package exports (PEP 562): a package ``__init__`` names which submodule holds each public name, and
the submodule is imported on first use. ``from lit_transformers.models import GPT`` then imports
``models/gpt.py`` alone, so a GPT run never pays for (or breaks on) timm, torchvision or scikit-learn behind
``models/backbone.py`` or ``data/images.py``; old checkpoints naming ``lit_transformers.models.GPTConfig``
still resolve."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_exports(
    package: str, exports: dict[str, list[str]]
) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``, whose public names live in the submodules that
    ``exports`` maps to them: ``{"gpt": ["GPT", "GPTConfig"], ...}``."""
    home = {name: submodule for submodule, names in exports.items() for name in names}

    def __getattr__(name: str) -> object:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home[name]}"), name)
        setattr(sys.modules[package], name, value)  # later lookups are plain attribute reads
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(home))

    return __getattr__, __dir__, list(home)
