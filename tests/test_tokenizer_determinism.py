"""The same texts train the same tokenizer, in one process and in fresh ones: a seed gives the same run even when
the tokenizer is not cached yet (WordPiece training alone was not so, huggingface/tokenizers#1794)."""

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from lit_transformers.text import Tokenizer
from lit_transformers.text.tokenizer import KINDS

# room for merges past the specials and alphabet (byte-level BPE starts from 256 bytes); char has no merges
VOCAB_SIZES = {"bpe": 400, "char": 0, "wordpiece": 150}


def corpus() -> list[str]:
    """Made-up words of a dozen syllables (two with accented letters): twenty-odd ## pieces, many tied merges."""
    rng = random.Random(0)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "éa", "ßu", "qi", "zy"]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(200)]
    return [" ".join(rng.choices(words, k=12)) + "." for _ in range(100)]


def trained_digests() -> dict[str, str]:
    """Per kind, a digest of the state (JSON, roles) of a tokenizer trained on :func:`corpus`."""
    texts = corpus()
    return {
        kind: hashlib.sha256(
            json.dumps(Tokenizer.train(texts, kind=kind, vocab_size=VOCAB_SIZES[kind]).state()).encode()
        ).hexdigest()
        for kind in KINDS
    }


@pytest.mark.parametrize("kind", KINDS)
def test_training_twice_in_one_process_gives_the_same_tokenizer(kind):
    texts = corpus()
    first = Tokenizer.train(texts, kind=kind, vocab_size=VOCAB_SIZES[kind])
    if kind != "char":
        assert first.vocab_size == VOCAB_SIZES[kind]  # it learnt merges, ties among them too
    for _ in range(5):
        assert Tokenizer.train(texts, kind=kind, vocab_size=VOCAB_SIZES[kind]).state() == first.state()


def test_fresh_processes_train_the_same_tokenizers():
    here = trained_digests()
    script = "import json, test_tokenizer_determinism as t; print(json.dumps(t.trained_digests()))"
    tests = Path(__file__).parent  # importable without conftest, whose imports take seconds
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": f"{tests.parent}{os.pathsep}{tests}"}
        result = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout.splitlines()[-1]) == here


def test_wordpiece_pieces_are_ordinary_tokens_and_only_the_specials_special():
    tok = Tokenizer.train(corpus(), kind="wordpiece", vocab_size=VOCAB_SIZES["wordpiece"])
    added = {token.content for token in tok.backend.get_added_tokens_decoder().values()}
    assert added == set(tok.special_tokens.values())
    vocab = tok.backend.get_vocab()
    assert {"##a", "##é", "##ß"} <= vocab.keys()
    ids = tok.encode("kaéaßu zyqi")
    assert any(tok.id_to_token(i).startswith("##") for i in ids)
    assert tok.decode(ids) == "kaéaßu zyqi"  # skip_special_tokens keeps the ## pieces
