"""Reading a Hugging Face checkpoint: what the GPT-2, BERT and Marian name maps (``hf_gpt2``, ``hf_bert``,
``hf_marian``) all start from."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def read_hf_config(path: str | Path, family: str) -> dict:
    """The ``config.json`` of a Hugging Face ``family`` (GPT-2, BERT, Marian) checkpoint directory."""
    path = Path(path).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"No config.json in {path}; pass a Hugging Face {family} checkpoint directory"
        )
    return json.loads((path / "config.json").read_text())


def load_hf_checkpoint(path_or_model, family: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config dict, state dict) from a ``transformers`` model object or a local checkpoint directory
    (``model.safetensors`` or ``pytorch_model.bin``, the latter read with ``weights_only``)."""
    if isinstance(path_or_model, torch.nn.Module):
        return path_or_model.config.to_dict(), path_or_model.state_dict()
    path = Path(path_or_model).expanduser()
    config = read_hf_config(path, family)
    if (path / "model.safetensors").is_file():
        from safetensors.torch import load_file

        state = load_file(str(path / "model.safetensors"))
    elif (path / "pytorch_model.bin").is_file():
        state = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"No model.safetensors or pytorch_model.bin in {path}")
    return config, state
