"""Checks shared by the datamodules' constructors: a bad value fails as the config is built, naming its key."""

from __future__ import annotations


def check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(
            f"data.batch_size={batch_size!r}: a batch needs a whole number of examples, at least one; "
            "set data.batch_size to 1 or more (examples per batch per device)"
        )
