"""One run per folder: a new run never overwrites an earlier run's metrics, config or checkpoints.

* A run refuses a non-empty run folder, unless it resumes from a checkpoint inside that folder (``ckpt_path``):
  then it continues there. Checkpoints are updated in place (``last.ckpt`` is this run's latest), the config
  files describe the latest attempt, and the CSV metrics of each attempt are kept: ``csv/metrics.csv``, then
  ``csv/resume_1/``, ``csv/resume_2/``, ...
* A multirun refuses a non-empty sweep folder.
* A run that fails before writing anything but its config removes what it wrote (its folder, unless files that
  were there before keep it), so only runs look like runs.
* A SLURM job that SLURM requeued (preempted, or stopped before its time limit) resumes from the ``last.ckpt`` its
  earlier attempt left in its folder, which it finds again because the folder is named by the job id.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from lit_transformers.utils.cluster import launcher_rank, slurm_requeued
from lit_transformers.utils.config import RESOLVED_CONFIG_ENV, ConfigError

# what a run writes before it has trained or evaluated anything (Hydra also writes <job name>.log)
CONFIG_FILES = {
    ".hydra/config.yaml",
    ".hydra/hydra.yaml",
    ".hydra/overrides.yaml",
    "config_resolved.yaml",
    "csv/hparams.yaml",
    "checkpoints/tokenizer.json",
}


class RunFolderTaken(ConfigError):
    pass


# run folder -> the files it held when RunFolderGuard accepted it (top-level logs only, e.g. a user's notes):
# a failed run removes what it wrote, never these
_found_before_run: dict[Path, set[str]] = {}


def is_job_log(relative_path: str) -> bool:
    """Hydra's ``<job name>.log`` at the top of a run folder."""
    return "/" not in relative_path and relative_path.endswith(".log")


def requeued_checkpoint(run_dir: Path) -> str | None:
    """In a requeued SLURM job, the ``last.ckpt`` of its earlier attempt, if any."""
    last = run_dir / "checkpoints" / "last.ckpt"
    return str(last) if slurm_requeued() and last.is_file() else None


def check_run_folder(run_dir: Path, ckpt_path: str | None) -> None:
    # job logs alone do not make a run: the other ranks of a torchrun/SLURM job may open theirs before rank 0 checks
    if not run_dir.is_dir() or all(is_job_log(p.name) and p.is_file() for p in run_dir.iterdir()):
        return
    if ckpt_path and Path(ckpt_path).resolve().is_relative_to(run_dir.resolve()):
        return  # resuming this folder's own run
    last = run_dir / "checkpoints" / "last.ckpt"
    resume = f"ckpt_path={last}" if last.is_file() else "ckpt_path=<a .ckpt in it>"
    raise RunFolderTaken(
        f"Run folder {run_dir} is not empty; it holds an earlier run, whose metrics and config this run "
        f"would overwrite (and its last.ckpt would not be this run's). To continue that run, resume it: {resume} "
        f"hydra.run.dir={run_dir}. To start a new run, pass an empty or new folder with hydra.run.dir=<folder>, or "
        "leave hydra.run.dir unset for a fresh timestamped one."
    )


def check_sweep_folder(sweep_dir: Path) -> None:
    if sweep_dir.is_dir() and any(sweep_dir.iterdir()):
        raise RunFolderTaken(
            f"Sweep folder {sweep_dir} is not empty; its jobs' folders would be overwritten. Pass a new "
            "folder with hydra.sweep.dir=<folder>, or leave it unset for a fresh timestamped one."
        )


class RunFolderGuard(Callback):
    """Hydra callback: it runs before Hydra writes ``.hydra/`` and the job log, so a refused run changes nothing."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if RESOLVED_CONFIG_ENV in os.environ or launcher_rank() != 0:
            return  # a DDP rank joining the run folder of its Lightning parent, or of rank 0 of its torchrun/SLURM job
        if slurm_requeued():
            return  # the job's own folder, from its earlier attempt (with a last.ckpt to resume, or started over)
        run_dir = Path(config.hydra.run.dir)
        _exit_if_taken(check_run_folder, run_dir, config.get("ckpt_path"))
        _found_before_run[run_dir.resolve()] = (
            {p.name for p in run_dir.iterdir()} if run_dir.is_dir() else set()
        )

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _exit_if_taken(check_sweep_folder, Path(config.hydra.sweep.dir))


def _exit_if_taken(check, *args) -> None:
    # Hydra turns a callback's exceptions into warnings and carries on; a refusal has to exit by itself
    try:
        check(*args)
    except RunFolderTaken as err:
        print(f"Error ({type(err).__name__}): {err}", file=sys.stderr)
        sys.exit(1)


def keep_earlier_csv_logs(cfg: DictConfig) -> None:
    """Point each CSV logger whose folder already has ``metrics.csv`` (a resume into its own run folder) at the
    next free ``resume_<N>`` version: Lightning's CSVLogger deletes the ``metrics.csv`` it finds."""
    for entry in (cfg.get("logger") or {}).values():
        csv_logger = entry is not None and str(entry.get("_target_")).endswith(".CSVLogger")
        if not csv_logger or entry.get("version") is None:  # version None: Lightning numbers them itself
            continue
        root = Path(entry.save_dir) / entry.name
        if (root / str(entry.version) / "metrics.csv").is_file():
            free = (f"resume_{n}" for n in itertools.count(1) if not (root / f"resume_{n}").exists())
            entry.version = next(free)


def remove_if_only_config(run_dir: Path) -> None:
    """Called when a run fails: if it wrote nothing but its config (and Hydra's logs), delete what it wrote, and
    the folder unless files the folder held before the run (a user's ``notes.log``) keep it."""
    if not run_dir.is_dir():
        return
    files = [p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if not p.is_dir()]
    if not all(f in CONFIG_FILES or is_job_log(f) for f in files):
        return
    kept = _found_before_run.get(run_dir.resolve(), set())
    for f in files:
        if f not in kept:
            (run_dir / f).unlink()
    for folder in run_dir.iterdir():  # .hydra/, csv/, checkpoints/: they held config files only
        if folder.is_dir() and folder.name not in kept:
            shutil.rmtree(folder)
    if not kept:
        run_dir.rmdir()
