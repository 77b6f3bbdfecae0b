"""Run by conftest.train_on_two_ranks (``python tests/ddp_worker.py JOB ...``): each job in turn, in one launch of 2
processes: the first trainer starts rank 1, which runs this same list, and the later jobs find both ranks there. A
job is a resolved train config (on ``trainer=ddp_cpu``), ``CFG.yaml``, of which rank 0 writes the run's final
metrics to ``metrics.json`` beside it, or ``call:module.function:ARG``, a function of a module in tests/ called with
ARG on each rank."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

from lit_transformers.train import train

if __name__ == "__main__":
    for job in sys.argv[1:]:
        if job.startswith("call:"):
            target, arg = job.removeprefix("call:").split(":", 1)
            module, function = target.rsplit(".", 1)
            getattr(importlib.import_module(module), function)(arg)
            continue
        path = Path(job)
        metrics = train(OmegaConf.load(path)).metrics
        if os.environ.get("LOCAL_RANK", "0") == "0":  # Lightning's rank of this process on the machine
            (path.parent / "metrics.json").write_text(json.dumps(metrics))
