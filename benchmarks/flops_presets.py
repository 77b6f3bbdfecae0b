"""The training FLOPs that ``train/mfu`` divides by, at every model preset's real size, against Lightning's
``measure_flops`` (``torch.utils.flop_counter`` over a forward and backward; attention through the math kernel,
the one it counts). The models are built on the meta device: nothing is allocated or computed, so GPT-2 small
and BERT-base count in seconds on a laptop. tests/test_throughput.py checks the same at tiny sizes.

    python benchmarks/flops_presets.py
    python benchmarks/flops_presets.py --presets llama_nano gpt2_small --seq-len 512

Prints, per preset: the formula's FLOPs per token (per image for ViTs; per target token for translation,
sources as long as targets, their FLOPs included), the count's, and their ratio.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_module
from lightning.fabric.utilities.throughput import measure_flops
from torch.nn.attention import SDPBackend, sdpa_kernel

from lit_transformers.models import BERT, GPT, GPTConfig
from lit_transformers.models.backbone import create_backbone, vit_flops_per_image
from lit_transformers.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from lit_transformers.tasks.specs import build_config

VOCAB = 32000
PRESETS = {  # name: train.yaml overrides that select it (its data group resolves its interpolations)
    "gpt_nano": ["model=gpt_nano"],
    "llama_nano": ["model=llama_nano"],
    "qwen2_nano": ["model=qwen2_nano"],
    "gpt2_small": ["model=gpt2_small"],
    "bert_mini": ["experiment=bert_pretrain", "model=bert_mini"],
    "bert_base": ["experiment=bert_pretrain", "model=bert_base"],
    "transformer_tiny": ["experiment=translation", "model=transformer_tiny"],
    "transformer_base": ["experiment=translation", "model=transformer_base"],
    "vit_digits": ["experiment=vit"],
    "deit_tiny": ["experiment=deit_tiny_imagenet"],
}


def model_spec(overrides: list[str]) -> dict:
    with initialize_config_module("lit_transformers.conf", version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    return {
        "model": dict(cfg.model),
        "img_size": cfg.data.get("img_size"),
        "in_chans": cfg.data.get("in_chans"),
    }


def formula_and_count(spec: dict, seq_len: int) -> tuple[str, float, float]:
    """(unit, formula FLOPs per unit, counted FLOPs per unit) of one forward + backward on the meta device."""
    model_cfg = spec["model"]
    with torch.device("meta"):
        if "backbone" in model_cfg:
            backbone = {k: v for k, v in dict(model_cfg["backbone"]).items() if k != "pretrained_file"}
            model = create_backbone(**{**backbone, "pretrained": False}, num_classes=10)
            images = torch.randn(2, model.patch_embed.proj.in_channels, *model.patch_embed.img_size)
            return "image", vit_flops_per_image(model), count(model, lambda: model(images)) / 2
        config = build_config(model_cfg, vocab_size=VOCAB)
        ids = torch.randint(0, VOCAB, (2, seq_len))
        if isinstance(config, Seq2SeqConfig):  # translation: sources as long as targets
            model = Seq2SeqTransformer(config)
            per_source, per_target = model.flops_per_token(seq_len, seq_len)
            return (
                "target token",
                per_source + per_target,
                count(model, lambda: model(ids, ids)) / ids.numel(),
            )
        if isinstance(config, GPTConfig):
            model = GPT(config)
            loss = lambda: F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())  # noqa: E731
            return "token", model.flops_per_token(seq_len), count(model, loss) / ids.numel()
        model = BERT(config)  # the encoder body, as the formula
        return "token", model.flops_per_token(seq_len), count(model, lambda: model(ids)) / ids.numel()


def count(model, forward) -> int:
    with sdpa_kernel(SDPBackend.MATH):
        return measure_flops(model, forward, loss_fn=lambda out: out.float().sum())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    parser.add_argument("--seq-len", type=int, default=128, help="text length (GPT, BERT, translation)")
    args = parser.parse_args()
    print(f"{'preset':<18}{'per':<14}{'formula':>14}{'counted':>14}{'ratio':>8}")
    for name in args.presets:
        unit, formula, counted = formula_and_count(model_spec(PRESETS[name]), args.seq_len)
        print(f"{name:<18}{unit:<14}{formula:>14.4g}{counted:>14.4g}{formula / counted:>8.3f}")


if __name__ == "__main__":
    main()
