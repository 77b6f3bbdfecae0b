"""Seq2SeqTransformer: parity with torch.nn.Transformer and Hugging Face Marian (from_hf / to_hf, greedy
decoding), cross-attention and causality, the label-smoothed loss, and beam search against exhaustive search."""

import copy
import itertools
import math

import pytest
import torch
from torch import nn

from lit_transformers.models import Seq2SeqConfig, Seq2SeqTransformer
from lit_transformers.models.seq2seq import SourceDecoder
from lit_transformers.nn import IGNORE_INDEX, token_cross_entropy
from lit_transformers.nn.beam import beam_search

PAD, BOS, EOS = 0, 1, 2
TINY = dict(
    vocab_size=50,
    max_len=64,
    n_encoder_layer=2,
    n_decoder_layer=2,
    n_head=4,
    d_model=32,
    d_ff=64,
    dropout=0.0,
    pad_id=PAD,
    bos_id=BOS,
    eos_id=EOS,
)


def _model(seed=0, **overrides) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(Seq2SeqConfig(**{**TINY, **overrides}))
    with (
        torch.no_grad()
    ):  # our init sets biases and LayerNorms to 0/1; random values make every mapping visible
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.normal_(1.0 if ".ln_" in name else 0.0, 0.1)
    return model.eval()


def _sources(lengths, vocab_size, seed=1):
    """Right-padded random sources (B, max length) of real tokens (none of PAD/BOS/EOS) and their mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size, (len(lengths), max(lengths)), generator=g)
    valid = torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~valid, PAD), valid


# ---- parity with torch.nn.Transformer ----------------------------------------------------------------------


def _paper_positions(max_len: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), as the paper writes it."""
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    for pos in range(max_len):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            table[pos, 2 * i], table[pos, 2 * i + 1] = math.sin(angle), math.cos(angle)
    return table.float()


def _torch_transformer_copy(model: Seq2SeqTransformer) -> nn.Transformer:
    c = model.config
    reference = nn.Transformer(
        c.d_model, c.n_head, c.n_encoder_layer, c.n_decoder_layer, c.d_ff, dropout=0.0, batch_first=True
    )
    # nn.Transformer ends each stack with a LayerNorm that a post-norm model does not have
    reference.encoder.norm, reference.decoder.norm = nn.Identity(), nn.Identity()
    ours = model.state_dict()
    theirs = {}
    for stack in ("encoder", "decoder"):
        for i in range(len(getattr(reference, stack).layers)):
            p, q = f"{stack}.layers.{i}.", f"{stack}.{i}."
            for part in ("weight", "bias"):
                theirs[f"{p}self_attn.in_proj_{part}"] = ours[f"{q}attn.qkv_proj.{part}"]
                theirs[f"{p}self_attn.out_proj.{part}"] = ours[f"{q}attn.out_proj.{part}"]
                theirs[f"{p}linear1.{part}"] = ours[f"{q}mlp.fc.{part}"]
                theirs[f"{p}linear2.{part}"] = ours[f"{q}mlp.proj.{part}"]
                theirs[f"{p}norm1.{part}"] = ours[f"{q}ln_1.{part}"]
                if stack == "encoder":
                    theirs[f"{p}norm2.{part}"] = ours[f"{q}ln_2.{part}"]
                    continue
                theirs[f"{p}multihead_attn.in_proj_{part}"] = torch.cat(
                    [ours[f"{q}cross_attn.q_proj.{part}"], ours[f"{q}cross_attn.kv_proj.{part}"]]
                )
                theirs[f"{p}multihead_attn.out_proj.{part}"] = ours[f"{q}cross_attn.out_proj.{part}"]
                theirs[f"{p}norm2.{part}"] = ours[f"{q}ln_cross.{part}"]
                theirs[f"{p}norm3.{part}"] = ours[f"{q}ln_2.{part}"]
    reference.load_state_dict(theirs, strict=True)
    return reference.eval()


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")  # nn.Transformer's padded fast path
def test_matches_torch_transformer_with_embeddings_and_paper_positions():
    model = _model(activation="relu", position="sinusoidal", norm_first=False, scale_embeddings=True)
    reference = _torch_transformer_copy(model)
    embedding = model.tgt_emb.weight.detach()  # shared by source, target and the output projection
    positions = _paper_positions(TINY["max_len"], TINY["d_model"])

    def embed(ids):
        return embedding[ids] * math.sqrt(TINY["d_model"]) + positions[: ids.size(1)]

    src, valid = _sources([9, 5, 7], TINY["vocab_size"])
    tgt, _ = _sources([6, 6, 6], TINY["vocab_size"], seed=2)
    tgt[:, 0] = BOS
    with torch.no_grad():
        hidden = reference(
            embed(src),
            embed(tgt),
            tgt_mask=nn.Transformer.generate_square_subsequent_mask(tgt.size(1)),
            src_key_padding_mask=~valid,
            memory_key_padding_mask=~valid,
            tgt_is_causal=True,
        )
        expected = hidden @ embedding.T
        torch.testing.assert_close(model(src, tgt, valid), expected, atol=1e-5, rtol=0)


# ---- Hugging Face Marian -------------------------------------------------------------------------------

MARIAN = dict(
    vocab_size=100,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=96,
    activation_function="swish",
    scale_embedding=True,
    dropout=0.0,
    pad_token_id=99,  # OPUS-MT: the last id is the pad, which also starts the decoder
    decoder_start_token_id=99,
    eos_token_id=0,
    forced_eos_token_id=None,  # ours does not force EOS at the length limit
)


def _marian(seed=0, **overrides):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(transformers.MarianConfig(**{**MARIAN, **overrides}))
    with torch.no_grad():  # HF initialises biases, LayerNorms and final_logits_bias to 0/1; randomise them
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.normal_(1.0 if "layer_norm" in name else 0.0, 0.1)
            elif "embed_positions" not in name:  # the sinusoidal table, which from_hf checks
                p.normal_(0.0, 0.15)
        model.final_logits_bias.normal_(0.0, 0.5)
    return model.eval()


def _marian_inputs(lengths=(7, 4), seed=1):
    """Right-padded sources of real tokens (not EOS 0 nor PAD 99), their mask, and decoder inputs."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, 99, (len(lengths), max(lengths)), generator=g)
    valid = torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]
    tgt = torch.randint(1, 99, (len(lengths), 6), generator=g)
    tgt[:, 0] = MARIAN["decoder_start_token_id"]
    return src.masked_fill(~valid, MARIAN["pad_token_id"]), valid, tgt


def _marian_logits(hf, src, valid, tgt):
    return hf(input_ids=src, attention_mask=valid.long(), decoder_input_ids=tgt).logits


@pytest.mark.parametrize("activation", ["swish", "gelu", "relu"])
def test_from_hf_model_object_matches_marian_logits(activation):
    hf = _marian(activation_function=activation)
    ours = Seq2SeqTransformer.from_hf(hf).eval()
    src, valid, tgt = _marian_inputs()
    with torch.no_grad():
        torch.testing.assert_close(
            ours(src, tgt, valid), _marian_logits(hf, src, valid, tgt), atol=1e-4, rtol=0
        )


def test_loss_with_labels_equals_marians_loss_through_the_logits_bias():
    hf = _marian()
    ours = Seq2SeqTransformer.from_hf(hf).eval()
    assert ours.output.bias is not None  # final_logits_bias, fused into the loss with the output layer
    src, valid, tgt = _marian_inputs()
    labels = torch.cat([tgt[:, 1:], torch.full((2, 1), IGNORE_INDEX)], dim=1)
    labels[1, 3:] = IGNORE_INDEX  # target padding
    with torch.no_grad():
        total, count = ours(src, tgt, valid, labels=labels)
        expected = hf(input_ids=src, attention_mask=valid.long(), decoder_input_ids=tgt, labels=labels).loss
    assert count == 5 + 3
    torch.testing.assert_close(total / count, expected, atol=1e-5, rtol=0)


def test_separate_vocabularies_and_untied_output_match_marian():
    hf = _marian(share_encoder_decoder_embeddings=False, decoder_vocab_size=120, tie_word_embeddings=False)
    ours = Seq2SeqTransformer.from_hf(hf).eval()
    assert (ours.config.src_vocab_size, ours.config.vocab_size) == (100, 120)
    assert ours.src_emb is not ours.tgt_emb and ours.output.weight is not ours.tgt_emb.weight
    src, valid, tgt = _marian_inputs()
    tgt[0, 3] = 110  # a target-only token
    with torch.no_grad():
        torch.testing.assert_close(
            ours(src, tgt, valid), _marian_logits(hf, src, valid, tgt), atol=1e-4, rtol=0
        )
        torch.testing.assert_close(
            _marian_logits(ours.to_hf(), src, valid, tgt), ours(src, tgt, valid), atol=1e-5, rtol=0
        )


@pytest.mark.parametrize("marian", ["hugging_face", "our_export"])
def test_greedy_translation_is_token_identical_to_marian_generate(marian, tmp_path):
    """Against a Marian built by transformers, and against ours exported with ``to_hf`` and reloaded (its
    saved generation config must not force EOS at the length limit, which ours does not do)."""
    hf = _marian(tie_word_embeddings=False)  # tied random embeddings mostly repeat the previous token
    with torch.no_grad():  # EOS likely enough that some translations end early and others at the length limit
        hf.final_logits_bias[0, MARIAN["eos_token_id"]] = 2.5
    ours = Seq2SeqTransformer.from_hf(hf).eval()
    if marian == "our_export":
        ours.to_hf(tmp_path)
        hf = type(hf).from_pretrained(tmp_path).eval()
    lengths, extra = [7, 3, 10, 5], 6
    src, valid, _ = _marian_inputs(lengths, seed=3)
    translations = ours.translate(src, valid, beam_size=1, max_extra_tokens=extra)
    expected = []
    for row, length in zip(src, lengths):  # one sentence at a time: Marian's length limit is per batch
        out = hf.generate(row[None, :length], num_beams=1, do_sample=False, max_new_tokens=length + extra)[
            0, 1:
        ].tolist()  # without the decoder start token
        expected.append(out[: out.index(MARIAN["eos_token_id"])] if MARIAN["eos_token_id"] in out else out)
    assert translations == expected
    stopped_early = [len(t) < n + extra for t, n in zip(translations, lengths)]
    assert any(stopped_early) and not all(stopped_early), "the test needs both EOS and length-limit stops"


def test_to_hf_round_trips_through_save_pretrained(tmp_path):
    ours = Seq2SeqTransformer.from_hf(_marian())
    hf = ours.to_hf(tmp_path)
    src, valid, tgt = _marian_inputs()
    with torch.no_grad():
        torch.testing.assert_close(
            _marian_logits(hf, src, valid, tgt), ours(src, tgt, valid), atol=1e-5, rtol=0
        )
        for reloaded in (Seq2SeqTransformer.from_hf(hf), Seq2SeqTransformer.from_hf(tmp_path)):
            assert reloaded.config == ours.config
            for (name, theirs), mine in zip(reloaded.state_dict().items(), ours.state_dict().values()):
                torch.testing.assert_close(theirs, mine, atol=0, rtol=0, msg=name)
            torch.testing.assert_close(
                reloaded.eval()(src, tgt, valid), ours(src, tgt, valid), atol=0, rtol=0
            )


def test_a_model_without_logits_bias_exports_with_marians_zero_final_logits_bias():
    ours = _model(position="sinusoidal_concat", activation="silu")
    assert ours.output.bias is None
    src, valid = _sources([8, 5], TINY["vocab_size"])
    tgt, _ = _sources([6, 6], TINY["vocab_size"], seed=2)
    with torch.no_grad():
        hf = ours.to_hf()
        assert not hf.final_logits_bias.any()
        torch.testing.assert_close(
            _marian_logits(hf, src, valid, tgt), ours(src, tgt, valid), atol=1e-5, rtol=0
        )


def test_from_hf_refuses_what_it_cannot_represent(tmp_path):
    transformers = pytest.importorskip("transformers")
    with pytest.raises(ValueError, match="decoder_attention_heads"):
        Seq2SeqTransformer.from_hf(_marian(decoder_attention_heads=2))
    config = transformers.MarianConfig(**MARIAN).to_dict() | {"normalize_before": True}
    with pytest.raises(ValueError, match="normalize_before"):
        Seq2SeqTransformer.from_hf(_marian(**config))
    tampered = _marian()
    with torch.no_grad():  # HF's [sin | cos] table is computed, not loaded: it must be the one ours computes
        tampered.model.decoder.embed_positions.weight[3, 0] += 0.1
    with pytest.raises(ValueError, match="embed_positions"):
        Seq2SeqTransformer.from_hf(tampered)
    with pytest.raises(FileNotFoundError, match="config.json"):
        Seq2SeqTransformer.from_hf(tmp_path)
    for overrides in (
        {"position": "sinusoidal"},
        {"position": "rope"},
        {"norm_first": True, "position": "sinusoidal_concat"},
    ):
        with pytest.raises(ValueError, match=next(iter(overrides))):
            _model(**overrides).to_hf()


# ---- what each position sees ----------------------------------------------------------------------------


def test_cross_attention_reads_real_source_tokens_only():
    model = _model()
    src, valid = _sources([8, 5], TINY["vocab_size"])
    tgt, _ = _sources([6, 6], TINY["vocab_size"], seed=2)
    with torch.no_grad():
        logits = model(src, tgt, valid)
        changed = src.clone()
        changed[:, 3] = changed[:, 3] % (TINY["vocab_size"] - 3) + 3  # another real token
        assert ((model(changed, tgt, valid) - logits).abs().amax(dim=-1) > 1e-3).all()
        padding_changed = src.clone()
        padding_changed[1, 5:] = 7  # behind the mask
        torch.testing.assert_close(model(padding_changed, tgt, valid), logits, atol=1e-6, rtol=0)


@pytest.mark.parametrize("t", [1, 3, 5])
def test_target_positions_do_not_see_later_targets(t):
    model = _model()
    src, valid = _sources([8, 5], TINY["vocab_size"])
    tgt, _ = _sources([6, 6], TINY["vocab_size"], seed=2)
    changed = tgt.clone()
    changed[:, t] = changed[:, t] % (TINY["vocab_size"] - 3) + 3
    with torch.no_grad():
        logits, changed_logits = model(src, tgt, valid), model(src, changed, valid)
    torch.testing.assert_close(changed_logits[:, :t], logits[:, :t], atol=1e-6, rtol=0)
    assert ((changed_logits[:, t:] - logits[:, t:]).abs().amax(dim=-1) > 1e-3).all()


# ---- label-smoothed loss -------------------------------------------------------------------------------


def test_label_smoothed_loss_equals_hand_computation_and_ignores_padding():
    eps, V = 0.1, 5
    logits = torch.randn(2, 3, V, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[1, 4, IGNORE_INDEX], [0, IGNORE_INDEX, IGNORE_INDEX]])
    expected = 0.0
    for b, t in itertools.product(range(2), range(3)):
        if labels[b, t] == IGNORE_INDEX:
            continue
        logp = logits[b, t].double().log_softmax(dim=-1)
        expected += (1 - eps) * -logp[labels[b, t]] + eps * (-logp).sum() / V
    total, count = token_cross_entropy(logits, labels, label_smoothing=eps)
    assert count == 3
    torch.testing.assert_close(total.double(), expected, atol=1e-5, rtol=0)
    logits[labels == IGNORE_INDEX] = 1e4  # anything at padding positions
    torch.testing.assert_close(token_cross_entropy(logits, labels, label_smoothing=eps)[0], total)


# ---- beam search ----------------------------------------------------------------------------------------


def _beam_translations(model, src, valid, beam_size, alpha, max_extra_tokens=50):
    """beam_search called directly (translate sends beam 1 to the greedy loop): (hypotheses, scores)."""
    max_new = valid.sum(dim=1) + max_extra_tokens
    decoder = SourceDecoder(model, model.encode(src, valid), valid, beams=beam_size)
    c = model.config
    out, scores = beam_search(decoder, src.size(0), c.bos_id, c.eos_id, c.pad_id, max_new, beam_size, alpha)
    hypotheses = [row[: row.index(EOS)] if EOS in row else row for row in out[:, 1:].tolist()]
    return [h[:limit] for h, limit in zip(hypotheses, max_new.tolist())], scores


def _penalised_scores(model64, src, hypotheses, alpha, limit) -> list[float]:
    """log P(hypothesis + EOS unless it stopped at the limit | src) / ((5 + |Y|) / 6)^alpha of each hypothesis,
    |Y| counting the EOS, teacher-forced in one batch by a float64 copy of the model (a causal decoder's logits
    at a position do not depend on the filler after it)."""
    targets = [h if len(h) == limit else [*h, EOS] for h in hypotheses]
    padded = torch.tensor([t + [EOS] * (limit - len(t)) for t in targets])
    inputs = torch.cat([torch.full((len(targets), 1), BOS), padded[:, :-1]], dim=1)
    with torch.no_grad():
        logp = model64(src.expand(len(targets), -1), inputs).log_softmax(dim=-1)
    token_logp = logp.gather(2, padded[:, :, None])[..., 0]
    return [token_logp[i, : len(t)].sum().item() / ((5 + len(t)) / 6) ** alpha for i, t in enumerate(targets)]


def _model_with_eos_bias(eos_bias: float, seed=0, **overrides):
    """A random model whose EOS logit is raised so that some hypotheses end before the length limit (untied:
    tied random embeddings mostly repeat the previous token)."""
    model = _model(seed, output_bias=True, tie_output=False, **overrides)
    with torch.no_grad():
        model.output.bias[EOS] = eos_bias
    return model


def test_beam_of_one_is_greedy_without_length_penalty_and_never_worse_with_it():
    model = _model_with_eos_bias(2.7)
    model64 = copy.deepcopy(model).double()
    lengths, extra = [6, 3, 9, 4, 7], 5
    src, valid = _sources(lengths, TINY["vocab_size"])
    greedy = model.translate(src, valid, beam_size=1, max_extra_tokens=extra)
    assert any(len(g) < n + extra for g, n in zip(greedy, lengths)), "no hypothesis ended in EOS"
    assert _beam_translations(model, src, valid, 1, alpha=0.0, max_extra_tokens=extra)[0] == greedy
    beam, _ = _beam_translations(model, src, valid, 1, alpha=0.6, max_extra_tokens=extra)
    for row, n, g, b in zip(src, lengths, greedy, beam):
        beam_score, greedy_score = _penalised_scores(model64, row[None, :n], [b, g], 0.6, n + extra)
        assert b == g or beam_score > greedy_score


@pytest.mark.parametrize(
    "seed, output_scale, eos_bias, narrow_beam_misses",
    [(1, 1.0, 0.5, False), (3, 0.5, 0.0, True)],  # optima of 1 and 0 words; one a beam of 2 misses
)
def test_wide_beam_finds_the_exhaustive_search_optimum(seed, output_scale, eos_bias, narrow_beam_misses):
    """Vocabulary PAD, BOS, EOS and one word; hypotheses of at most 4 tokens: every sequence of the 3 non-EOS
    tokens of length 0-3 followed by EOS, and every one of length 4 without (1 + 3 + 9 + 27 + 81 = 121)."""
    alpha, limit = 0.6, 4
    # large learned positions make the next-token distribution depend on the position, as EOS does in real
    # translations; scaling the output down flattens it so that greedy choices can be wrong
    model = _model_with_eos_bias(eos_bias, seed, vocab_size=4, max_len=8, position="learned")
    with torch.no_grad():
        model.pos_emb.weight.normal_(0.0, 2.0)
        model.output.weight *= output_scale
    model64 = copy.deepcopy(model).double()
    src = torch.tensor([[3, 3], [3, 0], [0, 3], [3, 1]])  # any ids but EOS: the sources only have to differ
    valid = torch.ones_like(src, dtype=torch.bool)
    continuing = [t for t in range(4) if t != EOS]
    hypotheses = [list(h) for n in range(limit + 1) for h in itertools.product(continuing, repeat=n)]
    assert len(hypotheses) == 121
    beam, scores = _beam_translations(model, src, valid, len(hypotheses), alpha, max_extra_tokens=limit - 2)
    for i, row in enumerate(src):
        ranked = sorted(
            zip(_penalised_scores(model64, row[None], hypotheses, alpha, limit), hypotheses), reverse=True
        )
        (best, optimum), (runner_up, _) = ranked[:2]
        assert best - runner_up > 1e-3, "pick another seed: the optimum is not unique at float32 precision"
        assert beam[i] == optimum
        assert scores[i].item() == pytest.approx(best, abs=1e-5)
    narrow, _ = _beam_translations(model, src, valid, 2, alpha, max_extra_tokens=limit - 2)
    assert (narrow != beam) == narrow_beam_misses


def test_batched_beam_search_equals_one_sentence_at_a_time():
    model = _model_with_eos_bias(1.9)
    lengths = [6, 3, 9, 4]
    src, valid = _sources(lengths, TINY["vocab_size"])
    batched = model.translate(src, valid, beam_size=4, max_extra_tokens=5)
    alone = [
        model.translate(row[None, :n], beam_size=4, max_extra_tokens=5)[0] for row, n in zip(src, lengths)
    ]
    assert batched == alone
    assert len({len(h) for h in batched}) > 1, "hypotheses of one length would not test the padding"


@pytest.mark.parametrize("beam_size", [1, 4])
def test_cached_decoding_equals_uncached(beam_size):
    model = _model_with_eos_bias(1.9)
    src, valid = _sources([6, 3, 9, 4], TINY["vocab_size"])
    cached = model.translate(src, valid, beam_size=beam_size, max_extra_tokens=5)
    assert model.translate(src, valid, beam_size=beam_size, max_extra_tokens=5, use_cache=False) == cached
