"""Model families as plain ``nn.Module``s (no Lightning). Exports load lazily: ``GPT`` imports ``gpt.py``
alone, not timm behind ``create_backbone``."""

from lit_transformers.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "backbone": ["ImageClassifierConfig", "create_backbone"],
        "bert": ["BERT", "BERTConfig"],
        "clip": ["CLIP", "CLIPConfig"],
        "gpt": ["GPT", "GPTConfig"],
        "scalar": ["ScalarGPT"],
        "seq2seq": ["Seq2SeqConfig", "Seq2SeqTransformer"],
    },
)
