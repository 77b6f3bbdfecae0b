"""What a run prints and what TensorBoard shows: a plain progress line when stdout is a log file, the run summary
last, no ``v_num``, no noise before training, and TensorBoard's HPARAMS tab filled with the final metrics."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from types import SimpleNamespace

import lightning as L
import pytest
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.loggers import CSVLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import plugin_data_pb2

from lit_transformers.callbacks.console import LineProgressBar, TerminalProgressBar
from lit_transformers.callbacks.progress import progress_count

from conftest import REPO, TINY_LM, cli_env

# the console as users see it: the default progress bar and model summary, and every dashboard
SHOWN = [o for o in TINY_LM if not o.startswith(("callbacks.progress_bar", "callbacks.model_summary"))]
STEPS, EVERY = 4, 2


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory, cache_dir):
    """A run with stdout and stderr into one pipe (not a terminal, like a SLURM log): (its output, its folder)."""
    run_dir = tmp_path_factory.mktemp("run")
    overrides = [
        *SHOWN,
        "logger=many",
        f"trainer.max_steps={STEPS}",
        f"trainer.log_every_n_steps={EVERY}",
        f"hydra.run.dir={run_dir}",
        f"paths.cache_dir={cache_dir}",
    ]
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *overrides],
        cwd=REPO,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    return result.stdout, run_dir


@pytest.mark.cli
def test_a_log_file_gets_a_progress_line_within_the_first_log_every_n_steps(logged_run):
    output, _ = logged_run
    line = re.search(
        rf"^step {EVERY}/{STEPS}  train/loss [\d.]+  lr [\d.e+-]+  .*left \d+:\d\d:\d\d$", output, re.M
    )
    assert line, output[-3000:]
    # printed while training, not when the run ends (a live bar writes nothing to a file until then)
    assert line.start() < output.index("`Trainer.fit` stopped"), output[-3000:]
    assert re.search(rf"^validation at step {EVERY}: val/loss [\d.]+", output, re.M), output[-3000:]


@pytest.mark.cli
def test_the_run_summary_is_printed_last_and_names_the_tables(logged_run):
    output, run_dir = logged_run
    assert "wandb: Run summary:" in output  # wandb's closing report, which used to come after the summary
    summary = output[output.rindex("Run folder:") :].strip().splitlines()
    assert summary[0] == f"Run folder:      {run_dir}"
    assert f"Table:           {run_dir / 'csv' / 'val_samples.csv'}" in summary
    assert summary[-1].startswith("wandb:           wandb sync "), summary  # its own line, nothing after it
    assert "v_num" not in output


@pytest.mark.cli
def test_no_noise_before_training_and_no_metric_objects_in_the_model_summary(logged_run):
    output, _ = logged_run
    for noise in [
        "litlogger",
        "anonymous setting",
        "LeafSpec",
        "set_vital",
        "already configured with model summary",
    ]:
        assert noise not in output, noise
    assert "model.tok_emb" in output  # the layer table is there...
    assert "MinMetric" not in output and "val_loss_best" not in output and "eval_means" not in output
    assert "FLOPs" not in output  # ...without FLOPs, counted only for models with an example_input_array


@pytest.mark.cli
def test_the_hparams_tab_holds_the_hyperparameters_with_the_final_metrics(logged_run):
    _, run_dir = logged_run
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    plugin = {
        tag: plugin_data_pb2.HParamsPluginData.FromString(content)
        for tag, content in events.PluginTagToContent("hparams").items()
    }
    metrics = {m.name.tag for m in plugin["_hparams_/experiment"].experiment.metric_infos}
    assert {"val/loss", "test/loss"} <= metrics
    hparams = plugin["_hparams_/session_start_info"].session_start_info.hparams
    assert hparams["trainer/max_steps"].number_value == STEPS
    assert hparams["model/d_model"].number_value == 32
    # the tab shows each metric's chart's latest value: one test/loss point, the one in metrics.csv
    with open(run_dir / "csv" / "metrics.csv") as f:
        test_loss = [float(r["test/loss"]) for r in csv.DictReader(f) if r["test/loss"]]
    assert [e.value for e in events.Scalars("test/loss")] == pytest.approx(test_loss)
    # Lightning's epoch beside the other counters, and train and val loss on one chart
    assert "trainer/epoch" in events.Tags()["scalars"] and "epoch" not in events.Tags()["scalars"]
    layout = layout_pb2.Layout.FromString(
        events.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0]
    )
    charts = {c.title: list(c.multiline.tag) for category in layout.category for c in category.chart}
    assert charts == {"train and val loss": ["^train/loss$", "^val/loss$"]}


class _Versioned(L.LightningModule):
    pass


@pytest.mark.parametrize("bar", [TerminalProgressBar, LineProgressBar])
def test_no_v_num_on_the_progress_bar(bar, tmp_path):
    trainer = L.Trainer(
        logger=CSVLogger(tmp_path, version="alfw"), accelerator="cpu", enable_model_summary=False
    )
    module = _Versioned()
    assert RichProgressBar().get_metrics(trainer, module) == {
        "v_num": "alfw"
    }  # Lightning's bar shows the run id
    assert bar().get_metrics(trainer, module) == {}


@pytest.mark.parametrize(("steps_per_batch", "counted"), [(None, ("step", 8, 12)), (4, ("iteration", 2, 3))])
def test_the_progress_line_counts_iterations_of_a_task_that_steps_several_times_a_batch(
    steps_per_batch, counted
):
    task = SimpleNamespace() if steps_per_batch is None else SimpleNamespace(optimizer_steps_per_batch=4)
    trainer = SimpleNamespace(
        lightning_module=task, max_steps=12, global_step=8, estimated_stepping_batches=99
    )
    assert progress_count(trainer) == counted  # PPO: 12 optimizer steps are 3 iterations of 4
