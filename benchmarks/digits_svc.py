"""Peer baseline for ``experiment=vit``: scikit-learn's SVC on the very same stratified digits split.

python benchmarks/digits_svc.py
"""

from __future__ import annotations

from sklearn.datasets import load_digits
from sklearn.svm import SVC

from lit_transformers.data.images import stratified_split


def main(val_fraction: float = 0.1, test_fraction: float = 0.2, seed: int = 0) -> None:
    digits = load_digits()  # the split arguments are data/digits.yaml's defaults
    split = stratified_split(digits.target, val_fraction, test_fraction, seed)
    x, y = digits.data / 16, digits.target
    model = SVC().fit(x[split["train"]], y[split["train"]])  # RBF kernel, C=1, gamma="scale"
    for name in ("val", "test"):
        print(
            f"SVC {name} accuracy: {model.score(x[split[name]], y[split[name]]):.4f} "
            f"({len(split[name])} images)"
        )


if __name__ == "__main__":
    main()
