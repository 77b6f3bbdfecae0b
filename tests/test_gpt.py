"""GPT: Hugging Face GPT-2 parity (from_hf / to_hf), causality, KV cache, GPT-2 init, tied embeddings, the LM head
fused with the loss."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from lit_transformers.models import GPT, GPTConfig
from lit_transformers.nn import IGNORE_INDEX, linear_cross_entropy, token_mean
from lit_transformers.text import left_pad

transformers = pytest.importorskip("transformers")

SMALL = {"vocab_size": 97, "n_positions": 48, "n_embd": 32, "n_layer": 2, "n_head": 4}


def _hf_model(**overrides):
    torch.manual_seed(0)
    config = transformers.GPT2Config(**{**SMALL, **overrides}, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # HF initialises biases and LayerNorms to 0/1; make every mapping visible
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.normal_(0.5 if "ln" in name else 0.0, 0.1)
    return model


def _tokens(B=2, T=20, seed=1):
    return torch.randint(0, SMALL["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("activation", ["gelu_new", "relu"])
def test_from_hf_model_object_matches_gpt2_logits(activation):
    hf = _hf_model(activation_function=activation, n_inner=48)
    ours = GPT.from_hf(hf).eval()
    x = _tokens()
    torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-4, rtol=0)


def test_from_hf_safetensors_directory_matches_gpt2_logits(tmp_path):
    hf = _hf_model()
    hf.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    ours = GPT.from_hf(tmp_path).eval()
    x = _tokens()
    torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-4, rtol=0)


def test_from_hf_rejects_missing_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        GPT.from_hf(tmp_path)


def test_to_hf_round_trip_matches_our_logits(tmp_path):
    torch.manual_seed(3)
    ours = GPT(GPTConfig(vocab_size=97, block_size=48, n_layer=2, n_head=4, d_model=32)).eval()
    x = _tokens()
    hf = ours.to_hf(tmp_path)
    torch.testing.assert_close(hf(x).logits, ours(x), atol=1e-4, rtol=0)
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(reloaded(x).logits, ours(x), atol=1e-4, rtol=0)
    torch.testing.assert_close(GPT.from_hf(tmp_path).eval()(x), ours(x), atol=1e-5, rtol=0)


def test_untied_gpt2_round_trips():
    hf = _hf_model(tie_word_embeddings=False)
    with torch.no_grad():
        hf.lm_head.weight.normal_(0, 0.02)
    ours = GPT.from_hf(hf).eval()
    assert not ours.config.tie_embeddings
    x = _tokens()
    torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(ours.to_hf()(x).logits, hf(x).logits, atol=1e-4, rtol=0)


def _gpt(position="learned", **kw):
    torch.manual_seed(0)
    return GPT(
        GPTConfig(vocab_size=97, block_size=40, n_layer=2, n_head=4, d_model=32, position=position, **kw)
    ).eval()


@pytest.mark.parametrize("position", ["learned", "sinusoidal", "rope"])
def test_outputs_up_to_t_ignore_tokens_after_t(position):
    model = _gpt(position)
    x = _tokens(T=16)
    changed = x.clone()
    changed[:, 9:] = (x[:, 9:] + 5) % 97
    a, b = model(x), model(changed)
    torch.testing.assert_close(a[:, :9], b[:, :9])
    assert not torch.allclose(a[:, 9:], b[:, 9:])


@pytest.mark.parametrize("position", ["learned", "sinusoidal", "rope"])
def test_kv_cache_decoding_equals_full_forward(position):
    model = _gpt(position)
    x = _tokens(T=12)
    full = model(x)
    caches = model.new_caches(2, 12)
    steps = [model(x[:, :5], caches=caches)] + [model(x[:, t : t + 1], caches=caches) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_kv_cache_with_left_padding_equals_each_prompt_alone(position):
    """Prefill a left-padded batch, decode token by token; each row's logits equal its unpadded full pass."""
    model = _gpt(position)
    rows = [_tokens(1, 11, seed=5)[0].tolist(), _tokens(1, 6, seed=6)[0].tolist()]
    prompt_len = [7, 2]
    ids, valid = left_pad([r[:n] for r, n in zip(rows, prompt_len)], pad_id=0)
    width = ids.size(1)
    positions = (valid.cumsum(-1) - 1).clamp(min=0)
    caches = model.new_caches(2, width + 4)
    mask = valid[:, None, None, :] | torch.eye(width, dtype=torch.bool)  # pad queries see themselves
    logits = [model(ids, position_ids=positions, mask=mask, caches=caches)[:, -1]]
    for step in range(4):
        nxt = torch.tensor([[rows[i][prompt_len[i] + step]] for i in range(2)])
        valid = torch.cat([valid, torch.ones(2, 1, dtype=torch.bool)], dim=1)
        positions = torch.cat([positions, positions[:, -1:] + 1], dim=1)
        logits.append(
            model(nxt, position_ids=positions[:, -1:], mask=valid[:, None, None, :], caches=caches)[:, -1]
        )
    for i in range(2):
        alone = model(torch.tensor([rows[i][: prompt_len[i] + 4]]))[0, prompt_len[i] - 1 :]
        torch.testing.assert_close(torch.stack([lg[i] for lg in logits]), alone, atol=1e-5, rtol=1e-5)


def test_gpt2_init_std_and_scaled_residual_projections():
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=1000, block_size=64, n_layer=8, n_head=4, d_model=256)
    model = GPT(config)
    residual_std = 0.02 / math.sqrt(2 * config.n_layer)
    for name, p in model.named_parameters():
        if name.endswith(("attn.out_proj.weight", "mlp.proj.weight")):
            assert p.std().item() == pytest.approx(residual_std, rel=0.05), name
        elif name.endswith(("qkv_proj.weight", "mlp.fc.weight", "tok_emb.weight", "pos_emb.weight")):
            assert p.std().item() == pytest.approx(0.02, rel=0.05), name
        elif name.endswith("bias") and "ln" not in name:
            assert torch.all(p == 0), name
        elif "ln" in name:
            assert torch.all(p == (1 if name.endswith("weight") else 0)), name


def test_tied_embeddings_share_one_tensor():
    tied, untied = _gpt(), _gpt(tie_embeddings=False)
    assert tied.lm_head.weight is tied.tok_emb.weight
    assert untied.lm_head.weight is not untied.tok_emb.weight
    assert untied.num_params() - tied.num_params() == 97 * 32
    tied(_tokens()).sum().backward()
    assert tied.tok_emb.weight.grad is not None


def test_sequence_longer_than_block_size_is_an_error():
    model = _gpt()
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 41, dtype=torch.long))
    with pytest.raises(ValueError, match="block_size"):
        model.new_caches(1, 41)


# ---- the LM head fused with the loss -------------------------------------------------------------------


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("chunk_rows", [3, None])  # several chunks, one
@pytest.mark.parametrize("with_bias", [False, True])  # GPT's head, Marian's (final_logits_bias)
def test_linear_cross_entropy_matches_float64_logits_then_cross_entropy(
    label_smoothing, chunk_rows, with_bias
):
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(2, 7, 16, generator=g), torch.randn(50, 16, generator=g)
    bias = torch.randn(50, generator=g) if with_bias else None
    labels = torch.randint(0, 50, (2, 7), generator=g)
    labels[0, :3] = IGNORE_INDEX
    hidden[0, :3] = 1e4  # anything at ignored positions: no loss, no gradient
    params = [hidden, weight] + ([bias] if with_bias else [])
    reference = [p.double().requires_grad_() for p in params]
    expected = F.cross_entropy(
        F.linear(*reference).flatten(0, 1), labels.flatten(), reduction="sum", label_smoothing=label_smoothing
    )
    (0.7 * expected).backward()
    for p in params:
        p.requires_grad_()
    total, count = linear_cross_entropy(
        hidden, weight, labels, label_smoothing, bias=bias, chunk_rows=chunk_rows
    )
    (0.7 * total).backward()
    assert count == 11
    torch.testing.assert_close(total.double(), expected, rtol=1e-6, atol=0)
    for p, ref in zip(params, reference):
        torch.testing.assert_close(p.grad.double(), ref.grad, rtol=1e-5, atol=1e-6)
    assert not hidden.grad[0, :3].any()
    with torch.no_grad():  # evaluation: the loss alone
        again, _ = linear_cross_entropy(
            hidden, weight, labels, label_smoothing, bias=bias, chunk_rows=chunk_rows
        )
    torch.testing.assert_close(again, total)


def test_linear_cross_entropy_under_bf16_autocast_matches_the_lm_head_in_bf16():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(64, 32, generator=g, requires_grad=True)
    weight = (0.1 * torch.randn(40, 32, generator=g)).requires_grad_()
    labels = torch.randint(0, 40, (64,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        total, _ = linear_cross_entropy(hidden, weight, labels, chunk_rows=16)
        expected = F.cross_entropy((hidden @ weight.T).float(), labels, reduction="sum")
    total.backward()
    assert total.dtype == hidden.grad.dtype == weight.grad.dtype == torch.float32
    torch.testing.assert_close(total, expected, rtol=1e-3, atol=0)
    hidden32, weight32 = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
    F.cross_entropy(hidden32 @ weight32.T, labels, reduction="sum").backward()
    torch.testing.assert_close(weight.grad, weight32.grad, rtol=0.05, atol=0.05)


def test_gpt_with_labels_returns_the_loss_of_its_logits_through_the_tied_embedding():
    torch.manual_seed(0)
    fused, plain = _gpt(), _gpt()
    plain.load_state_dict(fused.state_dict())
    x, y = _tokens(), _tokens(seed=2)
    y[:, :5] = IGNORE_INDEX  # e.g. an SFT prompt
    total, count = fused(x, labels=y)
    (total / count).backward()
    logits = plain(x)
    expected = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    expected.backward()
    torch.testing.assert_close(total / count, expected)
    for (name, p), q in zip(fused.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_batch_without_labelled_positions_has_zero_loss_and_gradients():
    model = _gpt()
    loss = token_mean(*model(_tokens(), labels=torch.full((2, 20), IGNORE_INDEX)))
    loss.backward()
    assert loss.item() == 0
    assert all(not p.grad.any() for p in model.parameters())  # zeros, not 0 * inf = NaN


@pytest.mark.parametrize("weight_trains", [True, False])  # False: a frozen head still passes gradients back
def test_linear_cross_entropy_passes_gradcheck_in_float64(weight_trains):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(5, 4, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(6, 4, dtype=torch.float64, generator=g, requires_grad=weight_trains)
    bias = torch.randn(6, dtype=torch.float64, generator=g, requires_grad=True)
    labels = torch.tensor([0, 5, IGNORE_INDEX, 2, 2])

    def loss(h, w, b):
        return linear_cross_entropy(h, w, labels, 0.1, bias=b, chunk_rows=2)[0]

    assert loss(hidden, weight, bias).dtype == torch.float64
    assert torch.autograd.gradcheck(loss, (hidden, weight, bias))


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
def test_activation_checkpointing_recomputes_each_block_and_gives_the_same_gradients(layout):
    llama = {"norm": "rmsnorm", "gated_mlp": True, "activation": "silu", "position": "rope", "n_kv_head": 2}
    config = GPTConfig(
        vocab_size=97,
        block_size=32,
        n_layer=2,
        n_head=4,
        d_model=32,
        dropout=0.1,
        **(llama if layout == "llama" else {}),
    )
    idx, labels = _tokens(), _tokens(seed=2)
    grads, block_calls = [], []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = GPT(dataclasses.replace(config, activation_checkpointing=checkpointing)).train()
        calls = []
        model.blocks[0].attn.register_forward_hook(lambda *_, calls=calls: calls.append(1))
        torch.manual_seed(1)  # the same dropout masks in both runs (checkpointing replays the RNG state)
        total, count = model(idx, labels=labels)
        (total / count).backward()
        grads.append({name: p.grad for name, p in model.named_parameters()})
        block_calls.append(len(calls))
    assert block_calls == [1, 2]  # attention recomputed in backward: its activations were not kept
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-7, msg=name)
