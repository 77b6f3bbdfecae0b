"""Model families as plain ``nn.Module``s (no Lightning)."""

from lit_transformers.models.backbone import create_backbone
from lit_transformers.models.bert import BERT, BERTConfig
from lit_transformers.models.clip import CLIP, CLIPConfig
from lit_transformers.models.gpt import GPT, GPTConfig
from lit_transformers.models.scalar import ScalarGPT
from lit_transformers.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

__all__ = [
    "BERT",
    "BERTConfig",
    "CLIP",
    "CLIPConfig",
    "GPT",
    "GPTConfig",
    "ScalarGPT",
    "Seq2SeqConfig",
    "Seq2SeqTransformer",
    "create_backbone",
]
