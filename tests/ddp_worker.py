"""Run by conftest.train_on_two_ranks (``python tests/ddp_worker.py CFG.yaml ...``): each resolved train config (on
``trainer=ddp_cpu``) in turn, in one launch of 2 processes: the first trainer starts rank 1, which runs this same
list, and the later trainers find both ranks there. Rank 0 writes each run's final metrics to ``metrics.json``
beside its config."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

from lit_transformers.train import train

if __name__ == "__main__":
    for path in map(Path, sys.argv[1:]):
        metrics = train(OmegaConf.load(path)).metrics
        if os.environ.get("LOCAL_RANK", "0") == "0":  # Lightning's rank of this process on the machine
            (path.parent / "metrics.json").write_text(json.dumps(metrics))
