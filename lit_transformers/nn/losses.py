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


def token_mean(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Mean token loss from (sum, count); 0 for a batch without labelled positions, where 0 / 0 would be NaN
    and its gradient would poison every weight."""
    return total / count.clamp(min=1)


# logits held at once by linear_cross_entropy: 32 MB of float32, e.g. 1024 rows of an 8192-token vocabulary,
# which stays in a server CPU's last-level cache between the matmul and the softmax passes
CHUNK_ELEMENTS = 2**23


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float = 0.0,
    *,
    bias: torch.Tensor | None = None,
    chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_cross_entropy(F.linear(hidden, weight, bias), labels, label_smoothing)`` for an output layer
    (an LM head), without ever holding the (N, V) logits.

    hidden (..., d), weight (V, d), bias (V,) or None, labels (...). Rows go through in chunks of
    ``chunk_rows`` (default: :data:`CHUNK_ELEMENTS` logits per chunk). For each chunk the forward computes the
    logits, their loss and, when a gradient is wanted, the gradient of the logits (softmax - target) in place,
    then multiplies it back into gradients of ``hidden``, ``weight`` and ``bias``; the backward only scales
    those. Against logits followed by ``F.cross_entropy``: one ``exp`` per logit instead of two (log-softmax
    forward and backward each take one), no (N, V) fill and scatter for the NLL backward, and logits memory of
    one chunk instead of up to three full (N, V) tensors (logits, log-probs and their gradient) — the idea of
    Liger-Kernel's fused linear cross-entropy, written in torch ops so that it runs on CPU too.

    Under autocast the matmuls run in the autocast dtype, as ``nn.Linear`` would; the softmax in float32 (float64
    for float64 inputs). Only the inputs that require a gradient get one: a frozen head costs no weight-gradient
    matmul.
    """
    hidden, labels = hidden.flatten(0, -2), labels.flatten()
    count = (labels != IGNORE_INDEX).sum()
    chunk_rows = chunk_rows or max(1, CHUNK_ELEMENTS // weight.size(0))
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias)):
        total = _LinearCrossEntropy.apply(hidden, weight, bias, labels, label_smoothing, chunk_rows)
    else:
        no_grads = (False, False, False)
        total = _chunked_cross_entropy(hidden, weight, bias, labels, label_smoothing, chunk_rows, no_grads)[0]
    return total, count


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, label_smoothing, chunk_rows):
        total, *grads = _chunked_cross_entropy(
            hidden, weight, bias, labels, label_smoothing, chunk_rows, ctx.needs_input_grad[:3]
        )
        ctx.save_for_backward(*grads)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total):
        grads = (None if g is None else g * grad_total for g in ctx.saved_tensors)
        return *grads, None, None, None


def _chunked_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    label_smoothing: float,
    chunk_rows: int,
    needs_grad: tuple[bool, bool, bool],
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Summed loss of F.linear(hidden (N, d), weight (V, d), bias (V,)) against labels (N,), and the gradients
    of that sum with respect to hidden, weight and bias where ``needs_grad`` asks for them (else None)."""
    device = hidden.device.type
    mm_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
    float_dtype = torch.promote_types(mm_dtype, torch.float32)  # of the softmax and the accumulators
    eps, vocab_size = label_smoothing, weight.size(0)
    valid = labels != IGNORE_INDEX
    targets = labels.masked_fill(~valid, 0)[:, None]  # any index: ignored rows are zeroed below
    total = torch.zeros((), dtype=float_dtype, device=hidden.device)
    grad_hidden = torch.empty_like(hidden) if needs_grad[0] else None
    grad_weight = torch.zeros_like(weight, dtype=float_dtype) if needs_grad[1] else None
    grad_bias = torch.zeros_like(bias, dtype=float_dtype) if needs_grad[2] else None
    with torch.autocast(device, enabled=False):  # the casts below are explicit
        w = weight.to(mm_dtype)
        # looping over the chunk count, not range(0, N, chunk_rows), lets torch.compile treat N as dynamic
        # instead of recompiling for every number of rows
        for i in range(-(-hidden.size(0) // chunk_rows)):
            rows = slice(i * chunk_rows, (i + 1) * chunk_rows)
            h, real = hidden[rows].to(mm_dtype), valid[rows, None]
            z = (h @ w.T).to(float_dtype)  # (n, V) logits
            if bias is not None:
                z += bias.to(float_dtype)
            target_logit = z.gather(1, targets[rows])
            row_max = z.amax(1, keepdim=True)
            # per row: log-sum-exp - (1 - eps) * target logit - eps * mean logit (Szegedy et al.'s smoothing)
            loss = row_max - (1 - eps) * target_logit
            if eps:
                loss -= eps * z.mean(1, keepdim=True)
            z.sub_(row_max).exp_()
            row_sum = z.sum(1, keepdim=True)
            total += (loss + row_sum.log()).masked_fill(~real, 0).sum()
            if not any(needs_grad):
                continue
            # d loss / d logits = softmax - (1 - eps) * one_hot - eps / V on real rows, 0 on ignored ones
            z.mul_(real / row_sum)
            z.scatter_add_(1, targets[rows], -(1 - eps) * real.to(float_dtype))
            if eps:
                z.sub_(eps / vocab_size * real)
            if grad_bias is not None:
                grad_bias += z.sum(0)
            z = z.to(mm_dtype)
            if grad_hidden is not None:
                grad_hidden[rows] = z @ w
            if grad_weight is not None and grad_weight.dtype == mm_dtype:
                grad_weight.addmm_(z.T, h)  # in place: no (V, d) temporary per chunk
            elif grad_weight is not None:
                grad_weight += z.T @ h  # low-precision products, accumulated in float32
    if grad_weight is not None:
        grad_weight = grad_weight.to(weight.dtype)
    if grad_bias is not None:
        grad_bias = grad_bias.to(bias.dtype)
    return total, grad_hidden, grad_weight, grad_bias


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
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """image_features, text_features: (B, E) normalised; logit_scale: exp(learned log-scale). ``valid``: (B,)
        bool, False for rows that must not count (under DDP, evaluation's repeats of pairs that other batches
        hold): left out of the mean and as every row's negatives; the loss is then the mean over the valid rows
        (0 when there are none)."""
        B = image_features.size(0)
        rows = None
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
            if valid is not None:
                columns = all_gather(valid).flatten()  # (W*B,)
                logits_image = logits_image.masked_fill(~columns, float("-inf"))
                logits_text = logits_text.masked_fill(~columns, float("-inf"))
                rows = valid if self.local_loss else columns
        per_row = (
            F.cross_entropy(logits_image.float(), labels, reduction="none")
            + F.cross_entropy(logits_text.float(), labels, reduction="none")
        ) / 2
        return per_row.mean() if rows is None else per_row[rows].sum() / rows.sum().clamp(min=1)
