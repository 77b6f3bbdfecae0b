"""Lightning callbacks that the stock ones do not cover. Exports load lazily, each from its own file."""

from lit_transformers.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "checkpoint": ["NewestLastCheckpoint"],
        "final_validation": ["ValidateAfterLastStep"],
        "interrupt": ["Interrupted", "StopOnSignal"],
        "nonfinite": ["NonFiniteLossError", "StopOnNonFiniteLoss"],
        "progress": ["StepProgressBar"],
        "random_state": ["RandomStateCheckpoint"],
        "samples": ["TextSamples"],
        "throughput": ["StageClock", "Throughput"],
    },
)
