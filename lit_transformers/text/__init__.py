"""Text utilities below both ``data`` and ``tasks`` (no Lightning): tokenizer, chat templates, padding and
collation, splits, BERT's sentence pairs and masking. Exports load lazily, like every package's."""

from lit_transformers.lazy import lazy_exports
from lit_transformers.nn.losses import IGNORE_INDEX

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "batching": ["eos_terminated", "left_pad", "pad_pairs", "right_pad"],
        "chat": ["ChatTokens", "check_messages", "encode_chat", "encode_prompt_completion", "render_chat"],
        "mlm": ["SentencePair", "build_nsp_pairs", "mask_tokens", "pack_pair", "split_sentences"],
        "splits": ["hashed_order", "split_by_fractions"],
        "tokenizer": ["BERT_SPECIAL_TOKENS", "MARIAN_SPECIAL_TOKENS", "SPECIAL_TOKENS", "Tokenizer"],
    },
)
__all__ = [*__all__, "IGNORE_INDEX"]
