"""What a run prints while it trains: a live bar on a terminal, plain lines in a log file, and the model's layers.

``progress_bar()`` picks the bar: on a terminal the live step bar (``StepProgressBar``), with log lines printed
above it instead of onto it; when stdout is a file or a pipe (a SLURM log) a ``LineProgressBar``, since a live bar
writes nothing there until it ends.
"""

from __future__ import annotations

import logging
import sys
import time
from datetime import timedelta

import lightning as L
from lightning.pytorch.callbacks import ProgressBar, RichModelSummary
from lightning.pytorch.utilities.model_summary import get_formatted_model_size, get_human_readable_count
from torch import nn
from torchmetrics import Metric

from lit_transformers.callbacks.progress import StepProgressBar, progress_count


def progress_bar() -> ProgressBar:
    """The live step bar on a terminal, plain lines otherwise."""
    return TerminalProgressBar() if sys.stdout.isatty() else LineProgressBar()


def shown_metrics(metrics: dict) -> dict:
    """The progress-bar metrics without Lightning's ``v_num``: the logger's run id (wandb's ``alfw``) says
    nothing about training and the run folder already names the run."""
    return {k: v for k, v in metrics.items() if k != "v_num"}


class TerminalProgressBar(StepProgressBar):
    """The live step bar, without ``v_num``, and with log records ("Samples at step 50: ...") printed above it.

    While the bar is live, rich swaps ``sys.stdout``/``sys.stderr`` for proxies that print above it; logging
    handlers keep the stream they were built with and would write onto the bar's line, so they are pointed at the
    proxies while it lives.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._moved_handlers: list[tuple[logging.StreamHandler, object]] = []

    def get_metrics(self, trainer, pl_module):
        return shown_metrics(super().get_metrics(trainer, pl_module))

    def _init_progress(self, trainer: L.Trainer) -> None:
        super()._init_progress(trainer)
        if self._moved_handlers:
            return
        proxies = {getattr(s, "rich_proxied_file", None): s for s in (sys.stdout, sys.stderr)}
        for handler in _stream_handlers():
            proxy = proxies.get(handler.stream)
            if proxy is not None:
                self._moved_handlers.append((handler, handler.setStream(proxy)))

    def _stop_progress(self) -> None:
        super()._stop_progress()
        for handler, stream in self._moved_handlers:
            handler.setStream(stream)
        self._moved_handlers = []


def _stream_handlers() -> list[logging.StreamHandler]:
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    handlers = {h for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers}
    # exactly StreamHandler: a FileHandler (Hydra's job log) keeps writing to its file
    return [h for h in handlers if type(h) is logging.StreamHandler]


class LineProgressBar(ProgressBar):
    """One plain line every ``trainer.log_every_n_steps`` optimizer steps (PPO: iterations; and at the last), and
    one per validation, for output that is not a terminal::

        step 20/500  train/loss 5.306  lr 2.00e-03  18,479 tokens/s  elapsed 0:00:12  left 0:04:48
        validation at step 20: val/loss 5.256  val/ppl 191.7
    """

    def __init__(self):
        super().__init__()
        self._enabled = True
        # (time, steps or iterations done) when training started: a resumed run starts later
        self._started: tuple[float, int] | None = None
        self._printed_step = -1

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def get_metrics(self, trainer, pl_module):
        return shown_metrics(super().get_metrics(trainer, pl_module))

    def on_train_start(self, trainer, pl_module) -> None:
        self._started = (time.monotonic(), progress_count(trainer)[1])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        unit, done, total = progress_count(trainer)
        due = done % trainer.log_every_n_steps == 0 or done == total
        if not self._enabled or not due or done == self._printed_step:  # accumulating batches repeat a step
            return
        self._printed_step = done
        metrics = self.get_metrics(trainer, pl_module)
        parts = [f"{unit} {done}/{total}"]
        parts += [f"{k} {_number(v)}" for k, v in metrics.items() if k.startswith("train/")]
        if trainer.optimizers:
            parts.append(f"lr {trainer.optimizers[0].param_groups[0]['lr']:.2e}")
        for key, value in trainer.callback_metrics.items():  # train/tokens_per_sec, train/samples_per_sec
            if key.startswith("train/") and key.endswith("_per_sec"):
                parts.append(f"{float(value):,.0f} {key.removeprefix('train/').removesuffix('_per_sec')}/s")
        started_at, first_done = self._started
        elapsed = time.monotonic() - started_at
        parts.append(f"elapsed {timedelta(seconds=round(elapsed))}")
        if done > first_done:
            left = elapsed / (done - first_done) * (total - done)
            parts.append(f"left {timedelta(seconds=round(left))}")
        print("  ".join(parts), flush=True)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not self._enabled or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        metrics = self.get_metrics(trainer, pl_module)
        shown = "  ".join(f"{k} {_number(v)}" for k, v in metrics.items() if k.startswith("val/"))
        print(f"validation at step {trainer.global_step}: {shown}", flush=True)


def _number(value) -> str:
    return f"{float(value):.4g}"


def _holds_only_metrics(module: nn.Module) -> bool:
    """A torchmetrics object, or a container of them (one still empty when training starts included)."""
    containers = (nn.ModuleDict, nn.ModuleList)
    return isinstance(module, Metric) or (
        isinstance(module, containers) and all(_holds_only_metrics(c) for c in module.children())
    )


class ModelSummaryWithoutMetrics(RichModelSummary):
    """Lightning's layer table without the torchmetrics objects (``val_loss_best``, a ``ModuleDict`` of means:
    bookkeeping, not layers), and without the FLOPs column when nothing was counted (FLOPs are only counted for a
    model with an ``example_input_array``; otherwise the column reads 0 in every row)."""

    def __init__(self, max_depth: int = 2, **summarize_kwargs):  # 2: the model's own layers, not just "model"
        super().__init__(max_depth, **summarize_kwargs)

    def _summary(self, trainer, pl_module):
        summary = super()._summary(trainer, pl_module)
        summary._layer_summary = {
            name: layer
            for name, layer in summary._layer_summary.items()
            if not _holds_only_metrics(layer._module)
        }
        return summary

    @staticmethod
    def summarize(
        summary_data,
        total_parameters,
        trainable_parameters,
        model_size,
        total_training_modes,
        total_flops,
        **_,
    ) -> None:
        from rich import get_console
        from rich.table import Table

        columns = [(name, values) for name, values in summary_data if total_flops or name != "FLOPs"]
        table = Table(header_style="bold magenta")
        for name, _values in columns:
            table.add_column(name, justify="right" if name in ("Params", "FLOPs") else "left")
        for row in zip(*(values for _name, values in columns)):
            table.add_row(*row)
        totals = {
            "Trainable params": get_human_readable_count(int(trainable_parameters)),
            "Non-trainable params": get_human_readable_count(int(total_parameters - trainable_parameters)),
            "Total params": get_human_readable_count(int(total_parameters)),
            "Total estimated model params size (MB)": get_formatted_model_size(model_size),
        }
        if total_flops:
            totals["Total FLOPs"] = get_human_readable_count(total_flops)
        console = get_console()
        console.print(table)
        console.print("\n".join(f"[bold]{name}[/]: {value}" for name, value in totals.items()))
