"""The converter idiom shared by GPT-2, BERT and Marian: one activation table, one strictness rule (a HF
weight the name map does not use, or one it needs that the file lacks, is refused by name), the buffer
allow-list."""

import re

import pytest
import torch
from test_bert_model import _hf as _bert
from test_gpt import _hf_model as _gpt2
from test_gpt import _tokens
from test_seq2seq_model import _marian

from lit_transformers.models import BERT, GPT, Seq2SeqTransformer
from lit_transformers.models.hf_convert import EXPORTED_ACTIVATIONS, HF_ACTIVATIONS
from lit_transformers.nn.blocks import ACTIVATIONS

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

# family: (a small random HF model, our class, a weight of a head or layer we do not convert, one we need)
FAMILIES = {
    "gpt2": (_gpt2, GPT, "score.weight", "transformer.h.1.mlp.c_fc.weight"),
    "bert": (
        lambda: _bert(transformers.BertForPreTraining),
        BERT,
        "classifier.weight",  # BertForSequenceClassification's head
        "bert.encoder.layer.1.attention.self.key.bias",
    ),
    "marian": (
        _marian,
        Seq2SeqTransformer,
        "model.encoder.layernorm_embedding.weight",  # BART's embedding LayerNorm, which Marian lacks
        "model.decoder.layers.1.encoder_attn.k_proj.weight",
    ),
}


def _saved(tmp_path, family, edit):
    """A ``save_pretrained`` directory of ``family`` whose safetensors ``edit`` changed in place."""
    FAMILIES[family][0]().save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    state = safetensors_torch.load_file(path)
    edit(state)
    safetensors_torch.save_file(state, path, metadata={"format": "pt"})
    return tmp_path


@pytest.mark.parametrize("family", FAMILIES)
def test_a_hf_weight_the_map_does_not_use_is_refused_by_name(tmp_path, family):
    _, cls, unused, _ = FAMILIES[family]
    path = _saved(tmp_path, family, lambda state: state.update({unused: torch.zeros(2, 32)}))
    with pytest.raises(ValueError, match=re.escape(unused)):
        cls.from_hf(path)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_weight_the_file_lacks_is_refused_by_name(tmp_path, family):
    _, cls, _, needed = FAMILIES[family]
    path = _saved(tmp_path, family, lambda state: state.pop(needed))
    with pytest.raises(ValueError, match=re.escape(needed)):
        cls.from_hf(path)


def test_a_tied_copy_that_differs_from_its_tensor_is_refused(tmp_path):
    """A tied GPT-2 (tie_word_embeddings=true) whose file holds an lm_head.weight of its own: the file
    contradicts its config, so neither matrix is silently taken."""
    path = _saved(tmp_path, "gpt2", lambda state: state.update({"lm_head.weight": torch.randn(97, 32)}))
    with pytest.raises(ValueError, match=r"\['lm_head.weight'\] should be tied to 'transformer.wte.weight'"):
        GPT.from_hf(path)


def test_old_gpt2_files_causal_mask_buffers_are_not_weights(tmp_path):
    """GPT-2 files saved before transformers made them non-persistent hold each layer's causal mask
    (``attn.bias``) and its fill value (``attn.masked_bias``): the allow-list skips them."""
    hf = _gpt2()
    n = hf.config.n_positions

    def add_buffers(state):
        for i in range(hf.config.n_layer):
            state[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
            state[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)

    ours = GPT.from_hf(_saved(tmp_path, "gpt2", add_buffers)).eval()
    x = _tokens()
    torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize(("hf_name", "ours"), HF_ACTIVATIONS.items())
def test_each_hf_activation_name_computes_our_activation(hf_name, ours):
    from transformers.activations import ACT2FN

    x = torch.linspace(-6, 6, 241)
    torch.testing.assert_close(ACTIVATIONS[ours]()(x), ACT2FN[hf_name](x), atol=1e-6, rtol=0)


def test_every_activation_of_ours_exports_to_a_hf_name_that_reads_back():
    assert {HF_ACTIVATIONS[EXPORTED_ACTIVATIONS[ours]] for ours in ACTIVATIONS} == set(ACTIVATIONS)
