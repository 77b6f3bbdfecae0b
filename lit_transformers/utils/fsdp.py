"""FSDP wrap policy for YAML: Hydra cannot spell a set of classes, so a function returns it."""

from lit_transformers.nn.blocks import TransformerBlock


def block_wrap_policy() -> set[type]:
    return {TransformerBlock}
