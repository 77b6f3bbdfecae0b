"""BERT token classification: BIO spans as conlleval reads them, CoNLL files, first-piece labels, end to end."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from lit_transformers.data import read_conll
from lit_transformers.data.token_classification import align_labels
from lit_transformers.nn import IGNORE_INDEX
from lit_transformers.tasks.evaluation import bio_spans, entity_counts
from lit_transformers.train import train

from test_bert_train import TINY_MODEL, TINY_TRAINER


def test_bio_spans_follow_conlleval():
    tags = ["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-LOC", "B-ORG", "I-PER", "O"]
    # I- after O starts an entity; B- always starts one; I- of another type ends one and starts its own
    assert bio_spans(tags) == {("PER", 0, 2), ("LOC", 3, 5), ("LOC", 5, 6), ("ORG", 6, 7), ("PER", 7, 8)}
    assert bio_spans(["O", "O"]) == set()
    assert bio_spans(["B-X", "I-X"]) == {("X", 0, 2)}  # an entity running to the end


def test_entity_counts_need_exact_type_and_boundaries():
    true = ["B-PER", "I-PER", "O", "B-LOC"]
    assert entity_counts(true, true) == (2, 2, 2)
    assert entity_counts(true, ["B-PER", "O", "O", "B-ORG"]) == (0, 2, 2)  # short span, wrong type
    assert entity_counts(true, ["B-PER", "I-PER", "O", "O"]) == (1, 1, 2)


def test_read_conll_and_label_alignment(tmp_path):
    path = tmp_path / "a.conll"
    path.write_text(
        "-DOCSTART- -X- O O\n\nEU NNP B-ORG\nrejects VBZ O\n\n\nPeter NNP B-PER\nBlackburn NNP I-PER\n"
    )
    sentences = read_conll(path)
    assert [s["words"] for s in sentences] == [["EU", "rejects"], ["Peter", "Blackburn"]]
    assert sentences[0]["labels"] == ["B-ORG", "O"] and sentences[0]["where"].endswith("a.conll:3")
    (tmp_path / "bad.conll").write_text("EU B-ORG\nrejects\n")
    with pytest.raises(ValueError, match=r"bad.conll:2: 'rejects' has no label column"):
        read_conll(tmp_path / "bad.conll")
    # word 0 -> 1 piece, word 1 -> 3 pieces, word 2 -> dropped by the tokenizer ([UNK]); CLS=2, SEP=3, UNK=1
    ids, labels = align_labels([[10], [11, 12, 13], []], [5, 6, 7], 2, 3, 1, max_len=16)
    assert ids == [2, 10, 11, 12, 13, 1, 3]
    assert labels == [IGNORE_INDEX, 5, 6, IGNORE_INDEX, IGNORE_INDEX, 7, IGNORE_INDEX]
    ids, labels = align_labels([[10], [11, 12, 13], [14]], [5, 6, 7], 2, 3, 1, max_len=4)
    assert ids == [2, 10, 3] and labels == [IGNORE_INDEX, 5, IGNORE_INDEX]  # whole words only


def write_conll(path: Path, n_sentences: int = 60, seed: int = 0) -> Path:
    """Sentences where capitalised names after "Mr" are PER and after "in" are LOC."""
    rng = random.Random(seed)
    people, places = ["Smith", "Jones", "Brown", "Taylor"], ["Paris", "Berlin", "Madrid", "Rome"]
    lines = []
    for _ in range(n_sentences):
        words = [("the", "O"), ("report", "O"), ("by", "O"), ("Mr", "O"), (rng.choice(people), "B-PER")]
        words += [("was", "O"), ("written", "O"), ("in", "O"), (rng.choice(places), "B-LOC"), (".", "O")]
        lines += [f"{w} {t}" for w, t in words] + [""]
    path.write_text("\n".join(lines))
    return path


def test_fast_dev_run_bert_token_classify(compose_cfg, tmp_path):
    path = write_conll(tmp_path / "train.conll")
    cfg = compose_cfg(
        "experiment=bert_token_classify", f"data.path={path}", "debug=fdr", "data.vocab_size=100", *TINY_MODEL
    )
    metrics = train(cfg).metrics
    assert {"test/acc", "test/entity_f1", "test/entity_precision", "test/entity_recall"} <= set(metrics)


def test_token_classifier_learns_entities(compose_cfg, tmp_path):
    path = write_conll(tmp_path / "train.conll", n_sentences=80)
    cfg = compose_cfg(
        "experiment=bert_token_classify", f"data.path={path}", "data.vocab_size=100", *TINY_MODEL, *TINY_TRAINER,
        "trainer.max_steps=40", "trainer.val_check_interval=20", "trainer.limit_val_batches=null",
        "trainer.limit_test_batches=null", "task.optimizer.lr=3e-3", "task.scheduler.warmup_steps=5",
    )  # fmt: skip
    metrics = train(cfg).metrics
    assert metrics["test/entity_f1"] > 0.9 and metrics["test/acc"] > 0.95
    assert metrics["val/entity_f1_best"] >= metrics["val/entity_f1"]
