"""How a run starts, stops and ends: signals, atomic checkpoints, run folders, final validation, what it reports."""

from __future__ import annotations

import csv
import logging
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lit_transformers.callbacks import StopOnSignal
from lit_transformers.train import train
from lit_transformers.utils.checkpoint_io import AtomicCheckpointIO
from lit_transformers.utils.run_folder import RunFolderGuard

from conftest import REPO, TINY_LM, cli_env, train_main

# long enough never to finish on its own; each logged row reaches metrics.csv at once, so the test can see steps
ENDLESS = [
    *TINY_LM,
    "trainer.max_steps=100000",
    "trainer.val_check_interval=1000",
    "logger.csv.flush_logs_every_n_steps=1",
]


def _train_steps(metrics_csv: Path) -> list[int]:
    with open(metrics_csv) as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row.get("train/loss")]


def _start(run_dir: Path, cache_dir: Path, *overrides: str, logs: Path) -> subprocess.Popen:
    command = [
        sys.executable,
        str(REPO / "train.py"),
        *ENDLESS,
        f"hydra.run.dir={run_dir}",
        f"paths.cache_dir={cache_dir}",
    ]
    # files, not pipes: a full pipe would block the run while the test waits for it
    with open(logs.with_suffix(".out"), "w") as out, open(logs.with_suffix(".err"), "w") as err:
        return subprocess.Popen([*command, *overrides], cwd=REPO, env=cli_env(), stdout=out, stderr=err)


def _stop_after_steps(process: subprocess.Popen, csv_dir: Path, signum: int, steps: int = 2) -> int:
    """Send ``signum`` once ``steps`` training steps are in ``csv_dir``/metrics.csv; returns the exit status."""
    metrics = csv_dir / "metrics.csv"
    deadline = time.monotonic() + 120
    try:
        while not (metrics.is_file() and len(_train_steps(metrics)) >= steps):
            assert process.poll() is None, "the run ended before it was signalled"
            assert time.monotonic() < deadline, "no training step logged in 120 s"
            time.sleep(0.1)
        process.send_signal(signum)
        return process.wait(timeout=120)
    finally:
        process.kill()


@pytest.mark.cli
def test_ctrl_c_and_sigterm_stop_at_a_step_boundary_and_the_printed_command_resumes(tmp_path, cache_dir):
    run_dir, logs = tmp_path / "run", tmp_path / "log"
    last, metrics = run_dir / "checkpoints" / "last.ckpt", run_dir / "csv" / "metrics.csv"
    assert _stop_after_steps(_start(run_dir, cache_dir, logs=logs), run_dir / "csv", signal.SIGINT) == 130
    stderr = logs.with_suffix(".err").read_text()
    assert "Stopped by SIGINT after step" in stderr and f"saved {last}" in stderr
    stopped_at = torch.load(last, weights_only=False)["global_step"]
    assert _train_steps(metrics) == list(range(stopped_at))  # every step up to the stop is logged, none after
    assert "--- sample ---" not in logs.with_suffix(".out").read_text()  # stopped: no test, no sampling
    assert not list(run_dir.rglob(".*.partial"))

    # the resume command it printed continues the run in its folder; a scheduler's SIGTERM stops that one
    resume = shlex.split(stderr.split("Resume with:\n", 1)[1].splitlines()[0])
    assert resume[-2:] == [f"ckpt_path={last}", f"hydra.run.dir={run_dir}"]
    first_attempt = metrics.read_text()
    resumed = _start(run_dir, cache_dir, *resume[2:], logs=tmp_path / "resumed")
    assert _stop_after_steps(resumed, run_dir / "csv" / "resume_1", signal.SIGTERM) == 143
    assert "Stopped by SIGTERM after step" in (tmp_path / "resumed.err").read_text()
    assert metrics.read_text() == first_attempt  # the earlier attempt's metrics are kept
    stopped_again = torch.load(last, weights_only=False)["global_step"]
    assert _train_steps(run_dir / "csv" / "resume_1" / "metrics.csv") == list(
        range(stopped_at, stopped_again)
    )


@pytest.mark.slow
@pytest.mark.cli
@pytest.mark.ddp
def test_sigterm_to_rank_zero_stops_both_ddp_ranks_at_the_same_step(tmp_path, cache_dir):
    run_dir, logs = tmp_path / "run", tmp_path / "log"
    process = _start(run_dir, cache_dir, "trainer=ddp_cpu", "data.batch_size=4", logs=logs)
    assert _stop_after_steps(process, run_dir / "csv", signal.SIGTERM) == 143
    assert "Stopped by SIGTERM" in logs.with_suffix(".err").read_text()
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] >= 2


def test_second_ctrl_c_is_left_to_the_os_which_quits_at_once():
    callback = StopOnSignal()
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        callback.on_train_start(SimpleNamespace(global_step=0, is_global_zero=False), None)
        assert signal.getsignal(signal.SIGINT) == callback._handle
        callback._handle(signal.SIGINT, None)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])


def test_training_in_this_process_gives_back_the_signal_handlers_it_found(compose_cfg):
    def mine(signum, frame):
        raise AssertionError("not called")

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGINT, mine)
        signal.signal(signal.SIGTERM, mine)
        train(compose_cfg(*TINY_LM, "trainer.max_steps=2", "test=false"))
        assert signal.getsignal(signal.SIGINT) is mine and signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])


def test_a_failed_save_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    io, path = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, path)

    def killed_halfway(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", killed_halfway)
    with pytest.raises(OSError, match="No space"):
        io.save_checkpoint({"global_step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path)["global_step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # the partial file is gone too


def test_trainer_config_writes_checkpoints_atomically(compose_cfg):
    trainer = instantiate(compose_cfg("trainer=cpu").trainer)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _earlier_run(run_dir: Path) -> dict[str, bytes]:
    for name, text in {
        ".hydra/overrides.yaml": "- seed=1\n",
        "config_resolved.yaml": "seed: 1\n",
        "csv/metrics.csv": "step,train/loss\n0,5.7\n",
        "checkpoints/last.ckpt": "weights",
    }.items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text(text)
    return _snapshot(run_dir)


def test_a_new_run_into_a_used_run_folder_is_refused_and_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    before = _earlier_run(run_dir)
    result = train_main(*TINY_LM, f"hydra.run.dir={run_dir}")
    assert result.returncode == 1
    message = result.stderr.strip()
    assert f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}" in message and "hydra.run.dir=" in message
    assert "Traceback" not in message and len(message.splitlines()) == 1
    assert _snapshot(run_dir) == before  # not even Hydra's .hydra/ or log file


def test_a_failed_run_into_a_folder_of_user_logs_removes_only_what_it_wrote(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "experiment-notes.log").write_text("lr sweep, day 2\n")  # a log alone does not make a run
    missing = tmp_path / "missing.txt"
    result = train_main(
        *TINY_LM, f"hydra.run.dir={run_dir}", f"paths.cache_dir={cache_dir}", "data.corpus.source=path",
        f"data.corpus.path={missing}",
    )  # fmt: skip
    assert result.returncode == 1 and str(missing) in result.stderr, result.stderr[-2000:]
    assert _snapshot(run_dir) == {"experiment-notes.log": b"lr sweep, day 2\n"}  # no config, no job log


def test_a_sweep_into_a_used_sweep_folder_is_refused(tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    _earlier_run(sweep_dir / "0")
    with pytest.raises(SystemExit) as exit:  # Hydra only warns about a callback's exceptions
        RunFolderGuard().on_multirun_start(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}}}))
    assert exit.value.code == 1 and "hydra.sweep.dir=" in capsys.readouterr().err


def test_a_step_limited_run_validates_its_last_step_and_says_where_everything_went(
    compose_cfg, tmp_path, capsys, caplog
):
    # 3 steps, validation every 100: without the final validation there is no best checkpoint and no val/loss
    overrides = [o for o in TINY_LM if o != "callbacks.progress_bar=null"]
    # the live step bar, which a terminal gets (captured output is not one: it would get plain lines)
    overrides.append("callbacks.progress_bar._target_=lit_transformers.callbacks.console.TerminalProgressBar")
    with caplog.at_level(logging.WARNING):
        train(compose_cfg(*overrides, "trainer.max_steps=3", "trainer.val_check_interval=100"))
    best = tmp_path / "checkpoints" / "step_000003.ckpt"
    assert best.is_file()
    assert "No checkpoint to test" not in caplog.text
    out = capsys.readouterr().out
    assert re.search(r"step\s+━+ 3/3", out)  # the bar counts steps, not "Epoch 0/-2"
    assert f"Run folder:      {tmp_path}" in out
    assert re.search(rf"Best checkpoint: {re.escape(str(best))} \(val/loss \d", out)
    assert f"Last checkpoint: {tmp_path / 'checkpoints' / 'last.ckpt'}" in out
    assert f"Metrics:         {tmp_path / 'csv' / 'metrics.csv'}" in out


def test_a_step_limited_overfit_run_validates_its_last_step(compose_cfg, tmp_path, caplog):
    # debug=overfit validates every 100 steps: a run of 4 still validates, keeps a best checkpoint and tests it
    overrides = [o for o in TINY_LM if not o.startswith("trainer.val_check_interval")]
    with caplog.at_level(logging.WARNING, logger="lit_transformers.train"):
        result = train(compose_cfg("debug=overfit", *overrides, "sample=null"))
    assert result.best_checkpoint == str(tmp_path / "checkpoints" / "step_000004.ckpt")
    assert {"val/loss", "test/loss"} <= set(result.metrics)
    assert "No checkpoint to test" not in caplog.text


@pytest.mark.parametrize(
    ("overrides", "cause"),
    [
        (["trainer.limit_val_batches=0"], "validation is off"),
        (["train=false"], "train=false without ckpt_path"),
    ],
)
def test_testing_without_a_checkpoint_warns_with_the_real_cause(overrides, cause, compose_cfg, caplog):
    with caplog.at_level(logging.WARNING, logger="lit_transformers.train"):
        train(compose_cfg(*TINY_LM, "sample=null", *overrides))
    assert f"No checkpoint to test: {cause}" in caplog.text


def test_dashboards_get_the_resolved_config_once_unmerged(compose_cfg, tmp_path):
    cfg = compose_cfg(
        *TINY_LM, "trainer.max_steps=2", "test=false", "sample=null", "logger=many", "logger.wandb=null"
    )
    train(cfg)
    expected = OmegaConf.to_container(cfg, resolve=True)
    assert expected["seed"] == 1234
    for hparams in (tmp_path / "csv" / "hparams.yaml", tmp_path / "tensorboard" / "hparams.yaml"):
        assert yaml.safe_load(hparams.read_text()) == expected, hparams


def test_fast_dev_run_writes_no_checkpoints_or_logs(compose_cfg, tmp_path):
    train(compose_cfg(*TINY_LM, "debug=fdr", "sample=null"))
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "csv").exists()
