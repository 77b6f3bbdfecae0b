"""Padding and collation of token-id sequences into (B, T) tensors plus a (B, T) bool of real tokens."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _pad(sequences: Sequence[Sequence[int]], pad_id: int, left: bool, width: int | None, device):
    if not sequences or any(len(s) == 0 for s in sequences):
        raise ValueError("Every sequence needs at least one token (prepend BOS to an empty prompt)")
    width = width or max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long, device=device)
    valid = torch.zeros(len(sequences), width, dtype=torch.bool, device=device)
    for row, seq in enumerate(sequences):
        seq = list(seq)[:width]
        span = slice(width - len(seq), width) if left else slice(0, len(seq))
        ids[row, span] = torch.as_tensor(seq, dtype=torch.long)
        valid[row, span] = True
    return ids, valid


def left_pad(
    sequences: Sequence[Sequence[int]], pad_id: int, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts for generation: (B, T) ids padded on the left (so every row ends at its last real token),
    and (B, T) bool of real tokens."""
    return _pad(sequences, pad_id, left=True, width=None, device=device)


def right_pad(
    sequences: Sequence[Sequence[int]], pad_id: int, width: int | None = None, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Training batches: (B, width) ids padded (or truncated) on the right, and (B, width) bool of real
    tokens; width defaults to the longest sequence."""
    return _pad(sequences, pad_id, left=False, width=width, device=device)


def eos_terminated(sequences: Sequence[Sequence[int]], eos_id: int, pad_id: int, width: int) -> torch.Tensor:
    """(B, width) ids: each sequence cut to width - 1 tokens, then EOS, then padding (CLIP captions: the
    text feature is read at the EOS position, so EOS must survive truncation)."""
    return right_pad([[*seq[: width - 1], eos_id] for seq in sequences], pad_id, width)[0]


def pad_pairs(
    first: Sequence[Sequence[int]], second: Sequence[Sequence[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paired sequences (reward-model chosen/rejected) as one right-padded (2B, T) batch: rows 0..B-1 are
    ``first``, rows B..2B-1 ``second``, so both go through the model in one forward pass."""
    if len(first) != len(second):
        raise ValueError(f"Pairs need as many first as second sequences, got {len(first)} and {len(second)}")
    return right_pad([*first, *second], pad_id)
