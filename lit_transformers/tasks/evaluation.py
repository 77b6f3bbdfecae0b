"""Evaluation shared by the tasks: zero-shot classifier, retrieval recall@k, BIO entity counts, sacreBLEU
corpus scores. (Their pictures are drawn in :mod:`lit_transformers.utils.figures`.)"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torchmetrics import Metric


@torch.no_grad()
def zero_shot_classifier(
    encode_texts: Callable[[list[str]], torch.Tensor], class_names: Sequence[str], templates: Sequence[str]
) -> torch.Tensor:
    """(embed_dim, n_classes) weights: per class, the renormalised mean of its normalised prompt embeddings
    (open_clip's ``build_zero_shot_classifier``). Templates are format strings with one ``{}``."""
    weights = []
    for name in class_names:
        prompts = F.normalize(encode_texts([t.format(name) for t in templates]), dim=-1)  # (K, E)
        weights.append(F.normalize(prompts.mean(dim=0), dim=-1))
    return torch.stack(weights, dim=1)


def recall_at_k(
    similarity: torch.Tensor, relevant: torch.Tensor, ks: Sequence[int] = (1, 5, 10)
) -> dict[int, float]:
    """similarity, relevant: (n_queries, n_candidates) -> share of queries with a hit in their top k."""
    top = similarity.topk(min(max(ks), similarity.size(1)), dim=1).indices  # (Q, k_max)
    hits = relevant.to(top.device).gather(1, top)  # (Q, k_max) bool
    return {k: hits[:, :k].any(dim=1).float().mean().item() for k in ks}


def bio_spans(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """Entities (type, first, end) of a BIO tag sequence, as CoNLL's conlleval reads them: ``B-X`` starts
    an entity, ``I-X`` continues one of type X (and starts one when it follows anything else), ``O`` and
    unknown tags end it."""
    spans, current = set(), None  # current: [type, start]
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, kind = tag.partition("-")
        continues = prefix == "I" and current is not None and current[0] == kind
        if current is not None and not continues:
            spans.add((current[0], current[1], i))
            current = None
        if prefix == "B" or (prefix == "I" and not continues):
            current = [kind, i]
    return spans


def entity_counts(true_tags: Sequence[str], predicted_tags: Sequence[str]) -> tuple[int, int, int]:
    """(true positives, predicted entities, true entities) of one sentence: an entity counts when its type
    and both boundaries match exactly. Entity F1 = 2 tp / (predicted + true), summed over sentences."""
    true, predicted = bio_spans(true_tags), bio_spans(predicted_tags)
    return len(true & predicted), len(predicted), len(true)


class CorpusScore(Metric):
    """sacreBLEU's corpus BLEU or chrF (0-100) over every hypothesis seen, reduced across DDP ranks.

    Corpus scores are not means of sentence scores, but sacreBLEU computes them from per-sentence statistics
    that add up (n-gram matches and totals, lengths): each rank sums them, the sum is all-reduced, and the
    score is computed from the total, exactly as sacreBLEU would on the whole corpus in one process.
    """

    full_state_update = False

    def __init__(self, kind: str = "bleu"):
        super().__init__()
        from sacrebleu.metrics import BLEU, CHRF

        kinds = {"bleu": BLEU, "chrf": CHRF}
        if kind not in kinds:
            raise ValueError(f"Unknown corpus score {kind!r}; choose one of {sorted(kinds)}")
        self.scorer = kinds[kind]()
        width = len(self.scorer._extract_corpus_statistics(["a"], [["a"]])[0])
        self.add_state("stats", torch.zeros(width, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, hypotheses: Sequence[str], references: Sequence[str]) -> None:
        stats = self.scorer._extract_corpus_statistics(list(hypotheses), [list(references)])
        self.stats += torch.tensor(stats, dtype=torch.float64).sum(dim=0).to(self.stats.device)

    def compute(self) -> torch.Tensor:
        score = self.scorer._compute_score_from_stats(self.stats.cpu().numpy())
        return torch.tensor(score.score, dtype=torch.float64)

    def signature(self) -> str:
        return str(self.scorer.get_signature())
