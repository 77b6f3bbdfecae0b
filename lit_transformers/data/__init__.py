"""LightningDataModules and corpora (tokenizers, padding and splits live in ``lit_transformers.text``)."""

from lit_transformers.data.bert import EncoderCollator, MaskedLMDataModule
from lit_transformers.data.captions import CaptionDataModule, read_caption_table
from lit_transformers.data.corpus import CorpusSpec, load_documents, split_documents
from lit_transformers.data.gettext import language_samples, read_mo
from lit_transformers.data.images import ImageClassificationDataModule, build_transform, load_image_splits
from lit_transformers.data.instructions import InstructionDataModule
from lit_transformers.data.lm import CausalLMDataModule, TokenWindows
from lit_transformers.data.text_classification import TextClassificationDataModule, read_labeled_table
from lit_transformers.data.token_classification import TokenClassificationDataModule, read_conll
from lit_transformers.data.translation import TranslationDataModule, gettext_pairs, read_parallel_file

__all__ = [
    "CaptionDataModule",
    "CausalLMDataModule",
    "CorpusSpec",
    "EncoderCollator",
    "ImageClassificationDataModule",
    "InstructionDataModule",
    "MaskedLMDataModule",
    "TextClassificationDataModule",
    "TokenClassificationDataModule",
    "TokenWindows",
    "TranslationDataModule",
    "build_transform",
    "gettext_pairs",
    "language_samples",
    "load_documents",
    "load_image_splits",
    "read_conll",
    "read_labeled_table",
    "read_mo",
    "read_parallel_file",
    "read_caption_table",
    "split_documents",
]
