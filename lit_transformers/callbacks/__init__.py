"""Lightning callbacks that the stock ones do not cover."""

from lit_transformers.callbacks.final_validation import ValidateAfterLastStep
from lit_transformers.callbacks.interrupt import Interrupted, StopOnSignal
from lit_transformers.callbacks.nonfinite import NonFiniteLossError, StopOnNonFiniteLoss
from lit_transformers.callbacks.progress import StepProgressBar
from lit_transformers.callbacks.random_state import RandomStateCheckpoint
from lit_transformers.callbacks.samples import TextSamples
from lit_transformers.callbacks.throughput import TokensPerSecond

__all__ = [
    "Interrupted",
    "NonFiniteLossError",
    "RandomStateCheckpoint",
    "StepProgressBar",
    "StopOnNonFiniteLoss",
    "StopOnSignal",
    "TextSamples",
    "TokensPerSecond",
    "ValidateAfterLastStep",
]
