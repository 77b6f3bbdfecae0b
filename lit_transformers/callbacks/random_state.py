"""The random state of every rank in checkpoints, so that a resumed run draws the same dropout masks and
augmentations as the run it continues.

Lightning checkpoints hold no random state (``isolate_rng`` only protects the sanity check). The states are kept
as tensors, ints and tuples, so checkpoints still load with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import logging
import random

import lightning as L
import numpy as np
import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


def collect_random_state() -> dict:
    """This process's python, numpy, torch (and current CUDA device's) generator states."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_random_state(state: dict) -> None:
    random.setstate(state["python"])
    keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


class RandomStateCheckpoint(L.Callback):
    """Saves each rank's random state with every checkpoint and restores it when training resumes.

    Lightning asks every rank for callback states but writes rank 0's checkpoint only, so the states are
    gathered: the checkpoint holds one per rank, and each rank takes its own back.
    """

    def __init__(self):
        self._loaded: list[dict] | None = None

    def state_dict(self) -> dict:
        state = collect_random_state()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            ranks: list = [None] * dist.get_world_size()
            dist.all_gather_object(ranks, state)
            return {"ranks": ranks}
        return {"ranks": [state]}

    def load_state_dict(self, state_dict: dict) -> None:
        self._loaded = state_dict["ranks"]

    def on_train_start(self, trainer, pl_module) -> None:
        # here, not in load_state_dict: building and restoring the train loader draws random numbers in between,
        # which the original run drew before its checkpoint
        if self._loaded is None:
            return
        if len(self._loaded) != trainer.world_size:
            log.warning(
                "The checkpoint holds the random state of %d processes, this run has %d: random state not restored",
                len(self._loaded),
                trainer.world_size,
            )
        else:
            restore_random_state(self._loaded[trainer.global_rank])
        self._loaded = None
