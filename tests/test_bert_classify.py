"""BERT fine-tuning: gettext .mo reader, labelled CSV/TSV/JSONL files, SequenceClassificationTask end to end
(language-ID demo on synthetic catalogs, init_from a pretraining checkpoint, init_from_hf)."""

from __future__ import annotations

import gettext
import json
import struct
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from lit_transformers.data import TextClassificationDataModule, language_samples, read_labeled_table, read_mo
from lit_transformers.data.gettext import clean_message
from lit_transformers.tasks import SequenceClassificationTask
from lit_transformers.train import train
from lit_transformers.utils.checkpoints import check_task_fits

from test_bert_train import TINY_BERT, TINY_MODEL, TINY_TRAINER

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def write_mo(path: Path, messages: dict[str, str], charset: str = "UTF-8", big_endian: bool = False) -> None:
    """A GNU .mo file (the format msgfmt writes): header, then msgid and msgstr tables, then the strings."""
    entries = sorted({"": f"Content-Type: text/plain; charset={charset}\n", **messages}.items())
    ids = [k.encode(charset) for k, _ in entries]
    strs = [v.encode(charset) for _, v in entries]
    order = ">" if big_endian else "<"
    n, start = len(entries), 28
    data_at = start + 16 * n
    blob, offsets = b"", []
    for s in ids + strs:
        offsets.append((len(s), data_at + len(blob)))
        blob += s + b"\x00"
    header = struct.pack(f"{order}7I", 0x950412DE, 0, n, start, start + 8 * n, 0, 0)
    tables = b"".join(struct.pack(f"{order}2I", *o) for o in offsets)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + tables + blob)


WORDS = {
    "de": "der die und nicht ist Datei konnte werden öffnen Fehler beim Speichern".split(),
    "fr": "le la les et ne pas est fichier impossible ouvrir erreur lors enregistrement".split(),
    "es": "el la los y no es archivo imposible abrir error al guardar".split(),
}


def write_locale(root: Path, n_messages: int = 40) -> Path:
    """Two catalogs per language of generated messages (``n_messages`` each)."""
    for lang, words in WORDS.items():
        for c in range(2):
            messages = {
                f"English message {c} {i}": " ".join(
                    words[(i * 7 + j * 3 + c) % len(words)] for j in range(5)
                )
                + f" {i}"
                for i in range(n_messages)
            }
            messages["Untranslated"] = "Untranslated"  # equal to its msgid: not a sample
            write_mo(root / lang / "LC_MESSAGES" / f"app{c}.mo", messages)
    return root


def test_read_mo_matches_the_standard_library(tmp_path):
    messages = {
        "Open _File": "_Datei öffnen",
        "Cannot save %s": "Kann %s nicht speichern",
        "ctx\x04Quit": "Beenden",
    }
    for big_endian in (False, True):
        path = tmp_path / f"{big_endian}.mo"
        write_mo(path, messages, big_endian=big_endian)
        with open(path, "rb") as f:
            reference = gettext.GNUTranslations(f)
        ours = read_mo(path)
        assert ours["Open _File"] == reference.gettext("Open _File") == "_Datei öffnen"
        assert ours["Cannot save %s"] == reference.gettext("Cannot save %s")
        assert ours["Quit"] == "Beenden"  # message context stripped
    latin = tmp_path / "latin1.mo"
    write_mo(latin, {"Yes": "Oui, déjà"}, charset="ISO-8859-1")
    assert read_mo(latin)["Yes"] == "Oui, déjà"
    (tmp_path / "bad.mo").write_bytes(b"not a catalog at all, just some bytes")
    with pytest.raises(ValueError, match="bad.mo"):
        read_mo(tmp_path / "bad.mo")


def test_clean_message_drops_placeholders_markup_and_accelerators():
    assert (
        clean_message("Impossible d'ouvrir « %s » : %d <b>erreur</b> {0}")
        == "Impossible d'ouvrir « » : erreur"
    )
    assert clean_message("_Datei   &öffnen") == "Datei öffnen"


def test_language_samples_and_missing_catalogs(tmp_path):
    root = write_locale(tmp_path / "locale")
    samples = language_samples(root, ["de", "fr"], max_per_language=30)
    assert len(samples) == 60 and {lang for _, lang in samples} == {"de", "fr"}
    assert all(text != "Untranslated" for text, _ in samples)
    assert samples == language_samples(root, ["de", "fr"], max_per_language=30)  # deterministic
    with pytest.raises(FileNotFoundError, match="data.path="):
        language_samples(root, ["de", "xx"])


def test_labeled_files_csv_tsv_jsonl_and_errors_naming_file_line_column(tmp_path):
    (tmp_path / "a.csv").write_text('text,text_pair,label\n"Hello, world",Bonjour,en\nHallo,,de\n')
    rows = read_labeled_table(tmp_path / "a.csv")
    assert [(r["text"], r["text_pair"], r["label"]) for r in rows] == [
        ("Hello, world", "Bonjour", "en"),
        ("Hallo", None, "de"),
    ]
    (tmp_path / "a.tsv").write_text("text\tlabel\nHola\tes\n")
    assert read_labeled_table(tmp_path / "a.tsv")[0]["label"] == "es"
    (tmp_path / "a.jsonl").write_text('{"text": "Ciao", "label": "it"}\n\n{"text": "Hej", "label": 3}\n')
    assert [r["label"] for r in read_labeled_table(tmp_path / "a.jsonl")] == ["it", "3"]
    (tmp_path / "bad.csv").write_text("text,label\nfine,x\n,y\n")
    with pytest.raises(ValueError, match=r"bad.csv:3: column 'text'"):
        read_labeled_table(tmp_path / "bad.csv")
    (tmp_path / "nolabel.csv").write_text("text,tag\nfine,x\n")
    with pytest.raises(ValueError, match=r"nolabel.csv:1: no column 'label'.*data.label_field"):
        read_labeled_table(tmp_path / "nolabel.csv")
    (tmp_path / "bad.jsonl").write_text('{"text": "a", "label": "x"}\n{"text": oops}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        read_labeled_table(tmp_path / "bad.jsonl")


def test_unknown_test_label_is_an_error_naming_file_and_line(tmp_path):
    (tmp_path / "train.csv").write_text(
        "text,label\n" + "".join(f"text {i},{'ab'[i % 2]}\n" for i in range(20))
    )
    (tmp_path / "test.csv").write_text("text,label\nsome text,a\nother text,c\n")
    dm = TextClassificationDataModule(
        source="file",
        path=str(tmp_path / "train.csv"),
        test_path=str(tmp_path / "test.csv"),
        cache_dir=str(tmp_path),
    )
    with pytest.raises(ValueError, match=r"test.csv:3: column 'label': label 'c' is not among"):
        dm.setup()


def _classify(compose_cfg, locale: Path, *overrides: str):
    return compose_cfg(
        "experiment=bert_classify", f"data.path={locale}", "data.vocab_size=300", "data.val_fraction=0.2",
        "data.test_fraction=0.2", *TINY_MODEL, *TINY_TRAINER, *overrides,
    )  # fmt: skip


def test_fast_dev_run_bert_classify_on_generated_catalogs(compose_cfg, tmp_path):
    locale = write_locale(tmp_path / "locale", n_messages=10)
    metrics = train(_classify(compose_cfg, locale, "debug=fdr", "data.languages=[de,fr,es]")).metrics
    assert {"test/acc", "test/f1_macro", "test/loss"} <= set(metrics)


def test_classifier_learns_language_id_and_logs_a_labelled_confusion_matrix(compose_cfg, tmp_path):
    locale = write_locale(tmp_path / "locale")
    # 4 heads of 16: with the tiny model's 2 heads of 16, about one run in three stalls with two languages merged
    # (the WordPiece ids, and so the run, differ at every training of the tokenizer: huggingface/tokenizers#1794)
    cfg = _classify(
        compose_cfg, locale, "data.languages=[de,fr,es]", "model.d_model=64", "model.n_head=4", "trainer.max_steps=80",
        "trainer.val_check_interval=40", "trainer.limit_val_batches=null", "trainer.limit_test_batches=null",
        "task.optimizer.lr=3e-3", "task.scheduler.warmup_steps=5",
    )  # fmt: skip
    metrics = train(cfg).metrics
    assert metrics["test/acc"] > 0.8  # three languages with disjoint vocabularies; chance is 1/3
    assert list((tmp_path / "csv" / "images").glob("test_confusion_matrix_step*.png"))
    task = SequenceClassificationTask.load_from_checkpoint(
        tmp_path / "checkpoints" / "last.ckpt", weights_only=True
    )
    assert task.hparams.class_names == ["de", "es", "fr"]
    assert task.predict(["die Datei konnte nicht werden", "impossible ouvrir le fichier"]) == ["de", "fr"]


def test_init_from_a_pretraining_checkpoint_drops_its_heads(compose_cfg, tmp_path):
    locale = write_locale(tmp_path / "locale", n_messages=10)
    pre = compose_cfg("experiment=bert_pretrain", *TINY_BERT, "test=false", "data.vocab_size=300")
    pre.callbacks.model_checkpoint.dirpath = str(tmp_path / "parent")
    train(pre)
    parent = tmp_path / "parent" / "last.ckpt"
    cfg = _classify(
        compose_cfg, locale, "data.languages=[de,fr,es]", f"init_from={parent}", f"data.tokenizer_path={parent}",
        "task.optimizer.lr=0", "task.optimizer.weight_decay=0", "test=false", "trainer.max_steps=2",
    )  # fmt: skip
    cfg.callbacks.model_checkpoint.dirpath = str(tmp_path / "child")
    train(cfg)
    parent_state = torch.load(parent, weights_only=True)["state_dict"]
    child_state = torch.load(tmp_path / "child" / "last.ckpt", weights_only=True)["state_dict"]
    body = [k for k in parent_state if k.startswith("model.") and "_head" not in k]
    assert body and all(
        torch.equal(child_state[k], parent_state[k]) for k in body
    )  # lr=0: exactly the parent's
    assert not any("mlm_head" in k or "nsp_head" in k for k in child_state)
    assert "classifier.1.weight" in child_state


def test_init_from_hf_directory_and_its_vocab(compose_cfg, tmp_path):
    transformers = pytest.importorskip("transformers")
    locale = write_locale(tmp_path / "locale", n_messages=10)
    words = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        *sorted({w.lower() for ws in WORDS.values() for w in ws}),
    ]
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "vocab.txt").write_text("\n".join(words) + "\n")
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    config = transformers.BertConfig(
        vocab_size=len(words), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.BertModel(config)
    hf.save_pretrained(hf_dir)
    cfg = _classify(
        compose_cfg, locale, "data.languages=[de,fr,es]", f"task.init_from_hf={hf_dir}", f"data.tokenizer_path={hf_dir}",
        "task.optimizer.lr=0", "task.optimizer.weight_decay=0", "test=false", "trainer.max_steps=1",
    )  # fmt: skip
    train(cfg)
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert torch.equal(
        state["state_dict"]["model.tok_emb.weight"], hf.embeddings.word_embeddings.weight.detach()
    )
    assert state["hyper_parameters"]["init_from_hf"] is None  # reloading does not need the directory
    assert state["hyper_parameters"]["model"]["d_model"] == 32
    # resuming with the same command line (ckpt_path=) finds the same model config
    check_task_fits(state, "last.ckpt", instantiate(cfg.task, _recursive_=False, _convert_="all"))
