"""Qwen2's sliding window on some layers only: ours windows exactly the layers that transformers'
``Qwen2ForCausalLM`` windows (``max_window_layers``, or a newer file's ``layer_types``), in both of its attention
implementations, and exports the same; a per-layer window no Hugging Face class represents is refused."""

import dataclasses
import json

import pytest
import torch
from test_llama import FULL, QWEN2_WINDOW, SLIDING, _hf, _ids, _logits

from lit_transformers.models import GPT, GPTConfig

transformers = pytest.importorskip("transformers")

LAYOUTS = {  # name: (Qwen2Config keys for three layers, the windowed layers)
    "from_max_window_layers": ({"max_window_layers": 1}, [False, True, True]),
    "from_layer_types": ({"layer_types": [SLIDING, FULL, SLIDING]}, [True, False, True]),
}


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_qwen2_windows_only_the_layers_transformers_windows(tmp_path, layout, attention):
    keys, windowed = LAYOUTS[layout]
    hf = _hf("qwen2", num_hidden_layers=3, **QWEN2_WINDOW, **keys)
    hf.set_attn_implementation(attention)
    hf.save_pretrained(tmp_path)
    ours = GPT.from_hf(tmp_path).eval()
    window = QWEN2_WINDOW["sliding_window"]
    assert [block.attn.sliding_window for block in ours.blocks] == [window if w else None for w in windowed]
    ids = _ids(20)  # longer than the window
    expected = _logits(hf, ids)
    torch.testing.assert_close(_logits(ours, ids), expected, atol=1e-4, rtol=0)
    # windowing every layer, or none, computes something else at this length: the parity sees a layer's window
    for alike in ({"layer_types": None}, {"layer_types": None, "sliding_window": None}):
        other = GPT(dataclasses.replace(ours.config, **alike)).eval()
        other.load_state_dict(ours.state_dict())
        assert (_logits(other, ids) - expected).abs().max() > 1e-3


def _qwen2_config(**window) -> GPTConfig:
    qwen2 = {"bias": False, "qkv_bias": True, "norm": "rmsnorm", "gated_mlp": True, "activation": "silu"}
    return GPTConfig(
        vocab_size=61, block_size=32, n_layer=3, n_head=4, d_model=32, position="rope", **qwen2, **window
    )


def test_export_writes_max_window_layers_for_transformers_without_layer_types(tmp_path):
    GPT(_qwen2_config(sliding_window=5, layer_types=[FULL, SLIDING, SLIDING])).to_hf(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["use_sliding_window"] and saved["layer_types"] == [FULL, SLIDING, SLIDING]
    # transformers before layer_types derived the windowed layers from max_window_layers alone
    older = {key: saved[key] for key in ("use_sliding_window", "sliding_window", "max_window_layers")}
    assert transformers.Qwen2Config(num_hidden_layers=3, **older).layer_types == saved["layer_types"]


@pytest.mark.parametrize(
    "window,refusal",
    [
        ({"sliding_window": 5, "layer_types": [FULL, SLIDING]}, "must name each of the n_layer=3 layers"),
        (
            {"sliding_window": 5, "layer_types": [FULL, "chunked_attention", FULL]},
            r"not \['chunked_attention'\]",
        ),
        ({"layer_types": [FULL, SLIDING, SLIDING]}, "with sliding_window set"),
    ],
)
def test_layer_types_that_do_not_fit_are_refused(window, refusal):
    with pytest.raises(ValueError, match=refusal):
        GPT(_qwen2_config(**window))


def test_a_window_on_some_layers_without_qwen2s_biases_is_refused_on_export():
    llama = dataclasses.replace(
        _qwen2_config(sliding_window=5, layer_types=[FULL, SLIDING, SLIDING]), qkv_bias=None
    )
    with pytest.raises(ValueError, match="a window on some layers only.*set qkv_bias=true bias=false"):
        GPT(llama).to_hf()
