"""LightningDataModules, tokenizers and corpora."""

from lit_transformers.data.corpus import CorpusSpec, load_documents, split_documents
from lit_transformers.data.lm import CausalLMDataModule, TokenWindows
from lit_transformers.data.tokenizer import Tokenizer

__all__ = ["CausalLMDataModule", "CorpusSpec", "TokenWindows", "Tokenizer", "load_documents", "split_documents"]
