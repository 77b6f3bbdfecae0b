"""Text utilities below both ``data`` and ``tasks`` (no Lightning): tokenizer, padding and collation, splits,
BERT's sentence pairs and masking."""

from lit_transformers.nn.losses import IGNORE_INDEX
from lit_transformers.text.batching import eos_terminated, left_pad, pad_pairs, right_pad
from lit_transformers.text.mlm import SentencePair, build_nsp_pairs, mask_tokens, pack_pair, split_sentences
from lit_transformers.text.splits import hashed_order, split_by_fractions
from lit_transformers.text.tokenizer import (
    BERT_SPECIAL_TOKENS,
    MARIAN_SPECIAL_TOKENS,
    SPECIAL_TOKENS,
    Tokenizer,
)

__all__ = [
    "BERT_SPECIAL_TOKENS",
    "IGNORE_INDEX",
    "MARIAN_SPECIAL_TOKENS",
    "SPECIAL_TOKENS",
    "SentencePair",
    "Tokenizer",
    "build_nsp_pairs",
    "eos_terminated",
    "hashed_order",
    "left_pad",
    "mask_tokens",
    "pack_pair",
    "pad_pairs",
    "right_pad",
    "split_by_fractions",
    "split_sentences",
]
