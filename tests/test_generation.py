"""generate(): HF greedy parity, batched left padding, EOS (one id or several), top-k/top-p filtering,
temperature."""

import pytest
import torch

from lit_transformers.models import GPT, GPTConfig
from lit_transformers.nn import generate, sample_next, truncate_after_eos
from lit_transformers.text import left_pad

transformers = pytest.importorskip("transformers")
V, PAD, EOS = 61, 0, 1


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=V, block_size=64, n_layer=2, n_head=4, d_model=32)
    model = GPT(config).eval()
    with torch.no_grad():  # a peakier next-token distribution than the 0.02 init gives
        model.tok_emb.weight.normal_(0, 0.5)
    return model


def _prompts():
    g = torch.Generator().manual_seed(4)
    return [torch.randint(2, V, (n,), generator=g).tolist() for n in (9, 3, 6)]


def test_greedy_matches_hf_generate(model):
    hf = model.to_hf()
    ids = torch.tensor([_prompts()[0]])
    expected = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=20,
        do_sample=False,
        pad_token_id=PAD,
        eos_token_id=None,
    )
    for use_cache in (True, False):
        got = generate(model, ids, max_new_tokens=20, temperature=0, use_cache=use_cache)
        assert torch.equal(got, expected)


def test_batched_left_padded_prompts_continue_as_if_alone(model):
    prompts = _prompts()
    ids, valid = left_pad(prompts, PAD)
    assert ids.shape == (3, 9) and valid.sum(1).tolist() == [9, 3, 6]
    for use_cache in (True, False):
        batch = generate(model, ids, valid, max_new_tokens=15, temperature=0, use_cache=use_cache)
        for row, prompt in enumerate(prompts):
            alone = generate(model, torch.tensor([prompt]), max_new_tokens=15, temperature=0)
            assert batch[row, ids.size(1) :].tolist() == alone[0, len(prompt) :].tolist()


def test_batched_left_padded_greedy_matches_hf(model):
    hf = model.to_hf()
    ids, valid = left_pad(_prompts(), PAD)
    expected = hf.generate(
        ids,
        attention_mask=valid.long(),
        max_new_tokens=12,
        do_sample=False,
        pad_token_id=PAD,
        eos_token_id=None,
    )
    assert torch.equal(generate(model, ids, valid, max_new_tokens=12, temperature=0), expected)


def test_stops_at_eos_and_pads_finished_rows(model):
    prompts = _prompts()
    ids, valid = left_pad(prompts, PAD)
    free = generate(model, ids, valid, max_new_tokens=10, temperature=0)[:, ids.size(1) :]
    eos = free[0, 2].item()  # pretend row 0's third generated token is EOS
    out = generate(model, ids, valid, max_new_tokens=10, temperature=0, eos_id=eos, pad_id=PAD)
    new = out[:, ids.size(1) :]
    for row in range(3):
        hits = (free[row] == eos).nonzero()
        stop = hits[0].item() + 1 if len(hits) else new.size(1)
        assert new[row, :stop].tolist() == free[row, :stop].tolist()  # identical up to and including EOS
        assert torch.all(new[row, stop:] == PAD)
    # the loop ends as soon as every row has finished
    first = (free[0] == eos).nonzero()[0].item()
    single = generate(model, ids[:1], valid[:1], max_new_tokens=10, temperature=0, eos_id=eos, pad_id=PAD)
    assert single.size(1) == ids.size(1) + first + 1 and single[0, -1].item() == eos


def test_stops_at_any_end_of_turn_id_as_hf_generate_with_several_eos_ids(model):
    ids, valid = left_pad(_prompts(), PAD)
    free = generate(model, ids, valid, max_new_tokens=10, temperature=0)[:, ids.size(1) :]
    # two end-of-turn ids (as <|im_end|> and EOS): row 0 stops at the second one, row 1 at the first
    stops = [free[1, 4].item(), free[0, 2].item()]
    assert stops[0] != stops[1]
    expected = model.to_hf().generate(
        ids,
        attention_mask=valid.long(),
        max_new_tokens=10,
        do_sample=False,
        pad_token_id=PAD,
        eos_token_id=stops,
    )
    got = generate(model, ids, valid, max_new_tokens=10, temperature=0, eos_id=stops, pad_id=PAD)
    assert torch.equal(got, expected)
    responses, mask, has_eos = truncate_after_eos(got[:, ids.size(1) :], stops, PAD)
    for row, ended in enumerate(has_eos.tolist()):
        hits = [i for i, token in enumerate(free[row].tolist()) if token in stops]
        assert ended == bool(hits) and mask[row].sum().item() == (hits[0] + 1 if hits else free.size(1))


def test_temperature_zero_is_greedy_and_sampling_is_seeded(model):
    ids = torch.tensor([_prompts()[1]])
    greedy = generate(model, ids, max_new_tokens=8, temperature=0)
    assert torch.equal(greedy, generate(model, ids, max_new_tokens=8, temperature=0, top_k=3, top_p=0.5))
    logits = torch.randn(4, V)
    assert torch.equal(sample_next(logits, temperature=0), logits.argmax(-1))
    # top_k=1 leaves only the argmax, whatever the temperature
    assert torch.equal(sample_next(logits, temperature=5.0, top_k=1), logits.argmax(-1))
    a = generate(model, ids, max_new_tokens=8, temperature=1.0, generator=torch.Generator().manual_seed(7))
    b = generate(model, ids, max_new_tokens=8, temperature=1.0, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


def _support(logits, n=3000, **kw):
    draws = sample_next(logits.expand(n, -1), generator=torch.Generator().manual_seed(0), **kw)
    return set(draws.tolist())


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.tensor([[1.0, 3.0, 0.5, 2.0, -1.0, 2.5]])
    assert _support(logits, top_k=3) == {1, 3, 5}  # logits 3.0, 2.5, 2.0
    assert _support(logits, top_k=1) == {1}


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.05, 0.4, 0.1, 0.3, 0.15]])
    logits = probs.log()
    # sorted: 0.4 (id 1), 0.3 (id 3), 0.15 (id 4), 0.1, 0.05; cumulative 0.4, 0.7, 0.85, 0.95, 1.0
    assert _support(logits, top_p=0.35) == {1}  # 0.4 alone reaches 0.35
    assert _support(logits, top_p=0.6) == {1, 3}  # 0.4 < 0.6 <= 0.7
    assert _support(logits, top_p=0.8) == {1, 3, 4}
    assert _support(logits, top_p=0.9) == {1, 3, 4, 2}
    # top-k first, then top-p renormalised over the survivors: {1: 0.4, 3: 0.3} -> (0.571, 0.429)
    assert _support(logits, top_k=2, top_p=0.55) == {1}
    assert _support(logits, top_k=2, top_p=0.6) == {1, 3}


def test_sampling_frequencies_follow_the_filtered_distribution():
    probs = torch.tensor([[0.05, 0.4, 0.1, 0.3, 0.15]])
    draws = sample_next(probs.log().expand(20000, -1), top_p=0.8, generator=torch.Generator().manual_seed(1))
    freq = torch.bincount(draws, minlength=5).float() / draws.numel()
    expected = torch.tensor([0.0, 0.4, 0.0, 0.3, 0.15]) / 0.85
    torch.testing.assert_close(freq, expected, atol=0.015, rtol=0)
    # temperature 2 flattens: p ~ probs ** (1/2)
    draws = sample_next(
        probs.log().expand(20000, -1), temperature=2.0, generator=torch.Generator().manual_seed(2)
    )
    freq = torch.bincount(draws, minlength=5).float() / draws.numel()
    torch.testing.assert_close(freq, probs[0].sqrt() / probs[0].sqrt().sum(), atol=0.015, rtol=0)


def test_left_pad_rejects_empty_prompts():
    with pytest.raises(ValueError, match="at least one token"):
        left_pad([[3], []], PAD)


def test_kv_cache_is_on_by_default_and_respects_block_size(model):
    calls = []
    hook = model.blocks[0].register_forward_pre_hook(lambda m, args: calls.append(args[0].size(1)))
    try:
        generate(model, torch.tensor([[5, 6, 7]]), max_new_tokens=4, temperature=0)
    finally:
        hook.remove()
    assert calls == [3, 1, 1, 1]  # prefill, then one token per step
    with pytest.raises(ValueError, match="block_size"):
        generate(model, torch.tensor([[5] * 60]), max_new_tokens=10)


def test_generation_can_fill_the_whole_context(model):
    ids = torch.tensor([[5] * 54])
    out = generate(model, ids, max_new_tokens=10, temperature=0)  # 54 + 10 = block_size 64
    assert out.shape == (1, 64)
    assert torch.equal(out, generate(model, ids, max_new_tokens=10, temperature=0, use_cache=False))


@pytest.mark.parametrize("settings", [{"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -2}])
def test_invalid_sampling_settings_are_rejected(settings):
    with pytest.raises(ValueError, match="Invalid sampling settings"):
        sample_next(torch.zeros(1, 5), **{"temperature": 1.0, **settings})


def test_generated_tokens_can_feed_a_training_forward(model):
    # PPO scores its own rollouts with gradients: generate() must not hand back inference-mode tensors
    out = generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=4, temperature=0)
    assert not out.is_inference()
    model(out).logsumexp(-1).mean().backward()
    assert model.tok_emb.weight.grad is not None
    model.zero_grad()
