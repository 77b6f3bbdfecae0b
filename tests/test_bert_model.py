"""BERT model: Hugging Face parity (BertModel, BertForPreTraining), from_hf / to_hf, bidirectionality."""

import json

import pytest
import torch

from lit_transformers.models import BERT, BERTConfig

transformers = pytest.importorskip("transformers")

SMALL = {
    "vocab_size": 101,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 48,
    "max_position_embeddings": 40,
    "type_vocab_size": 2,
}


def _randomise(model):
    """HF initialises biases and LayerNorms to 0/1; random values make every name mapping visible."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.normal_(1.0 if "LayerNorm" in name else 0.0, 0.1)
    return model.eval()


def _hf(cls, seed=0, **overrides):
    torch.manual_seed(seed)
    return _randomise(cls(transformers.BertConfig(**{**SMALL, **overrides})))


def _inputs(B=3, T=17, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, SMALL["vocab_size"], (B, T), generator=g)
    types = (torch.arange(T) >= T // 2).long().expand(B, T).clone()
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, -5:] = 0  # right padding in one row
    return ids, mask, types


@pytest.mark.parametrize("act", ["gelu", "gelu_new"])
def test_hidden_states_and_pooled_output_match_bert_model(act):
    hf = _hf(transformers.BertModel, hidden_act=act)
    ours = BERT.from_hf(hf).eval()
    assert not ours.config.pretraining_heads
    ids, mask, types = _inputs()
    out = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
    hidden = ours(ids, mask, types)
    real = mask.bool()  # HF's outputs at padded positions are unconstrained; compare real tokens
    torch.testing.assert_close(hidden[real], out.last_hidden_state[real], atol=1e-4, rtol=0)
    torch.testing.assert_close(ours.pool(hidden), out.pooler_output, atol=1e-4, rtol=0)


@pytest.mark.parametrize("act", ["gelu", "relu"])
def test_mlm_and_nsp_logits_match_bert_for_pretraining(act):
    hf = _hf(transformers.BertForPreTraining, seed=2, hidden_act=act)
    ours = BERT.from_hf(hf).eval()
    assert ours.config.pretraining_heads and ours.config.activation == act
    ids, mask, types = _inputs(seed=3)
    out = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
    hidden = ours(ids, mask, types)
    real = mask.bool()
    torch.testing.assert_close(ours.mlm_logits(hidden)[real], out.prediction_logits[real], atol=1e-4, rtol=0)
    torch.testing.assert_close(
        ours.nsp_logits(ours.pool(hidden)), out.seq_relationship_logits, atol=1e-4, rtol=0
    )


def test_mlm_decoder_is_tied_to_word_embeddings_with_its_own_bias():
    model = BERT(BERTConfig(vocab_size=50, max_position=16, n_layer=1, n_head=2, d_model=16, d_ff=32))
    assert model.mlm_head.decoder.weight is model.tok_emb.weight
    assert model.mlm_head.bias.shape == (50,)


def test_from_hf_directories_with_and_without_prefix_heads_and_position_ids(tmp_path):
    hf = _hf(transformers.BertForPreTraining, seed=4)
    ids, mask, types = _inputs(seed=5)
    expected = hf.bert(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    real = mask.bool()
    # 1) save_pretrained (safetensors, "bert." prefix, heads)
    hf.save_pretrained(tmp_path / "pretraining")
    ours = BERT.from_hf(tmp_path / "pretraining").eval()
    torch.testing.assert_close(ours(ids, mask, types)[real], expected[real], atol=1e-4, rtol=0)
    # 2) a sentence-transformers root: bare body keys, pytorch_model.bin, an old position_ids buffer
    root = tmp_path / "st"
    root.mkdir()
    body = {k.removeprefix("bert."): v for k, v in hf.state_dict().items() if k.startswith("bert.")}
    body["embeddings.position_ids"] = torch.arange(SMALL["max_position_embeddings"])[None]
    torch.save(body, root / "pytorch_model.bin")
    (root / "config.json").write_text(json.dumps({"model_type": "bert", **SMALL}))
    bare = BERT.from_hf(root).eval()
    assert not bare.config.pretraining_heads
    torch.testing.assert_close(bare(ids, mask, types)[real], expected[real], atol=1e-4, rtol=0)
    # 3) heads dropped on request
    assert not hasattr(BERT.from_hf(tmp_path / "pretraining", pretraining_heads=False), "mlm_head")


def test_from_hf_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        BERT.from_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", **SMALL}))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        BERT.from_hf(tmp_path)


@pytest.mark.parametrize(("heads", "activation"), [(True, "gelu"), (True, "relu"), (False, "gelu")])
def test_to_hf_round_trips(tmp_path, heads, activation):
    """The exported config's hidden_act is what ours computes, in the FFN and in the MLM head alike."""
    torch.manual_seed(3)
    config = BERTConfig(
        vocab_size=101, max_position=40, n_layer=2, n_head=4, d_model=32, d_ff=48, activation=activation,
        pretraining_heads=heads,
    )  # fmt: skip
    ours = _randomise(BERT(config))
    ids, mask, types = _inputs(seed=6)
    hidden = ours(ids, mask, types)
    real = mask.bool()
    ours.to_hf(tmp_path)
    cls = transformers.BertForPreTraining if heads else transformers.BertModel
    reloaded = cls.from_pretrained(tmp_path).eval()
    out = reloaded(input_ids=ids, attention_mask=mask, token_type_ids=types)
    if heads:
        torch.testing.assert_close(
            out.prediction_logits[real], ours.mlm_logits(hidden)[real], atol=1e-4, rtol=0
        )
        torch.testing.assert_close(
            out.seq_relationship_logits, ours.nsp_logits(ours.pool(hidden)), atol=1e-4, rtol=0
        )
    else:
        torch.testing.assert_close(out.last_hidden_state[real], hidden[real], atol=1e-4, rtol=0)
    again = BERT.from_hf(tmp_path).eval()
    assert again.config == ours.config
    torch.testing.assert_close(again(ids, mask, types), hidden, atol=1e-5, rtol=0)


def test_output_at_i_changes_when_a_later_token_changes():
    """Bidirectional: unlike GPT's causal mask (tests/test_gpt.py), position 0 sees position T-1."""
    torch.manual_seed(0)
    model = BERT(BERTConfig(vocab_size=50, max_position=16, n_layer=2, n_head=2, d_model=16, d_ff=32)).eval()
    ids = torch.randint(5, 50, (1, 10))
    changed = ids.clone()
    changed[0, 9] = (ids[0, 9] + 1) % 50
    before, after = model(ids), model(changed)
    for i in range(9):  # every earlier position is affected
        assert not torch.allclose(before[0, i], after[0, i], atol=1e-6), i


def test_padding_is_invisible_to_real_tokens():
    torch.manual_seed(0)
    model = BERT(BERTConfig(vocab_size=50, max_position=16, n_layer=2, n_head=2, d_model=16, d_ff=32)).eval()
    ids = torch.randint(5, 50, (1, 6))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], 1)
    mask = torch.cat([torch.ones(1, 6), torch.zeros(1, 4)], 1).long()
    torch.testing.assert_close(model(padded, mask)[:, :6], model(ids), atol=1e-5, rtol=0)


def test_attention_map_rows_are_distributions_over_real_tokens():
    torch.manual_seed(0)
    model = BERT(BERTConfig(vocab_size=50, max_position=16, n_layer=2, n_head=2, d_model=16, d_ff=32)).eval()
    ids = torch.randint(5, 50, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    attn = model.attention_map(ids, mask)
    assert attn.shape == (2, 8, 8)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 8))
    assert attn[1, :, 5:].abs().max() == 0


def test_presets_have_the_published_sizes(compose_cfg):
    from omegaconf import OmegaConf

    sizes = {}
    for name in ("bert_base", "bert_large"):
        spec = OmegaConf.to_container(
            compose_cfg(f"model={name}", resolve=False).model
        )  # with what it inherits
        spec.pop("_target_")
        spec["vocab_size"] = 30522
        with torch.device("meta"):
            sizes[name] = BERT(BERTConfig(**{**spec, "pretraining_heads": False})).num_params()
    assert 108e6 < sizes["bert_base"] < 111e6  # "110M"
    assert 333e6 < sizes["bert_large"] < 336e6  # "340M"


def test_bert_for_masked_lm_loads_its_mlm_head_and_a_fresh_nsp_head():
    hf = _hf(transformers.BertForMaskedLM, seed=7)
    ours = BERT.from_hf(hf).eval()
    ids, mask, types = _inputs(seed=8)
    real = mask.bool()
    expected = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    torch.testing.assert_close(
        ours.mlm_logits(ours(ids, mask, types))[real], expected[real], atol=1e-4, rtol=0
    )
    assert ours.nsp_head.weight.shape == (2, SMALL["hidden_size"])
