"""Ctrl-C (SIGINT) or a scheduler's SIGTERM stops training at the end of the current step with a resumable
``last.ckpt``; a second Ctrl-C quits at once."""

from __future__ import annotations

import os
import signal
import sys
import threading

import lightning as L
import torch


class Interrupted(SystemExit):
    """Training stopped on a signal. Exits with 128 + the signal number (130 for SIGINT, 143 for SIGTERM), the
    shell convention, so a scheduler records the job as killed instead of successful."""

    def __init__(self, signum: int, step: int, checkpoint: str | None):
        super().__init__(128 + signum)
        self.signal_name = signal.Signals(signum).name
        self.step, self.checkpoint = step, checkpoint


class StopOnSignal(L.Callback):
    """Turns SIGINT/SIGTERM into a stop at the next optimizer-step boundary, on every rank at the same step.

    Lightning's own SIGTERM handling raises ``SIGTERMException`` (a ``SystemExit`` with status 0), saves
    nothing, may stop in the middle of a validation, and in DDP broadcasts from inside the signal handler. This
    callback replaces its handler for the duration of training (Lightning restores the previous handlers when
    ``fit`` tears down) and keeps the rest of Lightning's exception path: raising ``Interrupted`` from a hook
    runs the ``on_exception`` hooks and finalizes the loggers (CSV rows flushed).

    ``last.ckpt`` is saved in ``on_train_batch_end``, where ModelCheckpoint saves, because that is the state
    Lightning resumes exactly (the next step, the same logged step numbers). The exception comes at the next hook,
    after Lightning has logged the step's metrics, and before any validation that was due.
    """

    def __init__(self):
        self._signum = 0
        self._step_seen = -1
        self._announce = True
        self._stop: Interrupted | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._signum, self._step_seen, self._stop = 0, trainer.global_step, None
        self._announce = trainer.is_global_zero  # every rank gets the terminal's Ctrl-C; one says so
        if threading.current_thread() is threading.main_thread():  # Python only allows handlers there
            signal.signal(signal.SIGINT, self._handle)
            signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame) -> None:
        self._signum = max(self._signum, signum)
        if signum == signal.SIGINT:
            # the OS default kills the process outright, even inside a hung collective or a slow save
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        if self._announce:
            # os.write, not print: the handler may run in the middle of a print to the same stream
            name = signal.Signals(signum).name
            hint = "; Ctrl-C again quits at once without saving" if signum == signal.SIGINT else ""
            os.write(
                sys.stderr.fileno(),
                f"\n{name}: stopping after this step and saving last.ckpt{hint}\n".encode(),
            )

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx
    ) -> None:
        if trainer.global_step != self._step_seen:  # else mid gradient accumulation: between steps
            self._step_seen = trainer.global_step
            self._decide(trainer, pl_module)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx
    ) -> None:
        self._raise_if_stopping()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._raise_if_stopping()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._stop is None:  # a signal after the last step: skip testing, and the exit status says so
            self._decide(trainer, pl_module)
        self._raise_if_stopping()

    def _decide(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        signum = self._signum
        if trainer.world_size > 1:  # any rank's signal stops them all, at this same step
            signum = int(
                trainer.strategy.reduce(torch.tensor(signum, device=pl_module.device), reduce_op="max")
            )
        if signum:
            self._stop = Interrupted(signum, trainer.global_step, self._save_last(trainer))

    def _raise_if_stopping(self) -> None:
        if self._stop is not None:
            raise self._stop

    @staticmethod
    def _save_last(trainer: L.Trainer) -> str | None:
        """Write ``last.ckpt`` where the ModelCheckpoint callback keeps it; None when checkpointing is off."""
        callback = trainer.checkpoint_callback
        if callback is None or not callback.dirpath:
            return None
        path = callback.format_checkpoint_name({}, callback.CHECKPOINT_NAME_LAST)
        callback.last_model_path = path  # before saving: the callback's state inside the file records it
        trainer.save_checkpoint(path, weights_only=False)  # the full state: a resume continues from it
        return path
