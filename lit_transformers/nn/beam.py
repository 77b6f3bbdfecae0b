"""Batched beam search for any decoder that follows the protocol of :mod:`lit_transformers.nn.generation`.

B sentences are searched together as B * K rows (K = beam size). Each step scores every continuation of every
live beam, takes the 2K best per sentence (a beam ends in EOS at most once, so at least K of them are not EOS:
finishing hypotheses never shrink the beam), moves the EOS-ending ones among the top K to the sentence's
finished list (its best K are kept) and continues the best K others. A sentence stops when no live beam can
still beat its best finished hypothesis under the length penalty, or at its length limit.
"""

from __future__ import annotations

import torch
from torch import nn


def length_penalty(length: torch.Tensor | int, alpha: float) -> torch.Tensor:
    """GNMT's ((5 + |Y|) / 6)^α (Wu et al. 2016); hypotheses are ranked by log P(Y) / penalty."""
    return ((5.0 + torch.as_tensor(length, dtype=torch.float32)) / 6.0) ** alpha


def beam_search(
    model: nn.Module,
    batch_size: int,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    max_new_tokens: torch.Tensor,
    beam_size: int = 4,
    alpha: float = 0.6,
    use_cache: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The best hypothesis of each of ``batch_size`` sentences.

    ``model`` decodes B * K rows, sentence b in rows b*K .. b*K + K - 1 (a translation decoder bound to its
    encoded sources repeated K times). ``max_new_tokens`` (B,) caps each sentence's hypothesis length: one
    that reaches it without EOS finishes there. Returns tokens (B, 1 + L) (BOS, the hypothesis with its EOS,
    then ``pad_id``) and each hypothesis's score log P / length penalty (B,).
    """
    B, K = batch_size, beam_size
    device = max_new_tokens.device
    with torch.inference_mode():
        limit = int(max_new_tokens.max())
        caches = None
        if use_cache:
            caches = model.new_caches(B * K, limit, device, next(model.parameters()).dtype)
        tokens = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)
        scores = torch.zeros(B, K, device=device)
        scores[:, 1:] = float("-inf")  # all beams start equal: continue only the first one at step 0
        finished_scores = torch.full((B, K), float("-inf"), device=device)
        finished_tokens = torch.full((B, K, limit + 1), pad_id, dtype=torch.long, device=device)
        done = torch.zeros(B, dtype=torch.bool, device=device)
        sentence_rows = torch.arange(B, device=device)[:, None] * K
        for step in range(limit):
            length = step + 1  # of every hypothesis made at this step, its last token included
            ids = tokens[:, -1:] if use_cache else tokens
            positions = torch.arange(ids.size(1), device=device)[None] + (step if use_cache else 0)
            logits = model(ids, position_ids=positions, caches=caches, last_only=True)[:, -1]
            logp = logits.float().log_softmax(dim=-1)  # (B*K, V)
            vocab = logp.size(-1)
            candidates = (scores[:, :, None] + logp.view(B, K, vocab)).view(B, K * vocab)
            top_scores, top = candidates.topk(2 * K, dim=1)  # (B, 2K), best first
            top_beam, top_token = top // vocab, top % vocab
            top_rows = sentence_rows + top_beam  # (B, 2K) rows of ``tokens`` they continue

            # finish: EOS among the K best, or every one of the K best at the sentence's length limit
            at_limit = (max_new_tokens <= length)[:, None]
            rank = torch.arange(2 * K, device=device)[None]
            finishing = ((top_token == eos_id) | at_limit) & (rank < K) & ~done[:, None]
            finishing &= top_scores > float("-inf")
            if bool(finishing.any()):  # most steps finish nothing: skip building their hypotheses
                new_scores = torch.where(finishing, top_scores / length_penalty(length, alpha), float("-inf"))
                new_tokens = torch.cat(
                    [tokens.index_select(0, top_rows.flatten()).view(B, 2 * K, -1), top_token[:, :, None]],
                    dim=2,
                )
                new_tokens = nn.functional.pad(new_tokens, (0, limit + 1 - new_tokens.size(2)), value=pad_id)
                pool_scores = torch.cat([finished_scores, new_scores], dim=1)  # (B, 3K)
                finished_scores, keep = pool_scores.topk(K, dim=1)
                pool_tokens = torch.cat([finished_tokens, new_tokens], dim=1)  # (B, 3K, limit + 1)
                finished_tokens = pool_tokens.gather(1, keep[:, :, None].expand(-1, -1, limit + 1))

            # continue: the K best candidates that do not end in EOS
            live = torch.argsort((top_token == eos_id).int(), dim=1, stable=True)[:, :K]
            scores = top_scores.gather(1, live)
            rows = top_rows.gather(1, live).flatten()
            tokens = torch.cat(
                [tokens.index_select(0, rows), top_token.gather(1, live).view(B * K, 1)], dim=1
            )
            if caches is not None:
                for cache in caches:
                    # self-attention only: cross-attention rows of one sentence hold the same source
                    cache.self_attn.reorder(rows)

            # a live beam's log-probability only falls, and the penalty grows at most to the length limit's
            best_possible = scores.max(dim=1).values / length_penalty(max_new_tokens, alpha)
            done |= (finished_scores[:, 0] >= best_possible) | at_limit[:, 0]
            if bool(done.all()):
                break
        # every hypothesis is at most as long as the live beams: BOS + one token per step run
        return finished_tokens[:, 0, : tokens.size(1)].clone(), finished_scores[:, 0].clone()
