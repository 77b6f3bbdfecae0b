"""The converter idiom shared by GPT-2, BERT and Marian: one activation table, one strictness rule (a HF
weight the name map does not use, or one it needs that the file lacks, is refused by name), the buffer
allow-list; decoders built on the meta device and handed the checkpoint's tensors (no random init, the weights
held once)."""

import json
import re
from pathlib import Path

import pytest
import torch
from test_bert_model import _hf as _bert
from test_gpt import _hf_model as _gpt2
from test_gpt import _tokens
from test_llama import _hf as _llama
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


def _recording(init, devices: list):
    def record(*args, **kwargs):
        devices.append((args[0] if args else kwargs["tensor"]).device.type)
        return init(*args, **kwargs)

    return record


DECODERS = {  # name: a small random HF causal LM
    "gpt2_tied": _gpt2,
    "llama_tied": lambda: _llama("llama", tie_word_embeddings=True),
    "qwen2_untied": lambda: _llama("qwen2"),
}


@pytest.mark.parametrize("decoder", DECODERS)
def test_a_decoder_loads_without_a_random_init_and_leaves_nothing_on_meta(tmp_path, monkeypatch, decoder):
    hf = DECODERS[decoder]().eval()
    hf.save_pretrained(tmp_path)
    initialised = []  # the device of every tensor an nn.init function fills while from_hf runs
    for name in ("normal_", "uniform_", "kaiming_uniform_", "zeros_", "ones_"):
        monkeypatch.setattr(torch.nn.init, name, _recording(getattr(torch.nn.init, name), initialised))
    ours = GPT.from_hf(tmp_path).eval()
    monkeypatch.undo()
    assert initialised and set(initialised) == {"meta"}  # built on meta: every init a no-op
    assert not [name for name, t in [*ours.named_parameters(), *ours.named_buffers()] if t.is_meta]
    if ours.config.tie_embeddings:  # one parameter under both names, as GPT() ties it
        assert ours.lm_head.weight is ours.tok_emb.weight
        assert len(list(ours.parameters())) == len(dict(ours.named_parameters(remove_duplicate=False))) - 1
    x = _tokens() % hf.config.vocab_size
    torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-4, rtol=0)
    # from a model object, ours copies: training ours leaves the object as it was
    from_object = GPT.from_hf(hf)
    with torch.no_grad():
        from_object.tok_emb.weight.add_(1.0)
    torch.testing.assert_close(hf(x).logits, ours(x), atol=1e-4, rtol=0)


def _rss(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak RSS reset is Linux's")
def test_loading_a_decoder_holds_its_weights_about_once(tmp_path):
    """Peak resident memory during from_hf of a 7M-parameter Llama directory, over its weights' bytes: a
    random init plus the checkpoint's tensors held the weights about 2.4x; built on meta, 0.8x (the fused q/k/v
    and gate/up projections are new tensors, the others the file's own pages)."""
    config = transformers.LlamaConfig(
        vocab_size=8000, hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
    )  # fmt: skip
    with torch.device("meta"):  # only its names and shapes: random values are written below, cheaply
        names = transformers.LlamaForCausalLM(config).state_dict()
    torch.manual_seed(0)
    state = {name: torch.randn(t.shape) for name, t in names.items()}
    config.save_pretrained(tmp_path / "big")
    safetensors_torch.save_file(state, tmp_path / "big" / "model.safetensors", metadata={"format": "pt"})
    weights = (tmp_path / "big" / "model.safetensors").stat().st_size
    del state
    small = _llama("llama")
    small.save_pretrained(tmp_path / "small")
    GPT.from_hf(tmp_path / "small")  # the first meta build imports parts of torch: not the loading's memory
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM restarts from the current resident memory
    before = _rss("VmRSS")
    model = GPT.from_hf(tmp_path / "big")
    peak = _rss("VmHWM") - before
    assert (
        json.loads((tmp_path / "big" / "config.json").read_text())["num_hidden_layers"]
        == model.config.n_layer
    )
    assert peak < 1.5 * weights, f"peak {peak / 2**20:.0f} MiB for {weights / 2**20:.0f} MiB of weights"
