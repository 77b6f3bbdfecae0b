"""scikit-learn peer of ``experiment=bert_classify``: TF-IDF character n-grams + logistic regression on the
same gettext language-ID split (the datamodule's own train/val/test), test accuracy and macro-F1.

    python benchmarks/language_id_baseline.py
    python benchmarks/language_id_baseline.py --path my_labels.csv --source file
"""

from __future__ import annotations

import argparse
import time

from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score

from lit_transformers.data import TextClassificationDataModule


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", default="gettext")
    p.add_argument("--path", default=None)
    p.add_argument("--languages", nargs="+", default=["de", "es", "fr", "it", "nl", "sv"])  # as the YAML
    p.add_argument("--max-per-language", type=int, default=1000)
    args = p.parse_args()
    dm = TextClassificationDataModule(
        source=args.source, path=args.path, languages=args.languages, max_per_language=args.max_per_language
    )
    splits = dm.splits  # the same examples and split as the BERT run (seed 0, 10% / 10%)
    text = lambda e: e["text"] if e["text_pair"] is None else f"{e['text']} | {e['text_pair']}"  # noqa: E731
    t0 = time.perf_counter()
    vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(1, 4), sublinear_tf=True, min_df=2)
    x_train = vectorizer.fit_transform([text(e) for e in splits["train"]])
    classifier = LogisticRegression(C=10.0, max_iter=2000).fit(x_train, [e["label"] for e in splits["train"]])
    predicted = classifier.predict(vectorizer.transform([text(e) for e in splits["test"]]))
    truth = [e["label"] for e in splits["test"]]
    print(
        f"train {len(splits['train'])}, test {len(truth)} examples, {len(dm.class_names)} classes; "
        f"fit + predict {time.perf_counter() - t0:.1f} s"
    )
    print(
        f"TF-IDF char 1-4-grams + logistic regression: test accuracy {accuracy_score(truth, predicted):.4f}, "
        f"macro-F1 {f1_score(truth, predicted, average='macro'):.4f}"
    )


if __name__ == "__main__":
    main()
