"""Evaluation metrics are sums and counts over every sample of the split: on the same checkpoint, 2 DDP ranks log
what 1 process logs, and what a recompute in plain torch gives (sum of per-sample values / count). The test splits
have an odd size, so the ranks get unequal shares: the case where a mean of rank means, or Lightning's
``sync_dist`` mean (which divides the summed batch sizes by the world size as integers), moves the value. Every
default family's 2-rank test runs in the session's one launch of 2 processes (conftest.two_rank_group), the slow
families' in one of their own, each a few seconds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import get_class, instantiate
from test_precision import FAMILIES

from lit_transformers.nn import IGNORE_INDEX, ClipLoss
from lit_transformers.train import train
from lit_transformers.utils.checkpoints import use_checkpoint_tokenizers

from conftest import compose_train_cfg, train_on_two_ranks, two_rank_group

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

FIT = ["trainer.max_steps=1", "trainer.limit_val_batches=0", "test=false", "sample=null"]
EVALUATE = ["train=false", "trainer.limit_test_batches=1.0", "sample=null"]


def _evaluations(cases: dict[str, Case], root: Path, cache_dir: Path):
    """Per family (its tiny experiment of test_precision, plus its case's overrides): one training step saved as
    last.ckpt, then its test in this process ("one"). Returns the 2-rank test of every family, to run in one launch
    (train_on_two_ranks), and a function of its results that adds each family's ("two") to the runs."""
    runs, ddp_configs = {}, []
    for family, case in cases.items():
        data = root / family / "data"
        data.mkdir(parents=True)
        overrides = [*FAMILIES[family](data), *case.overrides]
        train(compose_train_cfg(*overrides, *FIT, output_dir=root / family / "fit", cache_dir=cache_dir))
        checkpoint = root / family / "fit" / "checkpoints" / "last.ckpt"
        evaluate = [*overrides, *EVALUATE, f"ckpt_path={checkpoint}"]
        one = compose_train_cfg(
            *evaluate, *case.one_process, output_dir=root / family / "one", cache_dir=cache_dir
        )
        runs[family] = {"cfg": one, "checkpoint": checkpoint, "one": train(one).metrics}
        ddp_configs.append(
            compose_train_cfg(
                *evaluate, "trainer=ddp_cpu", output_dir=root / family / "two", cache_dir=cache_dir
            )
        )

    def finish(results: list[dict]) -> dict[str, dict]:
        for family, metrics in zip(cases, results):
            runs[family]["two"] = metrics
        return runs

    return ddp_configs, finish


def _test_batches(run: dict):
    """The trained task (eval mode) and the test batches of one process, tokenized with the checkpoint's tokenizers."""
    cfg, checkpoint = run["cfg"], run["checkpoint"]
    use_checkpoint_tokenizers(cfg.data, torch.load(checkpoint, weights_only=True), checkpoint)
    datamodule = instantiate(cfg.data, _convert_="all")
    datamodule.prepare_data()
    datamodule.setup("test")
    task = get_class(cfg.task._target_).load_from_checkpoint(checkpoint, weights_only=True).eval()
    return task, list(datamodule.test_dataloader())


def _mean(values: list[torch.Tensor]) -> float:
    return torch.cat(values).double().mean().item()


def _class_means(outputs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """Loss and accuracy over every (logits, label) row of every batch."""
    losses = [F.cross_entropy(logits, labels, reduction="none") for logits, labels in outputs]
    right = [(logits.argmax(-1) == labels).float() for logits, labels in outputs]
    return {"test/loss": _mean(losses), "test/acc": _mean(right)}


@torch.no_grad()
def _sequence_classes(task, batches) -> tuple[dict[str, float], int]:
    return _class_means([(task(b), b["labels"]) for b in batches]), sum(len(b["labels"]) for b in batches)


@torch.no_grad()
def _word_classes(task, batches) -> tuple[dict[str, float], int]:
    words = [b["labels"] != IGNORE_INDEX for b in batches]  # one label per word
    outputs = [(task(b)[w], b["labels"][w]) for b, w in zip(batches, words)]
    return _class_means(outputs), sum(len(b["labels"]) for b in batches)  # the ranks share sentences


@torch.no_grad()
def _image_classes(task, batches) -> tuple[dict[str, float], int]:
    outputs = [(task(images), labels) for images, labels in batches]
    return _class_means(outputs), sum(len(labels) for _, labels in outputs)


def _per_target(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each target token (positions labelled IGNORE_INDEX have none)."""
    targets = labels != IGNORE_INDEX
    return F.cross_entropy(logits[targets], labels[targets], reduction="none")


def _token_means(losses: list[torch.Tensor]) -> dict[str, float]:
    loss = _mean(losses)
    return {"test/loss": loss, "test/ppl": torch.tensor(loss).exp().item()}


@torch.no_grad()
def _next_tokens(task, batches) -> tuple[dict[str, float], int]:
    losses = [
        _per_target(task.model(b["input_ids"], b.get("position_ids"), b.get("attention_mask")), b["labels"])
        for b in batches
    ]  # SFT: the completions only
    return _token_means(losses), sum(len(b["labels"]) for b in batches)


@torch.no_grad()
def _translations(task, batches) -> tuple[dict[str, float], int]:
    """The ranks share batches (made by length under a token budget), not sentences."""
    losses = [_per_target(task(b["src_ids"], b["tgt_ids"], b["src_valid"]), b["labels"]) for b in batches]
    return _token_means(losses), len(batches)


@torch.no_grad()
def _preferences(task, batches) -> tuple[dict[str, float], int]:
    chosen, rejected = zip(
        *(task.model.score(b["pair_ids"], b["pair_mask"]).double().chunk(2) for b in batches)
    )
    chosen, rejected = torch.cat(chosen), torch.cat(rejected)
    rewards = torch.cat([chosen, rejected])
    expected = {
        "test/loss": -F.logsigmoid(chosen - rejected).mean(),  # Bradley-Terry, no margin
        "test/accuracy": (chosen > rejected).double().mean(),
        "test/margin": (chosen - rejected).mean(),
        "test/reward_mean": rewards.mean(),
        "test/reward_std": rewards.std(correction=0),
    }
    return {key: value.item() for key, value in expected.items()}, len(chosen)


@torch.no_grad()
def _policy_preferences(task, batches) -> tuple[dict[str, float], int]:
    """DPO's implicit rewards against the frozen reference, and RPO's NLL over every chosen token of the split."""
    beta, alpha = task.hparams.beta, task.hparams.rpo_alpha or 0.0
    chosen, rejected, nll, tokens = [], [], 0.0, 0
    for b in batches:
        (policy_chosen, policy_rejected), (ref_chosen, ref_rejected) = (
            task._sequence_logprobs(model, b) for model in (task.policy, task.reference)
        )  # summed response log-probs (B,) of each
        chosen.append(beta * (policy_chosen - ref_chosen).double())
        rejected.append(beta * (policy_rejected - ref_rejected).double())
        nll -= policy_chosen.double().sum()
        tokens += b["response_mask"][: len(policy_chosen), 1:].sum()
    chosen, rejected = torch.cat(chosen), torch.cat(rejected)
    expected = {
        "test/loss": -F.logsigmoid(chosen - rejected).mean() + alpha * nll / tokens,  # no label smoothing
        "test/rewards/chosen": chosen.mean(),
        "test/rewards/rejected": rejected.mean(),
        "test/rewards/accuracies": (chosen > rejected).double().mean(),
        "test/rewards/margins": (chosen - rejected).mean(),
    }
    return {key: value.item() for key, value in expected.items()}, len(chosen)


@torch.no_grad()
def _contrastive(task, batches) -> tuple[dict[str, float], int]:
    """One process's batches hold the rows of both ranks' batches: the same contrastive sets."""
    losses = []
    for batch in batches:
        image_features, text_features = task(batch["image"], batch["input_ids"])
        logits = task.model.logit_scale.exp() * image_features @ text_features.T  # (B, B): image i, text j
        pairs = torch.arange(len(logits))
        losses.append(
            (F.cross_entropy(logits, pairs, reduction="none") + F.cross_entropy(logits.T, pairs)) / 2
        )
    return {"test/loss": _mean(losses)}, sum(map(len, losses))


class Case(NamedTuple):
    overrides: list[str]  # of both runs: an odd test split, batches that do not divide it
    recompute: Callable | None  # (task, test batches) -> (expected metrics, samples the ranks share)
    one_process: tuple[str, ...] = ()  # of the one-process run only


DEFAULT = {
    "bert_classify": Case(["data.test_fraction=0.15", "data.batch_size=4"], _sequence_classes),  # 9 texts
    "bert_token_classify": Case(
        ["data.test_fraction=0.15", "data.batch_size=4"], _word_classes
    ),  # 9 sentences
    "vit": Case(["data.test_fraction=0.07", "data.batch_size=16"], _image_classes),  # 127 images
    "translation": Case([], _translations),  # an odd number of batches
}
ODD_PROMPTS = "data.test_fraction=0.075"  # 9 of data.n_examples=120
SLOW = {
    "gpt_pretrain": Case([], _next_tokens),  # 609 windows
    "gpt_sft": Case([ODD_PROMPTS], _next_tokens),
    "gpt_reward": Case([ODD_PROMPTS], _preferences),
    "gpt_dpo": Case([ODD_PROMPTS], _policy_preferences),  # the experiment adds RPO
    "gpt_ppo": Case([ODD_PROMPTS], None),
    # CLIP's loss gathers every batch, so its eval keeps DistributedSampler's padding: a repeat of the first image
    # evens out the odd split and must not count. Each rank's batch of 4 meets the other's, as one process's
    # batch of 8 holds both
    "clip": Case(
        ["data.test_fraction=0.07", "data.batch_size=4"], _contrastive, one_process=("data.batch_size=8",)
    ),
}


@two_rank_group
def default_runs(root, cache_dir):
    """The DEFAULT families' evaluations, their 2-rank tests in the session's launch of 2 processes."""
    return _evaluations(DEFAULT, root, cache_dir)


@pytest.fixture(scope="module")
def slow_runs(tmp_path_factory, cache_dir) -> dict[str, dict]:
    ddp_configs, finish = _evaluations(SLOW, tmp_path_factory.mktemp("ddp_metrics_slow"), cache_dir)
    return finish(train_on_two_ranks(*ddp_configs))


def _assert_agree(run: dict, case: Case) -> None:
    one, two = run["one"], run["two"]
    tested = sorted(k for k in one if k.startswith("test/"))
    assert tested and sorted(k for k in two if k.startswith("test/")) == tested
    for key in tested:
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    if case.recompute is None:
        return
    expected, n_samples = case.recompute(*_test_batches(run))
    assert n_samples % 2 == 1  # unequal shares of 2 ranks (CLIP's: evened out by a repeat)
    for key, value in expected.items():
        assert one[key] == pytest.approx(value, rel=1e-5), key


@pytest.mark.parametrize("local_loss", [True, False])
def test_clip_loss_leaves_out_the_padding_repeat_as_a_pair_and_as_a_negative(local_loss):
    """Rank 1's last row repeats an image of an earlier batch (DistributedSampler's padding): marked not valid, the
    ranks' losses, weighted by their valid rows, give the loss of the 7 real pairs of one process's batch."""
    world, rows = 2, 4
    g = torch.Generator().manual_seed(0)
    image, text = (F.normalize(torch.randn(world * rows, 16, generator=g), dim=-1) for _ in range(2))
    valid = torch.arange(world * rows) < 7
    shards = {name: list(t.split(rows)) for name, t in (("image", image), ("text", text), ("valid", valid))}

    def all_gather_for(rank):
        def all_gather(x, sync_grads=False):  # what Lightning's all_gather returns on `rank`: (W, B, ...)
            (name,) = [name for name, parts in shards.items() if parts[rank] is x]
            return torch.stack(shards[name])

        return all_gather

    scale, loss_fn = torch.tensor(10.0), ClipLoss(local_loss)
    per_rank = [
        loss_fn(shards["image"][r], shards["text"][r], scale, all_gather_for(r), r, world, shards["valid"][r])
        for r in range(world)
    ]
    ours = sum(loss * part.sum() for loss, part in zip(per_rank, shards["valid"])) / valid.sum()
    logits = scale.double() * image[:7].double() @ text[:7].double().T
    labels = torch.arange(7)
    expected = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
    assert ours.item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.cli
@pytest.mark.ddp
@pytest.mark.parametrize("family", list(DEFAULT))
def test_two_ranks_log_the_one_process_means_of_every_sample(default_runs, family):
    _assert_agree(default_runs[family], DEFAULT[family])


@pytest.mark.cli
@pytest.mark.ddp
def test_bleu_over_two_ranks_equals_one_process(default_runs):
    """The test split is an odd number of batches, so the ranks get unequal shares; corpus BLEU/chrF are
    computed from statistics summed over both (a rank-0-only or mean-of-ranks score would differ)."""
    one, two = default_runs["translation"]["one"], default_runs["translation"]["two"]
    assert one["test/bleu_identity"] > 0  # the sources share numbers and placeholders with the references
    for key in ("test/bleu", "test/chrf", "test/bleu_identity", "test/chrf_identity", "test/loss"):
        assert two[key] == pytest.approx(one[key], rel=1e-6), key


@pytest.mark.slow  # one launch of 2 processes evaluating 6 families, after 12 runs in this process
@pytest.mark.cli
@pytest.mark.ddp
@pytest.mark.parametrize("family", list(SLOW))
def test_two_ranks_log_the_one_process_means_of_every_sample_in_the_gpt_and_clip_families(slow_runs, family):
    _assert_agree(slow_runs[family], SLOW[family])
