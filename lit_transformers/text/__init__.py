"""Text utilities below both ``data`` and ``tasks`` (no Lightning): tokenizer, padding and collation, splits."""

from lit_transformers.nn.losses import IGNORE_INDEX
from lit_transformers.text.batching import eos_terminated, left_pad, pad_pairs, right_pad
from lit_transformers.text.splits import split_by_fractions
from lit_transformers.text.tokenizer import SPECIAL_TOKENS, Tokenizer

__all__ = [
    "IGNORE_INDEX",
    "SPECIAL_TOKENS",
    "Tokenizer",
    "eos_terminated",
    "left_pad",
    "pad_pairs",
    "right_pad",
    "split_by_fractions",
]
