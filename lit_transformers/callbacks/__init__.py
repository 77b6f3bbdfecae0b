"""Lightning callbacks that the stock ones do not cover."""

from lit_transformers.callbacks.nonfinite import NonFiniteLossError, StopOnNonFiniteLoss
from lit_transformers.callbacks.samples import TextSamples
from lit_transformers.callbacks.throughput import TokensPerSecond

__all__ = ["NonFiniteLossError", "StopOnNonFiniteLoss", "TextSamples", "TokensPerSecond"]
