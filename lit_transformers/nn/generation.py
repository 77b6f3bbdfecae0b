"""Autoregressive generation for any decoder that follows the small protocol below.

The model is called as ``model(input_ids, position_ids=..., mask=..., caches=..., last_only=...)`` ->
logits (B, T, V) (only the last position with ``last_only``) and provides
``model.new_caches(batch_size, max_len, device, dtype)``. GPT, the translation decoder and the PPO
policy all share this loop; :func:`token_logprobs` recomputes what it sampled with the same masks and
positions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from lit_transformers.nn.attention import padded_attention_mask, padded_position_ids


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Refuse sampling settings that :func:`sample_next` cannot use (callers check before a slow model load)."""
    if temperature < 0 or (top_k is not None and top_k < 0) or (top_p is not None and not 0 < top_p <= 1):
        raise ValueError(
            f"Invalid sampling settings temperature={temperature}, top_k={top_k}, top_p={top_p}: "
            "need temperature >= 0 (0 = greedy), top_k >= 0 (0 = off) and 0 < top_p <= 1"
        )


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Pick one token per row from (B, V) logits. temperature == 0 means greedy (argmax)."""
    check_sampling(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # drop a token when the tokens ranked above it already cover top_p (the first always survives)
        drop_sorted = cumulative - sorted_logits.softmax(dim=-1) >= top_p
        logits = logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def generate(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | Sequence[int] | None = None,
    pad_id: int = 0,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    max_lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Continue left-padded prompts (B, T); returns (B, T + n) with n <= max_new_tokens.

    Rows that emit ``eos_id`` (one id, or several: an instruct tokenizer's ``end_of_turn_ids``, as HF's
    ``eos_token_id=[a, b]``) stop and are filled with ``pad_id``; the loop ends when all rows stopped.
    ``max_lengths`` (B,) caps each row's new tokens below ``max_new_tokens`` (translation: the source length
    + 50).
    """
    # inference mode skips autograd bookkeeping (~5% faster decoding on CPU); the result is cloned
    # outside it so callers (PPO rollouts) can feed it to a training forward pass
    with torch.inference_mode():
        B, T = input_ids.shape
        valid = (
            torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        )
        padded = not bool(valid.all())
        positions = padded_position_ids(valid)  # left padding: each row's first real token is position 0
        caches = None
        if use_cache:
            dtype = next(model.parameters()).dtype
            # the last sampled token is never fed back, so the cache needs T + max_new_tokens - 1 slots
            caches = model.new_caches(B, T + max(max_new_tokens - 1, 0), input_ids.device, dtype)

        tokens, step_ids, step_pos = input_ids, input_ids, positions
        finished = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
        stop_ids = None if eos_id is None else torch.tensor(eos_id, device=input_ids.device).reshape(-1)
        for step in range(max_new_tokens):
            mask = padded_attention_mask(valid, step_ids.size(1)) if padded else None
            logits = model(step_ids, position_ids=step_pos, mask=mask, caches=caches, last_only=True)[:, -1]
            next_token = sample_next(logits, temperature, top_k, top_p, generator)
            next_token = next_token.masked_fill(finished, pad_id)
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)
            # a finished row goes on decoding padding unmasked: its outputs are discarded, and masking it would
            # give every other row a masked (slower) attention
            if padded:  # left-padded prompts: keys of the new tokens are real
                valid = torch.cat([valid, torch.ones_like(finished)[:, None]], dim=1)
            positions = torch.cat([positions, positions[:, -1:] + 1], dim=1)
            if stop_ids is not None:
                finished |= torch.isin(next_token, stop_ids)
            if max_lengths is not None:
                finished |= max_lengths <= step + 1
            if (eos_id is not None or max_lengths is not None) and bool(finished.all()):
                break
            step_ids, step_pos = (
                (next_token[:, None], positions[:, -1:]) if use_cache else (tokens, positions)
            )
    return tokens.clone()


def padded_forward(
    forward: Callable[..., torch.Tensor], sequences: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """``forward(sequences, position_ids=, mask=)`` (a decoder, or its ``hidden_states``) under the
    padding-aware mask and positions that :func:`generate` uses, left or right padding: a forward of
    generated sequences (log-probs, values, rewards) sees each token as sampling did."""
    return forward(
        sequences,
        position_ids=padded_position_ids(attention_mask),
        mask=padded_attention_mask(attention_mask),
    )


def logprobs_of(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(..., V) logits, (...) token ids -> (...) log-probability of each token, in float32."""
    return logits.float().log_softmax(dim=-1).gather(-1, tokens[..., None]).squeeze(-1)


def token_logprobs(
    model: nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """(B, T - 1) log-probability of each token given the ones before it, under :func:`padded_forward`
    (so PPO's recomputed log-probs match its samples).

    ``temperature`` divides the logits as sampling did; entries at padding positions are meaningless and
    must be masked by the caller.
    """
    logits = padded_forward(model, sequences, attention_mask)  # (B, T, V)
    return logprobs_of(logits[:, :-1].float() / max(temperature, 1e-8), sequences[:, 1:])
