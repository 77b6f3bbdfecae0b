"""What every training objective shares: models built from plain config, ``init_from`` (loaded by
:mod:`~lit_transformers.tasks.init_from`), frozen submodules, optimiser and schedule from config, tokenizer in
the checkpoint, grad-norm logging, and (from :class:`~lit_transformers.tasks.eval_metrics.EvalMetrics`) split-wide
means and bests that survive a resume.

Hyperparameters are plain containers (dicts, lists, numbers, strings), from which ``tasks/specs.py`` builds
the model configs, optimizer and schedule, on load as on training.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from unittest.mock import patch

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from lit_transformers.contract import check_data
from lit_transformers.tasks import lora as lora_adapters
from lit_transformers.tasks.eval_metrics import EvalMetrics
from lit_transformers.tasks.init_from import (
    as_override,  # noqa: F401 (re-exported)
    load_parent,
    parent_model_config,  # noqa: F401 (re-exported)
)
from lit_transformers.tasks.optim import decay_groups, unrefused_clipping
from lit_transformers.tasks.specs import build_config, build_from_spec
from lit_transformers.text import Tokenizer

log = logging.getLogger(__name__)


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """Dropout off inside (for generation, dashboards, predictions); the module's train/eval mode is
    restored afterwards, also when the body raises."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


class Task(EvalMetrics):
    """Base of every task. Subclasses implement ``build_model()`` (or ``build_models()`` for several named
    models) and the step methods. Models are built in ``configure_model`` so that they can depend on the
    datamodule (vocabulary, class names) and are built once per rank (FSDP-friendly). The datamodule comes
    through :meth:`connect_data` (``train()`` calls it), checked against the protocols in ``data_needs``.

    Args (shared by every task; subclasses pass them through ``**task_args``):
        optimizer: ``{_target_: torch.optim.AdamW, lr: ..., ...}``, built over the decay/no-decay groups.
        scheduler: ``{_target_: lit_transformers.tasks.warmup_cosine, ...}`` or None for a constant lr.
        init_from: a checkpoint whose primary model initialises ``model``, or ``{submodule: checkpoint}``
            for tasks with several models; applied once, then the task's own checkpoints carry the weights.
        compile: ``torch.compile`` the trainable models.
        tokenizer: the tokenizer's plain state; text tasks set it from the datamodule, and checkpoints
            carry it, so a reloaded task tokenizes exactly as in training.
        trust_checkpoint: allow ``init_from`` files that need arbitrary unpickling (trusted files only).
        lora: ``{r, alpha, dropout, target_modules, modules_to_save}`` (``tasks.lora.LoRASpec``): train LoRA
            adapters on ``lora_models`` over their frozen base (which ``init_from`` / ``init_from_hf`` name,
            and keep naming in the checkpoints); None trains every weight.
    """

    new_heads: tuple[
        str, ...
    ] = ()  # state-dict prefixes (e.g. "model.head") created fresh on top of init_from
    frozen: tuple[str, ...] = ()  # submodules kept fixed: no gradient, not optimised, always in eval mode
    # state-dict prefixes (e.g. "model.mlm_head") of parent heads this task does not build: dropped on init_from
    dropped_heads: tuple[str, ...] = ()
    data_needs: tuple[type, ...] = ()  # protocols of lit_transformers.contract the datamodule must satisfy
    # a task meant to start from a parent checkpoint: what to pass, named by the warning when init_from is unset
    init_from_hint: str | None = None
    # the field of the first model's config that bounds its input length (GPT's block_size, BERT's max_position):
    # checked against the data's longest sequence before training, not at the first batch that exceeds it
    context_field: str | None = None
    # the models ``lora`` puts adapters on (by module name, tasks.lora.DEFAULT_TARGETS of their family)
    lora_models: tuple[str, ...] = ("model",)

    def __init__(
        self,
        optimizer: dict,
        scheduler: dict | None = None,
        init_from: str | dict | None = None,
        compile: bool = False,
        tokenizer: dict | None = None,
        trust_checkpoint: bool = False,
        lora: dict | None = None,
    ):
        super().__init__()
        self.save_hyperparameters(logger=False)  # here, so no subclass can forget it: includes their args
        self.tokenizer = Tokenizer.from_state(tokenizer) if tokenizer else None
        self.data = None  # the datamodule, set by connect_data
        self._built = False

    # ---- data ----------------------------------------------------------------------------------

    def connect_data(self, datamodule) -> None:
        """The one way a task receives its datamodule (``train()`` calls it before fit and test): checked
        against ``data_needs`` now, read when the models are built (after the datamodule's ``setup``). A
        trainer given a datamodule but no connected task only takes batches from it."""
        check_data(datamodule, self.data_needs, type(self).__name__)
        self.data = datamodule

    # ---- models --------------------------------------------------------------------------------

    def build_model(self) -> nn.Module:
        raise NotImplementedError

    def build_models(self) -> dict[str, nn.Module]:
        """Named models, each set as an attribute of the task (and so named in its checkpoints)."""
        return {"model": self.build_model()}

    def attach_tokenizer(self) -> Tokenizer | None:
        """The tokenizer this task uses: the datamodule's when training with one (then recorded in the
        hyperparameters, so checkpoints carry it), else the one its checkpoint carried, else none."""
        tokenizer = self.data.tokenizer if self.data is not None else None
        if tokenizer is not None:
            self.tokenizer = tokenizer
            self.hparams.tokenizer = tokenizer.state()
        return self.tokenizer

    def check_hf_vocabulary(self, n_embeddings: int, what: str) -> None:
        """After ``init_from_hf`` loaded ``what``: refuse a run tokenizer with more tokens than its ``n_embeddings``
        rows, naming the fix (the checkpoint's own tokenizer)."""
        path = self.hparams.init_from_hf
        tokenizer = self.attach_tokenizer()
        if tokenizer is not None and tokenizer.vocab_size > n_embeddings:
            raise ValueError(
                f"init_from_hf={path} has {n_embeddings} word embeddings but this run's tokenizer has "
                f"{tokenizer.vocab_size} tokens; set data.tokenizer_path={path} to use the checkpoint's own"
            )
        log.info("init_from_hf: loaded the %s in %s", what, path)

    def attach_class_names(self) -> list[str]:
        """The class names of a classification task (its ``class_names`` argument): the datamodule's when
        training (then recorded in the hyperparameters, so checkpoints carry them), else the checkpoint's."""
        class_names = self.data.class_names if self.data is not None else None
        if class_names:
            self.hparams.class_names = list(class_names)
        if not self.hparams.class_names:
            raise ValueError(
                "No class names: connect a datamodule that has them (task.connect_data(datamodule), as train() "
                "does), or pass task.class_names"
            )
        return self.hparams.class_names

    def require_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise ValueError(
                "No tokenizer: connect a datamodule that has one (task.connect_data(datamodule), as train() "
                "does), or load a checkpoint of this task"
            )
        return self.tokenizer

    def text_model_config(self, **from_tokenizer):
        """The model config from ``hparams.model``, its null fields taken from the tokenizer:
        ``from_tokenizer`` maps field -> function of the tokenizer (vocabulary size, EOS id)."""
        tokenizer = self.attach_tokenizer()
        defaults = {field: get(tokenizer) for field, get in from_tokenizer.items()} if tokenizer else {}
        config = build_config(self.hparams.model, **defaults)
        unset = [field for field in from_tokenizer if getattr(config, field) is None]
        if unset:
            raise ValueError(f"model.{unset[0]} is null and there is no tokenizer to take it from; set it")
        if tokenizer is not None and config.vocab_size < tokenizer.vocab_size:
            raise ValueError(
                f"model.vocab_size={config.vocab_size} is smaller than the tokenizer's {tokenizer.vocab_size} "
                "tokens; leave it null to take the tokenizer's"
            )
        return config

    def configure_model(self) -> None:
        if self._built:
            return
        started = self.hparams.init_from or self.hparams.get("init_from_hf")
        if not started and self.init_from_hint and self._trainer is not None:  # not a reload
            log.warning(
                "%s starts from random weights: no init_from (%s)", type(self).__name__, self.init_from_hint
            )
        # build_models clears the directories it loads, as init_from below; a LoRA run keeps naming its base
        sources = {key: self.hparams.get(key) for key in lora_adapters.BASE_SOURCES[1:]}
        models = self.build_models()
        for name, module in models.items():
            setattr(self, name, module)
        self.model_names = list(models)
        self._built = True
        self._check_context(models[self.model_names[0]])
        if self.hparams.init_from:
            self._load_init_from(self.hparams.init_from)
            # the weights now live in this task's own checkpoints; reloading them must not need the parent file
            # (a LoRA checkpoint holds adapters only: its base is rebuilt from the source it keeps naming)
            if self.hparams.lora is None:
                self.hparams.init_from = None
        for name in self.frozen:
            getattr(self, name).requires_grad_(False).eval()
        if self.hparams.lora is not None:
            self.hparams.update({key: path for key, path in sources.items() if path})
            lora_adapters.configure_lora(self)
        if self.hparams.compile:
            for name in self.trainable_models():
                getattr(self, name).compile()  # in place: state-dict names stay free of "_orig_mod."

    def _check_context(self, model: nn.Module) -> None:
        longest = getattr(self.data, "longest_sequence", None)
        if self.context_field is None or longest is None:
            return
        key, length = longest
        context = getattr(model.config, self.context_field)
        if length > context:
            raise ValueError(
                f"{key}={length} is longer than the model's context, model.{self.context_field}={context}, and a "
                f"batch that long would fail mid-training; lower {key} or raise model.{self.context_field}"
            )

    def trainable_models(self) -> list[str]:
        return [name for name in self.model_names if name not in self.frozen]

    def _load_init_from(self, init_from: str | Mapping) -> None:
        """A checkpoint into ``model``, or each ``{submodule: checkpoint}`` into its submodule (:func:`load_parent`);
        tasks with other model names map ``init_from`` onto them first."""
        targets = {"model": init_from} if isinstance(init_from, str) else dict(init_from)
        for target, path in targets.items():
            load_parent(self, target, path)

    def train(self, mode: bool = True):
        super().train(mode)
        for name in self.frozen if self._built else ():
            getattr(self, name).eval()  # Lightning calls train() each epoch: frozen models keep dropout off
        return self

    # ---- optimisation ----------------------------------------------------------------------------

    def param_groups(self) -> list[dict]:
        groups: list[dict] = []
        for name in self.trainable_models():
            module = getattr(self, name)
            skip = getattr(module, "no_weight_decay", lambda: set())()
            groups += decay_groups(module, set(skip))
        return groups

    def total_steps(self) -> int:
        """Optimizer steps the schedule spans. Lightning counts batches; a task that steps its optimizer
        several times per batch (manual optimisation, PPO epochs) overrides this."""
        return int(self.trainer.estimated_stepping_batches)

    def configure_optimizers(self):
        optimizer = build_from_spec(self.hparams.optimizer, Optimizer, "task.optimizer", self.param_groups())
        for group in optimizer.param_groups:  # timm layer-wise lr decay stores "lr_scale" per group
            group["lr"] *= group.get("lr_scale", 1.0)
        if self.hparams.scheduler is None:
            return optimizer
        scheduler = build_from_spec(
            self.hparams.scheduler, LRScheduler, "task.scheduler", optimizer, total_steps=self.total_steps()
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "name": "train/lr"},
        }

    def clip_gradients(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Lightning's clipping (automatic, and PPO's manual ``self.clip_gradients``), also where its precision
        plugins refuse the clip of the GPU presets (``optim.unrefused_clipping``)."""
        unrefused = unrefused_clipping(self.trainer, optimizer)
        with patch.multiple(self.trainer.precision_plugin, **unrefused) if unrefused else nullcontext():
            super().clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def on_before_optimizer_step(self, optimizer) -> None:
        if (self.trainer.global_step + 1) % self.trainer.log_every_n_steps:
            return  # an extra pass over every gradient is only worth it on steps that get logged
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads:
            self.log("train/grad_norm", torch.nn.utils.get_total_norm(grads), on_step=True, on_epoch=False)

    # ---- checkpoints and files -------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        cls = type(self)
        checkpoint["task_class"] = (
            f"{cls.__module__}.{cls.__qualname__}"  # named when a run loads the wrong file
        )
        if self.hparams.lora is not None:
            lora_adapters.slim_checkpoint(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        lora_adapters.restore_base(self, checkpoint)

    def on_fit_start(self) -> None:
        checkpoints = self.trainer.checkpoint_callback
        if (
            self.tokenizer is not None
            and self.trainer.is_global_zero
            and getattr(checkpoints, "dirpath", None)
        ):
            self.tokenizer.save(
                Path(checkpoints.dirpath) / "tokenizer.json"
            )  # for tools outside this package
