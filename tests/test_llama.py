"""The Llama / Qwen2 / Mistral layouts of our GPT against transformers' own classes, on random tiny models that
transformers builds and writes with ``save_pretrained``: logits, greedy and sampled generation, export, sharded
and bf16 files, the n_kv_head KV cache, and the refusals of what ours cannot represent."""

import dataclasses
import json
import pickle

import pytest
import torch

from lit_transformers.models import GPT, GPTConfig
from lit_transformers.models.hf_llama import rope_from_hf
from lit_transformers.nn import generate
from lit_transformers.nn.positions import rope_inv_freq
from lit_transformers.text import Tokenizer, left_pad
from lit_transformers.train import train

from conftest import TINY_LM

transformers = pytest.importorskip("transformers")
V, PAD = 61, 0
SMALL = {
    "vocab_size": V,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # grouped-query: fewer key/value heads than heads
    "max_position_embeddings": 64,
}
FULL, SLIDING = "full_attention", "sliding_attention"
LINEAR = {"rope_type": "linear", "factor": 2.0}
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
QWEN2_WINDOW = {"use_sliding_window": True, "sliding_window": 6}
VARIANTS = {  # name: (model_type, config overrides, sequence length)
    "llama_gqa_untied_theta": ("llama", {"rope_theta": 500000.0}, 20),
    "llama_mqa_tied": ("llama", {"num_key_value_heads": 1, "tie_word_embeddings": True}, 20),
    "llama_attention_and_mlp_biases": ("llama", {"attention_bias": True, "mlp_bias": True}, 20),
    "qwen2_qkv_bias_tied": ("qwen2", {"tie_word_embeddings": True, "rope_theta": 1e6}, 20),
    "mistral_sliding_window": ("mistral", {"sliding_window": 6}, 20),  # longer than the window
    # Qwen2 windows the layers from max_window_layers on: here the second and third of three
    "qwen2_window_upper_layers": (
        "qwen2",
        {"num_hidden_layers": 3, **QWEN2_WINDOW, "max_window_layers": 1},
        20,
    ),
    # heads wider and narrower than hidden_size / num_attention_heads = 8 (Qwen3's and some Mistrals' layout)
    "llama_head_dim_wider": ("llama", {"head_dim": 16}, 20),
    "qwen2_head_dim_narrower": ("qwen2", {"head_dim": 4, "num_key_value_heads": 1}, 20),
    "rope_linear": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, 20),
    # dynamic NTK changes the frequencies only past max_position_embeddings
    "rope_dynamic": (
        "llama",
        {"max_position_embeddings": 16, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
        30,
    ),
    # original length 16 puts one of the head's four frequencies in llama3's blended band, the others slowed
    "rope_llama3": ("llama", {"rope_scaling": {**LLAMA3, "original_max_position_embeddings": 16}}, 40),
}


def _hf(model_type: str, seed: int = 0, **overrides):
    """A random tiny transformers causal LM; every weight is moved off its init (biases start at 0, norms at
    1), so a bias or norm weight read wrongly shows in the logits."""
    config = transformers.AutoConfig.for_model(model_type, **SMALL | overrides)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.3)
    return model


def _saved(path, model, **kwargs):
    model.save_pretrained(path, **kwargs)
    return path


def _ids(length: int, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids):
    with torch.no_grad():
        out = model(ids)
    return out if isinstance(out, torch.Tensor) else out.logits


@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_match_transformers_from_a_saved_directory(tmp_path, variant):
    model_type, overrides, length = VARIANTS[variant]
    hf = _hf(model_type, **overrides)
    ours = GPT.from_hf(_saved(tmp_path, hf)).eval()
    ids = _ids(length)
    assert ours.config.n_kv_head == hf.config.num_key_value_heads
    assert ours.config.head_size == hf.model.layers[0].self_attn.head_dim  # head_dim variants: not 8
    expected = _logits(hf, ids)
    torch.testing.assert_close(_logits(ours, ids), expected, atol=1e-4, rtol=0)
    # the RoPE base, scaling and window must matter at this length, or the parity could not see one dropped
    plain = dataclasses.replace(
        ours.config, rope_theta=10000.0, rope_scaling=None, sliding_window=None, layer_types=None
    )
    if plain != ours.config:
        without = GPT(plain).eval()
        without.load_state_dict(ours.state_dict())
        assert (_logits(without, ids) - expected).abs().max() > 1e-3


@pytest.mark.parametrize("variant", ["llama_gqa_untied_theta", "qwen2_qkv_bias_tied"])
def test_fused_lm_head_loss_equals_transformers_loss(variant):
    model_type, overrides, length = VARIANTS[variant]
    hf = _hf(model_type, **overrides)
    ours = GPT.from_hf(hf).eval()
    ids = _ids(length + 1)
    inputs, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    total, count = ours(inputs, labels=targets)
    expected = hf(input_ids=inputs, labels=targets, shift_labels=targets).loss
    torch.testing.assert_close(total / count, expected, atol=1e-5, rtol=0)


GENERATING = [
    "llama_gqa_untied_theta",
    "qwen2_qkv_bias_tied",
    "mistral_sliding_window",
    "qwen2_window_upper_layers",
    "rope_dynamic",
    "llama_head_dim_wider",
]


def _prompts():
    g = torch.Generator().manual_seed(4)
    return [torch.randint(1, V, (n,), generator=g).tolist() for n in (9, 3, 6)]


@pytest.mark.parametrize("variant", GENERATING)
def test_greedy_and_seeded_sampled_generation_equal_transformers_generate(variant):
    model_type, overrides, _ = VARIANTS[variant]
    hf = _hf(model_type, **overrides)
    ours = GPT.from_hf(hf).eval()
    ids, valid = left_pad(_prompts(), PAD)
    hf_args = {
        "attention_mask": valid.long(),
        "max_new_tokens": 12,
        "pad_token_id": PAD,
        "eos_token_id": None,
    }
    expected = hf.generate(ids, do_sample=False, **hf_args)
    # dynamic RoPE frequencies change as the sequence grows past the original length: cached keys keep the
    # ones they were rotated with (HF's cache, and ours), a forward without a cache re-rotates them all
    for use_cache in (True,) if variant == "rope_dynamic" else (True, False):
        got = generate(ours, ids, valid, max_new_tokens=12, temperature=0, use_cache=use_cache)
        assert torch.equal(got, expected), use_cache
    # sampling: both draw with torch.multinomial from the global generator, one draw per step, after
    # temperature, top-k and top-p in that order
    settings = {"temperature": 0.8, "top_k": 20, "top_p": 0.9}
    torch.manual_seed(11)
    expected = hf.generate(ids, do_sample=True, **hf_args, **settings)
    torch.manual_seed(11)
    got = generate(ours, ids, valid, max_new_tokens=12, **settings)
    assert torch.equal(got, expected)
    assert not torch.equal(got, generate(ours, ids, valid, max_new_tokens=12, temperature=0))  # it sampled


def test_kv_cache_holds_n_kv_head_heads():
    config = GPTConfig(vocab_size=V, block_size=32, n_layer=2, n_head=8, d_model=64, position="rope")
    full = GPT(config).new_caches(3, 20)
    grouped = GPT(GPTConfig(**{**config.__dict__, "n_kv_head": 2})).new_caches(3, 20)
    assert full[0].self_attn.k.shape == (3, 8, 20, 8) and grouped[0].self_attn.k.shape == (3, 2, 20, 8)

    def cache_bytes(caches):
        return sum(t.numel() * t.element_size() for c in caches for t in (c.self_attn.k, c.self_attn.v))

    assert cache_bytes(full) == 4 * cache_bytes(grouped)


@pytest.mark.parametrize(
    "overrides,architecture",
    [
        ({"n_kv_head": 2, "tie_embeddings": False}, "LlamaForCausalLM"),
        ({"n_kv_head": 1, "qkv_bias": True, "tie_embeddings": True}, "Qwen2ForCausalLM"),
        ({"bias": True}, "LlamaForCausalLM"),
        ({"n_kv_head": 2, "sliding_window": 5, "rope_scaling": LINEAR}, "MistralForCausalLM"),
        ({"rope_scaling": DYNAMIC}, "LlamaForCausalLM"),
        ({"head_dim": 12, "n_kv_head": 2}, "LlamaForCausalLM"),
        ({"head_dim": 4, "qkv_bias": True}, "Qwen2ForCausalLM"),
        ({"qkv_bias": True, "sliding_window": 5, "layer_types": [FULL, SLIDING]}, "Qwen2ForCausalLM"),
    ],
)
def test_to_hf_round_trip(tmp_path, overrides, architecture):
    llama = {"bias": False, "activation": "silu", "position": "rope", "norm": "rmsnorm", "gated_mlp": True}
    config = GPTConfig(
        vocab_size=V, block_size=32, n_layer=2, n_head=4, d_model=32, d_ff=40, rope_theta=5e4, **llama | overrides
    )  # fmt: skip
    torch.manual_seed(0)
    ours = GPT(config).eval()
    with torch.no_grad():
        for param in ours.parameters():
            param.add_(torch.randn_like(param) * 0.3)
    ours.to_hf(tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(hf).__name__ == architecture
    ids = _ids(30)
    torch.testing.assert_close(_logits(hf, ids), _logits(ours, ids), atol=1e-4, rtol=0)
    back = GPT.from_hf(tmp_path)
    assert back.config == config
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), ours.state_dict().values()))


def test_sharded_safetensors_load(tmp_path):
    hf = _hf("qwen2")
    _saved(tmp_path, hf, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and not (
        tmp_path / "model.safetensors"
    ).exists()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    ids = _ids(12)
    torch.testing.assert_close(_logits(GPT.from_hf(tmp_path), ids), _logits(hf, ids), atol=1e-4, rtol=0)


def test_bf16_checkpoint_loads_in_bf16_with_its_exact_weights(tmp_path):
    hf = _hf("llama").to(torch.bfloat16)
    _saved(tmp_path, hf)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    ours = GPT.from_hf(tmp_path).eval()
    assert {p.dtype for p in ours.parameters()} == {torch.bfloat16}
    assert ours.rotary.cos.dtype == torch.float32  # the RoPE table is not rounded to bf16
    assert torch.equal(ours.tok_emb.weight, hf.model.embed_tokens.weight)
    assert torch.equal(ours.blocks[1].mlp.proj.weight, hf.model.layers[1].mlp.down_proj.weight)
    ids = _ids(12)
    reference = _logits(hf.float(), ids)
    torch.testing.assert_close(_logits(ours, ids).float(), reference, atol=0.15, rtol=0.05)
    assert GPT.from_hf(tmp_path, dtype=torch.float32).tok_emb.weight.dtype == torch.float32


class _Pickled(dict):
    """A state dict whose class only arbitrary unpickling can rebuild."""


def test_pytorch_model_bin_needing_unpickling_loads_only_when_trusted(tmp_path):
    hf = _hf("mistral")
    hf.config.save_pretrained(tmp_path)
    torch.save(_Pickled(hf.state_dict()), tmp_path / "pytorch_model.bin")
    with pytest.raises((pickle.UnpicklingError, ValueError), match="weights_only|trust_checkpoint"):
        GPT.from_hf(tmp_path)
    ids = _ids(12)
    trusted = GPT.from_hf(tmp_path, trust_checkpoint=True)
    torch.testing.assert_close(_logits(trusted, ids), _logits(hf, ids), atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "config,refusal",
    [
        (
            lambda: transformers.LlamaConfig(
                **SMALL,
                rope_scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32},
            ),
            "Unsupported rope_scaling type 'yarn'.*linear",
        ),
        (
            lambda: transformers.MixtralConfig(**SMALL, num_local_experts=4),
            "Unsupported architecture.*LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM",
        ),
        (lambda: transformers.GemmaConfig(**SMALL), "Unsupported architecture.*gemma"),
        (
            lambda: transformers.LlamaConfig(**SMALL, architectures=["LlamaForSequenceClassification"]),
            "LlamaForSequenceClassification",
        ),
        (
            lambda: transformers.Qwen2Config(
                **SMALL, **QWEN2_WINDOW, layer_types=["chunked_attention", SLIDING]
            ),
            r"layer_types \['chunked_attention'\]",
        ),
    ],
)
def test_what_ours_cannot_represent_is_refused_by_name(tmp_path, config, refusal):
    config().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=refusal):
        GPT.from_hf(tmp_path)


def test_a_config_no_hf_decoder_represents_is_refused_on_export():
    config = GPTConfig(vocab_size=V, block_size=16, n_layer=1, n_head=2, d_model=16, norm="rmsnorm")
    with pytest.raises(ValueError, match="gated_mlp=False.*position='learned'"):
        GPT(config).to_hf()
    gpt2_layout = dataclasses.replace(config, norm="layernorm", head_dim=4)
    with pytest.raises(ValueError, match="GPT-2 has no head_dim.*the Llama layout"):
        GPT(gpt2_layout).to_hf()


@pytest.mark.parametrize(
    "preset,architecture",
    [
        ("llama_nano", "LlamaForCausalLM"),
        ("llama_mini", "LlamaForCausalLM"),
        ("qwen2_nano", "Qwen2ForCausalLM"),
    ],
)
def test_presets_are_the_hf_layouts(compose_cfg, preset, architecture):
    spec = {k: v for k, v in compose_cfg(f"model={preset}").model.items() if k != "_target_"}
    model = GPT(GPTConfig(**{**spec, "vocab_size": V}))
    assert type(model.to_hf()).__name__ == architecture
    assert model.new_caches(1, 8)[0].self_attn.k.size(1) == spec["n_kv_head"] < spec["n_head"]


def test_causal_lm_continues_a_bf16_hf_llama_directory_in_float32(compose_cfg, tmp_path):
    hf_dir = tmp_path / "hf"
    texts = ["The for statement iterates over the items of a sequence."] * 50
    tokenizer = Tokenizer.train(texts, vocab_size=300)
    tokenizer.save(hf_dir / "tokenizer.json")
    hf = _hf("qwen2", vocab_size=tokenizer.vocab_size).to(torch.bfloat16)  # as most Hub checkpoints are
    hf.save_pretrained(hf_dir)
    cfg = compose_cfg(
        "model=llama_nano", *TINY_LM, f"task.init_from_hf={hf_dir}", f"data.tokenizer_path={hf_dir}",
        "task.optimizer.lr=0", "task.optimizer.weight_decay=0", "test=false", "sample=null", "trainer.max_steps=1",
    )  # fmt: skip
    train(cfg)
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    # float32 weights (trainer.precision decides what runs in bf16), the checkpoint's values exactly
    expected = hf.model.layers[1].self_attn.k_proj.bias.float()
    trained = state["state_dict"]["model.blocks.1.attn.qkv_proj.bias"]
    assert trained.dtype == torch.float32 and torch.equal(trained[32:48], expected)  # [q | k | v]
    hparams = state["hyper_parameters"]
    assert hparams["init_from_hf"] is None  # reloading does not need the directory
    assert (
        hparams["model"]["qkv_bias"]
        and hparams["model"]["n_kv_head"] == 2
        and hparams["model"]["d_model"] == 32
    )


@pytest.mark.parametrize(
    "scaling",
    [LINEAR, {"rope_type": "dynamic", "factor": 4.0}, {**LLAMA3, "original_max_position_embeddings": 8192}],
)
def test_rope_frequencies_equal_transformers_at_llama_3_1_size(scaling):
    # head size 128 and an 8192-token original length put many frequencies in each of llama3's three bands
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(
        hidden_size=4096,
        num_attention_heads=32,
        max_position_embeddings=131072,
        rope_theta=5e5,
        rope_scaling=scaling,
    )
    seq_len = 3 * 131072  # past the original length: where dynamic scaling acts
    expected, _ = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, "cpu", seq_len=seq_len)
    theta, ours = rope_from_hf(config.to_dict())
    torch.testing.assert_close(rope_inv_freq(128, theta, ours, seq_len).float(), expected, rtol=1e-5, atol=0)
