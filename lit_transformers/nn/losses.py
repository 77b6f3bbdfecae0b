"""Training objectives as plain torch (open_clip keeps its ``loss.py`` the same way): tested directly,
wired into LightningModules by the tasks."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = (
    -100
)  # label of positions without a target (padding, prompts in SFT); F.cross_entropy's default

AllGather = Callable[..., torch.Tensor]  # (B, ...) -> (world_size, B, ...), as LightningModule.all_gather


def token_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy over positions whose label is not IGNORE_INDEX, and how many there were.

    logits (..., V), labels (...). Returning sum and count (not their ratio) lets callers average over
    tokens across batches and ranks: a batch-size-weighted mean of batch means is wrong whenever batches
    hold different numbers of ignored labels.

    ``label_smoothing`` = ε trains against (1 - ε) one-hot + ε uniform over the V classes (Szegedy et al.
    2016, the translation recipe of Vaswani et al. 2017): per token (1 - ε) NLL + ε mean_v(-log p_v).
    """
    total = F.cross_entropy(
        logits.flatten(0, -2).float(), labels.flatten(), reduction="sum", label_smoothing=label_smoothing
    )
    return total, (labels != IGNORE_INDEX).sum()


class ClipLoss(nn.Module):
    """Symmetric InfoNCE: mean of image->text and text->image cross-entropy (open_clip's ``ClipLoss``).

    With several ranks, features are gathered from all of them. ``gather_with_grad`` sends gradients back
    through the gather to the rank that made each feature; without it, only the local slice carries gradient.
    ``local_loss`` scores only this rank's B rows against all W*B columns (labels offset by rank * B) instead
    of the full (W*B, W*B) matrix; DDP's gradient averaging then gives the gradient of the global-batch loss.
    """

    def __init__(self, local_loss: bool = True, gather_with_grad: bool = True):
        super().__init__()
        self.local_loss, self.gather_with_grad = local_loss, gather_with_grad

    def gather(self, x: torch.Tensor, all_gather: AllGather, rank: int) -> torch.Tensor:
        if self.gather_with_grad:
            return all_gather(x, sync_grads=True).flatten(0, 1)  # (W*B, E)
        parts = list(all_gather(x.detach()).unbind(0))
        parts[rank] = x  # the local slice keeps its graph
        return torch.cat(parts)

    def forward(
        self,
        image_features: torch.Tensor,
        text_features: torch.Tensor,
        logit_scale: torch.Tensor,
        all_gather: AllGather | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> torch.Tensor:
        """image_features, text_features: (B, E) normalised; logit_scale: exp(learned log-scale)."""
        B = image_features.size(0)
        if world_size == 1:
            logits_image = logit_scale * image_features @ text_features.T  # (B, B)
            logits_text, labels = logits_image.T, torch.arange(B, device=image_features.device)
        else:
            all_image = self.gather(image_features, all_gather, rank)  # (W*B, E)
            all_text = self.gather(text_features, all_gather, rank)
            if self.local_loss:
                logits_image = logit_scale * image_features @ all_text.T  # (B, W*B)
                logits_text = logit_scale * text_features @ all_image.T
                labels = torch.arange(B, device=image_features.device) + rank * B
            else:
                logits_image = logit_scale * all_image @ all_text.T  # (W*B, W*B)
                logits_text, labels = (
                    logits_image.T,
                    torch.arange(world_size * B, device=image_features.device),
                )
        return (
            F.cross_entropy(logits_image.float(), labels) + F.cross_entropy(logits_text.float(), labels)
        ) / 2
