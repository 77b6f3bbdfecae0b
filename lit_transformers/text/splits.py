"""One deterministic train/val/test split by fractions, shared by every datamodule."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def hashed_order(keys: Sequence[str], seed: int | str = 0) -> list[int]:
    """Indices of ``keys`` ranked by a seeded hash of each key: a shuffle that every rank and run agrees on, and
    in which an item keeps its place relative to the others when items are added or removed."""
    return sorted(range(len(keys)), key=lambda i: hashlib.sha1(f"{seed}:{keys[i]}".encode()).hexdigest())


def split_by_fractions(
    keys: Sequence[str], val_fraction: float, test_fraction: float, seed: int = 0, what: str = "items"
) -> dict[str, list[int]]:
    """Indices of ``keys`` per split (each split in key order), ranked by a seeded hash of each key.

    The hash (not the input order) decides, so an item stays in its split when others are added or
    reordered, and every rank computes the same split without communicating. A non-zero fraction always
    gets at least one item; training must keep at least one.
    """
    ranked = hashed_order(keys, seed)
    n_val = max(1, round(len(keys) * val_fraction)) if val_fraction > 0 else 0
    n_test = max(1, round(len(keys) * test_fraction)) if test_fraction > 0 else 0
    if len(keys) - n_val - n_test < 1:
        raise ValueError(
            f"{len(keys)} {what} are too few for val/test splits of {n_val}/{n_test} and a training split; "
            "add data or lower data.val_fraction/data.test_fraction"
        )
    parts = {
        "train": ranked[n_val + n_test :],
        "val": ranked[:n_val],
        "test": ranked[n_val : n_val + n_test],
    }
    return {
        name: sorted(idx, key=lambda i: keys[i]) for name, idx in parts.items()
    }  # input order is irrelevant
