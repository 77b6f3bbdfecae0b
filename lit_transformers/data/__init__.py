"""LightningDataModules, tokenizers and corpora."""

from lit_transformers.data.corpus import CorpusSpec, load_documents, split_documents
from lit_transformers.data.lm import CausalLMDataModule, TokenWindows
from lit_transformers.data.tokenizer import Tokenizer
from lit_transformers.data.captions import CaptionDataModule, read_caption_table, tokenize
from lit_transformers.data.images import ImageClassificationDataModule, build_transform, load_image_splits

__all__ = ["CausalLMDataModule", "CorpusSpec", "TokenWindows", "Tokenizer", "load_documents", "split_documents"]
__all__ += [
    "CaptionDataModule",
    "ImageClassificationDataModule",
    "build_transform",
    "load_image_splits",
    "read_caption_table",
    "tokenize",
]
