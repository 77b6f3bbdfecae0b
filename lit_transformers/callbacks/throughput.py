"""Training throughput of every family: ``train/samples_per_sec``, ``train/tokens_per_sec`` (real tokens, padding
left out) and ``train/mfu`` (model FLOPs utilisation) where the model counts its FLOPs; and :class:`StageClock`,
the seconds of each stage of an RL iteration (``train/time/generation_s``, ...).

Lightning's ``ThroughputMonitor`` was read and not used: it multiplies rank 0's counts by the world size as this
does, but it reports only after a window of ``window_size`` (100) batches, assumes one batch size for the whole
run, keeps its clock running through checkpoint writes, and takes one ``flops_per_batch`` for every batch, where
padded batches differ in length (and attention FLOPs grow with it). Its ``get_available_flops`` table gives the
peak here; tests check our FLOPs counts against ``torch.utils.flop_counter``, which its ``measure_flops`` wraps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property

import lightning as L
import torch
from lightning.fabric.utilities.throughput import get_available_flops


def matmul_flops(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    n: int = 2048,
    seconds: float = 0.05,
) -> float:
    """This device's measured FLOP/s on a large (n x n x n) matmul: the best of a few. Sizes double from 256 to n
    and stop at the first whose matmul takes ``seconds``: a dtype the device only emulates (float16 on most CPUs:
    2 GFLOP/s against fp32's 78 on this project's CPU) would take minutes at n = 2048, while a fast one reaches n.
    Its own random generator: measured during training, it leaves the run's random stream (dropout) alone."""
    generator = torch.Generator(device).manual_seed(0)
    size = min(256, n)
    while True:
        a, b = (torch.randn(size, size, device=device, dtype=dtype, generator=generator) for _ in range(2))
        best = float("inf")
        for _ in range(4):
            synchronize(a.device)
            t0 = time.perf_counter()
            torch.mm(a, b)
            synchronize(a.device)
            best = min(best, time.perf_counter() - t0)
        if size >= n or best >= seconds:
            return 2 * size**3 / best
        size = min(2 * size, n)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a clock read after it has timed that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class BatchCount:
    samples: int  # sequences (rows, when packed), images, image-caption pairs, preference pairs or prompts
    tokens: int | None = None  # real (non-padding) tokens; None where the unit is an image or a prompt
    flops: int | None = None  # training FLOPs (forward + backward) of the model, None where not counted


class ModelFlops:
    """The training FLOPs of a task's model (``nn.flops``): the part its weights make, a walk over the modules,
    counted once; per batch only the attention's part, which grows with the batch's length. :class:`Throughput`
    builds it at fit start, once ``configure_model`` has added any LoRA adapters (tokens pass through theirs)."""

    def __init__(self, model: torch.nn.Module | None):
        self.model = model
        count = getattr(model, "weight_flops_per_token", None)
        # per token (GPT, BERT) or (per source token, per target token) (translation); None: not counted
        self.weights_per_token: int | tuple[int, int] | None = count and count()

    @cached_property
    def per_image(self) -> int | None:
        """Per image of a timm ViT (attention included: every image has as many tokens); None for other models.
        Counted at the first image batch, so that only image runs import timm."""
        from lit_transformers.models.backbone import vit_flops_per_image

        return vit_flops_per_image(self.model)

    def per_token(self, seq_len: int) -> int | None:
        """Per token of a ``seq_len``-token batch (GPT, BERT); None for models that do not count their FLOPs."""
        if self.weights_per_token is None:
            return None
        return self.weights_per_token + self.model.attention_flops_per_token(seq_len)

    def per_source_and_target_token(self, src_len: int, tgt_len: int) -> tuple[int, int]:
        """Per source token and per target token of a translation batch (``Seq2SeqTransformer``)."""
        (source, target), attention = (
            self.weights_per_token,
            self.model.attention_flops_per_token(src_len, tgt_len),
        )
        return source + attention[0], target + attention[1]


def count_batch(pl_module: L.LightningModule, batch, flops: ModelFlops | None = None) -> BatchCount:
    """What one training batch holds, read from the layouts of ``lit_transformers.data``'s collators:

    - preference pairs (reward, DPO: ``pair_mask``): pairs, and the real tokens of both responses' rows;
    - translation (``src_valid``/``tgt_valid``): sentence pairs, real target tokens (fairseq's ``wps``), FLOPs of
      the real source and target tokens;
    - images (ViT: ``(images, labels)``; CLIP: ``image``): images (CLIP: image-caption pairs), FLOPs of a ViT;
    - text (``input_ids``: GPT, SFT, BERT): sequences, real tokens (``attention_mask`` where it is per token, else
      the ids that are not the pad id; a packed row counts its samples' tokens), FLOPs of those tokens;
    - prompts (PPO, GRPO: ``prompt_ids`` alone): prompts, a whole iteration each (see :class:`StageClock`).

    FLOPs are counted on the real tokens at the batch's padded length (attention spans it): padding is compute
    the model did not need, so it lowers MFU. ``flops``: the module's model's, where the caller keeps one for the
    run (:class:`Throughput`); None counts them afresh.
    """
    flops = flops or ModelFlops(getattr(pl_module, "model", None))
    if isinstance(batch, (list, tuple)):
        images = batch[0]
        return BatchCount(images.size(0), None, flops.per_image and flops.per_image * images.size(0))
    if "pair_mask" in batch:  # chosen rows, then rejected ones
        return BatchCount(batch["pair_mask"].size(0) // 2, int(batch["pair_mask"].sum()))
    if "src_valid" in batch:
        src, tgt = batch["src_valid"], batch["tgt_valid"]
        per_source, per_target = flops.per_source_and_target_token(src.size(1), tgt.size(1))
        src_tokens, tgt_tokens = int(src.sum()), int(tgt.sum())
        return BatchCount(src.size(0), tgt_tokens, per_source * src_tokens + per_target * tgt_tokens)
    if "image" in batch:
        return BatchCount(batch["image"].size(0))
    if "input_ids" in batch:
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        tokenizer = getattr(pl_module, "tokenizer", None)
        pad_id = tokenizer.pad_id if tokenizer is not None else None
        if mask is not None and mask.dim() == 2:
            tokens = int(mask.sum())
        else:  # no mask, or a packed batch's (R, 1, T, T) one
            tokens = ids.numel() if pad_id is None else int((ids != pad_id).sum())
        per_token = flops.per_token(ids.size(1))
        return BatchCount(ids.size(0), tokens, per_token and per_token * tokens)
    return BatchCount(batch["prompt_ids"].size(0))


def precision_dtype(precision: str) -> torch.dtype:
    """The matmul dtype of a Lightning precision setting ("bf16-mixed" -> bfloat16, "32-true" -> float32)."""
    if "bf16" in precision:
        return torch.bfloat16
    return torch.float16 if "16" in precision else torch.float32


class Throughput(L.Callback):
    """Per training step, over training time only: ``train/samples_per_sec``, ``train/tokens_per_sec`` where
    the batch has tokens, and ``train/mfu`` where the model counts its FLOPs (:func:`count_batch`): achieved
    FLOP/s over ``peak_flops`` per device. Rates are of all processes: this rank's counts times the world size
    (summing the ranks' counts would synchronise them every step).

    ``peak_flops`` None: Lightning's table of known accelerators (datasheet peak at the run's precision), else a
    one-off matmul measurement on the device (CPUs, unlisted GPUs), so MFU is against what this machine does.
    """

    def __init__(self, peak_flops: float | None = None):
        self.peak_flops = peak_flops
        self._last: float | None = None  # end of the previous step, moved later by the pauses since
        self._paused: float | None = None  # when the clock stopped
        self.clock = time.perf_counter  # seconds; a test swaps in a clock it moves by hand
        self._flops: ModelFlops | None = None  # the model's, counted at fit start

    def _peak(self, trainer, pl_module) -> float:
        if self.peak_flops is None:
            dtype = precision_dtype(str(trainer.precision))
            self.peak_flops = get_available_flops(pl_module.device, dtype)
            if self.peak_flops is None:
                self._pause()  # seconds of matmuls, at the first step that has FLOPs: not training time
                self.peak_flops = matmul_flops(pl_module.device, dtype)
        return self.peak_flops

    def on_fit_start(self, trainer, pl_module) -> None:
        self._flops = ModelFlops(getattr(pl_module, "model", None))

    # validation, checkpoint writing and the turn of an epoch are not training time: they stop the clock, and
    # the next training batch restarts it
    def _pause(self) -> None:
        if self._paused is None:
            self._paused = self.clock()

    def on_validation_start(self, trainer, pl_module) -> None:
        self._pause()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._pause()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._pause()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._paused is not None and self._last is not None:
            self._last += self.clock() - self._paused
        self._paused = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        synchronize(pl_module.device)
        now = self.clock()
        if self._last is not None:
            count, scale = count_batch(pl_module, batch, self._flops), trainer.world_size / (now - self._last)
            rates = {"train/samples_per_sec": count.samples * scale}
            if count.tokens is not None:
                rates["train/tokens_per_sec"] = count.tokens * scale
            if count.flops:
                rates["train/mfu"] = (
                    count.flops * scale / (self._peak(trainer, pl_module) * trainer.world_size)
                )
            for key, rate in rates.items():
                pl_module.log(key, rate, on_step=True, on_epoch=False)
        self._last = now


class StageClock:
    """Seconds of each stage of a training step that has stages (PPO's and GRPO's generation, scoring and
    update), logged as ``train/time/<stage>_s``: ``start(device)``, then ``lap(stage)`` at the end of each
    stage (the seconds since the previous lap, the device's queued work included), then ``log(module)``."""

    def __init__(self):
        self.device = torch.device("cpu")
        self.seconds: dict[str, float] = {}
        self._last = 0.0

    def start(self, device: torch.device) -> None:
        self.device, self.seconds = device, {}
        synchronize(device)
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        synchronize(self.device)
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self._last
        self._last = now

    def log(self, module: L.LightningModule) -> None:
        for stage, seconds in self.seconds.items():
            module.log(f"train/time/{stage}_s", seconds, on_step=True, on_epoch=False)
