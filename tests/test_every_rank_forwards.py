"""Under FSDP every rank must run every forward (each holds a shard of the weights the others need), so a
validation that logs dashboards forwards on every rank and only the logging is rank 0's; and a block's
weights are gathered only during the block's forward, so no submodule of a block may run outside it.
Checked in one process: the same validation run as rank 0 and as a rank that believes it is not rank 0
must run the same module forwards, each layer of a Transformer block inside that block's forward."""

from __future__ import annotations

from collections import Counter
from functools import partial

import lightning as L
import pytest
from hydra.utils import instantiate
from test_translation import _translation, write_parallel_locale

from lit_transformers.nn import TransformerBlock

from test_bert_train import TINY_MODEL, TINY_PAIRS

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _validation_forwards(task, datamodule) -> tuple[Counter, list[str]]:
    """Forward calls per module class during one validation of ``task`` (built on the first call), and the
    submodules of a Transformer block that ran while the block was not in its forward."""
    calls: Counter = Counter()
    outside: list[str] = []
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        limit_val_batches=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    handles = []

    class CountForwards(L.Callback):
        def on_validation_start(self, trainer, task):  # the models exist from here on
            for module in task.modules():
                handles.append(module.register_forward_hook(lambda m, *_: calls.update([type(m).__name__])))
            for name, block in task.named_modules():
                if isinstance(block, TransformerBlock):
                    watch_block(name, block)

    def watch_block(name, block):
        running = []  # non-empty while the block's forward runs: when FSDP has its weights gathered
        handles.append(block.register_forward_pre_hook(lambda *_: running.append(True)))
        handles.append(block.register_forward_hook(lambda *_: running.clear()))  # hooks returning None
        for inner, module in block.named_modules():
            if module is not block:
                handles.append(module.register_forward_pre_hook(partial(check, running, f"{name}.{inner}")))

    def check(running, where, module, args):
        if not running:
            outside.append(where)

    trainer.callbacks.append(CountForwards())
    try:
        trainer.validate(task, datamodule=datamodule, verbose=False)
    finally:
        for handle in handles:
            handle.remove()
    return calls, outside


@pytest.mark.parametrize(
    "family",
    [
        pytest.param(lambda tmp: _translation(write_parallel_locale(tmp / "locale", n=10)), id="translation"),
        pytest.param(
            lambda tmp: ["experiment=bert_pretrain", *TINY_MODEL, TINY_PAIRS, "data.vocab_size=400"],
            id="bert_pretrain",
        ),
    ],
)
def test_a_rank_other_than_zero_runs_the_same_validation_forwards(compose_cfg, tmp_path, monkeypatch, family):
    cfg = compose_cfg(*family(tmp_path), "data.num_workers=0")
    datamodule = instantiate(cfg.data, _convert_="all")
    task = instantiate(cfg.task, _recursive_=False, _convert_="all")
    task.connect_data(datamodule)
    rank_zero, outside = _validation_forwards(task, datamodule)
    assert rank_zero  # the validation ran forwards at all
    assert not outside  # e.g. an attention map computed from a block's projection called on its own
    monkeypatch.setattr(L.Trainer, "is_global_zero", property(lambda trainer: False))
    other_rank, _ = _validation_forwards(task, datamodule)
    assert other_rank == rank_zero
