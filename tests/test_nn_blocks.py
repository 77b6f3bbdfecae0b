"""Encoder/decoder blocks against torch.nn.TransformerEncoderLayer/DecoderLayer with copied weights."""

import pytest
import torch
from torch import nn

from lit_transformers.nn import DecoderBlock, EncoderBlock, FeedForward, KVCache, LayerCache, padding_mask

D, H, FF = 16, 4, 40


def _copy_self_attn(ours, ref):
    ours.qkv_proj.weight.copy_(ref.in_proj_weight), ours.qkv_proj.bias.copy_(ref.in_proj_bias)
    ours.out_proj.weight.copy_(ref.out_proj.weight), ours.out_proj.bias.copy_(ref.out_proj.bias)


def _copy_cross_attn(ours, ref):
    ours.q_proj.weight.copy_(ref.in_proj_weight[:D]), ours.q_proj.bias.copy_(ref.in_proj_bias[:D])
    ours.kv_proj.weight.copy_(ref.in_proj_weight[D:]), ours.kv_proj.bias.copy_(ref.in_proj_bias[D:])
    ours.out_proj.weight.copy_(ref.out_proj.weight), ours.out_proj.bias.copy_(ref.out_proj.bias)


def _copy_common(ours, ref):
    ours.mlp.fc.load_state_dict(ref.linear1.state_dict())
    ours.mlp.proj.load_state_dict(ref.linear2.state_dict())
    _copy_self_attn(ours.attn, ref.self_attn)


def _randomize(module):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.3 if p.ndim == 1 else 0.0, 0.3)  # LayerNorm affine and biases non-trivial


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_block_matches_torch_encoder_layer(norm_first, activation):
    ref = (
        nn.TransformerEncoderLayer(
            D, H, FF, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
        )
        .double()
        .eval()
    )
    _randomize(ref)
    ours = EncoderBlock(D, H, d_ff=FF, activation=activation, norm_first=norm_first).double().eval()
    with torch.no_grad():
        _copy_common(ours, ref)
        ours.ln_1.load_state_dict(ref.norm1.state_dict()), ours.ln_2.load_state_dict(ref.norm2.state_dict())
    x = torch.randn(3, 7, D, dtype=torch.float64)
    valid = torch.ones(3, 7, dtype=torch.bool)
    valid[1, 4:] = False
    torch.testing.assert_close(ours(x), ref(x))
    expected = ref(x, src_key_padding_mask=~valid)
    got = ours(x, mask=padding_mask(valid))
    # torch's fast path zeroes padded query rows in eval; compare real positions only
    torch.testing.assert_close(got[valid], expected[valid])


def _decoder_pair(norm_first):
    ref = (
        nn.TransformerDecoderLayer(
            D, H, FF, dropout=0.0, activation="gelu", batch_first=True, norm_first=norm_first
        )
        .double()
        .eval()
    )
    _randomize(ref)
    ours = DecoderBlock(D, H, cross_attention=True, d_ff=FF, activation="gelu", norm_first=norm_first)
    ours = ours.double().eval()
    with torch.no_grad():
        _copy_common(ours, ref)
        _copy_cross_attn(ours.cross_attn, ref.multihead_attn)
        ours.ln_1.load_state_dict(ref.norm1.state_dict())
        ours.ln_cross.load_state_dict(ref.norm2.state_dict())
        ours.ln_2.load_state_dict(ref.norm3.state_dict())
    return ours, ref


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_block_matches_torch_decoder_layer(norm_first):
    ours, ref = _decoder_pair(norm_first)
    tgt = torch.randn(2, 6, D, dtype=torch.float64)
    memory = torch.randn(2, 9, D, dtype=torch.float64)
    mem_valid = torch.ones(2, 9, dtype=torch.bool)
    mem_valid[0, 7:] = False
    future = nn.Transformer.generate_square_subsequent_mask(6, dtype=torch.float64)
    expected = ref(tgt, memory, tgt_mask=future, tgt_is_causal=True, memory_key_padding_mask=~mem_valid)
    got = ours(tgt, context=memory, context_mask=padding_mask(mem_valid))
    torch.testing.assert_close(got, expected)


def test_decoder_block_incremental_decoding_matches_full_pass():
    ours, _ = _decoder_pair(norm_first=False)
    tgt = torch.randn(2, 6, D, dtype=torch.float64)
    memory = torch.randn(2, 9, D, dtype=torch.float64)
    full = ours(tgt, context=memory)
    cache = LayerCache(
        KVCache(2, H, 6, D // H, dtype=torch.float64), KVCache(2, H, 9, D // H, dtype=torch.float64)
    )
    steps = [ours(tgt[:, :2], context=memory, cache=cache)]
    steps += [ours(tgt[:, t : t + 1], context=memory, cache=cache) for t in range(2, 6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def _reference_pre_norm_block(x, block):
    """GPT-2 block by hand in float64: x + Attn(LN(x)); x + FFN(LN(x)); causal softmax attention."""
    B, T, _ = x.shape
    hs = D // H

    def ln(h, m):
        return (h - h.mean(-1, keepdim=True)) / torch.sqrt(
            h.var(-1, unbiased=False, keepdim=True) + m.eps
        ) * m.weight + m.bias

    h = ln(x, block.ln_1)
    qkv = h @ block.attn.qkv_proj.weight.T + block.attn.qkv_proj.bias
    q, k, v = (t.reshape(B, T, H, hs).transpose(1, 2) for t in qkv.split(D, -1))
    scores = q @ k.transpose(-1, -2) / hs**0.5
    scores = scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
    att = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
    x = x + att @ block.attn.out_proj.weight.T + block.attn.out_proj.bias
    h = ln(x, block.ln_2)
    h = torch.relu(h @ block.mlp.fc.weight.T + block.mlp.fc.bias)
    return x + h @ block.mlp.proj.weight.T + block.mlp.proj.bias


def test_pre_norm_decoder_block_matches_hand_written_reference():
    block = DecoderBlock(D, H, d_ff=FF, activation="relu").double().eval()
    _randomize(block)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    torch.testing.assert_close(block(x), _reference_pre_norm_block(x, block))


def test_feed_forward_width_activation_and_errors():
    ff = FeedForward(8, 24, activation="gelu_tanh")
    assert ff.fc.out_features == 24 and ff.proj.in_features == 24
    x = torch.randn(4, 8)
    torch.testing.assert_close(ff(x), ff.proj(nn.functional.gelu(ff.fc(x), approximate="tanh")))
    assert DecoderBlock(8, 2).mlp.fc.out_features == 32  # default 4 * d_model
    with pytest.raises(ValueError, match="choose one of"):
        FeedForward(8, 16, activation="swishy")


@pytest.mark.parametrize("family", ["GPT", "BERT", "Seq2Seq", "CLIP"])
def test_a_model_built_by_hand_without_a_vocabulary_size_says_which_key_to_set(family):
    from lit_transformers import models

    config, model = {
        "GPT": (models.GPTConfig, models.GPT),
        "BERT": (models.BERTConfig, models.BERT),
        "Seq2Seq": (models.Seq2SeqConfig, models.Seq2SeqTransformer),
        "CLIP": (models.CLIPConfig, models.CLIP),
    }[family]
    with pytest.raises(ValueError, match="vocab_size is None: set it in the model config"):
        model(config())
