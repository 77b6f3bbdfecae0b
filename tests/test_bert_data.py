"""BERT inputs: masking statistics, next-sentence pairs, sentence splitting, WordPiece, the linear schedule."""

import random

import pytest
import torch

from lit_transformers.nn import IGNORE_INDEX
from lit_transformers.tasks import warmup_linear
from lit_transformers.text import Tokenizer, build_nsp_pairs, mask_tokens, pack_pair, split_sentences

MASK, VOCAB = 4, 1000


def _batch(B=64, T=128, seed=0):
    """Ids >= 10 (specials are 0..4), [CLS]=2 at 0, [SEP]=3 at the end of the real tokens, padding 0."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, VOCAB, (B, T), generator=g)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    valid = torch.arange(T)[None] < lengths[:, None]
    ids[:, 0] = 2
    ids[torch.arange(B), lengths - 1] = 3
    ids[~valid] = 0
    eligible = valid & (ids >= 10)
    return ids, eligible


def test_bert_masking_selects_15_percent_with_80_10_10_split():
    ids, eligible = _batch()
    selected = changed_mask = changed_random = kept = n_eligible = 0
    for seed in range(20):
        corrupted, labels = mask_tokens(ids, eligible, MASK, VOCAB, torch.Generator().manual_seed(seed))
        chosen = labels != IGNORE_INDEX
        assert not (chosen & ~eligible).any()  # special tokens and padding never selected
        assert torch.equal(labels[chosen], ids[chosen])  # labels are the original tokens...
        assert torch.equal(corrupted[~chosen], ids[~chosen])  # ...and nothing else is touched
        selected += chosen.sum().item()
        n_eligible += eligible.sum().item()
        changed_mask += (chosen & (corrupted == MASK)).sum().item()
        kept += (chosen & (corrupted == ids)).sum().item()
        changed_random += (chosen & (corrupted != MASK) & (corrupted != ids)).sum().item()
    assert selected / n_eligible == pytest.approx(0.15, abs=0.005)
    assert changed_mask / selected == pytest.approx(0.8, abs=0.02)
    assert changed_random / selected == pytest.approx(0.1, abs=0.015)  # (a random draw equal to the original
    assert kept / selected == pytest.approx(0.1, abs=0.015)  # counts as kept: 1 in 1000)


def test_masking_is_seeded_and_every_row_gets_its_share():
    ids, eligible = _batch(B=8)
    a = mask_tokens(ids, eligible, MASK, VOCAB, torch.Generator().manual_seed(1))
    b = mask_tokens(ids, eligible, MASK, VOCAB, torch.Generator().manual_seed(1))
    c = mask_tokens(ids, eligible, MASK, VOCAB, torch.Generator().manual_seed(2))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[1], c[1])  # another draw, other positions (dynamic masking)
    per_row = (a[1] != IGNORE_INDEX).sum(1)
    expected = (eligible.sum(1) * 0.15).round().long()
    assert torch.equal(per_row, expected)


def test_max_predictions_caps_and_whole_word_masking_takes_every_piece():
    ids, eligible = _batch(B=32)
    _, labels = mask_tokens(ids, eligible, MASK, VOCAB, torch.Generator().manual_seed(0), max_predictions=5)
    assert (labels != IGNORE_INDEX).sum(1).max() <= 5
    # words of 1-3 pieces: a word is selected entirely or not at all
    g = torch.Generator().manual_seed(3)
    word_starts = torch.rand(ids.shape, generator=g) < 0.5
    word_starts[:, 0] = True
    word = word_starts.long().cumsum(1)
    for seed in range(5):
        _, labels = mask_tokens(
            ids, eligible, MASK, VOCAB, torch.Generator().manual_seed(seed), word_starts=word_starts
        )
        chosen = labels != IGNORE_INDEX
        assert chosen.any()
        for b in range(ids.size(0)):
            for w in word[b][chosen[b]].unique():
                pieces = (word[b] == w) & eligible[b]
                assert chosen[b][pieces].all(), "a word was masked partially"
        assert (chosen.sum(1) <= (eligible.sum(1) * 0.15).round()).all()


def _documents(n_docs=30, seed=0):
    """Documents of sentences whose tokens name their (document, sentence): checkable provenance."""
    rng = random.Random(seed)
    return [[[1000 * d + s] * rng.randint(3, 12) for s in range(rng.randint(5, 25))] for d in range(n_docs)]


def test_nsp_pairs_are_half_next_consecutive_or_from_another_document_and_fit():
    docs, max_len = _documents(), 64
    pairs = [p for seed in range(5) for p in build_nsp_pairs(docs, max_len, random.Random(seed))]
    share = sum(p.is_next for p in pairs) / len(pairs)
    assert 0.42 < share < 0.58, share
    for p in pairs:
        assert p.a and p.b
        assert len(p.a) + len(p.b) + 3 <= max_len
        doc_a, a_first, a_end = p.a_span
        doc_b, b_first, b_end = p.b_span
        # every token comes from the sentences its span names (truncation only trims the ends)
        assert {divmod(t, 1000) for t in p.a} <= {(doc_a, s) for s in range(a_first, a_end)}
        assert {divmod(t, 1000) for t in p.b} <= {(doc_b, s) for s in range(b_first, b_end)}
        if p.is_next:  # B continues A in the same document
            assert doc_b == doc_a and b_first == a_end
        else:
            assert doc_b != doc_a
    ids, types = pack_pair(pairs[0].a, pairs[0].b, cls_id=2, sep_id=3)
    n_a = len(pairs[0].a)
    assert ids[0] == 2 and ids[n_a + 1] == 3 and ids[-1] == 3
    assert types == [0] * (n_a + 2) + [1] * (len(pairs[0].b) + 1)


def test_pack_pair_single_segment_and_longest_first_truncation():
    assert pack_pair([7, 8], None, 2, 3) == ([2, 7, 8, 3], [0, 0, 0, 0])
    ids, types = pack_pair(list(range(10, 20)), [30, 31, 32], 2, 3, max_len=10)
    assert ids == [2, 10, 11, 12, 13, 3, 30, 31, 32, 3]  # the longer segment lost its tail
    assert types == [0] * 6 + [1] * 4
    assert pack_pair(list(range(10, 30)), None, 2, 3, max_len=6)[0] == [2, 10, 11, 12, 13, 3]


def test_nsp_short_sequences_and_truncation():
    docs = _documents(seed=1)
    long = build_nsp_pairs(docs, 64, random.Random(0), short_seq_prob=0.0)
    short = build_nsp_pairs(docs, 64, random.Random(0), short_seq_prob=1.0)
    mean = lambda ps: sum(len(p.a) + len(p.b) for p in ps) / len(ps)  # noqa: E731
    assert mean(short) < 0.8 * mean(long)
    # one very long sentence per document: truncated from both ends, never beyond max_seq_len
    huge = [[[1000 * d + s] * 200 for s in range(2)] for d in range(3)]
    for p in build_nsp_pairs(huge, 32, random.Random(0)):
        assert len(p.a) + len(p.b) + 3 <= 32


def test_nsp_needs_two_documents():
    with pytest.raises(ValueError, match="at least two documents"):
        build_nsp_pairs([[[1, 2], [3, 4]]], 32, random.Random(0))


def test_sentence_splitting_is_rule_based_and_deterministic():
    text = (
        'The for statement loops. It ends! Does it? "Yes." (Maybe.) 3 more\n\nA new   paragraph\nwraps lines.'
    )
    assert split_sentences(text) == [
        "The for statement loops.",
        "It ends!",
        "Does it?",
        '"Yes."',
        "(Maybe.)",
        "3 more",
        "A new paragraph wraps lines.",
    ]
    assert split_sentences("e.g. os.path.join(a, b) is a call.") == ["e.g. os.path.join(a, b) is a call."]


def test_wordpiece_tokenizer_with_bert_special_tokens(tmp_path):
    texts = ["The quick brown fox jumps over the lazy dog. Déjà vu!"] * 20
    tok = Tokenizer.train(texts, kind="wordpiece", vocab_size=120, lowercase=True)
    assert [tok.special_id(r) for r in ("pad", "unk", "cls", "sep", "mask")] == [0, 1, 2, 3, 4]
    ids = tok.encode("The QUICK fox. Deja vu")
    assert tok.decode(ids) == "the quick fox. deja vu"  # lowercased, accents stripped
    assert tok.special_id("cls") not in ids  # specials are added by the datamodule, not encode()
    tok.save(tmp_path / "tokenizer.json")
    assert Tokenizer.from_file(tmp_path / "tokenizer.json") == tok  # BERT roles recognised from [CLS]
    assert Tokenizer.from_file(tmp_path).encode("lazy dog") == tok.encode("lazy dog")  # a directory


def test_vocab_txt_of_a_hugging_face_bert_matches_its_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    words = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "the",
        "for",
        "state",
        "##ment",
        "loop",
        "##s",
        ".",
        ",",
    ]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    hf = transformers.BertTokenizer(str(tmp_path / "vocab.txt"), do_lower_case=True)  # positional: v4 and v5
    ours = Tokenizer.from_file(tmp_path)
    text = "The for statement loops, the unknownword."
    assert ours.encode(text) == hf(text, add_special_tokens=False)["input_ids"]
    assert ours.special_id("mask") == 4


def test_warmup_linear_rises_then_decays_to_zero():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = warmup_linear(opt, total_steps=20, warmup_steps=5)
    lrs = []
    for _ in range(20):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert lrs[5:] == pytest.approx([(20 - s) / 15 for s in range(5, 20)])
    assert opt.param_groups[0]["lr"] == 0.0


def test_a_one_document_corpus_is_a_clear_error(tmp_path):
    from lit_transformers.data import MaskedLMDataModule

    (tmp_path / "one.txt").write_text("A single paragraph. It has two sentences.\n")
    dm = MaskedLMDataModule(
        corpus={"source": "path", "path": str(tmp_path / "one.txt")},
        vocab_size=50,
        val_fraction=0.0,
        test_fraction=0.0,
        cache_dir=str(tmp_path),
    )
    with pytest.raises(ValueError, match="train split has 1 document.*NotNext"):
        dm.setup()


def test_eval_dupe_factor_adds_pair_draws_to_validation_and_test_only(tmp_path):
    from lit_transformers.data import MaskedLMDataModule

    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    for d in range(12):
        rng = random.Random(d)
        sentences = [" ".join(rng.choices(words, k=rng.randint(4, 9))).capitalize() + "." for _ in range(12)]
        (tmp_path / f"doc{d}.txt").write_text(" ".join(sentences))

    def pairs(eval_dupe_factor):
        dm = MaskedLMDataModule(
            corpus={"source": "path", "path": str(tmp_path)},
            vocab_size=60,
            max_seq_len=32,
            dupe_factor=2,
            eval_dupe_factor=eval_dupe_factor,
            val_fraction=0.25,
            test_fraction=0.25,
            cache_dir=str(tmp_path / "cache"),
        )
        dm.setup()
        return dm.datasets

    once, thrice = pairs(1), pairs(3)
    assert thrice["train"] == once["train"]
    for split in ("val", "test"):
        # the first pass is the same draw; the others add pairs with other boundaries and partners
        assert thrice[split][: len(once[split])] == once[split]
        assert len(thrice[split]) > 2 * len(once[split])
        assert thrice[split][len(once[split]) :] != once[split] * 2
