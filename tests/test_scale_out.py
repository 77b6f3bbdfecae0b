"""Scale out: every process of a multi-node job shares one run folder, and two nodes train as one node does."""

from __future__ import annotations

import csv
import socket
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import lightning as L
import pytest
from omegaconf import OmegaConf

from lit_transformers.utils.cluster import job_id_or_now, launcher_rank, on_rank_zero
from lit_transformers.utils.config import ConfigError
from lit_transformers.utils.run_folder import (
    is_job_log,
    requeued_checkpoint,
)

from conftest import REPO, TINY_LM, cli_env, train_cli, train_main

# a validation and a checkpoint at step 2 and 4, nothing after training
RUN = [*TINY_LM, "test=false", "sample=null"]


class PrintClusterEnvironment(L.Callback):
    """Says which launcher Lightning found (``TorchElasticEnvironment`` for torchrun), in each rank's output."""

    def on_fit_start(self, trainer, pl_module):
        environment = type(trainer.strategy.cluster_environment).__name__
        print(f"rank {trainer.global_rank}/{trainer.world_size}: {environment}", flush=True)


def _losses(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")}


def _files(run_dir: Path) -> list[str]:
    """The run's files, but Hydra's job logs: one per launched process, named after Lightning's DDP children."""
    files = (p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file())
    return sorted(f for f in files if not is_job_log(f))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # three 2-process runs: ~40 s on 2 cores
@pytest.mark.cli
@pytest.mark.ddp
def test_two_torchrun_nodes_share_one_run_folder_and_train_as_one_node(tmp_path, cache_dir, ddp_cli):
    one_node = ddp_cli(*RUN, run_dir=tmp_path / "one_node")

    port, job_id = _free_port(), "job-1234"
    nodes = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1"),
                *(f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}"),
                f"--rdzv-id={job_id}",
                str(REPO / "train.py"),
                *(*RUN, "trainer=ddp_cpu", "trainer.num_nodes=2", "trainer.devices=1"),
                *(f"paths.cache_dir={cache_dir}", f"paths.log_dir={tmp_path}"),
                "+callbacks.print_environment._target_=test_scale_out.PrintClusterEnvironment",
            ],
            cwd=REPO,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    logs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert "rank 0/2: TorchElasticEnvironment" in logs[0] and "rank 1/2: TorchElasticEnvironment" in logs[1]

    runs = list((tmp_path / "train" / "runs").iterdir())
    assert [run.name for run in runs] == [job_id]  # one folder, named by the job, not by each node's clock
    # one checkpoint set, one metrics file, one config: what the one-node run wrote, and nothing more
    assert _files(runs[0]) == _files(one_node)
    expected, got = _losses(one_node), _losses(runs[0])
    assert sorted(got) == sorted(expected) == [0, 1, 2, 3]
    assert [got[s] for s in sorted(got)] == pytest.approx([expected[s] for s in sorted(got)], abs=1e-5)


SLURM_TASK_2_OF_4 = {
    "SLURM_JOB_ID": "987",
    "SLURM_NTASKS": "4",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_PROCID": "2",
    "SLURM_JOB_NAME": "train",
}


def test_slurm_tasks_name_their_run_folder_by_the_job_and_only_rank_zero_writes_hydra_files(monkeypatch):
    for key, value in SLURM_TASK_2_OF_4.items():
        monkeypatch.setenv(key, value)
    assert (job_id_or_now("%Y"), launcher_rank(), on_rank_zero(".hydra")) == ("987", 2, None)
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert on_rank_zero(".hydra") == ".hydra"
    monkeypatch.setenv(
        "SLURM_JOB_NAME", "interactive"
    )  # an salloc shell: Lightning does not treat it as a job
    assert job_id_or_now("%Y") == datetime.now().strftime("%Y")


def test_torchrun_on_several_nodes_without_a_job_id_is_refused(monkeypatch):
    torchrun = {"TORCHELASTIC_RUN_ID": "none", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}
    for key, value in torchrun.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match="--rdzv-id"):
        job_id_or_now("%Y")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")
    assert job_id_or_now("%Y") == "job-7"


def _last_value(run_dir: Path, metric: str) -> float:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return [float(r[metric]) for r in csv.DictReader(f) if r.get(metric)][-1]


def test_the_trials_of_a_sweep_share_one_wandb_group_and_a_single_run_has_none(compose_cfg):
    assert compose_cfg("logger=wandb").logger.wandb.group is None
    sweep = "/sweeps/2026-11-29_21-00-00"
    for multirun in ("hparams_search=gpt_optuna", "hydra.mode=MULTIRUN"):  # an Optuna sweep, any -m
        cfg = compose_cfg("logger=many", multirun, f"hydra.sweep.dir={sweep}", "task_name=gpt")
        assert cfg.logger.wandb.group == "gpt-2026-11-29_21-00-00"


def test_optuna_sweep_of_three_trials_reports_the_best_one(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    result = train_main(
        "hparams_search=gpt_optuna",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.sampler.n_startup_trials=2",
        *TINY_LM,
        "test=false",
        "sample=null",
        f"paths.cache_dir={cache_dir}",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    trials = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [t.name for t in trials] == ["0", "1", "2"]  # one folder (and dashboard) per trial
    losses = [_last_value(trial, "val/loss") for trial in trials]
    report = OmegaConf.load(sweep / "optimization_results.yaml")
    assert report.best_value == pytest.approx(min(losses), rel=1e-6)
    best = trials[losses.index(min(losses))]
    best_lr = OmegaConf.load(best / ".hydra" / "config.yaml").task.optimizer.lr
    assert best_lr == pytest.approx(report.best_params["task.optimizer.lr"])


@pytest.mark.slow  # two runs in parallel subprocesses: ~40 s on 2 cores
@pytest.mark.cli
def test_submitit_local_multirun_runs_each_job_in_its_own_folder(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    result = train_cli(
        "-m",
        "hydra/launcher=submitit_local",
        "seed=1,2",
        "logger=many",
        *TINY_LM,
        "test=false",
        "sample=null",
        f"paths.cache_dir={cache_dir}",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for job, seed in (("0", 1), ("1", 2)):
        assert OmegaConf.load(sweep / job / "config_resolved.yaml").seed == seed
        assert sorted(_losses(sweep / job)) == [0, 1, 2, 3]
        assert (sweep / job / "checkpoints" / "last.ckpt").is_file()
        assert len(list((sweep / job / "wandb").glob("offline-run-*"))) == 1  # a wandb run of its own
    assert _losses(sweep / "0") != _losses(sweep / "1")


def test_a_requeued_slurm_job_resumes_from_the_last_checkpoint_in_its_folder(tmp_path, monkeypatch):
    run_dir = tmp_path / "runs" / "987"
    (run_dir / "checkpoints").mkdir(parents=True)
    assert requeued_checkpoint(run_dir) is None
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert (
        requeued_checkpoint(run_dir) is None
    )  # the job's first attempt: a checkpoint there is another run's
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert requeued_checkpoint(run_dir) == str(run_dir / "checkpoints" / "last.ckpt")


@pytest.mark.slow  # two runs: ~20 s
@pytest.mark.cli
def test_a_requeued_slurm_job_continues_its_run(tmp_path, cache_dir):
    slurm = {
        **SLURM_TASK_2_OF_4,
        "SLURM_NTASKS": "1",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
    }
    common = [
        *TINY_LM,
        "test=false",
        "sample=null",
        f"paths.cache_dir={cache_dir}",
        f"paths.log_dir={tmp_path}",
    ]
    first = train_cli(*common, "trainer.max_steps=2", env=slurm)
    assert first.returncode == 0, first.stderr[-3000:]
    requeued = train_cli(*common, env={**slurm, "SLURM_RESTART_COUNT": "1"})
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    run_dir = tmp_path / "train" / "runs" / "987"
    assert sorted(_losses(run_dir)) == [0, 1]
    with open(run_dir / "csv" / "resume_1" / "metrics.csv") as f:  # the requeued attempt: steps 2 and 3
        assert sorted({int(r["step"]) for r in csv.DictReader(f) if r.get("train/loss")}) == [2, 3]
