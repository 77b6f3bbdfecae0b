"""What every training objective shares: models built from plain config, ``init_from``, frozen submodules,
optimiser and schedule from config, tokenizer in the checkpoint, grad-norm logging.

Hyperparameters are plain containers (dicts, lists, numbers, strings), from which ``tasks/specs.py`` builds
the model configs, optimizer and schedule, on load as on training.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from unittest.mock import patch

import lightning as L
import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from torchmetrics import MaxMetric, MeanMetric, MinMetric

from lit_transformers.contract import check_data
from lit_transformers.tasks import lora as lora_adapters
from lit_transformers.tasks.optim import decay_groups, unrefused_clipping
from lit_transformers.tasks.specs import build_config, build_from_spec, load_weights, model_weights
from lit_transformers.text import Tokenizer
from lit_transformers.utils.checkpoints import read_checkpoint

log = logging.getLogger(__name__)

# model config fields that say how a model trains, not what it is: a run may set them apart from its init_from parent
TRAINING_FIELDS = ("dropout", "attn_dropout", "activation_checkpointing")


def parent_model_config(checkpoint: Mapping, ours: Mapping) -> dict:
    """The fields of the model config that ``checkpoint`` was trained with which its weights depend on (all but
    :data:`TRAINING_FIELDS`) and which differ from ``ours``; none for another kind of model (``_target_``)."""
    theirs = checkpoint.get("hyper_parameters", {}).get("model") or {}
    if theirs.get("_target_") != ours.get("_target_"):
        return {}
    return {
        k: v
        for k, v in theirs.items()
        if k not in TRAINING_FIELDS and not k.startswith("_") and ours.get(k) != v
    }


def as_override(value) -> str:
    """``value`` as a command-line override writes it (``null``, ``true``)."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


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


class Task(L.LightningModule):
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
        self.eval_means = nn.ModuleDict()  # the running means of log_mean, one per logged key

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
        targets = {"model": init_from} if isinstance(init_from, str) else dict(init_from)
        for target, path in targets.items():
            prefix = f"{target}."
            new = tuple(h.removeprefix(prefix) for h in self.new_heads if h.startswith(prefix))
            checkpoint = read_checkpoint(path, "init_from", self.hparams.trust_checkpoint)
            parent_state = checkpoint.get("hyper_parameters", {}).get("tokenizer")
            parent = Tokenizer.from_state(parent_state) if parent_state else None
            if parent is not None and self.tokenizer is not None and parent != self.tokenizer:
                raise ValueError(
                    f"init_from={path} was trained with a different tokenizer ({parent.vocab_size} tokens) than "
                    f"this run's data ({self.tokenizer.vocab_size} tokens); set data.tokenizer_path={path} "
                    "to train with the parent's tokenizer"
                )
            weights = checkpoint
            if "lora_base" in checkpoint:  # adapters only: the parent's model rebuilt on its base, merged
                weights = lora_adapters.merged_weights(checkpoint, path, self.hparams.trust_checkpoint)
            dropped = tuple(h.removeprefix(prefix) for h in self.dropped_heads if h.startswith(prefix))
            if dropped:  # e.g. a classifier fine-tuned from a pretraining checkpoint leaves its MLM/NSP heads
                weights = {k: v for k, v in model_weights(weights).items() if not k.startswith(dropped)}
            try:
                fresh = load_weights(self.get_submodule(target), path, new, weights)
            except ValueError as err:
                ours = self.hparams.get("model") or {}
                differ = parent_model_config(checkpoint, ours)
                if not differ:
                    raise
                raise ValueError(
                    f"init_from={path} was trained with another model config than this run's "
                    f"({', '.join(f'model.{k}={as_override(ours.get(k))}' for k in differ)}), and its weights fit "
                    f"only its own: add {' '.join(f'model.{k}={as_override(v)}' for k, v in differ.items())}"
                ) from err
            log.info(
                "init_from: loaded %s into %s%s",
                path,
                target,
                f"; new (not in the checkpoint): {', '.join(prefix + k for k in fresh)}" if fresh else "",
            )

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

    # ---- metrics and files -----------------------------------------------------------------------

    def eval_mean(self, key: str) -> MeanMetric:
        """The running mean behind :meth:`log_mean`'s ``key``, made at its first use (on this task's device)."""
        if key not in self.eval_means:
            self.eval_means[key] = MeanMetric().to(self.device)
        return self.eval_means[key]

    def log_mean(
        self, key: str, values: torch.Tensor, weight: torch.Tensor | float = 1.0, prog_bar: bool = False
    ) -> None:
        """Log the validation or test value ``key`` as its mean over every sample (or token) of the split, all
        batches and ranks together: ``values`` holds one value per sample (weight 1 each), or is a batch mean
        that stands for ``weight`` samples or tokens. The sums of value x weight and of weight are all-reduced
        before the division, so 2 DDP ranks log what 1 process logs, whatever their shares of the split.
        (``self.log(..., sync_dist=True)`` does not: Lightning divides the ranks' summed batch sizes by the
        world size as integers, so 13 samples on 2 ranks count as 12.) Lightning computes and resets the mean
        at epoch end; read it then from ``trainer.callback_metrics[key]``."""
        metric = self.eval_mean(key)
        metric.update(values, weight)
        self.log(
            key, metric, on_step=False, on_epoch=True, prog_bar=prog_bar, metric_attribute=f"eval_means.{key}"
        )

    def track_best(self, key: str, mode: str) -> None:
        """Keep the best (``mode``: min or max) validation ``key`` for :meth:`log_best`, in a tracker saved in
        checkpoints (so the best survives a resume) and named ``<key with _>_best`` in the state dict."""
        tracker = {"min": MinMetric, "max": MaxMetric}[mode]()
        tracker.persistent(True)
        setattr(self, f"{key.replace('/', '_')}_best", tracker)

    def log_best(self, key: str, value: torch.Tensor | None = None) -> None:
        """At validation end, feed ``value`` (default: ``key`` as the steps logged it) to ``key``'s tracker
        (:meth:`track_best`) and log the best so far as ``<key>_best``; nothing during the sanity check."""
        value = self.trainer.callback_metrics.get(key) if value is None else value
        if value is not None and not self.trainer.sanity_checking:
            tracker = getattr(self, f"{key.replace('/', '_')}_best")
            tracker(value)
            self.log(f"{key}_best", tracker.compute(), sync_dist=True)

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
