"""Every dashboard shows the run's own seed: a datamodule's hparams (its ``data.seed``, which seeds only the
split) never reach the loggers, which get the run's whole config once, from train.py."""

from __future__ import annotations

import pytest
import wandb
import yaml

from lit_transformers.train import train

from test_bert_classify import write_locale
from test_bert_train import TINY_BERT, TINY_MODEL, TINY_TRAINER
from test_instructgpt import TINY, TINY_DATA, TINY_TASK

# one optimizer step and one validation batch, logged to CSV, TensorBoard and an offline wandb run
LOGGED = ["logger=many", "trainer.max_steps=1", "trainer.val_check_interval=1", "trainer.limit_val_batches=1"]
LOGGED += ["test=false", "seed=1234", "data.seed=0"]
CLASSIFY = ["data.vocab_size=300", "data.max_seq_len=48", "data.val_fraction=0.2", "data.test_fraction=0.2"]
TINY_RUNS = {
    "bert_pretrain": TINY_BERT,
    "bert_classify": [*TINY_MODEL, *TINY_TRAINER, *CLASSIFY, "data.languages=[de,fr,es]"],
    "gpt_sft": [*TINY, *TINY_DATA, *TINY_TASK],
}


@pytest.fixture
def wandb_configs(monkeypatch) -> list[dict]:
    """The config of each wandb run as wandb holds it when train.py finishes the run (an offline run keeps it
    in its binary .wandb file until synced)."""
    configs, finish = [], wandb.finish

    def record_and_finish(*args, **kwargs):
        configs.append(wandb.run.config.as_dict())
        finish(*args, **kwargs)

    monkeypatch.setattr(wandb, "finish", record_and_finish)
    return configs


@pytest.mark.parametrize("experiment", list(TINY_RUNS))
def test_every_dashboard_logs_the_runs_seed_not_the_datamodules(
    experiment, compose_cfg, tmp_path, wandb_configs
):
    locale = (
        [f"data.path={write_locale(tmp_path / 'locale', n_messages=10)}"]
        if experiment == "bert_classify"
        else []
    )
    train(compose_cfg(f"experiment={experiment}", *TINY_RUNS[experiment], *locale, *LOGGED))
    (wandb_config,) = wandb_configs
    logged = {
        "csv": yaml.safe_load((tmp_path / "csv" / "hparams.yaml").read_text()),
        "tensorboard": yaml.safe_load((tmp_path / "tensorboard" / "hparams.yaml").read_text()),
        "wandb": wandb_config,
    }
    for dashboard, hparams in logged.items():
        assert hparams["seed"] == 1234, dashboard
        assert hparams["data"]["seed"] == 0, dashboard  # the split's seed stays where the config puts it
