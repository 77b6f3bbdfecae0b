"""Checkpoints are written whole or not at all, so a kill during a save never leaves a broken ``last.ckpt``."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import fsspec
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lit_transformers.utils.errors import DiskFull


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write to a hidden temporary file in the checkpoint's own folder, then ``os.replace`` it over the target.

    Lightning's ``TorchCheckpointIO`` stages the file in the system temp folder and moves it into place; when
    that folder is on another filesystem (local ``/tmp``, runs on a network disk) the move is a copy, and a job
    killed during the copy leaves a truncated checkpoint under the final name. A rename within one folder is
    atomic: readers see the old file or the new one. Remote paths (``s3://``...) keep Lightning's behaviour.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None or fsspec.utils.get_protocol(str(path)) != "file":
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")  # not *.ckpt: never mistaken for a checkpoint
        try:
            with open(partial, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())  # the bytes are on disk before the name points at them
            os.replace(partial, path)
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise DiskFull(err.errno, _disk_full_message(path)) from err
        finally:
            partial.unlink(missing_ok=True)


def _disk_full_message(path: Path) -> str:
    free = shutil.disk_usage(path.parent).free
    kept = f"{path} still holds the previous save" if path.is_file() else f"{path} was not written"
    return (
        f"No space left on the disk (or quota) of {path.parent} for checkpoint {path.name} ({free / 2**20:.0f} MiB "
        f"free); nothing partial was left, and {kept}. Free space there, or put the run on a disk with room: "
        "hydra.run.dir=<folder> (or callbacks.model_checkpoint.dirpath=<folder> for the checkpoints alone)"
    )
