"""The CLIP tasks from published weights, on random ones (no download): task.init_from_open_clip /
task.init_from_hf load the checkpoint (and refuse a ResNet CLIP, or a run tokenizer that is not the CLIP's),
a converted CLIP fine-tunes on the digits, experiment=clip_zero_shot scores every image of an ImageFolder as
transformers does, and experiment=clip_linear_probe trains a head on a frozen CLIP's image features."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import lightning as L
import open_clip
import pytest
import safetensors.torch
import torch
from test_clip_pretrained import (
    ATOL,
    SMALL,
    _caption_ids,
    _clip_tokenizer_dir,
    _hf_clip,
    _images,
    _perturbed,
    _resnet_clip,
)
from torchvision import datasets, transforms

from lit_transformers.data.images import ImageClassificationDataModule
from lit_transformers.models import CLIP
from lit_transformers.tasks import ContrastiveTask
from lit_transformers.tasks.linear_probe import LinearProbeTask
from lit_transformers.tasks.specs import model_weights
from lit_transformers.tasks.zero_shot import ZeroShotTask
from lit_transformers.text import Tokenizer

from image_helpers import (
    FixedBatches,
    fixed_caption_batch,
    run_experiment,
    tiny_clip_task,
    write_image_folder,
)

transformers = pytest.importorskip("transformers")
# OpenAI CLIP's pixel statistics, as experiment=clip_zero_shot sets them
CLIP_NORMALIZE = transforms.Normalize(
    (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
)


def _open_clip_dir(tmp_path, model, config) -> str:
    """A directory as open_clip's Hub repositories hold a model: open_clip_config.json + safetensors."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": config}))
    safetensors.torch.save_file(model.state_dict(), tmp_path / "open_clip_model.safetensors")
    return str(tmp_path)


def test_init_from_open_clip_loads_the_weights_and_refuses_a_resnet_clip_with_the_reason(tmp_path):
    reference = _perturbed(lambda: open_clip.CLIP(**SMALL))
    task = ContrastiveTask(
        model={}, init_from_open_clip=_open_clip_dir(tmp_path / "vit", reference, SMALL), optimizer={}
    )
    task.configure_model()
    images, ids = _images(2, 32), _caption_ids(["a cat", "a dog"], 100, 16)
    with torch.no_grad():
        for got, want in zip(task.model.eval()(images, ids), reference(images, ids)):
            torch.testing.assert_close(got, want, **ATOL)
    assert task.hparams.init_from_open_clip is None and task.hparams.model["text_activation"] == "quick_gelu"
    resnet = _open_clip_dir(tmp_path / "rn50", *_resnet_clip())
    with pytest.raises(ValueError, match=r"image tower is a ResNet.*supported: open_clip's ViT CLIPs"):
        ContrastiveTask(model={}, init_from_open_clip=resnet, optimizer={})


def _hf_clip_dir(path, image_size: int, channels: int):
    """A random HF CLIP saved with the CLIP tokenizer above (2514 tokens, EOS last): a Hub directory."""
    hf_tokenizer = _clip_tokenizer_dir(path)
    text = {"vocab_size": 2514, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    text |= {"num_attention_heads": 2, "max_position_embeddings": 16, "eos_token_id": 2513}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    vision |= {"image_size": image_size, "patch_size": image_size // 4, "num_channels": channels}
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    hf = _perturbed(lambda: transformers.CLIPModel(config))
    hf.save_pretrained(path)
    return hf, hf_tokenizer


def test_a_converted_clip_fine_tunes_on_the_digits_with_its_hub_tokenizer(tmp_path):
    """task.init_from_hf + data.tokenizer_path: a random HF CLIP for 8x8 grayscale digits trains and evaluates
    zero-shot."""
    checkpoint = tmp_path / "clip"
    _hf_clip_dir(checkpoint, image_size=8, channels=1)
    overrides = [
        f"task.init_from_hf={checkpoint}",
        f"data.tokenizer_path={checkpoint}",
        "data.context_length=16",
    ]
    metrics = run_experiment(tmp_path / "run", ["experiment=clip", "debug=fdr", *overrides])
    assert {"test/zeroshot_top1", "test/i2t_recall@1"} <= set(metrics)


def test_init_from_hf_refuses_a_run_tokenizer_that_is_not_the_clips(tmp_path):
    _hf_clip().save_pretrained(tmp_path)  # EOS id 99 of 100 tokens
    task = ContrastiveTask(model={}, init_from_hf=str(tmp_path), optimizer={})
    task.data = SimpleNamespace(tokenizer=Tokenizer.train(["a photo of a cat", "a dog"], vocab_size=300))
    with pytest.raises(ValueError, match=r"EOS id 99 over 100 tokens.*set data\.tokenizer_path"):
        task.configure_model()


def test_zero_shot_logits_are_transformers_clip_logits_over_the_class_prompts(tmp_path):
    hf, hf_tokenizer = _hf_clip_dir(tmp_path, image_size=16, channels=3)
    names = ["cat", "dog", "fox"]
    task = ZeroShotTask(
        templates=["a photo of a {}."], tokenizer_path=str(tmp_path), init_from_hf=str(tmp_path), optimizer={}
    )
    task.data = SimpleNamespace(class_names=names)
    task.configure_model()
    prompts = hf_tokenizer([f"a photo of a {name}." for name in names], padding="max_length", max_length=16)
    images = _images(5, 16)
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor(prompts["input_ids"]), pixel_values=images).logits_per_image
        torch.testing.assert_close(task.model(images), expected, **ATOL)


def _hf_zero_shot_accuracy(hf, hf_tokenizer, folder, template: str) -> float:
    """transformers' CLIP classifying every image of ``folder`` (CLIP's normalisation, no resize: the images
    have the model's size) by the prompt of each class folder's name."""
    images = datasets.ImageFolder(
        folder, transform=transforms.Compose([transforms.ToTensor(), CLIP_NORMALIZE])
    )
    pixels, labels = (torch.stack(part) for part in zip(*[(x, torch.tensor(y)) for x, y in images]))
    prompts = hf_tokenizer(
        [template.format(name) for name in images.classes], padding="max_length", max_length=16
    )
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor(prompts["input_ids"]), pixel_values=pixels).logits_per_image
    return (logits.argmax(1) == labels).float().mean().item()


def test_clip_zero_shot_experiment_scores_every_image_of_a_folder_as_transformers_does(tmp_path, caplog):
    hf, hf_tokenizer = _hf_clip_dir(tmp_path / "clip", image_size=16, channels=3)
    folder = write_image_folder(tmp_path / "images", per_class=10, size=16)
    overrides = [f"task.{key}={tmp_path / 'clip'}" for key in ("init_from_hf", "tokenizer_path")]
    overrides += [f"data.root={folder}", "data.img_size=16", "data.num_workers=0", "trainer.accelerator=cpu"]
    overrides += ["task.templates=['a photo of a {}.']"]
    with caplog.at_level(logging.INFO):
        metrics = run_experiment(tmp_path / "run", ["experiment=clip_zero_shot", *overrides])
    assert {"test/acc", "test/acc_top3", "test/acc_class_min"} <= set(metrics)
    assert "cat" in (tmp_path / "run" / "csv" / "test_acc_class.csv").read_text()  # the per-class table
    assert f"the test split is every image of {folder} (30)" in caplog.text
    assert metrics["test/acc"] == pytest.approx(
        _hf_zero_shot_accuracy(hf, hf_tokenizer, folder, "a photo of a {}.")
    )
    # nothing trained: the pretrained weights are what is tested, which is no cause for a warning
    assert "No checkpoint to test" not in caplog.text
    assert "testing the weights that task.init_from_hf loaded" in caplog.text


def test_a_folder_scored_whole_leaves_nothing_to_train_on_and_says_so(tmp_path):
    folder = write_image_folder(tmp_path, per_class=3)
    rgb = {"img_size": 16, "in_chans": 3, "mean": [0.5] * 3, "std": [0.5] * 3}
    data = ImageClassificationDataModule("folder", str(folder), val_fraction=0.0, test_fraction=1.0, **rgb)
    data.setup()
    assert len(data.datasets["test"]) == 9
    with pytest.raises(ValueError, match=r"train split is empty: data\.test_fraction=1\.0 puts every image"):
        data.train_dataloader()


def test_a_linear_probe_reads_clips_image_features_through_a_frozen_tower(tmp_path):
    hf, _ = _hf_clip_dir(tmp_path, image_size=16, channels=3)
    task = LinearProbeTask(init_from_hf=str(tmp_path), optimizer={})
    task.data = SimpleNamespace(class_names=["cat", "dog", "fox"])
    task.configure_model()
    images = _images(5, 16)
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor([[0, 2513]]), pixel_values=images).image_embeds  # L2-normalised
    torch.testing.assert_close(task.model.encode_image(images), expected, **ATOL)
    logits = task(images)
    torch.testing.assert_close(logits, task.head(expected), **ATOL)
    logits.sum().backward()
    assert all(p.grad is not None for p in task.head.parameters())
    assert not any(p.requires_grad or p.grad is not None for p in task.model.parameters())
    # applied once: the task's checkpoints rebuild the CLIP from the recorded architecture
    assert task.hparams.init_from_hf is None and task.hparams.model["vocab_size"] == 2514


def _contrastive_checkpoint(path) -> str:
    """A checkpoint of ours after one contrastive step (experiment=clip's task on 8x8 grayscale images)."""
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(tiny_clip_task(), datamodule=FixedBatches(fixed_caption_batch(4)))
    trainer.save_checkpoint(path)
    return str(path)


@pytest.mark.parametrize("source", ["init_from_hf", "init_from"])
def test_clip_linear_probe_experiment_trains_only_the_head_on_the_digits(tmp_path, source):
    """From a converted random HF CLIP (task.init_from_hf) or a CLIP checkpoint of ours (init_from)."""
    if source == "init_from_hf":
        _hf_clip_dir(tmp_path / "clip", image_size=8, channels=1)
        original = CLIP.from_hf(tmp_path / "clip").state_dict()
        overrides = [f"task.init_from_hf={tmp_path / 'clip'}"]
    else:
        checkpoint = _contrastive_checkpoint(tmp_path / "clip.ckpt")
        original = model_weights(torch.load(checkpoint, weights_only=True))
        overrides = [f"init_from={checkpoint}"]
    overrides += ["data=digits", "data.img_size=8", "data.in_chans=1", "data.mean=[0.3]", "data.std=[0.38]"]
    overrides += ["data.num_workers=0", "trainer.accelerator=cpu", "trainer.max_steps=4"]
    overrides += [
        "trainer.val_check_interval=2",
        "task.scheduler.warmup_steps=2",
        "callbacks.model_checkpoint.save_top_k=-1",
    ]
    metrics = run_experiment(tmp_path / "run", ["experiment=clip_linear_probe", *overrides])
    assert {"val/acc", "test/acc", "test/acc_top5", "test/acc_class_min"} <= set(metrics)
    assert "zero" in (tmp_path / "run" / "csv" / "test_acc_class.csv").read_text()  # the per-class table
    heads = []
    for name in ("step_000002.ckpt", "last.ckpt"):  # after 2 and 4 steps
        state = torch.load(tmp_path / "run" / "checkpoints" / name, weights_only=True)
        # the optimizer holds the head's weight and bias, nothing of the tower
        assert sum(len(group["params"]) for group in state["optimizer_states"][0]["param_groups"]) == 2
        weights = state["state_dict"]
        tower = {k.removeprefix("model."): v for k, v in weights.items() if k.startswith("model.")}
        assert tower.keys() == original.keys() and all(torch.equal(tower[k], original[k]) for k in original)
        heads.append(weights["head.weight"])
    assert heads[0].shape == (10, 16) and not torch.equal(*heads)  # the head trained


def test_a_linear_probe_without_a_pretrained_clip_or_with_layer_decay_is_refused_naming_the_keys(tmp_path):
    task = LinearProbeTask(model={"_target_": "lit_transformers.models.clip.CLIPConfig"}, optimizer={})
    task.data = SimpleNamespace(class_names=["cat", "dog"])
    with pytest.raises(ValueError, match=r"set task\.init_from_hf=.*init_from=<a CLIP \.ckpt of ours>"):
        task.configure_model()
    with pytest.raises(ValueError, match=r"task\.layer_decay=null"):
        LinearProbeTask(init_from_hf=str(tmp_path), layer_decay=0.65, optimizer={})
    gpt = {
        "state_dict": {"model.w": torch.zeros(1)},
        "hyper_parameters": {"model": {"_target_": "GPTConfig"}},
    }
    torch.save(gpt, tmp_path / "gpt.ckpt")
    with pytest.raises(
        ValueError, match=r"holds no CLIP \(its model is GPTConfig\); pass a checkpoint of experiment=clip"
    ):
        LinearProbeTask(init_from=str(tmp_path / "gpt.ckpt"), optimizer={})
