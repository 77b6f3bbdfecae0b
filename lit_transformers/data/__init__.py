"""LightningDataModules and corpora (tokenizers, padding and splits live in ``lit_transformers.text``).
Exports load lazily: a text datamodule does not import timm, torchvision and scikit-learn behind ``images``."""

from lit_transformers.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "bert": ["EncoderCollator", "MaskedLMDataModule"],
        "captions": ["CaptionDataModule", "read_caption_table"],
        "corpus": ["CorpusSpec", "load_documents", "split_documents"],
        "gettext": ["language_samples", "read_mo"],
        "images": ["ImageClassificationDataModule", "build_transform", "load_image_splits"],
        "instructions": ["InstructionDataModule"],
        "lm": ["CausalLMDataModule", "TokenWindows"],
        "text_classification": ["TextClassificationDataModule", "read_labeled_table"],
        "token_classification": ["TokenClassificationDataModule", "read_conll"],
        "translation": ["TranslationDataModule", "gettext_pairs", "read_parallel_file"],
    },
)
