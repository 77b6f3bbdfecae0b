"""What a task needs from its data, stated once: small protocols a datamodule satisfies by having the
attributes, and the one check that names what is missing.

A task declares the protocols it needs (``Task.data_needs``) and receives its datamodule through one hook,
``task.connect_data(datamodule)``, which ``train()`` calls before fitting or testing. The attributes are read
later, when the task builds its models (after the datamodule's ``setup``), so a datamodule may create them
as ``None`` and fill them in ``setup``. This module imports no Lightning and nothing of ours but the
tokenizer type: ``tasks`` and ``data`` both sit above it, and neither imports the other.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from lit_transformers.text import Tokenizer


@runtime_checkable
class TokenizedText(Protocol):
    """Text data: the tokenizer it trained or loaded; the task builds its vocabulary from it and carries it
    in its checkpoints."""

    tokenizer: Tokenizer | None


@runtime_checkable
class ClassNames(Protocol):
    """Labelled data (images, sentences, tags): the class names, in label-id order."""

    class_names: Sequence[str]


@runtime_checkable
class ParallelText(TokenizedText, Protocol):
    """Translation data: ``tokenizer`` is the target side's (the joint one by default), ``source_tokenizer``
    the source side's own (None, or the same object, with one joint vocabulary); ``fixed_examples(n)`` the
    same ``n`` (source, reference) validation pairs at every call, shown on dashboards."""

    source_tokenizer: Tokenizer | None

    def fixed_examples(self, n: int) -> list[tuple[str, str]]: ...


@runtime_checkable
class RetrievalTargets(TokenizedText, Protocol):
    """Image-text data: ``retrieval_targets(split)`` the split's texts and the (n_texts, n_images) bool
    matrix of which text describes which image; ``class_names`` and ``templates`` (split -> prompt format
    strings) for zero-shot classification, empty when the data has no labels."""

    class_names: Sequence[str]
    templates: Mapping[str, Sequence[str]]

    def retrieval_targets(self, split: str) -> tuple[list[str], torch.Tensor]: ...


def protocol_members(protocol: type) -> list[str]:
    """The attribute and method names a protocol asks for, its bases' included."""
    names = set()
    for cls in protocol.__mro__:
        if cls is not protocol and not getattr(cls, "_is_protocol", False):
            continue
        names |= set(getattr(cls, "__annotations__", {}))
        names |= {k for k, v in vars(cls).items() if callable(v) and not k.startswith("_")}
    return sorted(names)


def check_data(datamodule: object, needs: Sequence[type], who: str) -> None:
    """Refuse a datamodule without an attribute that one of ``needs`` asks for, naming every one missing.

    Looked up statically (``inspect.getattr_static``): a property is not evaluated, so checking reads no
    data."""
    missing = [
        f"{name} ({protocol.__name__})"
        for protocol in needs
        for name in protocol_members(protocol)
        if _absent(datamodule, name)
    ]
    if missing:
        raise TypeError(
            f"{who} needs data with {', '.join(missing)}, which {type(datamodule).__name__} does not have. "
            f"Pair the task with a datamodule that provides them (see lit_transformers/contract.py), or "
            "add them to this datamodule."
        )


def _absent(obj: object, name: str) -> bool:
    try:
        inspect.getattr_static(obj, name)
    except AttributeError:
        return True
    return False
