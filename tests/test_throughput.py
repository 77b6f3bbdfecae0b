"""Throughput for every family: the FLOPs that MFU divides by agree with torch's own count of a forward and
backward, tokens/s counts real tokens only, and each family's tiny run logs its rates (and PPO its stages)."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from test_precision import FAMILIES
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from lit_transformers.callbacks import throughput
from lit_transformers.callbacks.throughput import count_batch, matmul_flops
from lit_transformers.data.instructions import collate
from lit_transformers.models import BERT, GPT, BERTConfig, GPTConfig
from lit_transformers.models.backbone import create_backbone, vit_flops_per_image
from lit_transformers.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from lit_transformers.text.batching import right_pad
from lit_transformers.train import train

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

LLAMA = dict(
    norm="rmsnorm",
    gated_mlp=True,
    activation="silu",
    n_kv_head=2,
    position="rope",
    tie_embeddings=False,
    bias=False,
)


def counted_flops(forward) -> int:
    """FLOPs of ``forward()`` and the backward of its sum, by torch.utils.flop_counter (what Lightning's
    measure_flops wraps). Attention through the math kernel: the fused CPU kernel is not counted by it."""
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        forward().float().sum().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
def test_gpt_flops_per_token_match_torch_flop_counter(layout):
    model = GPT(
        GPTConfig(
            vocab_size=500,
            block_size=64,
            n_layer=2,
            n_head=4,
            d_model=64,
            **(LLAMA if layout == "llama" else {}),
        )
    )
    ids = torch.randint(0, 500, (2, 48))
    counted = counted_flops(lambda: F.cross_entropy(model(ids).flatten(0, 1), ids.flatten()))
    # norms and biases are weights too but no matmul: the formula counts them, a few per mille of the whole
    assert model.flops_per_token(48) == pytest.approx(counted / ids.numel(), rel=0.03)


def test_bert_flops_per_token_match_torch_flop_counter():
    model = BERT(
        BERTConfig(vocab_size=500, n_layer=2, n_head=4, d_model=64, d_ff=256, pretraining_heads=False)
    )
    ids = torch.randint(0, 500, (3, 24))
    assert model.flops_per_token(24) == pytest.approx(
        counted_flops(lambda: model(ids)) / ids.numel(), rel=0.03
    )


def test_vit_flops_per_image_match_torch_flop_counter():
    model = create_backbone(
        "vit_tiny_patch16_224",
        img_size=8,
        patch_size=2,
        in_chans=1,
        embed_dim=64,
        depth=2,
        num_heads=4,
        num_classes=10,
    )
    images = torch.randn(3, 1, 8, 8)
    assert vit_flops_per_image(model) == pytest.approx(counted_flops(lambda: model(images)) / 3, rel=0.03)
    assert vit_flops_per_image(create_backbone("resnet18", num_classes=10)) is None  # not a ViT: no MFU


def test_translation_flops_per_token_match_torch_flop_counter():
    config = Seq2SeqConfig(
        vocab_size=500,
        n_encoder_layer=2,
        n_decoder_layer=1,
        n_head=4,
        d_model=64,
        d_ff=128,
        pad_id=0,
        bos_id=1,
    )
    model = Seq2SeqTransformer(config)
    src, tgt = torch.randint(3, 500, (2, 20)), torch.randint(3, 500, (2, 12))
    per_source, per_target = model.flops_per_token(20, 12)
    counted = counted_flops(lambda: model(src, tgt))
    assert per_source * src.numel() + per_target * tgt.numel() == pytest.approx(counted, rel=0.03)


# ---- real tokens ---------------------------------------------------------------------------------------

PAD = 0
LENGTHS = [3, 7, 5]  # three sequences, padded to 7


def _module(model=None):
    return SimpleNamespace(model=model, tokenizer=SimpleNamespace(pad_id=PAD))


def _sequences(lengths=LENGTHS) -> list[list[int]]:
    return [list(range(1, n + 1)) for n in lengths]


def test_counted_tokens_leave_padding_out():
    ids, valid = right_pad(_sequences(), PAD)
    bert = {"input_ids": ids, "attention_mask": valid, "token_type_ids": torch.zeros_like(ids)}
    assert count_batch(_module(), bert) == count_batch(_module(), {"input_ids": ids})  # mask or pad id alike
    no_padding = SimpleNamespace(model=None, tokenizer=None)  # a tokenizer-less module: every id is real
    assert count_batch(no_padding, {"input_ids": ids}).tokens == ids.numel()
    assert (count_batch(_module(), bert).samples, count_batch(_module(), bert).tokens) == (3, sum(LENGTHS))
    # SFT: prompt + completion, padded, the last column dropped (no target): the longest loses its last token
    items = [{"prompt": s[:2], "completion": s[2:]} for s in _sequences()]
    assert count_batch(_module(), collate(items, "sft", PAD)).tokens == 3 + 6 + 5
    # packed rows hold each sample but its last token, and count no padding
    assert count_batch(_module(), collate(items, "sft", PAD, packing=True, width=8)).tokens == 2 + 6 + 4
    pairs = [{"prompt": s[:1], "chosen": s[1:], "rejected": s[1:2]} for s in _sequences()]
    pair_count = count_batch(_module(), collate(pairs, "pairs", PAD))
    assert (pair_count.samples, pair_count.tokens) == (
        3,
        sum(LENGTHS) + 3 * 2,
    )  # rejected rows: 2 tokens each


def test_translation_counts_real_target_tokens_and_the_flops_of_real_tokens():
    src_ids, src_valid = right_pad(_sequences([4, 6, 2]), PAD)
    tgt_ids, tgt_valid = right_pad(_sequences(), PAD)
    model = Seq2SeqTransformer(
        Seq2SeqConfig(vocab_size=50, n_encoder_layer=1, n_decoder_layer=1, n_head=2, d_model=16, d_ff=32)
    )
    batch = {"src_ids": src_ids, "src_valid": src_valid, "tgt_ids": tgt_ids, "tgt_valid": tgt_valid}
    count = count_batch(_module(model), batch)
    per_source, per_target = model.flops_per_token(6, 7)
    assert (count.samples, count.tokens) == (3, sum(LENGTHS))
    assert count.flops == per_source * 12 + per_target * sum(LENGTHS)


def test_measuring_the_peak_leaves_the_random_stream_alone():
    """Measured at the first step with FLOPs (CPUs, unlisted GPUs): a draw from the run's stream there would
    change every later dropout mask, and a resumed run's against an uninterrupted one."""
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    assert matmul_flops(n=64) > 0
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize(("flop_rate", "expected_sizes"), [(1e11, [256, 512, 1024, 2048]), (1e9, [256, 512])])
def test_the_peak_is_measured_at_the_first_size_that_takes_long_enough(
    monkeypatch, flop_rate, expected_sizes
):
    """A dtype the CPU only emulates (float16: ~1 GFLOP/s here) stops growing at 512 instead of spending minutes
    on 2048^3 matmuls; a fast one is measured at the full 2048. The fake clock advances by each matmul's FLOPs
    over the device's rate, so the answer is that rate, measured at the size recorded."""
    sizes, now = [], [0.0]

    def fake_mm(a, b):
        sizes.append(a.size(0))
        now[0] += 2 * a.size(0) ** 3 / flop_rate
        return a

    monkeypatch.setattr(throughput.torch, "mm", fake_mm)
    monkeypatch.setattr(throughput.time, "perf_counter", lambda: now[0])
    assert matmul_flops() == pytest.approx(flop_rate)
    assert sizes == [size for size in expected_sizes for _ in range(4)]


# ---- every family's run -----------------------------------------------------------------------------------

RATES = {"train/samples_per_sec", "train/tokens_per_sec", "train/mfu"}
LOGGED = {  # the rates each family logs: tokens where it has them, MFU where its model counts its FLOPs
    "gpt_pretrain": RATES,
    "gpt_sft": RATES,
    "gpt_reward": RATES - {"train/mfu"},
    "gpt_dpo": RATES - {"train/mfu"},
    "gpt_ppo": {"train/samples_per_sec"},
    "bert_pretrain": RATES,
    "bert_classify": RATES,
    "bert_token_classify": RATES,
    "translation": RATES,
    "vit": {"train/samples_per_sec", "train/mfu"},
    "clip": {"train/samples_per_sec"},
}
STAGES = ["train/time/generation_s", "train/time/scoring_s", "train/time/update_s"]


@pytest.mark.parametrize("family", list(LOGGED))
def test_every_family_logs_its_throughput(compose_cfg, tmp_path, family):
    ppo = ["task.num_ppo_epochs=1"] if family == "gpt_ppo" else []  # max_steps counts its optimizer steps
    overrides = [*FAMILIES[family](tmp_path), *ppo, "trainer.max_steps=3", "test=false", "sample=null"]
    train(compose_cfg(*overrides, "callbacks.throughput.peak_flops=1e12", "trainer.gradient_clip_val=null"))
    rows = list(csv.DictReader(open(tmp_path / "csv" / "metrics.csv")))
    logged = {key for row in rows for key, value in row.items() if value and key.startswith("train/")}
    assert logged & RATES == LOGGED[family], sorted(logged)
    if family == "gpt_ppo":  # each iteration's stages took part of its time (the step also loads its batch)
        (row,) = [r for r in rows if r.get("train/samples_per_sec")][-1:]
        iteration = 4 / float(row["train/samples_per_sec"])  # data.batch_size=4 prompts
        stages = [float(row[key]) for key in STAGES]
        assert all(s > 0 for s in stages) and sum(stages) <= iteration, (stages, iteration)
