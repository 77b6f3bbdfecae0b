"""One LightningModule per training objective."""

from lit_transformers.tasks.base import Task, load_weights
from lit_transformers.tasks.causal_lm import IGNORE_INDEX, CausalLMTask
from lit_transformers.tasks.contrastive import ClipLoss, ContrastiveTask
from lit_transformers.tasks.image_classification import ImageClassificationTask
from lit_transformers.tasks.optim import decay_groups, warmup_cosine

__all__ = [
    "CausalLMTask",
    "ClipLoss",
    "ContrastiveTask",
    "IGNORE_INDEX",
    "ImageClassificationTask",
    "Task",
    "decay_groups",
    "load_weights",
    "warmup_cosine",
]
