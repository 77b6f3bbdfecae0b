"""CLIP from published weights, on random ones (no download): open_clip's ViT CLIPs and transformers'
CLIPModel give the same image features, text features, logits and zero-shot predictions after conversion;
to_hf loads back in transformers; CLIP's Hub tokenizer gives transformers' ids; what our CLIP cannot compute
is refused by name. And a timm ViT from a local checkpoint file, through the config keys."""

from __future__ import annotations

import gzip

import open_clip
import pytest
import safetensors.torch
import timm
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from open_clip.zero_shot_classifier import build_zero_shot_classifier

from lit_transformers.models import CLIP, CLIPConfig, create_backbone
from lit_transformers.models.clip import clip_vit
from lit_transformers.tasks.evaluation import zero_shot_classifier
from lit_transformers.text import Tokenizer, eos_terminated

transformers = pytest.importorskip("transformers")

ATOL = dict(atol=1e-4, rtol=0)  # fp32
# a small open_clip CLIP in the OpenAI layout (QuickGELU, as OpenAI's weights use): 2-block towers
SMALL = {
    "embed_dim": 32,
    "quick_gelu": True,
    "vision_cfg": {
        "image_size": 32,
        "layers": 2,
        "width": 64,
        "patch_size": 8,
        "head_width": 16,
        "mlp_ratio": 2.0,
    },
    "text_cfg": {"context_length": 16, "vocab_size": 100, "width": 48, "heads": 4, "layers": 2},
}
NAMES, TEMPLATES = ["cat", "dog", "fox", "owl"], ["a photo of a {}", "a drawing of the {}"]


def _perturbed(build) -> torch.nn.Module:
    """``build()`` seeded, in eval mode, with every tensor moved off its initialisation (LayerNorms are ones
    and zeros there, so a swapped weight and bias would go unseen)."""
    torch.manual_seed(0)
    model = build()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model.eval()


def _caption_ids(texts: list[str], vocab: int, context: int) -> torch.Tensor:
    """A stand-in tokenizer: each character's id below the EOS, then EOS (the largest id), then padding 0."""
    rows = [[ord(ch) % (vocab - 2) + 1 for ch in text][: context - 1] + [vocab - 1] for text in texts]
    return torch.tensor([row + [0] * (context - len(row)) for row in rows])


def _images(n: int, size: int) -> torch.Tensor:
    """Noise around a colour of each image's own, so that a random CLIP's image features differ."""
    g = torch.Generator().manual_seed(1)
    return 2 * torch.randn(n, 3, 1, 1, generator=g) + 0.5 * torch.randn(n, 3, size, size, generator=g)


def _ours(model: CLIP, images, ids) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    image, text = model(images, ids)
    return image, text, model.logit_scale.exp() * image @ text.T


@torch.no_grad()
def _assert_open_clip_parity(reference, config, n_images: int, captions: list[str]) -> CLIP:
    ours = CLIP.from_open_clip(reference, config).eval()
    config = open_clip.get_model_config(config) if isinstance(config, str) else config
    vision, text = config["vision_cfg"], config["text_cfg"]
    images, ids = (
        _images(n_images, vision["image_size"]),
        _caption_ids(captions, text["vocab_size"], text["context_length"]),
    )
    image, text_features, scale = reference(images, ids)
    expected = (image, text_features, scale * image @ text_features.T)
    for got, want in zip(_ours(ours, images, ids), expected):
        torch.testing.assert_close(got, want, **ATOL)
    return ours


def test_open_clip_small_clip_features_logits_and_zero_shot_predictions_match():
    reference = _perturbed(lambda: open_clip.CLIP(**SMALL))
    ours = _assert_open_clip_parity(reference, SMALL, 4, ["a cat", "two dogs in the snow"])
    text = SMALL["text_cfg"]
    tokenize = lambda texts: _caption_ids(texts, text["vocab_size"], text["context_length"])  # noqa: E731
    with torch.no_grad():
        images = _images(24, SMALL["vision_cfg"]["image_size"])
        classifier = build_zero_shot_classifier(reference, tokenize, NAMES, TEMPLATES, use_tqdm=False)
        expected = (reference.encode_image(images, normalize=True) @ classifier).argmax(dim=1)
        weights = zero_shot_classifier(lambda t: ours.encode_text(tokenize(t)), NAMES, TEMPLATES)
        predicted = (ours.encode_image(images) @ weights).argmax(dim=1)
    torch.testing.assert_close(weights, classifier, **ATOL)
    assert predicted.tolist() == expected.tolist() and len(set(expected.tolist())) > 1


def test_an_open_clip_model_objects_quick_gelu_wins_over_its_name():
    """create_model("ViT-B-32", pretrained="openai") computes QuickGELU though the config of "ViT-B-32" does not
    say so: the converted model follows the object."""
    reference = _perturbed(lambda: open_clip.CLIP(**SMALL))  # quick_gelu: true
    _assert_open_clip_parity(reference, {**SMALL, "quick_gelu": False}, 2, ["a cat", "a dog"])


def test_open_clip_vit_b32_features_and_logits_match():
    reference = open_clip.create_model("ViT-B-32", pretrained=None).eval()  # 150M: the small CLIP perturbs
    ours = _assert_open_clip_parity(reference, "ViT-B-32", 2, ["a photo of a cat", "a diagram"])
    assert ours.config.image["name"] == "vit_base_patch32_clip_224"  # timm's preset of this tower


def _hf_clip(eos_token_id: int = 99):
    """A random transformers CLIPModel with 2-block towers, in fp32."""
    text = {
        "vocab_size": 100,
        "hidden_size": 48,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 16,
        "bos_token_id": 98,
        "pad_token_id": 0,
        "eos_token_id": eos_token_id,
    }
    vision = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "image_size": 32,
        "patch_size": 8,
    }
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=32)
    return _perturbed(lambda: transformers.CLIPModel(config))


@torch.no_grad()
def _assert_hf_parity(ours: CLIP, hf, images, ids) -> None:
    out = hf(input_ids=ids, pixel_values=images)
    for got, want in zip(_ours(ours, images, ids), (out.image_embeds, out.text_embeds, out.logits_per_image)):
        torch.testing.assert_close(got, want, **ATOL)


# eos_token_id 2: the value of configs written before transformers fixed it (OpenAI's); HF then pools at the
# largest id, which tokenized captions hold at their EOS
@pytest.mark.parametrize("eos_token_id", [99, 2])
def test_hf_clip_features_logits_and_zero_shot_predictions_match(eos_token_id):
    hf = _hf_clip(eos_token_id)
    ours = CLIP.from_hf(hf).eval()
    _assert_hf_parity(ours, hf, _images(4, 32), _caption_ids(["a cat", "a dog on a sofa"], 100, 16))
    images, prompts = _images(24, 32), _caption_ids([f"a photo of a {name}" for name in NAMES], 100, 16)
    with torch.no_grad():
        expected = hf(input_ids=prompts, pixel_values=images).logits_per_image.argmax(dim=1)
        image, text, _ = _ours(ours, images, prompts)
    assert (image @ text.T).argmax(dim=1).tolist() == expected.tolist()


def test_to_hf_round_trip_loads_in_transformers(tmp_path):
    hf = _hf_clip()
    ours = CLIP.from_hf(hf).eval()
    ours.to_hf(tmp_path)
    reloaded = transformers.CLIPModel.from_pretrained(tmp_path).eval()
    images, ids = _images(3, 32), _caption_ids(["a cat", "an owl", "a red fox at night"], 100, 16)
    _assert_hf_parity(ours, reloaded, images, ids)
    _assert_hf_parity(CLIP.from_hf(tmp_path).eval(), hf, images, ids)


def _clip_tokenizer_dir(tmp_path, n_merges: int = 2000):
    """A Hub directory that transformers writes for a CLIP tokenizer: OpenAI's byte alphabet, its first
    ``n_merges`` BPE merges (open_clip ships the file) and the two special tokens, in CLIP's vocabulary order."""
    from open_clip.tokenizer import bytes_to_unicode, default_bpe

    lines = gzip.open(default_bpe()).read().decode("utf-8").split("\n")[1 : n_merges + 1]
    merges = [tuple(line.split()) for line in lines]
    alphabet = list(bytes_to_unicode().values())
    tokens = [*alphabet, *(a + "</w>" for a in alphabet), *("".join(m) for m in merges)]
    vocab = {token: i for i, token in enumerate([*tokens, "<|startoftext|>", "<|endoftext|>"])}
    hf = transformers.CLIPTokenizerFast(vocab=vocab, merges=merges)
    hf.save_pretrained(tmp_path)
    return transformers.CLIPTokenizerFast.from_pretrained(tmp_path)


def test_clip_hub_tokenizer_ids_equal_transformers_clip_tokenizer(tmp_path):
    hf = _clip_tokenizer_dir(tmp_path)
    ours = Tokenizer.from_file(tmp_path)
    captions = [
        "a photo of a CAT.",
        "Two dogs   playing in the snow!",
        "an illustration of the number 7, handwritten",
        "a very long caption " * 30,  # cut to 77 tokens, still ending in <|endoftext|>
    ]
    expected = hf(captions, padding="max_length", max_length=77, truncation=True)["input_ids"]
    ours.save_pretrained(tmp_path / "export")
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "export")
    assert exported(captions, padding="max_length", max_length=77, truncation=True)["input_ids"] == expected
    reloaded = (Tokenizer.from_state(ours.state()), Tokenizer.from_file(tmp_path / "export"))
    for tokenizer in (ours, *reloaded):  # as checkpoints store it, as save_pretrained writes it
        ids = eos_terminated(tokenizer.encode_batch(captions), tokenizer.eos_id, tokenizer.pad_id, 77)
        assert ids.tolist() == expected


def _resnet_clip():
    """open_clip's RN50 config at a tiny width: a ModifiedResNet image tower."""
    config = open_clip.get_model_config("RN50")
    config = {**config, "embed_dim": 32, "vision_cfg": {**config["vision_cfg"], "width": 8, "image_size": 32}}
    config["text_cfg"] = SMALL["text_cfg"]
    return open_clip.CLIP(**config), config


def test_a_resnet_clip_is_refused_naming_what_is_supported():
    model, config = _resnet_clip()
    for name in (config, "RN50"):
        with pytest.raises(ValueError, match=r"ResNet.*supported: open_clip's ViT CLIPs"):
            CLIP.from_open_clip(model, name)


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda c: c["text_cfg"].update(no_causal_mask=True), "text_cfg.no_causal_mask=True"),
        (lambda c: c["vision_cfg"].update(ls_init_value=1e-5), "vision_cfg.ls_init_value=1e-05"),
        (lambda c: c.update(custom_text=True), "custom_text"),
    ],
)
def test_an_open_clip_option_our_clip_cannot_compute_is_refused_by_name(edit, named):
    config = {**SMALL, "vision_cfg": dict(SMALL["vision_cfg"]), "text_cfg": dict(SMALL["text_cfg"])}
    edit(config)
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        CLIP.from_open_clip({}, config)


def test_a_siglip_logit_bias_is_refused_unless_zero():
    state = _perturbed(lambda: open_clip.CLIP(**SMALL)).state_dict()
    with pytest.raises(ValueError, match="logit_bias"):
        CLIP.from_open_clip({**state, "logit_bias": torch.tensor([-10.0])}, SMALL)
    CLIP.from_open_clip({**state, "logit_bias": torch.zeros(1)}, SMALL)  # adds nothing to the logits


def _vit_backbone(tmp_path, *overrides: str) -> dict:
    """experiment=vit's model.backbone (the digits ViT), composed as train.py does, resolved."""
    with initialize_config_module("lit_transformers.conf", version_base="1.3"):
        cfg = compose("train", overrides=["experiment=vit", f"paths.output_dir={tmp_path}", *overrides])
    return OmegaConf.to_container(cfg.model.backbone, resolve=True)


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_a_timm_checkpoint_file_loads_offline_through_the_config_keys(tmp_path, suffix, monkeypatch, caplog):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    backbone = _vit_backbone(tmp_path)
    sizes = {k: v for k, v in backbone.items() if v is not None and k not in ("name", "pretrained")}
    reference = _perturbed(lambda: timm.create_model(backbone["name"], num_classes=10, **sizes))
    path = tmp_path / f"vit{suffix}"
    if suffix == ".safetensors":
        safetensors.torch.save_file(reference.state_dict(), path)
    else:
        torch.save({"state_dict": reference.state_dict()}, path)  # a training checkpoint's layout
    keys = ["model.backbone.pretrained=true", f"model.backbone.pretrained_file={path}"]
    images = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        loaded = create_backbone(**_vit_backbone(tmp_path, *keys), num_classes=10).eval()
        torch.testing.assert_close(loaded(images), reference(images), atol=0, rtol=0)
        new_head = create_backbone(**_vit_backbone(tmp_path, *keys), num_classes=3).eval()
        torch.testing.assert_close(
            new_head.forward_head(new_head.forward_features(images), pre_logits=True),
            reference.forward_head(reference.forward_features(images), pre_logits=True),
        )
    assert new_head.head.weight.shape[0] == 3
    assert "10-class classifier; the model's 3-class head is new" in caplog.text


@pytest.mark.parametrize(
    ("eos_id", "image", "named"),
    [
        (
            3,
            {"name": "vit_tiny_patch16_224", "img_size": 8, "patch_size": 4, "in_chans": 1},
            "CLIP-architecture",
        ),
        (2, clip_vit(8, 4, 32, 1, 2, 64, quick_gelu=True, in_chans=1), "eos_token_id is 2"),
    ],
)
def test_to_hf_refuses_what_hf_clip_cannot_compute(eos_id, image, named):
    """Our digits CLIP's timm ViT (post-norm embedding, LayerNorm eps 1e-6) and an EOS id of 2 (at which HF
    pools text at the largest id instead) do not export."""
    model = CLIP(
        CLIPConfig(image=image, embed_dim=16, vocab_size=64, eos_id=eos_id, context_length=8, text_width=32)
    )
    with pytest.raises(ValueError, match=named):
        model.to_hf()
