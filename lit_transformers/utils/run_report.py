"""What the console says when a run ends: where everything went, or how to resume a stopped run."""

from __future__ import annotations

import contextlib
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import lightning as L
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lit_transformers.callbacks import Interrupted


def checkpoint_lines(trainer: L.Trainer) -> list[str]:
    """The run summary's lines on checkpoints, taken when training ends (testing a checkpoint loads the checkpoint
    callback's state from it, an older best and last too)."""
    checkpoints = trainer.checkpoint_callback
    if checkpoints is None:
        return ["Checkpoints:     none (checkpointing is off)"]
    lines = []
    if checkpoints.best_model_path:
        score = checkpoints.best_model_score
        judged = f" ({checkpoints.monitor} {float(score):.4g})" if score is not None else ""
        lines.append(f"Best checkpoint: {checkpoints.best_model_path}{judged}")
    if checkpoints.last_model_path:
        lines.append(f"Last checkpoint: {checkpoints.last_model_path}")
    return lines


def run_summary(run_dir: str | Path, checkpoints: list[str], loggers: list[Logger]) -> str:
    """Where everything went: the run folder, ``checkpoints`` (``checkpoint_lines``), and each dashboard's files
    (the CSV logger's metrics, pictures and tables) or command."""
    lines = [f"Run folder:      {run_dir}", *checkpoints]
    for logger in loggers:
        if isinstance(logger, CSVLogger):
            folder = Path(logger.log_dir)
            lines.append(f"Metrics:         {folder / 'metrics.csv'}")
            if (folder / "images").is_dir():
                lines.append(f"Images:          {folder / 'images'}/")
            lines += [
                f"Table:           {t}" for t in sorted(folder.glob("*.csv")) if t.name != "metrics.csv"
            ]
        elif isinstance(logger, TensorBoardLogger):
            lines.append(f"TensorBoard:     tensorboard --logdir {logger.log_dir}")
        elif isinstance(logger, WandbLogger):
            run = logger.experiment
            link = f"wandb sync {Path(run.dir).parent}" if run.offline else run.url
            lines.append(f"wandb:           {link}")
    return "\n".join(lines)


def this_command(*replaced: str) -> list[str]:
    """The command line this process was started with, quoted, its overrides of the keys ``replaced`` left out
    (so the caller can append new values)."""
    started_as = getattr(sys.modules["__main__"], "__spec__", None)  # python -m <module>; None for a file
    if started_as is not None:
        program = f"python -m {started_as.name}"
    else:
        program = f"python {sys.argv[0]}" if sys.argv[0].endswith(".py") else Path(sys.argv[0]).name
    overrides = [
        o for o in HydraConfig.get().overrides.task if o.split("=", 1)[0].lstrip("+~") not in replaced
    ]
    return [program, *map(shlex.quote, overrides)]


def resume_command(checkpoint: str) -> str:
    """The command line of this run, continuing in its own folder from ``checkpoint``."""
    arguments = [f"ckpt_path={checkpoint}", f"hydra.run.dir={HydraConfig.get().runtime.output_dir}"]
    return " ".join([*this_command("ckpt_path"), *map(shlex.quote, arguments)])


@contextlib.contextmanager
def report_interruptions(resume: Callable[[str], str] = resume_command):
    """A run stopped by a signal says where its checkpoint is and how to resume (``resume(checkpoint)``: the
    command line), and exits 130 (SIGINT) or 143 (SIGTERM). Outside training, Lightning's ``SIGTERMException``
    (status 0) gets the same status 143."""
    try:
        yield
    except Interrupted as stop:
        if rank_zero_only.rank == 0:
            if stop.checkpoint:
                saved = f"saved {stop.checkpoint}\nResume with:\n  {resume(stop.checkpoint)}"
            else:
                saved = "nothing saved: checkpointing is off (trainer.enable_checkpointing=false)"
            print(f"\nStopped by {stop.signal_name} after step {stop.step}; {saved}", file=sys.stderr)
        raise
    except SIGTERMException as stop:
        if rank_zero_only.rank == 0:
            print("\nStopped by SIGTERM outside the training steps; nothing new was saved", file=sys.stderr)
        raise SystemExit(128 + signal.SIGTERM) from stop
