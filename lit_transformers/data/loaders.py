"""The DataLoaders of every datamodule: a training order that resumes exactly, and evaluation that counts each
sample once under DDP.

Training uses torchdata's ``StatefulDataLoader``. Lightning saves the state of such a loader in checkpoints and
restores it on resume, so a resumed run continues the epoch where it stopped instead of replaying its first
batches. Its sampler shuffles by seed + epoch like Lightning's ``DistributedSampler``, and is one, so Lightning
keeps it under DDP instead of injecting its own.

Evaluation loaders stay plain DataLoaders. Under DDP, Lightning's ``DistributedSampler`` would repeat a few samples
to give every rank the same number of batches, and the repeats would bias val/test metrics; here each rank gets a
disjoint share instead (Lightning's ``UnrepeatedDistributedSampler``), so ranks may run one batch more or less than
each other. Eval steps that all-gather per batch (CLIP's loss) would then wait forever: they pass
``shard_eval=False`` and keep Lightning's padding.
"""

from __future__ import annotations

import os

import lightning as L
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler


class ResumableSampler(StatefulDistributedSampler):
    """Shuffles by seed + epoch (Lightning calls ``set_epoch`` before each epoch) and, after loading a state,
    skips the samples of that epoch already trained on.

    A state saved on an epoch's last batch (an epoch-end checkpoint, or ``limit_train_batches``) belongs to a
    finished epoch: the next epoch then starts at its beginning, as in a run that was never interrupted.
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int):
        super().__init__(dataset, num_replicas, rank, shuffle=True, seed=seed)
        self.position_epoch = 0  # the epoch whose samples ``yielded`` counts
        self.resume_epoch: int | None = None

    def __iter__(self):
        # a generator, so this runs at the first batch, once Lightning has set the epoch
        if self.resume_epoch != self.epoch:
            self.next_yielded = None
        self.resume_epoch = None
        self.position_epoch = self.epoch
        yield from super().__iter__()

    def state_dict(self) -> dict[str, int]:
        return {**super().state_dict(), "epoch": self.position_epoch}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        super().load_state_dict(state_dict)
        self.resume_epoch = state_dict["epoch"]


def make_loader(
    dataset: Dataset,
    batch_size: int,
    train: bool,
    num_workers: int = 0,
    collate_fn=None,
    drop_last: bool = False,
    trainer: L.Trainer | None = None,
    shard_eval: bool = True,
) -> DataLoader:
    """A shuffled, resumable loader when ``train``, else a sequential one. ``trainer`` (the datamodule's; None
    outside a Trainer) gives the world size and this rank's place in it."""
    world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
    common = dict(
        batch_size=batch_size,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        collate_fn=collate_fn,
        drop_last=drop_last,
    )
    seed = int(os.environ.get("PL_GLOBAL_SEED", 0))  # the seed Lightning's own DistributedSampler takes
    if train:
        return StatefulDataLoader(
            dataset,
            sampler=ResumableSampler(dataset, world, rank, seed),
            **common,
        )
    sampler = (
        UnrepeatedDistributedSampler(dataset, world, rank, shuffle=False)
        if shard_eval and world > 1
        else None
    )
    # every iterator of a DataLoader draws its workers' base seed from its generator, by default the global one:
    # each validation would then move the training's random stream (dropout masks, PPO/GRPO samples), so that
    # how often a run validates changed what it trained (tests/test_reproducibility.py)
    return DataLoader(dataset, sampler=sampler, generator=torch.Generator().manual_seed(seed), **common)


class CollatedSplits(L.LightningDataModule):
    """The loaders of a datamodule that keeps each split in ``self.datasets[split]`` (a dataset or a list) and
    batches it with ``self.collate`` (None: torch's default): shuffled and resumable for training, each sample
    once for evaluation, in batches of ``eval_batch_size`` where the family has one and it is set."""

    datasets: dict[str, Dataset]
    collate = None

    def _dataloader(self, split: str, shuffle: bool) -> DataLoader:
        h = self.hparams
        batch_size = h.batch_size if shuffle else h.get("eval_batch_size") or h.batch_size
        return make_loader(
            self.datasets[split],
            batch_size,
            shuffle,
            h.num_workers,
            self.collate,
            drop_last=shuffle
            and len(self.datasets[split]) > h.batch_size,  # a full last batch, when there is one
            trainer=self.trainer,
        )

    def train_dataloader(self) -> DataLoader:
        return self._dataloader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._dataloader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._dataloader("test", shuffle=False)
