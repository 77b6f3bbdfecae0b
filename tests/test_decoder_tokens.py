"""A decoder's special tokens as its Hub tokenizer has them: ``GPT.to_hf(dir, tokenizer)`` writes the tokenizer's
bos/eos/pad ids into config.json (and its end-of-turn ids into generation_config.json), and ``sample`` prompts a
tokenizer without BOS (Qwen2's) with its ids alone, as transformers tokenizes them."""

from types import SimpleNamespace

import pytest
import torch
from test_llama import _hf

from lit_transformers.models import GPT, GPTConfig
from lit_transformers.tasks import CausalLMTask
from lit_transformers.text import Tokenizer

from test_hub_tokenizers import _chatml, _llama3

transformers = pytest.importorskip("transformers")
LAYOUTS = {"chatml": _chatml, "llama3": _llama3}  # Qwen2-style (no BOS) and Llama-3-style (no pad)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_to_hf_with_the_tokenizer_writes_its_special_ids_that_transformers_reads(tmp_path, layout):
    hf_tokenizer = LAYOUTS[layout](tmp_path / "tokenizer")
    tokenizer = Tokenizer.from_file(tmp_path / "tokenizer")
    llama = {"bias": False, "activation": "silu", "position": "rope", "norm": "rmsnorm", "gated_mlp": True}
    config = GPTConfig(vocab_size=len(hf_tokenizer), block_size=32, n_layer=1, n_head=2, d_model=16, **llama)
    GPT(config).to_hf(tmp_path / "model", tokenizer)
    written = transformers.AutoConfig.from_pretrained(tmp_path / "model")
    assert (written.bos_token_id, written.eos_token_id) == (
        hf_tokenizer.bos_token_id,
        hf_tokenizer.eos_token_id,
    )
    # a tokenizer without a pad token pads with its EOS (TRL's rule, which Tokenizer.from_file applies)
    pad = hf_tokenizer.eos_token_id if hf_tokenizer.pad_token_id is None else hf_tokenizer.pad_token_id
    assert written.pad_token_id == pad
    stops = transformers.GenerationConfig.from_pretrained(tmp_path / "model").eos_token_id
    expected = ["<|im_end|>"] if layout == "chatml" else ["<|eot_id|>", "<|end_of_text|>"]
    assert sorted(stops) == sorted(hf_tokenizer.convert_tokens_to_ids(expected))


def test_sampling_prompts_with_a_tokenizer_without_bos_continues_them_as_transformers_generate(tmp_path):
    hf_tokenizer = _chatml(tmp_path)  # Qwen2's: no BOS
    hf = _hf("qwen2", vocab_size=len(hf_tokenizer))
    hf.save_pretrained(tmp_path)
    task = CausalLMTask(model={}, init_from_hf=str(tmp_path), optimizer={})
    task.data = SimpleNamespace(tokenizer=Tokenizer.from_file(tmp_path))
    task.configure_model()
    prompts = ["A man is eating", "The quick brown fox"]
    got = task.sample(prompts, max_new_tokens=6, temperature=0)
    assert all(got)  # it generated text, not an end of turn at once
    for prompt, text in zip(prompts, got):
        ids = hf_tokenizer(prompt, return_tensors="pt").input_ids  # the prompt's tokens alone, nothing before
        with torch.no_grad():
            out = hf.generate(ids, do_sample=False, max_new_tokens=6, eos_token_id=hf_tokenizer.eos_token_id)
        assert text == hf_tokenizer.decode(out[0, ids.size(1) :], skip_special_tokens=True)
