"""ViT image classification: timm backbones, DeiT recipe knobs, image data sources, metrics, experiments."""

from __future__ import annotations

import csv

import lightning as L
import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from PIL import Image
from timm.data.auto_augment import RandAugment
from torchvision.datasets import cifar

from lit_transformers.data import ImageClassificationDataModule, build_transform, load_image_splits
from lit_transformers.models import create_backbone
from lit_transformers.tasks import ImageClassificationTask, warmup_cosine

from image_helpers import run_experiment, write_fake_cifar10, write_fake_mnist, write_image_folder

SMALL = {"recipe": "small", "degrees": 10, "translate": [0.125, 0.125], "scale": [0.9, 1.1]}
TINY_VIT = {
    "name": "vit_tiny_patch16_224",
    "img_size": 8,
    "patch_size": 2,
    "in_chans": 1,
    "embed_dim": 32,
    "depth": 2,
    "num_heads": 2,
}


@pytest.mark.parametrize("img_size,patch_size,class_token", [(8, 2, True), (32, 4, True), (32, 8, False)])
def test_vit_patch_tokens_match_hw_over_p_squared(img_size, patch_size, class_token):
    model = create_backbone(
        "vit_tiny_patch16_224",
        img_size=img_size,
        patch_size=patch_size,
        in_chans=3,
        class_token=class_token,
        global_pool="token" if class_token else "avg",
        num_classes=0,
        depth=1,
    )
    x = torch.randn(2, 3, img_size, img_size)
    n = (img_size * img_size) // patch_size**2
    assert model.forward_features(x).shape == (2, n + int(class_token), 192)
    # each token is the linear projection of one flattened P*P*C patch, in row-major patch order
    patches = F.unfold(x, kernel_size=patch_size, stride=patch_size).transpose(1, 2)  # (B, N, C*P*P)
    proj = model.patch_embed.proj
    expected = patches @ proj.weight.flatten(1).T + proj.bias
    torch.testing.assert_close(model.patch_embed(x), expected, atol=1e-5, rtol=1e-5)


def _task(layer_decay=None, weight_decay=0.05, lr=1e-3) -> ImageClassificationTask:
    return ImageClassificationTask(
        model={"backbone": TINY_VIT},
        optimizer={"_target_": "torch.optim.AdamW", "lr": lr, "weight_decay": weight_decay},
        scheduler={
            "_target_": "lit_transformers.tasks.warmup_cosine",
            "warmup_steps": 2,
            "min_lr_ratio": 0.1,
        },
        layer_decay=layer_decay,
        class_names=[str(i) for i in range(10)],
    )


def _fit(task, steps=3, **trainer_kwargs) -> L.Trainer:
    datamodule = ImageClassificationDataModule(transform=SMALL, batch_size=16)
    trainer = L.Trainer(
        max_steps=steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        **trainer_kwargs,
    )
    task.connect_data(datamodule)
    trainer.fit(task, datamodule=datamodule)
    return trainer


def test_no_weight_decay_on_pos_embed_cls_token_norms_and_biases():
    task = _task()
    task.configure_model()
    decayed = {id(p) for g in task.param_groups() if g.get("weight_decay", None) != 0.0 for p in g["params"]}
    for name, param in task.model.named_parameters():
        exempt = name in ("pos_embed", "cls_token") or param.ndim == 1
        assert (id(param) not in decayed) == exempt, name


def test_layer_decay_scales_are_applied_by_the_scheduler():
    decay, depth, lr = 0.5, TINY_VIT["depth"], 1e-3
    trainer = _fit(_task(layer_decay=decay, lr=lr), steps=3)
    optimizer = trainer.optimizers[0]
    schedule = warmup_cosine(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), 3, 2, 0.1)
    for _ in range(3):
        schedule.optimizer.step()
        schedule.step()
    factor = schedule.get_last_lr()[0]  # the shared schedule's multiplier after 3 steps

    def layer(
        name: str,
    ) -> int:  # by hand: stem 0, block i at i + 1, final norm with the last block, head top
        if name.startswith(("patch_embed", "cls_token", "pos_embed")):
            return 0
        if name.startswith("blocks."):
            return int(name.split(".")[1]) + 1
        return depth if name.startswith("norm.") else depth + 1

    lr_of = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    for name, param in trainer.lightning_module.model.named_parameters():
        expected = lr * factor * decay ** (depth + 1 - layer(name))
        assert lr_of[id(param)] == pytest.approx(expected, rel=1e-6), name


def test_label_smoothing_loss_matches_float64_hand_computation():
    task = _task()
    task.hparams.label_smoothing = 0.1
    logits, labels = torch.randn(6, 10), torch.randint(0, 10, (6,))
    logp = torch.log_softmax(logits.double(), -1)
    target = torch.full((6, 10), 0.1 / 10, dtype=torch.float64)
    target[torch.arange(6), labels] += 0.9
    assert task.loss(logits, labels).item() == pytest.approx(-(target * logp).sum(-1).mean().item(), rel=1e-6)


def test_mixup_batches_are_full_and_carry_smoothed_soft_targets():
    mixup = {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "label_smoothing": 0.1}
    datamodule = ImageClassificationDataModule(transform=SMALL, mixup=mixup, batch_size=50)
    datamodule.setup()
    _, targets = next(iter(datamodule.train_dataloader()))
    sizes = [len(x) for x, _ in datamodule.train_dataloader()]
    assert set(sizes) == {50}  # 1257 training images: the ragged last batch is dropped
    assert targets.shape == (50, 10)
    torch.testing.assert_close(targets.sum(-1), torch.ones(50))
    assert targets.min() >= 0.1 / 10 - 1e-6  # smoothing mass survives mixing
    odd = ImageClassificationDataModule(transform=SMALL, mixup=mixup, batch_size=33)
    with pytest.raises(ValueError, match="must be even"):
        odd.setup()


def test_digits_split_is_stratified_and_disjoint():
    splits, names = load_image_splits("digits", val_fraction=0.1, test_fraction=0.2, seed=0)
    assert names[7] == "seven"
    indices = {k: set(ds.indices) for k, ds in splits.items()}
    assert sum(len(v) for v in indices.values()) == 1797
    assert not (indices["train"] & indices["test"]) and not (indices["val"] & indices["test"])
    labels = np.array(splits["train"].dataset.targets)
    overall = np.bincount(labels, minlength=10) / len(labels)
    for name, idx in indices.items():
        share = np.bincount(labels[list(idx)], minlength=10) / len(idx)
        assert np.abs(share - overall).max() < 0.02, name


def test_image_folder_with_train_val_layout_and_clear_error_when_missing(tmp_path):
    write_image_folder(tmp_path / "train")
    write_image_folder(tmp_path / "val", per_class=2)
    datamodule = ImageClassificationDataModule(
        source="folder",
        root=str(tmp_path),
        img_size=16,
        in_chans=3,
        mean=[0.5] * 3,
        std=[0.5] * 3,
        transform=SMALL,
        batch_size=4,
    )
    datamodule.setup()
    assert datamodule.class_names == ["cat", "dog", "fox"]
    assert (
        len(datamodule.datasets["train"]) == 12 and len(datamodule.datasets["test"]) == 6
    )  # test falls back to val
    images, labels = next(iter(datamodule.val_dataloader()))
    assert images.shape == (4, 3, 16, 16) and labels.tolist() == [0, 0, 1, 1]
    single_tree, names = load_image_splits(
        "folder", root=str(tmp_path / "train"), val_fraction=0.25, test_fraction=0.25
    )
    assert [len(single_tree[s]) for s in ("train", "val", "test")] == [6, 3, 3] and names == [
        "cat",
        "dog",
        "fox",
    ]
    assert sorted(single_tree["val"].dataset.targets[i] for i in single_tree["val"].indices) == [0, 1, 2]
    with pytest.raises(FileNotFoundError, match="data.root"):
        load_image_splits("folder", root=str(tmp_path / "nowhere"))


def test_torchvision_mnist_and_cifar10_from_their_on_disk_layouts(tmp_path, monkeypatch):
    splits, names = load_image_splits("mnist", root=str(write_fake_mnist(tmp_path / "m")), val_fraction=0.25)
    assert [len(splits[s]) for s in ("train", "val", "test")] == [30, 10, 20] and len(names) == 10
    with pytest.raises(FileNotFoundError, match="download=true"):
        load_image_splits("cifar10", root=str(tmp_path / "empty"))
    monkeypatch.setattr(cifar, "check_integrity", lambda *args, **kwargs: True)  # fake files fail the md5s
    splits, names = load_image_splits(
        "cifar10", root=str(write_fake_cifar10(tmp_path / "c")), val_fraction=0.1
    )
    assert [len(splits[s]) for s in ("train", "val", "test")] == [90, 10, 20] and names[0] == "airplane"


def test_timm_recipe_builds_randaugment_and_random_erasing():
    train = build_transform(True, 224, 3, recipe="timm", auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25)
    steps = [type(t).__name__ for t in train.transforms[1].transforms]
    assert "RandAugment" in steps and "RandomErasing" in steps
    assert isinstance(
        next(t for t in train.transforms[1].transforms if type(t).__name__ == "RandAugment"), RandAugment
    )
    evaluation = build_transform(False, 224, 3, recipe="timm", crop_pct=0.875)
    assert evaluation(Image.new("RGB", (300, 400))).shape == (3, 224, 224)
    with pytest.raises(ValueError, match="one per channel"):
        build_transform(False, 8, 1, mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])


def test_pretrained_file_loads_local_weights_and_resizes_the_head(tmp_path):
    source = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=5)
    path = tmp_path / "weights.pth"
    torch.save(source.state_dict(), path)
    model = create_backbone(
        "vit_tiny_patch16_224",
        pretrained=True,
        pretrained_file=str(path),
        img_size=32,
        patch_size=8,
        depth=2,
        num_classes=3,
    )
    torch.testing.assert_close(model.blocks[0].attn.qkv.weight, source.blocks[0].attn.qkv.weight)
    assert model.head.out_features == 3
    with pytest.raises(FileNotFoundError, match="pretrained_file"):
        create_backbone(
            "vit_tiny_patch16_224", pretrained=True, pretrained_file=str(tmp_path / "missing.pth")
        )


def test_test_metrics_per_class_accuracy_and_confusion_matrix_image(tmp_path):
    task = _task()
    trainer = _fit(task, steps=2, default_root_dir=tmp_path, limit_test_batches=2)
    trainer.loggers = [L.pytorch.loggers.CSVLogger(tmp_path, name="csv", version="")]
    metrics = trainer.test(task, datamodule=trainer.datamodule, verbose=False)[0]
    assert 0 <= metrics["test/acc"] <= metrics["test/acc_top5"] <= 1
    table = list(csv.DictReader(open(tmp_path / "csv" / "test_acc_class.csv")))  # one row per class
    assert [row["class"] for row in table] == task.hparams.class_names
    assert metrics["test/acc_class_min"] == pytest.approx(
        min(float(row["accuracy"]) for row in table), abs=1e-4
    )
    assert list((tmp_path / "csv" / "images").glob("test_confusion_matrix_*.png"))


def test_fast_dev_run_vit(tmp_path):
    metrics = run_experiment(tmp_path, ["experiment=vit", "debug=fdr"])
    assert "test/acc" in metrics


def test_fast_dev_run_vit_cifar10(tmp_path, monkeypatch):
    monkeypatch.setattr(cifar, "check_integrity", lambda *args, **kwargs: True)
    root = write_fake_cifar10(tmp_path / "cifar")
    overrides = [
        f"data.root={root}",
        "data.download=false",
        "data.batch_size=4",
        "data.num_workers=0",
        "trainer.precision=32-true",
    ]
    assert "test/acc" in run_experiment(tmp_path, ["experiment=vit_cifar10", "debug=fdr", *overrides])


def test_fast_dev_run_deit_tiny_imagenet(tmp_path):
    write_image_folder(tmp_path / "imagenet" / "train", per_class=4)
    write_image_folder(tmp_path / "imagenet" / "val", per_class=2)
    overrides = [
        f"data.root={tmp_path / 'imagenet'}",
        "data.batch_size=4",
        "data.num_workers=0",
        "trainer.precision=32-true",
    ]
    assert "test/acc" in run_experiment(tmp_path, ["experiment=deit_tiny_imagenet", "debug=fdr", *overrides])
