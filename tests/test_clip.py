"""CLIP: contrastive loss (open_clip parity, distributed semantics), temperature clamp, towers, zero-shot,
retrieval, caption data and the experiments."""

from __future__ import annotations

import json
import math

import lightning as L
import open_clip
import pytest
import torch
import torch.nn.functional as F
from torchmetrics.retrieval import RetrievalHitRate

from lit_transformers.data import CaptionDataModule
from lit_transformers.nn import ClipLoss
from lit_transformers.tasks.evaluation import recall_at_k, zero_shot_classifier

from conftest import TwoRankCall, two_rank_group
from image_helpers import FixedBatches, fixed_caption_batch, run_experiment, tiny_clip_task, write_caption_csv


def _features(n: int, dim: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    image = F.normalize(torch.randn(n, dim, generator=g), dim=-1).requires_grad_()
    text = F.normalize(torch.randn(n, dim, generator=g), dim=-1).requires_grad_()
    return image, text


def test_clip_loss_matches_open_clip_loss_and_gradients():
    image, text = _features(8)
    scale = torch.tensor(1 / 0.07)
    ours = ClipLoss()(image, text, scale)
    grads = torch.autograd.grad(ours, (image, text))
    reference = open_clip.ClipLoss()(image, text, scale)
    ref_grads = torch.autograd.grad(reference, (image, text))
    torch.testing.assert_close(ours, reference)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("local_loss", [True, False])
@pytest.mark.parametrize("gather_with_grad", [True, False])
def test_per_rank_losses_over_simulated_ranks_average_to_the_full_batch_loss(local_loss, gather_with_grad):
    world, rows = 2, 4
    image, text = _features(world * rows)
    scale = torch.tensor(10.0)
    image_shards, text_shards = list(image.split(rows)), list(text.split(rows))

    def all_gather_for(rank):
        def all_gather(x, sync_grads=False):  # what Lightning's all_gather returns on `rank`: (W, B, E)
            shards = image_shards if torch.equal(x, image_shards[rank]) else text_shards
            out = torch.stack(shards)
            return out if sync_grads else out.detach()

        return all_gather

    loss_fn = ClipLoss(local_loss, gather_with_grad)
    losses = [
        loss_fn(image_shards[r], text_shards[r], scale, all_gather_for(r), rank=r, world_size=world)
        for r in range(world)
    ]
    logits = scale.double() * image.double() @ text.double().T  # float64 full-batch reference
    labels = torch.arange(world * rows)
    full = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
    assert torch.stack(losses).mean().item() == pytest.approx(full.item(), rel=1e-5)
    if local_loss and gather_with_grad:  # DDP sums the gathers' gradients, then averages over ranks
        ours = torch.autograd.grad(torch.stack(losses).mean(), (image, text))
        ref = torch.autograd.grad(full, (image, text))
        for g, r in zip(ours, ref):
            torch.testing.assert_close(g.double(), r.double(), atol=1e-6, rtol=1e-4)


@two_rank_group
def clip_ddp_step(root, cache_dir):
    """One DDP step of tests/clip_ddp_worker.py, in the session's launch of 2 processes: what rank 0 saved."""
    root.mkdir(parents=True)
    out = root / "ddp.pt"
    return [TwoRankCall("clip_ddp_worker.one_step", str(out))], lambda results: torch.load(out)


@pytest.mark.cli
@pytest.mark.ddp
def test_ddp_two_ranks_match_one_process_on_the_same_global_batch(clip_ddp_step):
    ddp = clip_ddp_step
    assert ddp["world_size"] == 2

    L.seed_everything(0)
    task = tiny_clip_task()
    task.configure_model()
    batch = fixed_caption_batch(8)
    image, text = task.model(batch["image"], batch["input_ids"])
    loss = open_clip.ClipLoss()(image, text, task.model.logit_scale.exp())  # one process, all 8 rows
    loss.backward()
    assert ddp["loss"].item() == pytest.approx(loss.item(), rel=1e-5)
    for name, param in task.model.named_parameters():
        torch.testing.assert_close(ddp["grads"][name], param.grad, atol=1e-6, rtol=1e-4, msg=name)


def _logit_scale_after_one_step(
    max_logit_scale: float, init: float = math.log(100) - 0.01, grad: float = -1.0
) -> float:
    task = tiny_clip_task(
        init_logit_scale=init,
        max_logit_scale=max_logit_scale,
        optimizer={"_target_": "torch.optim.AdamW", "lr": 0.5},
    )

    class Push(L.Callback):  # a negative gradient asks for a larger scale; Adam then moves it by ~lr
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            pl_module.model.logit_scale.grad = torch.tensor(grad)

    trainer = L.Trainer(
        max_steps=1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Push()],
    )
    trainer.fit(task, datamodule=FixedBatches(fixed_caption_batch(4)))
    return task.model.logit_scale.item()


def test_logit_scale_is_clamped_to_ln100_after_an_optimizer_step():
    assert _logit_scale_after_one_step(max_logit_scale=10.0) > math.log(100) + 0.4  # the step overshoots...
    assert _logit_scale_after_one_step(max_logit_scale=math.log(100)) == pytest.approx(
        math.log(100)
    )  # ...clamped


def test_logit_scale_is_clamped_at_zero_from_below():
    # Adam's first step moves by ~lr = 0.5 against the gradient: 0.01 -> about -0.49 unclamped (temperature > 1)
    assert _logit_scale_after_one_step(max_logit_scale=math.log(100), init=0.01, grad=1.0) == 0.0


def test_text_tower_pools_at_the_eos_position_and_ignores_padding():
    task = tiny_clip_task()
    task.configure_model()
    model = task.model.eval()
    ids = torch.tensor(
        [[10, 63, 5, 2, 0, 0, 0, 0]]
    )  # EOS (2) at position 3; the largest id sits at position 1
    noisy = ids.clone()
    noisy[0, 4:] = torch.tensor([7, 8, 9, 2])  # anything after the EOS is invisible to it (causal attention)
    torch.testing.assert_close(model.encode_text(ids), model.encode_text(noisy))
    x = model.token_embedding(ids) + model.positions.weight[:8]
    for block in model.blocks:
        x = block(x)
    by_hand = [F.normalize(model.text_proj(model.ln_final(x[:, pos])), dim=-1) for pos in (3, 1)]
    torch.testing.assert_close(model.encode_text(ids), by_hand[0])
    assert not torch.allclose(by_hand[0], by_hand[1])  # argmax-of-ids pooling would read another position
    with pytest.raises(ValueError, match="EOS"):
        model.encode_text(torch.tensor([[10, 11, 12, 0, 0, 0, 0, 0]]))


def test_features_are_unit_norm_and_temperature_and_positions_skip_weight_decay():
    task = tiny_clip_task()
    task.configure_model()
    batch = fixed_caption_batch(4)
    for features in task.model(batch["image"], batch["input_ids"]):
        torch.testing.assert_close(features.norm(dim=-1), torch.ones(4))
    assert task.model.logit_scale.item() == pytest.approx(math.log(1 / 0.07))
    names = {id(p): n for n, p in task.model.named_parameters()}
    no_decay = {
        names[id(p)] for g in task.param_groups() if g.get("weight_decay") == 0.0 for p in g["params"]
    }
    assert {"logit_scale", "positions.weight", "visual.pos_embed", "visual.cls_token"} <= no_decay
    assert "token_embedding.weight" not in no_decay and "text_proj.weight" not in no_decay


def test_zero_shot_weights_are_the_renormalised_mean_of_normalised_prompt_embeddings():
    table = torch.randn(100, 6, dtype=torch.float64)
    vocab: dict[str, int] = {}

    def encode_texts(texts):  # a fixed, unnormalised embedding per distinct string
        return torch.stack([table[vocab.setdefault(t, len(vocab))] for t in texts])

    names, templates = ["cat", "dog", "fox"], ["a {}", "a photo of a {}", "my {}"]
    weights = zero_shot_classifier(encode_texts, names, templates)
    assert weights.shape == (6, 3)
    for c, name in enumerate(names):
        mean = sum(e / e.norm() for e in (table[vocab[t.format(name)]] for t in templates)) / len(templates)
        torch.testing.assert_close(weights[:, c], mean / mean.norm())


def test_recall_at_k_counts_any_relevant_caption_and_matches_torchmetrics_hit_rate():
    similarity = torch.tensor([[0.9, 0.1, 0.8, 0.3], [0.2, 0.4, 0.3, 0.1], [0.1, 0.5, 0.2, 0.6]])
    relevant = torch.tensor(
        [[0, 0, 1, 1], [1, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.bool
    )  # image 0 has 2 captions
    recall = recall_at_k(similarity, relevant, ks=(1, 2, 3))
    assert recall == pytest.approx({1: 0.0, 2: 2 / 3, 3: 1.0})  # by hand: ranks of the first hit are 2, 3, 2
    indexes = torch.arange(3)[:, None].expand_as(similarity)
    for k in (1, 2, 3):
        hit_rate = RetrievalHitRate(top_k=k)(
            similarity.flatten(), relevant.flatten(), indexes=indexes.flatten()
        )
        assert recall[k] == pytest.approx(hit_rate.item())


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_caption_table_groups_captions_per_image_and_splits_by_image(tmp_path, suffix):
    path = write_caption_csv(tmp_path, n_images=12, captions_per_image=2)
    if suffix == ".jsonl":
        rows = [
            dict(zip(("image", "caption"), line.split(","))) for line in path.read_text().splitlines()[1:]
        ]
        path = tmp_path / "pairs.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in rows))
    datamodule = CaptionDataModule(
        source="table",
        path=str(path),
        img_size=16,
        in_chans=3,
        mean=[0.5] * 3,
        std=[0.5] * 3,
        val_fraction=0.25,
        test_fraction=0.25,
        batch_size=2,
    )
    datamodule.setup()
    assert [len(datamodule.datasets[s]) for s in ("train", "val", "test")] == [6, 3, 3]
    texts, relevant = datamodule.retrieval_targets("val")
    assert (
        relevant.shape == (6, 3)
        and relevant.sum(0).tolist() == [2, 2, 2]
        and relevant.sum(1).tolist() == [1] * 6
    )
    for j, text in enumerate(texts):  # "picture <i> caption <j>" describes image i
        image = datamodule.datasets["val"].images.dataset.paths[int(relevant[j].nonzero())]
        assert text.split()[1] == image.stem
    item = datamodule.datasets["train"][0]
    assert (
        item["image"].shape == (3, 16, 16) and (item["input_ids"] == datamodule.tokenizer.eos_id).sum() == 1
    )


def test_caption_table_errors_name_the_fix(tmp_path):
    csv = tmp_path / "pairs.csv"
    with pytest.raises(FileNotFoundError, match="data.path"):
        CaptionDataModule(source="table", path=str(csv)).setup()
    csv.write_text("image,caption\n")
    with pytest.raises(ValueError, match="no rows"):
        CaptionDataModule(source="table", path=str(csv)).setup()
    csv.write_text("path,text\na.png,a cat\n")
    with pytest.raises(ValueError, match="data.image_key"):
        CaptionDataModule(source="table", path=str(csv)).setup()
    csv.write_text("image,caption\nmissing.png,a cat\n")
    with pytest.raises(FileNotFoundError, match="data.image_root"):
        CaptionDataModule(source="table", path=str(csv)).setup()


def test_digit_captions_test_prompts_are_unseen_and_tokenizer_travels_in_the_checkpoint():
    datamodule = CaptionDataModule(
        train_templates=["a handwritten {}", "the digit {}"], test_templates=["a scanned numeral {}"]
    )
    datamodule.setup()
    train_texts = {c for caps in datamodule.captions["train"] for c in caps}
    test_texts, relevant = datamodule.retrieval_targets("test")
    assert len(test_texts) == 10 and not train_texts & set(test_texts)
    assert datamodule.templates["test"] == ["a scanned numeral {}"]
    labels = torch.tensor(datamodule.datasets["test"].images.dataset.dataset.targets)[
        datamodule.datasets["test"].images.dataset.indices
    ]
    for text, row in zip(test_texts, relevant):  # a class's text describes exactly that class's images
        assert row.tolist() == (labels == datamodule.class_names.index(text.split()[-1])).tolist()

    task = tiny_clip_task()
    task.tokenizer, task.hparams.tokenizer = (
        datamodule.tokenizer,
        datamodule.tokenizer.state(),
    )  # as in training
    reloaded = tiny_clip_task(tokenizer=task.hparams.tokenizer)  # as load_from_checkpoint does
    assert reloaded.tokenizer.encode("a scanned numeral seven") == datamodule.tokenizer.encode(
        "a scanned numeral seven"
    )


def test_fast_dev_run_clip(tmp_path):
    metrics = run_experiment(tmp_path, ["experiment=clip", "debug=fdr"])
    assert {"test/zeroshot_top1", "test/i2t_recall@1", "test/t2i_recall@1"} <= set(metrics)


# the full ViT-B/32 (150M parameters) takes a minute on 2 CPU cores; by default both towers keep one block
SHRINK = ["model.image.depth=1", "model.text_layers=1"]


@pytest.mark.parametrize(
    "size", [pytest.param(SHRINK, id="one-block"), pytest.param([], id="full", marks=pytest.mark.slow)]
)
def test_fast_dev_run_clip_vit_b32_on_a_caption_csv(tmp_path, size):
    path = write_caption_csv(tmp_path / "pairs", n_images=12, captions_per_image=2)
    overrides = [
        f"data.path={path}",
        "data.batch_size=4",
        "data.num_workers=0",
        "data.val_fraction=0.25",
        "data.test_fraction=0.25",
        "trainer.precision=32-true",
        *size,
    ]
    metrics = run_experiment(tmp_path, ["experiment=clip_vit_b32", "debug=fdr", *overrides])
    assert "test/i2t_recall@1" in metrics and "test/zeroshot_top1" not in metrics
