"""Translation data, metrics, schedule and runs: gettext pairs, parallel files, token-budget batches, sacreBLEU,
the inverse-sqrt schedule, the experiments end to end. (The model and decoding are in tests/test_seq2seq_model.py;
sacreBLEU reduced over 2 DDP ranks in tests/test_ddp_metrics.py.)"""

from __future__ import annotations

import csv
import io
import json
import queue
import subprocess
import sys
import threading
from pathlib import Path
from unittest import mock

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from sacrebleu.metrics import BLEU, CHRF

from lit_transformers.data import TranslationDataModule, gettext_pairs, read_parallel_file
from lit_transformers.data.translation import token_budget_batches
from lit_transformers.nn import MultiHeadAttention
from lit_transformers.tasks import TranslationTask, inverse_sqrt
from lit_transformers.tasks.evaluation import CorpusScore
from lit_transformers.text import MARIAN_SPECIAL_TOKENS, Tokenizer
from lit_transformers.train import train
from lit_transformers.translate import load_task
from lit_transformers.translate import main as translate_entry_point

from conftest import TINY_TRAINER, assert_short_error, assert_user_error, cli_env, compose_train_cfg, run_main
from test_bert_classify import write_mo

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

NUMBERS = "null eins zwei drei vier fünf sechs sieben acht neun".split()


def write_parallel_locale(root: Path, n: int = 30) -> Path:
    """Two German catalogs of generated UI messages; the second disagrees on one translation and adds a plural."""
    for c in range(2):
        messages = {}
        for i in range(n):
            word = NUMBERS[i % 10]
            messages[f"Open file {i}"] = f"Datei {i} öffnen"
            messages[f"_Save document {word}"] = f"Dokument {word} _speichern"
            messages[f"Delete {i} items from the list"] = f"{i} Einträge aus der Liste löschen"
        messages["Quit"] = "Beenden" if c == 0 else "Verlassen"
        if c == 1:
            messages["One file\x00%d files"] = "Eine Datei\x00%d Dateien"
            messages["Close"] = "Schließen"
        write_mo(root / "de" / "LC_MESSAGES" / f"app{c}.mo", messages)
    return root


def test_gettext_pairs_clean_accelerators_skip_plurals_and_keep_one_translation(tmp_path):
    pairs = dict(gettext_pairs(write_parallel_locale(tmp_path / "locale"), "de"))
    assert pairs["Save document drei"] == "Dokument drei speichern"  # "_" accelerators stripped on both sides
    assert "One file" not in pairs and not any("Dateien" in t for t in pairs.values())  # plurals left out
    assert pairs["Quit"] == "Beenden"  # a tie between catalogs goes to the alphabetically first translation
    assert pairs["Close"] == "Schließen"
    assert len(pairs) == 3 * 30 - 20 + 2  # "_Save document <word>" repeats every 10 messages
    with pytest.raises(FileNotFoundError, match="data.source=file data.path="):
        gettext_pairs(tmp_path / "locale", "fr")


def test_splits_by_source_sentence_and_token_budget_batches(tmp_path):
    dm = TranslationDataModule(
        path=str(write_parallel_locale(tmp_path / "locale")),
        vocab_size=300,
        max_tokens=64,
        val_fraction=0.2,
        test_fraction=0.2,
        cache_dir=str(tmp_path / "cache"),
    )
    dm.setup()
    sources = {
        name: {e["src_text"] for batch in batches for e in batch} for name, batches in dm.datasets.items()
    }
    assert not (sources["train"] & sources["val"]) and not (sources["train"] & sources["test"])
    assert not (sources["val"] & sources["test"])
    assert sum(len(s) for s in sources.values()) == len(dm.pairs)  # every pair once
    for batches in dm.datasets.values():
        for batch in batches:
            longest = max(max(len(e["src"]), len(e["tgt"])) + 1 for e in batch)
            assert longest * len(batch) <= 64 or len(batch) == 1
    batch = dm.collate([dm.datasets["train"][0]])
    tok = dm.tokenizer
    row = batch["src_valid"][0].sum() - 1
    assert batch["src_ids"][0, row] == tok.eos_id  # source + EOS
    assert batch["tgt_ids"][0, 0] == tok.bos_id  # decoder input: BOS + target
    length = int(batch["tgt_valid"][0].sum())
    assert batch["labels"][0, length - 1] == tok.eos_id  # labels: target + EOS, shifted left by one
    assert torch.equal(batch["labels"][0, : length - 1], batch["tgt_ids"][0, 1:length])
    assert (batch["labels"][~batch["tgt_valid"]] == -100).all()
    assert tok.decode(batch["tgt_ids"][0, 1:length].tolist()) == batch["tgt_text"][0]


def test_token_budget_batches_cover_every_example_once():
    lengths = [5, 1, 9, 3, 3, 7, 2, 50, 4]
    batches = token_budget_batches(lengths, max_tokens=12)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert max(lengths[i] for i in b) * len(b) <= 12 or len(b) == 1


def test_parallel_files_and_errors_naming_file_and_line(tmp_path):
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("Hello\tHallo\n\nGood morning\tGuten Morgen\n", encoding="utf-8")
    assert read_parallel_file(tsv) == [("Hello", "Hallo"), ("Good morning", "Guten Morgen")]
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text(json.dumps({"en": "Yes", "de": "Ja"}) + "\n", encoding="utf-8")
    assert read_parallel_file(jsonl, "en", "de") == [("Yes", "Ja")]
    tsv.write_text("Hello\tHallo\nno tab here\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"pairs.tsv:2: expected 2 fields \(src, tgt\), found 1"):
        read_parallel_file(tsv)
    jsonl.write_text('{"src": "a", "tgt": "b"}\n{"src": "a"\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"pairs.jsonl:2: not valid JSON"):
        read_parallel_file(jsonl)
    with pytest.raises(FileNotFoundError, match="data.path="):
        read_parallel_file(tmp_path / "missing.tsv")


def test_inverse_sqrt_schedule_is_the_papers():
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([weight], lr=2.0)
    schedule = inverse_sqrt(optimizer, total_steps=10_000, d_model=512, warmup_steps=4000)
    lrs = []
    for _ in range(8000):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    for step in (1, 100, 4000, 8000):  # the paper counts steps from 1
        expected = 2.0 * 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert lrs[step - 1] == pytest.approx(expected, rel=1e-9)
    assert max(lrs) == pytest.approx(2.0 * (512 * 4000) ** -0.5)


def test_corpus_score_accumulated_over_batches_equals_sacrebleu_on_the_whole_corpus():
    hypotheses = ["Datei öffnen", "Das Dokument wurde gespeichert .", "Fehler", "eins zwei drei vier"]
    references = ["Datei öffnen", "Dokument gespeichert .", "Ein Fehler ist aufgetreten", "eins zwei drei"]
    for kind, reference in (("bleu", BLEU()), ("chrf", CHRF())):
        metric = CorpusScore(kind)
        metric.update(hypotheses[:1], references[:1])
        metric.update(hypotheses[1:], references[1:])
        expected = reference.corpus_score(hypotheses, [references]).score
        assert metric.compute().item() == pytest.approx(expected, abs=1e-9)
        assert 0 < expected < 100


def test_cross_attention_probabilities_equal_torch_multihead_attention():
    torch.manual_seed(0)
    d, heads = 16, 2
    ours = MultiHeadAttention(d, heads, cross_attention=True)
    reference = torch.nn.MultiheadAttention(d, heads, batch_first=True)
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.kv_proj.weight]))
        reference.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.kv_proj.bias]))
    x, context = torch.randn(2, 3, d), torch.randn(2, 5, d)
    valid = torch.tensor([[True] * 5, [True, True, True, False, False]])
    _, expected = reference(x, context, context, key_padding_mask=~valid, average_attn_weights=True)
    probs = ours.attention_probs(x, context, valid[:, None, None, :]).mean(dim=1)
    torch.testing.assert_close(probs, expected, atol=1e-6, rtol=1e-5)


def _translation(locale: Path, *overrides: str) -> list[str]:
    return [
        "experiment=translation", f"data.path={locale}", "data.vocab_size=300", "data.max_tokens=48",
        "data.val_fraction=0.2", "data.test_fraction=0.2", "model.n_encoder_layer=1", "model.n_decoder_layer=1",
        "model.d_model=32", "model.n_head=2", "model.d_ff=64", "task.test_beam_size=2", "task.max_extra_tokens=4",
        "task.scheduler.warmup_steps=2", *(o for o in TINY_TRAINER if not o.startswith("data.batch_size")), *overrides,
    ]  # fmt: skip


@pytest.mark.parametrize("experiment", ["translation", "translation_base"])
def test_fast_dev_run_of_both_experiments(compose_cfg, tmp_path, experiment):
    locale = write_parallel_locale(tmp_path / "locale", n=10)
    overrides = ["data.vocab_size=300", "data.num_workers=0", "trainer=cpu", "task.max_extra_tokens=2"]
    cfg = compose_cfg(f"experiment={experiment}", f"data.path={locale}", "debug=fdr", *overrides)
    metrics = train(cfg).metrics
    assert {"test/bleu", "test/chrf", "test/bleu_greedy", "test/bleu_identity", "test/loss"} <= set(metrics)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, cache_dir) -> tuple[Path, dict]:
    """One tiny translation run (4 steps, 2 validations, test) shared by the tests that read its outputs."""
    root = tmp_path_factory.mktemp("tiny_translation")
    locale = write_parallel_locale(root / "locale")
    cfg = compose_train_cfg(*_translation(locale), output_dir=root / "run", cache_dir=cache_dir)
    metrics = train(cfg).metrics
    GlobalHydra.instance().clear()
    return root, metrics


def test_tiny_run_logs_scores_translations_and_cross_attention(tiny_run):
    root, metrics = tiny_run
    rows = list(csv.DictReader(open(root / "run" / "csv" / "metrics.csv")))
    logged = {k for row in rows for k, v in row.items() if v}
    for key in (
        "train/loss",
        "train/padding",
        "train/tokens_per_sec",
        "val/loss",
        "val/ppl",
        "val/bleu",
        "val/chrf",
    ):
        assert key in logged, key
    assert metrics["test/ppl"] == pytest.approx(torch.tensor(metrics["test/loss"]).exp().item(), rel=1e-4)
    assert metrics["test/bleu_identity"] > 0  # the sources share numbers and placeholders with the references
    table = list(csv.DictReader(open(root / "run" / "csv" / "val_translations.csv")))
    assert len(table) == 2 * 4 and {"source", "reference", "hypothesis"} <= set(table[0])  # 2 validations
    assert list((root / "run" / "csv" / "images").glob("val_cross_attention_step*.png"))
    assert "tok:13a" in (root / "run" / "csv" / "hparams.yaml").read_text()  # sacreBLEU's signature, once


@pytest.fixture(scope="module")
def endless_checkpoint(tiny_run, tmp_path_factory) -> Path:
    """The tiny run's checkpoint with its EOS embedding (tied to the output layer) zeroed. The 4-step model answers
    every sentence with EOS at once; with an EOS logit of 0 it never does, so every translation runs to its length
    limit (source length + task.max_extra_tokens) and output lines tell their inputs apart."""
    checkpoint = torch.load(tiny_run[0] / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    eos_id = Tokenizer.from_state(checkpoint["hyper_parameters"]["tokenizer"]).eos_id
    checkpoint["state_dict"]["model.tgt_emb.weight"][eos_id] = 0
    path = tmp_path_factory.mktemp("endless") / "endless.ckpt"
    torch.save(checkpoint, path)
    return path


def _lit_translate(checkpoint: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "lit_transformers.translate", f"ckpt={checkpoint}", *overrides]


def test_lit_translate_reads_stdin_and_keeps_line_order(endless_checkpoint):
    """stdin lines in (latin-1 here, read with encoding=latin-1), one translation per line out, in order; batched
    decoding equals one by one. The command runs in this process on stdin's bytes; lit-translate on a real pipe
    (streaming, exit codes, a reader that leaves): the two tests below."""
    sentences = ["Open file 3", "", "Delete 12 items from the list", "Quit", "Close the café"]
    stdin = io.TextIOWrapper(io.BytesIO("\n".join(sentences).encode("latin-1") + b"\n"))
    with mock.patch.object(sys, "stdin", stdin):
        result = run_main(
            translate_entry_point, f"ckpt={endless_checkpoint}", "beam=2", "batch_size=2", "encoding=latin-1"
        )
    assert result.returncode == 0, result.stderr[-2000:]
    task = TranslationTask.load_from_checkpoint(endless_checkpoint, weights_only=True)
    expected = [task.translate_texts([s], beam_size=2)[0] for s in sentences]
    assert result.stdout.split("\n")[:-1] == expected
    assert expected[1] == "" and all(expected[i] for i in (0, 2, 3, 4))


@pytest.mark.cli
def test_lit_translate_streams_batches_and_names_the_lines_it_cannot_translate(endless_checkpoint):
    """The first batch's translations come out while stdin is still open. A line longer than the model takes and
    one that is not UTF-8 are each named on stderr with why and printed empty; every other line is translated, in
    its place, and the exit code says that not all were."""
    task = TranslationTask.load_from_checkpoint(endless_checkpoint, weights_only=True)
    good = ["Open file 3", "Quit", "Delete 12 items from the list", "Open file 7"]
    too_long = "word " * task.model.config.max_len
    process = subprocess.Popen(
        _lit_translate(endless_checkpoint, "beam=2", "batch_size=2"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(),
    )  # fmt: skip
    printed = queue.Queue()
    threading.Thread(target=lambda: [printed.put(line) for line in process.stdout], daemon=True).start()
    try:
        process.stdin.write(f"{good[0]}\n{good[1]}\n".encode())  # the first batch
        process.stdin.flush()
        first_batch = [printed.get(timeout=120) for _ in range(2)]
        process.stdin.write(f"{too_long}\n".encode() + "Öffne Datei\n".encode("latin-1"))
        process.stdin.write(f"{good[2]}\n{good[3]}\n".encode())
        process.stdin.close()
        assert process.wait(timeout=120) == 1
    finally:
        process.kill()
    stderr = process.stderr.read().decode()
    lines = [line.decode().removesuffix("\n") for line in first_batch + list(printed.queue)]
    expected = [task.translate_texts([s], beam_size=2)[0] for s in good]
    assert lines == [*expected[:2], "", "", *expected[2:]] and all(expected), stderr
    assert "line 3 not translated: A source of" in stderr and "exceeds model.max_len" in stderr
    assert "line 4 not translated: it is not utf-8 text (byte 0xd6" in stderr and "encoding=latin-1" in stderr
    assert "2 of 6 input lines were not translated" in stderr and "Traceback" not in stderr


@pytest.mark.cli
def test_lit_translate_stops_quietly_when_its_reader_leaves(endless_checkpoint):
    """``lit-translate < in | head -1``: once the reader has closed the pipe, the next batch's print ends the command
    with exit 1 and no BrokenPipeError traceback."""
    process = subprocess.Popen(
        _lit_translate(endless_checkpoint, "batch_size=1"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(),
    )  # fmt: skip
    try:
        process.stdin.write(b"Open file 3\n")
        process.stdin.flush()
        process.stdout.readline()  # the first translation, then the reader leaves, as head does
        process.stdout.close()
        process.stdin.write(b"Quit\nOpen file 7\n")
        process.stdin.close()
        assert process.wait(timeout=120) == 1
    finally:
        process.kill()
    stderr = process.stderr.read().decode()
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_lit_translate_names_bad_settings_before_loading(tmp_path):
    """A mistyped key in one paragraph, and an encoding that is unknown or not ASCII-compatible (stdin is split at
    newline bytes), each before the checkpoint is read (there is none here)."""
    missing = tmp_path / "none.ckpt"
    assert_short_error(
        run_main(translate_entry_point, f"ckpt={missing}", "beam=abc"), "beam='abc'", "expected int"
    )
    for encoding, needle in [("foo", "not a text encoding"), ("utf-16", "iconv -f utf-16 -t utf-8")]:
        GlobalHydra.instance().clear()
        with initialize_config_module("lit_transformers.conf", version_base="1.3"):
            cfg = compose("translate", overrides=[f"ckpt={missing}", f"encoding={encoding}"])
        assert_user_error(lambda: load_task(cfg), f"encoding={encoding}", needle)  # noqa: B023 - called at once


def test_hub_translation_dataset_from_a_local_copy(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"en": f"Open file {i}", "de": f"Datei {i} öffnen"} for i in range(20)]
    datasets.Dataset.from_dict({"translation": rows}).save_to_disk(str(tmp_path / "opus"))
    dm = TranslationDataModule(source="hub", name=str(tmp_path / "opus"), src_lang="en", lang="de")
    assert dm.pairs[3] == ("Open file 3", "Datei 3 öffnen")
    with pytest.raises(KeyError, match="data.src_lang and data.lang"):
        _ = TranslationDataModule(source="hub", name=str(tmp_path / "opus"), src_lang="en", lang="fr").pairs


def test_separate_vocabularies_train_and_reload_with_their_source_tokenizer(compose_cfg, tmp_path):
    locale = write_parallel_locale(tmp_path / "locale", n=10)
    separate = ["data.joint_vocab=false", "data.src_vocab_size=280", "trainer.max_steps=2", "test=false"]
    with pytest.raises(ValueError, match="model.share_embeddings=false"):
        train(compose_cfg(*_translation(locale, *separate)))
    train(compose_cfg(*_translation(locale, *separate, "model.share_embeddings=false")))
    task = TranslationTask.load_from_checkpoint(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    source, target = task.source_tokenizer, task.tokenizer
    assert "Datei" in target.backend.get_vocab() and "Datei" not in source.backend.get_vocab()
    assert task.model.src_emb.num_embeddings == source.vocab_size != task.model.tgt_emb.num_embeddings
    assert task.encode_sources(["Open file 3"])[0][:-1] == source.encode("Open file 3")
    assert len(task.translate_texts(["Open file 3", "Quit"], beam_size=2)) == 2


def test_fine_tuning_a_marian_checkpoint_end_to_end(compose_cfg, tmp_path):
    """A Marian directory (config, weights, and a tokenizer.json with Marian's special tokens) initialises the
    run; with lr 0 the trained checkpoint still computes Marian's logits, and reloads without the directory."""
    transformers = pytest.importorskip("transformers")
    locale = write_parallel_locale(tmp_path / "locale")
    texts = [text for pair in gettext_pairs(locale, "de") for text in pair]
    tokenizer = Tokenizer.train(texts, "bpe", 300, special_tokens=MARIAN_SPECIAL_TOKENS)
    marian_dir = tmp_path / "opus-mt-en-de"
    torch.manual_seed(0)
    marian = transformers.MarianMTModel(
        transformers.MarianConfig(
            vocab_size=tokenizer.vocab_size, d_model=32, encoder_layers=1, decoder_layers=1,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
            max_position_embeddings=128, activation_function="swish", scale_embedding=True,
            pad_token_id=tokenizer.pad_id, decoder_start_token_id=tokenizer.pad_id, eos_token_id=tokenizer.eos_id,
        )
    ).eval()  # fmt: skip
    marian.save_pretrained(str(marian_dir))
    tokenizer.save(marian_dir / "tokenizer.json")
    overrides = [
        f"task.init_from_hf={marian_dir}",
        f"data.tokenizer_path={marian_dir}",
        "task.optimizer.lr=0",
    ]
    train(compose_cfg(*_translation(locale, *overrides, "trainer.max_steps=2", "test=false")))
    task = TranslationTask.load_from_checkpoint(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert task.hparams.init_from_hf is None and task.model.config.bos_id == tokenizer.pad_id
    src = torch.tensor([[*tokenizer.encode("Open file 7"), tokenizer.eos_id]])
    tgt = torch.tensor([[tokenizer.pad_id, *tokenizer.encode("Datei 7")]])
    with torch.no_grad():
        expected = marian(input_ids=src, decoder_input_ids=tgt).logits
    torch.testing.assert_close(task.model.eval()(src, tgt), expected, atol=1e-4, rtol=1e-4)
    assert len(task.translate_texts(["Open file 7"], beam_size=2)) == 1
