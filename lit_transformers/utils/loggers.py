"""Lightning's TensorBoard and wandb loggers, laid out for reading (conf/logger/ names them).

* TensorBoard: a custom-scalars layout (train and val loss on one chart), Lightning's ``epoch`` as
  ``trainer/epoch`` (beside the other counters, not the first card), and the HPARAMS tab: the run's
  hyperparameters with its final metrics (``log_hparams_with_metrics``, once the run has them).
* wandb: without the ``anonymous`` setting, which wandb now warns about whatever its value.
"""

from __future__ import annotations

from collections.abc import Mapping

from lightning.fabric.utilities.logger import _convert_params, _flatten_dict
from lightning.pytorch import loggers
from lightning.pytorch.utilities import rank_zero_only


class TensorBoardLogger(loggers.TensorBoardLogger):
    """``custom_scalars``: TensorBoard's layout, ``{category: {chart title: ["Multiline", [tag regex, ...]]}}``."""

    def __init__(self, *args, custom_scalars: Mapping | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.custom_scalars = dict(custom_scalars or {})
        self._layout_written = False

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        # once: TensorBoard reads the layout from any event file of the run
        if self.custom_scalars and not self._layout_written:
            self.experiment.add_custom_scalars(self.custom_scalars)
            self._layout_written = True
        if "epoch" in metrics:  # Lightning adds the epoch to every logged row
            metrics = {("trainer/epoch" if k == "epoch" else k): v for k, v in metrics.items()}
        super().log_metrics(metrics, step)

    @rank_zero_only
    def log_hparams_with_metrics(self, params: Mapping, metrics: Mapping[str, float]) -> None:
        """The HPARAMS tab's row for this run: ``params`` and the names of ``metrics``.

        Lightning's ``log_hyperparams(params, metrics)`` would also log each metric again at one step, a stray
        point on every chart; the tab reads a metric's value from its chart (the latest step), so the metrics
        already logged only need naming here.
        """
        from torch.utils.tensorboard.summary import hparams

        flat = self._sanitize_params(_flatten_dict(_convert_params(dict(params))))
        flat = {k: v for k, v in flat.items() if not k.endswith("_target_")}  # class paths: rarely compared
        writer = self.experiment._get_file_writer()
        for summary in hparams(flat, dict(metrics)):  # experiment, session start, session end
            writer.add_summary(summary)
        writer.flush()


class WandbLogger(loggers.WandbLogger):
    """Lightning's, minus ``anonymous=None`` in ``wandb.init``'s arguments: wandb warns "The anonymous setting has
    no effect" for any value given, and Lightning always gives one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self._wandb_init.get("anonymous") is None:
            del self._wandb_init["anonymous"]
