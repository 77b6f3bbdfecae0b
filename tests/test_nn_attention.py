"""MultiHeadAttention against torch.nn.MultiheadAttention and the notes' worked example."""

import math

import pytest
import torch
from torch import nn

from lit_transformers.nn import KVCache, MultiHeadAttention, causal_mask, padding_mask

D, H = 16, 4


def _pair(cross=False, context_dim=None, bias=True):
    """Our attention and torch's, with identical weights (float64, eval)."""
    torch.manual_seed(0)
    kdim = context_dim if cross else None
    ref = nn.MultiheadAttention(D, H, bias=bias, batch_first=True, kdim=kdim, vdim=kdim).double().eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.3)  # non-zero biases too
    ours = MultiHeadAttention(D, H, bias=bias, cross_attention=cross, context_dim=context_dim).double().eval()
    with torch.no_grad():
        if ref._qkv_same_embed_dim:
            w, b = ref.in_proj_weight, ref.in_proj_bias
            if cross:
                ours.q_proj.weight.copy_(w[:D]), ours.kv_proj.weight.copy_(w[D:])
                if bias:
                    ours.q_proj.bias.copy_(b[:D]), ours.kv_proj.bias.copy_(b[D:])
            else:
                ours.qkv_proj.weight.copy_(w)
                if bias:
                    ours.qkv_proj.bias.copy_(b)
        else:
            ours.q_proj.weight.copy_(ref.q_proj_weight)
            ours.kv_proj.weight.copy_(torch.cat([ref.k_proj_weight, ref.v_proj_weight]))
            ours.q_proj.bias.copy_(ref.in_proj_bias[:D]), ours.kv_proj.bias.copy_(ref.in_proj_bias[D:])
        ours.out_proj.weight.copy_(ref.out_proj.weight)
        if bias:
            ours.out_proj.bias.copy_(ref.out_proj.bias)
    return ours, ref


@pytest.mark.parametrize("bias", [True, False])
def test_self_attention_matches_torch_multihead_attention(bias):
    ours, ref = _pair(bias=bias)
    x = torch.randn(3, 7, D, dtype=torch.float64)
    expected, _ = ref(x, x, x, need_weights=False)
    torch.testing.assert_close(ours(x), expected)


def test_key_padding_mask_matches_torch():
    ours, ref = _pair()
    x = torch.randn(3, 7, D, dtype=torch.float64)
    valid = torch.ones(3, 7, dtype=torch.bool)
    valid[0, 5:] = False
    valid[2, :3] = False  # left padding
    expected, _ = ref(x, x, x, key_padding_mask=~valid, need_weights=False)  # torch: True = ignore
    torch.testing.assert_close(ours(x, mask=padding_mask(valid)), expected)


def test_causal_attention_matches_torch_with_and_without_padding():
    ours, ref = _pair()
    x = torch.randn(2, 6, D, dtype=torch.float64)
    future = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)  # torch: True = ignore
    expected, _ = ref(x, x, x, attn_mask=future, need_weights=False)
    torch.testing.assert_close(ours(x, is_causal=True), expected)
    torch.testing.assert_close(ours(x, mask=causal_mask(6, 6)), expected)
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[1, 4] = False  # a padded key in the middle: row 1 never attends to it
    expected, _ = ref(x, x, x, attn_mask=future, key_padding_mask=~valid, need_weights=False)
    torch.testing.assert_close(ours(x, mask=padding_mask(valid), is_causal=True), expected)


@pytest.mark.parametrize("context_dim", [None, 24])
def test_cross_attention_matches_torch(context_dim):
    ours, ref = _pair(cross=True, context_dim=context_dim)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    memory = torch.randn(2, 9, context_dim or D, dtype=torch.float64)
    valid = torch.ones(2, 9, dtype=torch.bool)
    valid[0, 6:] = False
    expected, _ = ref(x, memory, memory, key_padding_mask=~valid, need_weights=False)
    torch.testing.assert_close(ours(x, context=memory, mask=padding_mask(valid)), expected)
    # a KV cache holds the projected memory; the second call reuses it without `context`
    cache = KVCache(2, H, 9, D // H, dtype=torch.float64)
    torch.testing.assert_close(ours(x, context=memory, mask=padding_mask(valid), kv_cache=cache), expected)
    torch.testing.assert_close(ours(x[:, -1:], mask=padding_mask(valid), kv_cache=cache), expected[:, -1:])


def test_notes_worked_example_two_tokens():
    """Scaled scores (2, 0) -> softmax (0.881, 0.119); v1=(1,0), v2=(0,2) -> z1 = (0.881, 0.238)."""
    eye = torch.eye(2, dtype=torch.float64)
    # K = V = x; Q = 2*sqrt(2) x so that q1.k / sqrt(d_k=2) = (2, 0) for x1=(1,0), x2=(0,2)
    self_attn = MultiHeadAttention(d_model=2, n_head=1, bias=False).double()
    # the same projections as cross-attention of x over itself, whose probabilities the module writes out
    cross_attn = MultiHeadAttention(d_model=2, n_head=1, bias=False, cross_attention=True).double()
    with torch.no_grad():
        self_attn.qkv_proj.weight.copy_(torch.cat([2 * math.sqrt(2) * eye, eye, eye]))
        cross_attn.q_proj.weight.copy_(2 * math.sqrt(2) * eye)
        cross_attn.kv_proj.weight.copy_(torch.cat([eye, eye]))
        for attn in (self_attn, cross_attn):
            attn.out_proj.weight.copy_(eye)
    x = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]], dtype=torch.float64)
    probs = cross_attn.attention_probs(x, x)[0, 0, 0]  # (B, nh, T, S) -> the first query's row
    # the log-probabilities are the scaled scores up to one shared constant
    scores = probs.log() - probs.log()[-1]
    torch.testing.assert_close(scores, torch.tensor([2.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(probs, torch.tensor([0.881, 0.119], dtype=torch.float64), atol=5e-4, rtol=0)
    z1 = torch.tensor([0.881, 0.238], dtype=torch.float64)
    torch.testing.assert_close(self_attn(x)[0, 0], z1, atol=5e-4, rtol=0)
    torch.testing.assert_close(cross_attn(x, context=x)[0, 0], z1, atol=5e-4, rtol=0)


def test_causal_attention_ignores_future_tokens():
    ours, _ = _pair()
    x = torch.randn(2, 8, D, dtype=torch.float64)
    changed = x.clone()
    changed[:, 5:] = torch.randn(2, 3, D, dtype=torch.float64)
    torch.testing.assert_close(ours(x, is_causal=True)[:, :5], ours(changed, is_causal=True)[:, :5])
    assert not torch.allclose(ours(x, is_causal=True)[:, 5:], ours(changed, is_causal=True)[:, 5:])


def test_kv_cache_incremental_equals_full_pass():
    ours, _ = _pair()
    x = torch.randn(2, 9, D, dtype=torch.float64)
    full = ours(x, is_causal=True)
    cache = KVCache(2, H, 9, D // H, dtype=torch.float64)
    parts = [ours(x[:, :4], is_causal=True, kv_cache=cache)]  # prefill 4 tokens, then chunks of 1 and 2
    parts.append(ours(x[:, 4:5], is_causal=True, kv_cache=cache))
    parts.append(ours(x[:, 5:7], is_causal=True, kv_cache=cache))  # end-aligned causal mask over 7 keys
    parts.append(ours(x[:, 7:9], is_causal=True, kv_cache=cache))
    torch.testing.assert_close(torch.cat(parts, dim=1), full)
    with pytest.raises(ValueError, match="overflow"):
        ours(x[:, :1], is_causal=True, kv_cache=cache)


def test_causal_mask_is_end_aligned():
    expected = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(causal_mask(2, 4), expected)


def test_attention_dropout_only_in_training():
    attn = MultiHeadAttention(D, H, dropout=0.5)
    x = torch.randn(2, 5, D)
    attn.eval()
    torch.testing.assert_close(attn(x), attn(x))
    attn.train()
    torch.manual_seed(1)
    a = attn(x)
    torch.manual_seed(2)
    assert not torch.allclose(a, attn(x))


def test_d_model_not_divisible_by_heads_is_an_error():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 3)


def test_sliding_window_mask_keeps_each_querys_latest_window_keys():
    expected = torch.tensor([[0, 0, 1, 1, 0], [0, 0, 0, 1, 1]], dtype=torch.bool)  # window 2, end-aligned
    assert torch.equal(causal_mask(2, 5, window=2), expected)


def _grouped_and_expanded(n_kv_head: int, **kwargs):
    """Grouped-query attention and plain multi-head attention whose key/value heads are the grouped one's,
    each repeated for the n_head / n_kv_head query heads it serves (float64, eval)."""
    torch.manual_seed(0)
    grouped = MultiHeadAttention(D, H, n_kv_head=n_kv_head, **kwargs).double().eval()
    expanded = MultiHeadAttention(D, H, **kwargs).double().eval()
    hs = D // H
    q, k, v = grouped.qkv_proj.weight.detach().split([D, n_kv_head * hs, n_kv_head * hs])
    qb, kb, vb = grouped.qkv_proj.bias.detach().split([D, n_kv_head * hs, n_kv_head * hs])

    def repeat(t):  # (n_kv * hs, ...) -> (n_head * hs, ...)
        return t.reshape(n_kv_head, hs, *t.shape[1:]).repeat_interleave(H // n_kv_head, 0).flatten(0, 1)

    with torch.no_grad():
        expanded.qkv_proj.weight.copy_(torch.cat([q, repeat(k), repeat(v)]))
        expanded.qkv_proj.bias.copy_(torch.cat([qb, repeat(kb), repeat(vb)]))
        expanded.out_proj.load_state_dict(grouped.out_proj.state_dict())
    return grouped, expanded


@pytest.mark.parametrize("n_kv_head", [1, 2])
def test_grouped_query_attention_is_attention_with_each_kv_head_repeated(n_kv_head):
    grouped, expanded = _grouped_and_expanded(n_kv_head)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    keys = padding_mask(torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]]))
    torch.testing.assert_close(grouped(x, is_causal=True), expanded(x, is_causal=True))
    torch.testing.assert_close(grouped(x, mask=keys, is_causal=True), expanded(x, mask=keys, is_causal=True))


def test_sliding_window_with_a_grouped_cache_equals_the_full_pass():
    grouped, expanded = _grouped_and_expanded(2, sliding_window=3)
    x = torch.randn(2, 9, D, dtype=torch.float64)
    within = torch.tensor(
        [[0 <= i - j < 3 for j in range(9)] for i in range(9)]
    )  # the latest 3, itself included
    full = expanded(x, mask=within)
    torch.testing.assert_close(grouped(x, is_causal=True), full)
    cache = KVCache(2, 2, 9, D // H, dtype=torch.float64)  # n_kv_head heads, not n_head
    parts = [grouped(x[:, :4], is_causal=True, kv_cache=cache)]  # prefill 4 tokens, then chunks of 1 and 4
    parts.append(grouped(x[:, 4:5], is_causal=True, kv_cache=cache))
    parts.append(grouped(x[:, 5:9], is_causal=True, kv_cache=cache))
    torch.testing.assert_close(torch.cat(parts, dim=1), full)
