"""Causal-LM objective, optimiser groups, LR schedule, init_from checks and the non-finite-loss guard."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch

from lit_transformers.callbacks import NonFiniteLossError, StopOnNonFiniteLoss
from lit_transformers.data import ImageClassificationDataModule
from lit_transformers.models import GPT, GPTConfig
from lit_transformers.nn import IGNORE_INDEX
from lit_transformers.tasks import CausalLMTask, TranslationTask, decay_groups, load_weights, warmup_cosine

TINY = GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, d_model=16)


def _task(**kwargs) -> CausalLMTask:
    task = CausalLMTask(
        TINY, optimizer={"_target_": "torch.optim.AdamW", "lr": 1e-2, "weight_decay": 0.1}, **kwargs
    )
    task.configure_model()
    return task


def test_loss_is_mean_next_token_nll_over_unmasked_positions():
    task = _task()
    ids = torch.randint(0, 50, (2, 8))
    labels = torch.randint(0, 50, (2, 8))
    labels[0, :3] = IGNORE_INDEX  # padding / prompt positions carry no target
    total, count = task._step({"input_ids": ids, "labels": labels})
    logp = task.model(ids).double().log_softmax(-1)
    keep = labels != IGNORE_INDEX
    expected = -logp[keep].gather(-1, labels[keep][:, None]).mean()
    assert count.item() == 13 and (total / count).item() == pytest.approx(expected.item(), rel=1e-5)


class _Ragged(torch.utils.data.Dataset):
    """Windows whose labels hide a different number of positions (IGNORE_INDEX) in each batch of 2."""

    hidden = (7, 7, 0, 0, 3, 5)  # targets per batch: 2, 16, 8 of 8 + 8 positions

    def __len__(self):
        return len(self.hidden)

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids, labels = torch.randint(0, 50, (8,), generator=g), torch.randint(0, 50, (8,), generator=g)
        labels[: self.hidden[i]] = IGNORE_INDEX
        return {"input_ids": ids, "labels": labels}


def test_val_loss_is_the_mean_over_every_target_token_and_ppl_its_exp():
    torch.manual_seed(0)
    task = _task()
    loader = torch.utils.data.DataLoader(_Ragged(), batch_size=2)
    trainer = L.Trainer(
        logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu"
    )
    metrics = trainer.validate(task, loader)[0]
    nll_sum, count, batch_means = 0.0, 0, []
    with torch.no_grad():
        for batch in loader:
            logp = task.model(batch["input_ids"]).double().log_softmax(-1)  # float64 reference
            keep = batch["labels"] != IGNORE_INDEX
            nll = -logp[keep].gather(-1, batch["labels"][keep][:, None])
            nll_sum, count = nll_sum + nll.sum().item(), count + int(keep.sum())
            batch_means.append(nll.mean().item())
    assert count == 2 + 16 + 8
    expected = nll_sum / count
    assert metrics["val/loss"] == pytest.approx(expected, rel=1e-6)
    # a mean of batch means would weigh batch 1's 2 tokens like batch 2's 16: the data tells the two apart
    assert sum(batch_means) / len(batch_means) != pytest.approx(expected, rel=1e-3)
    assert metrics["val/ppl"] == pytest.approx(math.exp(metrics["val/loss"]), rel=1e-6)  # float32 exp


def test_decay_applies_to_matrices_only():
    model = GPT(TINY)
    decay, no_decay = decay_groups(model)
    assert no_decay["weight_decay"] == 0.0 and "weight_decay" not in decay
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.ndim >= 2 for p in decay["params"])
    assert {names[id(p)] for p in no_decay["params"]} == {
        n for n, p in model.named_parameters() if p.ndim < 2
    }
    skipped = decay_groups(model, skip={"weight"})  # timm-style names in no_weight_decay()
    assert not any(p.ndim >= 2 and names[id(p)].endswith("weight") for p in skipped[0]["params"])


def test_warmup_cosine_schedule_values():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = warmup_cosine(opt, total_steps=110, warmup_steps=10, min_lr_ratio=0.1)
    lrs = []
    for _ in range(111):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lrs[110] == pytest.approx(0.1)


def test_warmup_longer_than_training_warns_and_warms_up_over_the_whole_run(caplog):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.6)
    with caplog.at_level("WARNING", logger="lit_transformers.tasks.optim"):
        sched = warmup_cosine(opt, total_steps=6, warmup_steps=50)
    assert "warmup_steps" in caplog.text and "max_steps" in caplog.text  # names the overrides that fix it
    lrs = []
    for _ in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # the docstring's step s -> lr * (s + 1) / warmup_steps, with the warmup shortened to the 6 steps there are
    assert lrs == pytest.approx([0.6 * (s + 1) / 6 for s in range(6)])


def test_layer_scaled_groups_get_their_lr_and_schedule():
    task = _task(
        scheduler={"_target_": "lit_transformers.tasks.warmup_cosine", "warmup_steps": 1, "min_lr_ratio": 0.0}
    )
    groups = decay_groups(task.model)
    groups[1]["lr_scale"] = 0.5
    task.param_groups = lambda: groups
    task._trainer = type("T", (), {"estimated_stepping_batches": 10})()
    config = task.configure_optimizers()
    optimizer = config["optimizer"]
    assert [g["lr"] for g in optimizer.param_groups] == [pytest.approx(1e-2), pytest.approx(5e-3)]


def test_init_from_mismatch_lists_the_keys(tmp_path):
    other = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=3, n_head=2, d_model=16))
    path = tmp_path / "other.pt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in other.state_dict().items()}}, path)
    with pytest.raises(ValueError, match=r"unexpected keys: \['blocks\.2\.") as err:
        load_weights(GPT(TINY), path)
    assert "missing keys: []" in str(err.value)
    wider = GPT(GPTConfig(vocab_size=60, block_size=16, n_layer=2, n_head=2, d_model=16))
    torch.save(wider.state_dict(), path)
    with pytest.raises(ValueError, match=r"tok_emb.weight: checkpoint \(60, 16\) vs model \(50, 16\)"):
        load_weights(GPT(TINY), path)


class _Batches(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        ids = torch.arange(i, i + 9) % 50
        return {"input_ids": ids[:-1], "labels": ids[1:]}


def test_non_finite_loss_stops_before_the_update_and_writes_no_checkpoint(tmp_path):
    task = _task()
    with torch.no_grad():
        task.model.ln_f.weight.fill_(float("nan"))
    before = {k: v.clone() for k, v in task.model.state_dict().items()}
    checkpoint = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = L.Trainer(
        max_steps=2,
        callbacks=[StopOnNonFiniteLoss(), checkpoint],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    loader = torch.utils.data.DataLoader(_Batches(), batch_size=4)
    with pytest.raises(NonFiniteLossError, match="learning rate"):
        trainer.fit(task, train_dataloaders=loader)
    after = task.model.state_dict()
    assert all(
        torch.equal(
            before[k],
            after[k],
        )
        or torch.isnan(before[k]).any()
        for k in before
    )
    assert not list(tmp_path.glob("*.ckpt"))


def test_connect_data_names_what_the_datamodule_lacks():
    task = TranslationTask({"_target_": "lit_transformers.models.Seq2SeqConfig"}, optimizer={})
    with pytest.raises(TypeError) as error:
        task.connect_data(ImageClassificationDataModule())
    for missing in (
        "tokenizer (ParallelText)",
        "source_tokenizer (ParallelText)",
        "fixed_examples (ParallelText)",
    ):
        assert missing in str(error.value)
    assert task.data is None

    class Parallel:  # the attributes alone make a datamodule fit; their values come with its setup
        tokenizer = source_tokenizer = None

        def fixed_examples(self, n: int) -> list[tuple[str, str]]:
            return []

    data = Parallel()
    task.connect_data(data)
    assert task.data is data
