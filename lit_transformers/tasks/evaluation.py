"""Evaluation shared by the image tasks: zero-shot classifier, retrieval recall@k, matrices as images."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F


@torch.no_grad()
def zero_shot_classifier(
    encode_texts: Callable[[list[str]], torch.Tensor], class_names: Sequence[str], templates: Sequence[str]
) -> torch.Tensor:
    """(embed_dim, n_classes) weights: per class, the renormalised mean of its normalised prompt embeddings
    (open_clip's ``build_zero_shot_classifier``). Templates are format strings with one ``{}``."""
    weights = []
    for name in class_names:
        prompts = F.normalize(encode_texts([t.format(name) for t in templates]), dim=-1)  # (K, E)
        weights.append(F.normalize(prompts.mean(dim=0), dim=-1))
    return torch.stack(weights, dim=1)


def recall_at_k(
    similarity: torch.Tensor, relevant: torch.Tensor, ks: Sequence[int] = (1, 5, 10)
) -> dict[int, float]:
    """similarity, relevant: (n_queries, n_candidates) -> share of queries with a hit in their top k."""
    top = similarity.topk(min(max(ks), similarity.size(1)), dim=1).indices  # (Q, k_max)
    hits = relevant.to(top.device).gather(1, top)  # (Q, k_max) bool
    return {k: hits[:, :k].any(dim=1).float().mean().item() for k in ks}


def matrix_image(matrix: torch.Tensor, cell: int | None = None) -> torch.Tensor:
    """(R, C) values -> (3, H, W) uint8 heatmap, min-max scaled, dark blue (low) to yellow (high)."""
    m = matrix.detach().float().cpu()
    m = (m - m.min()) / (m.max() - m.min()).clamp(min=1e-12)
    low, high = torch.tensor([0.10, 0.05, 0.35]), torch.tensor([1.0, 0.9, 0.1])
    rgb = low[:, None, None] + (high - low)[:, None, None] * m[None]  # (3, R, C)
    cell = cell or max(1, 256 // max(m.shape))
    rgb = rgb.repeat_interleave(cell, dim=1).repeat_interleave(cell, dim=2)
    return (rgb * 255).round().to(torch.uint8)
