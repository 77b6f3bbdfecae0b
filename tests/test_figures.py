"""Dashboard figures: the figure helper's matplotlib artists (class names, colour bar and scale, the attention cut,
CLIP's class order, a font that has the labels' glyphs), log_image rendering a Figure, no pictures during the sanity
check, and every family's pictures and example tables in a tiny run."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from matplotlib import font_manager
from matplotlib import pyplot as plt
from matplotlib.ft2font import FT2Font
from sacrebleu.metrics import CHRF
from torchvision.io import read_image

from lit_transformers.data import TranslationDataModule
from lit_transformers.train import train
from lit_transformers.utils.dashboards import log_image
from lit_transformers.utils.figures import (
    attention_figure,
    confusion_figure,
    matrix_figure,
    similarity_figure,
)

from conftest import TINY_TRAINER
from test_bert_classify import write_locale
from test_bert_train import TINY_MODEL

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _texts(labels) -> list[str]:
    return [label.get_text() for label in labels]


def test_confusion_figure_names_the_classes_shows_counts_and_row_shares_with_a_colour_bar():
    names = ["Katze", "Hund", "Fuchs"]
    counts = torch.tensor([[3, 1, 0], [0, 4, 0], [2, 2, 4]])
    figure = confusion_figure(counts, names, "test confusion matrix")
    ax, bar = figure.axes  # the matrix and its colour bar
    assert _texts(ax.get_xticklabels()) == names and _texts(ax.get_yticklabels()) == names
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == (
        "test confusion matrix",
        "predicted class",
        "true class",
    )
    image = ax.images[0]
    assert image.colorbar is not None and image.colorbar.ax is bar and "%" in bar.get_ylabel()
    assert image.get_clim() == (0, 100)  # a fixed scale: the same colour means the same share at every test
    shares = 100 * counts.double() / counts.sum(1, keepdim=True)  # each true class's row sums to 100 %
    np.testing.assert_allclose(np.asarray(image.get_array()), shares.numpy())
    cells = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    assert (
        cells[0, 0] == "3\n75%" and cells[1, 1] == "4\n100%" and cells[2, 0] == "2\n25%" and len(cells) == 9
    )


def test_attention_figure_caps_at_40_tokens_says_the_cut_and_shares_a_0_to_1_scale():
    probs = torch.rand(60, 50).softmax(-1)
    queries, keys = [f"t{i}" for i in range(60)], [f"s{i}" for i in range(50)]
    ax = attention_figure(probs, queries, keys, title="cross-attention").axes[0]
    shown = np.asarray(ax.images[0].get_array())
    assert shown.shape == (40, 40)
    np.testing.assert_allclose(shown, probs[:40, :40].numpy(), rtol=1e-6)
    assert _texts(ax.get_yticklabels()) == queries[:40] and _texts(ax.get_xticklabels()) == keys[:40]
    assert "first 40 of 60" in ax.get_title() and "40 of 50" in ax.get_title()
    small = attention_figure(probs[:5, :5], queries[:5], keys[:5], title="cross-attention").axes[0]
    assert small.get_title() == "cross-attention"  # nothing cut, nothing said
    assert ax.images[0].get_clim() == small.images[0].get_clim() == (0, 1)


def test_unicode_labels_use_a_font_that_has_their_glyphs():
    labels = ["Schlüssel", "Größe", "Maß", "Äpfel"]
    figure = matrix_figure(
        torch.rand(4, 4),
        labels,
        labels,
        title="Übersicht",
        x_label="Spalte",
        y_label="Zeile",
        colorbar_label="Wert",
    )
    ax = figure.axes[0]
    for text in [*ax.get_xticklabels(), *ax.get_yticklabels(), ax.title]:
        font = font_manager.findfont(text.get_fontproperties(), fallback_to_default=False)
        charmap = FT2Font(font).get_charmap()
        assert all(ord(c) in charmap for c in text.get_text()), (text.get_text(), font)
    with warnings.catch_warnings():
        warnings.simplefilter(
            "error"
        )  # matplotlib warns "Glyph ... missing from font(s)" when it draws a box
        log_image(_trainer(), "val/unicode", figure)


def test_similarity_figure_sorts_by_class_and_names_the_image_and_caption_axes():
    names = ["null", "eins", "zwei"]
    labels = [2, 1, 2, 1, 0]
    captions = [f"caption {i}" for i in range(5)]
    similarity = torch.arange(25.0).view(5, 5) / 25
    ax = similarity_figure(similarity, labels, names, captions, "similarity").axes[0]
    order = np.argsort(labels, kind="stable")  # [4, 1, 3, 0, 2]
    assert _texts(ax.get_yticklabels()) == ["null", "eins", "eins", "zwei", "zwei"]
    assert _texts(ax.get_xticklabels()) == [captions[i] for i in order]
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), similarity.numpy()[order][:, order])
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("caption", "image (class)")
    assert ax.images[0].get_clim() == (-1, 1)


def _trainer(tmp_path: Path | None = None, sanity_checking: bool = False, step: int = 7) -> SimpleNamespace:
    loggers = [CSVLogger(tmp_path, name="csv", version="")] if tmp_path else []
    fit_loop = SimpleNamespace(
        epoch_loop=SimpleNamespace(_batches_that_stepped=step)
    )  # dashboards.logged_step
    return SimpleNamespace(
        is_global_zero=True, sanity_checking=sanity_checking, fit_loop=fit_loop, loggers=loggers
    )


def test_log_image_renders_a_figure_at_card_size_closes_it_and_skips_the_sanity_check(tmp_path):
    log_image(_trainer(tmp_path), "test/confusion_matrix", confusion_figure(torch.eye(2), ["a", "b"], "cm"))
    png = read_image(str(tmp_path / "csv" / "images" / "test_confusion_matrix_step7.png"))
    assert png.dtype == torch.uint8 and png.shape[0] == 3 and min(png.shape[1:]) >= 480
    figure = plt.figure()
    log_image(_trainer(tmp_path, sanity_checking=True, step=0), "val/plot", figure)
    assert not plt.fignum_exists(figure.number)  # a pyplot figure is closed once logged
    assert not list((tmp_path / "csv" / "images").glob("val_plot_*"))


def _rows(path: Path) -> list[dict]:
    return list(csv.DictReader(open(path, encoding="utf-8")))


def _vit(tmp_path: Path) -> list[str]:
    return ["experiment=vit", "model.backbone.depth=1", *TINY_TRAINER]


def _clip(tmp_path: Path) -> list[str]:
    return ["experiment=clip", "model.image.depth=1", "model.text_layers=1", *TINY_TRAINER]


def _bert_classify(tmp_path: Path) -> list[str]:
    locale = write_locale(tmp_path / "locale", n_messages=10)
    return ["experiment=bert_classify", f"data.path={locale}", "data.languages=[de,fr,es]", "data.vocab_size=300",
            "data.val_fraction=0.2", "data.test_fraction=0.2", *TINY_MODEL, *TINY_TRAINER]  # fmt: skip


def _translation(tmp_path: Path) -> list[str]:
    numbers = "null eins zwei drei vier fünf sechs sieben acht neun".split()
    pairs = [(f"Open file {i}", f"Datei {i} öffnen") for i in range(20)]
    pairs += [
        (f"Delete {numbers[i % 10]} items from the list", f"{numbers[i % 10]} Einträge löschen")
        for i in range(10)
    ]
    (tmp_path / "pairs.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return ["experiment=translation", "data.source=file", f"data.path={tmp_path / 'pairs.tsv'}", "data.vocab_size=300",
            "data.max_tokens=48", "data.val_fraction=0.3", "data.test_fraction=0.2", "model.n_encoder_layer=1",
            "model.n_decoder_layer=1", "model.d_model=32", "model.n_head=2", "model.d_ff=64", "task.test_beam_size=1",
            "task.max_extra_tokens=4", *(o for o in TINY_TRAINER if not o.startswith("data.batch_size"))]  # fmt: skip


FAMILIES = {  # tiny-run overrides, the pictures and the tables each logs (validations at steps 2 and 4, then test)
    "vit": (_vit, {"val_misclassified", "test_misclassified", "test_confusion_matrix"}, {"test_acc_class"}),
    "clip": (_clip, {"val_similarity", "val_retrieval", "test_similarity", "test_retrieval"}, set()),
    "bert_classify": (_bert_classify, {"test_confusion_matrix"}, {"val_misclassified", "test_misclassified"}),
    "translation": (_translation, {"val_cross_attention"}, {"val_translations"}),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_logs_its_pictures_and_tables_but_none_during_the_sanity_check(
    compose_cfg, tmp_path, family
):
    overrides, pictures, tables = FAMILIES[family]
    cfg = compose_cfg(*overrides(tmp_path), "data.num_workers=0", "trainer.num_sanity_val_steps=1")
    train(cfg)
    run = tmp_path / "csv"
    images = {p.stem.rsplit("_step", 1)[0]: p for p in (run / "images").glob("*.png")}
    assert pictures <= set(images), sorted(images)
    steps = {int(p.stem.rsplit("_step", 1)[1]) for p in (run / "images").glob("*.png")}
    assert 0 not in steps  # the sanity check (at step 0) draws nothing
    assert all(min(read_image(str(p)).shape[1:]) >= 480 for p in images.values())
    for table in tables:
        assert _rows(run / f"{table}.csv"), table
    if family == "vit":
        digits = "zero one two three four five six seven eight nine".split()
        assert [row["class"] for row in _rows(run / "test_acc_class.csv")] == digits
    if family == "bert_classify":
        rows = _rows(run / "test_misclassified.csv")
        assert all(row["text"] and row["true"] != row["predicted"] for row in rows)
    if family == "translation":  # the per-sentence chrF column, as sacreBLEU scores each sentence
        for row in _rows(run / "val_translations.csv"):
            expected = CHRF().sentence_score(row["hypothesis"], [row["reference"]]).score
            assert float(row["chrF"]) == pytest.approx(expected, abs=0.051)


def test_translation_examples_are_sentences_not_the_placeholders_that_sort_first(tmp_path):
    placeholders = [("%s", "%s"), ("%d%%", "%d %%"), ("%s: %s", "%s: %s"), ("{name}", "{name}"), ("OK", "OK")]
    sentences = [(f"Delete {i} items from the list", f"{i} Einträge aus der Liste löschen") for i in range(8)]
    data = TranslationDataModule(source="file", path=str(tmp_path / "unused.tsv"))
    data.splits = {"val": placeholders + sentences}  # in sorted order, as gettext catalogs give them
    examples = data.fixed_examples(4)
    assert examples == data.fixed_examples(4)  # the same at every validation
    assert len(set(examples)) == 4 and set(examples) <= set(sentences)
    assert data.fixed_examples(20) == placeholders + sentences  # fewer pairs than asked: all of them
