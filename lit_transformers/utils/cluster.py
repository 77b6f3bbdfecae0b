"""Where a process stands in its job when torchrun or SLURM launched it, and the config resolvers built on that.

torchrun and ``srun`` start every rank themselves, on every node, and each rank composes the config on its own
(Lightning starts the extra ranks of a single-machine run itself, as children that inherit the resolved config:
``utils.config.resolve_once``). So that all the ranks of one job agree on one run folder, the folder is named by
the launcher's job id, which every rank of the job reads from its environment, instead of each rank's clock;
outside a launcher it stays a timestamp. Lightning's own cluster environments say which launcher is in charge,
the same test its Trainer makes.
"""

from __future__ import annotations

import functools
import os
from datetime import datetime
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from omegaconf import OmegaConf

from lit_transformers.utils.config import ConfigError
from lit_transformers.utils.errors import report_user_errors


def launcher_job_id() -> str | None:
    """torchrun's rendezvous id or SLURM's job id (the same in every rank of the job, and in a requeued SLURM
    job); None outside torchrun and ``srun``."""
    if TorchElasticEnvironment.detect():
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
        if run_id != "none":  # --standalone and single-node torchrun draw a fresh uuid
            return run_id
        # static rendezvous (--master_addr on several nodes) without --rdzv-id: every node says "none"
        if int(os.environ.get("WORLD_SIZE", 1)) > 1:
            raise ConfigError(
                "torchrun started this job on several nodes without a job id, so its ranks cannot agree on one "
                "run folder; pass the same --rdzv-id=<job id> to torchrun on every node (or hydra.run.dir=<folder>)"
            )
        return None
    if SLURMEnvironment.detect():
        return os.environ["SLURM_JOB_ID"]
    return None


def launcher_rank() -> int:
    """This process's global rank when torchrun or SLURM started it, else 0 (also in the children Lightning
    starts: they skip the run-folder work through the resolved config they inherit)."""
    for environment in (TorchElasticEnvironment, SLURMEnvironment):
        if environment.detect():
            return environment().global_rank()
    return 0


def slurm_requeued() -> bool:
    """Whether SLURM requeued this job (preempted, or requeued before its time limit): it then runs again, with the
    same job id, so in the same run folder."""
    return int(os.environ.get("SLURM_RESTART_COUNT", 0)) > 0


def job_id_or_now(time_format: str) -> str:
    """``${job_id_or_now:%Y-%m-%d_%H-%M-%S}``: the launcher's job id, else the time (Hydra's ``${now:...}``)."""
    return launcher_job_id() or datetime.now().strftime(time_format)


def on_rank_zero(value):
    """``${on_rank_zero:.hydra}``: the value on the launcher's rank 0, None on its other ranks (one writer)."""
    return value if launcher_rank() == 0 else None


def sweep_group(task_name: str) -> str | None:
    """``${sweep_group:${task_name}}``: in a Hydra multirun (a sweep's trials, SLURM jobs from ``-m``),
    ``<task_name>-<sweep folder name>``, the same for every job, so that dashboards group them; None for a single
    run, and where no Hydra app is running (configs composed by ``compose``)."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return f"{task_name}-{Path(HydraConfig.get().sweep.dir).name}"


def _exiting_on_user_errors(resolver):
    """``resolver``, exiting with its one-paragraph error (``report_user_errors``) instead of raising: Hydra resolves
    ``hydra.run.dir`` itself, where its callbacks turn an exception into a warning and its ``run_job`` into a
    traceback of OmegaConf's interpolation frames."""

    @functools.wraps(resolver)
    def resolve(*args):
        with report_user_errors():
            return resolver(*args)

    return resolve


def register_resolvers() -> None:
    # cached like ${now:}: resolved once per config, and Hydra copies the cache into each multirun job's config
    OmegaConf.register_new_resolver(
        "job_id_or_now", _exiting_on_user_errors(job_id_or_now), use_cache=True, replace=True
    )
    OmegaConf.register_new_resolver("on_rank_zero", on_rank_zero, replace=True)
    OmegaConf.register_new_resolver("sweep_group", sweep_group, replace=True)
