"""One LightningModule per training objective, on the shared base ``Task``."""

from lit_transformers.tasks.base import Task, build_config, load_weights
from lit_transformers.tasks.causal_lm import CausalLMTask
from lit_transformers.tasks.contrastive import ContrastiveTask
from lit_transformers.tasks.dpo import DPOTask
from lit_transformers.tasks.encoder import EncoderTask
from lit_transformers.tasks.image_classification import ImageClassificationTask
from lit_transformers.tasks.masked_lm import MaskedLMTask
from lit_transformers.tasks.optim import decay_groups, inverse_sqrt, warmup_cosine, warmup_linear
from lit_transformers.tasks.ppo import PPOTask
from lit_transformers.tasks.reward import RewardTask
from lit_transformers.tasks.sequence_classification import SequenceClassificationTask
from lit_transformers.tasks.sft import SFTTask
from lit_transformers.tasks.token_classification import TokenClassificationTask
from lit_transformers.tasks.translation import TranslationTask

__all__ = [
    "CausalLMTask",
    "ContrastiveTask",
    "DPOTask",
    "EncoderTask",
    "ImageClassificationTask",
    "MaskedLMTask",
    "PPOTask",
    "RewardTask",
    "SFTTask",
    "SequenceClassificationTask",
    "Task",
    "TokenClassificationTask",
    "TranslationTask",
    "build_config",
    "decay_groups",
    "inverse_sqrt",
    "load_weights",
    "warmup_cosine",
    "warmup_linear",
]
