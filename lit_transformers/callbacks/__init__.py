"""Lightning callbacks that the stock ones do not cover."""

from lit_transformers.callbacks.nonfinite import NonFiniteLossError, StopOnNonFiniteLoss
from lit_transformers.callbacks.random_state import RandomStateCheckpoint
from lit_transformers.callbacks.samples import TextSamples
from lit_transformers.callbacks.throughput import TokensPerSecond

__all__ = [
    "NonFiniteLossError",
    "RandomStateCheckpoint",
    "StopOnNonFiniteLoss",
    "TextSamples",
    "TokensPerSecond",
]
