"""BERT pretraining: masked-language modelling + next-sentence prediction (Devlin et al. 2019)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lit_transformers.models import BERT
from lit_transformers.nn import IGNORE_INDEX, token_cross_entropy, token_mean
from lit_transformers.tasks.base import eval_mode
from lit_transformers.tasks.encoder import EncoderTask
from lit_transformers.text import mask_tokens, pack_pair, right_pad
from lit_transformers.utils.dashboards import log_image, log_table
from lit_transformers.utils.figures import attention_figure


class MaskedLMTask(EncoderTask):
    """Loss = MLM cross-entropy over every selected token + NSP cross-entropy.

    Masks are drawn here, per batch, from a generator seeded by (``mask_seed``, epoch, batch index, rank):
    new masks every epoch (dynamic masking), identical on a rerun or resume. Validation and test masks are
    fixed, so their metrics are comparable between evaluations.

    Args: ``mask_prob``: share of eligible tokens selected; ``max_predictions_per_seq``: cap per sequence
    (None: no cap); ``whole_word_mask``: select whole words (all their ``##`` pieces); ``mask_seed``;
    ``dashboard_sentences``: fixed sentences whose top-5 predictions at masked positions (a table) and
    last-layer attention (an image) are logged at each validation; the rest as in :class:`EncoderTask`.
    """

    pretraining_heads = True
    dropped_heads = ()

    def __init__(
        self,
        model: dict,
        mask_prob: float = 0.15,
        max_predictions_per_seq: int | None = 20,
        whole_word_mask: bool = False,
        mask_seed: int = 0,
        dashboard_sentences: list[str] | None = None,
        **task_args,
    ):
        super().__init__(model, **task_args)
        self.track_best("val/loss", "min")

    def build_model(self) -> BERT:
        return self.build_bert()

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, T, d) hidden states of an unmasked batch."""
        return self.encode(batch)

    def mask(
        self, batch: dict[str, torch.Tensor], generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        tok = self.require_tokenizer()
        h = self.hparams
        return mask_tokens(
            batch["input_ids"],
            batch["eligible"],
            tok.special_id("mask"),
            tok.vocab_size,
            generator,
            h.mask_prob,
            h.max_predictions_per_seq,
            batch["word_starts"] if h.whole_word_mask else None,
        )

    def _step(self, batch, generator) -> dict[str, torch.Tensor]:
        masked, labels = self.mask(batch, generator)
        hidden = self.model(masked, batch["attention_mask"], batch["token_type_ids"])  # (B, T, d)
        selected = labels != IGNORE_INDEX
        mlm_logits = self.model.mlm_logits(hidden[selected])  # (N, V): only the N selected positions
        mlm_sum, count = token_cross_entropy(mlm_logits, labels[selected])
        nsp_logits = self.model.nsp_logits(self.model.pool(hidden))  # (B, 2)
        nsp_loss = F.cross_entropy(nsp_logits.float(), batch["next_sentence_label"])
        return {
            "mlm_loss": token_mean(mlm_sum, count),
            "count": count,
            "mlm_acc": (mlm_logits.argmax(-1) == labels[selected]).float().mean(),
            "nsp_loss": nsp_loss,
            "nsp_acc": (nsp_logits.argmax(-1) == batch["next_sentence_label"]).float().mean(),
        }

    def training_step(self, batch, batch_idx):
        out = self._step(batch, self.generator(self.hparams.mask_seed, self.current_epoch, batch_idx))
        loss = out["mlm_loss"] + out["nsp_loss"]
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        for name in ("mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc"):
            self.log(f"train/{name}", out[name], on_step=True, on_epoch=False)
        return loss

    def _eval_step(self, batch, batch_idx: int, stage: str) -> None:
        out = self._step(batch, self.generator(self.hparams.mask_seed, stage, batch_idx))
        n = batch["input_ids"].size(0)
        # token-weighted (MLM) and example-weighted (NSP) means over batches and ranks
        weights = {"mlm_loss": out["count"], "mlm_acc": out["count"], "nsp_loss": n, "nsp_acc": n}
        for name, weight in weights.items():
            self.log_mean(
                f"{stage}/{name}", out[name], weight, prog_bar=stage == "val" and name.endswith("acc")
            )

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, batch_idx, "val")

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, batch_idx, "test")

    def _log_totals(self, stage: str) -> torch.Tensor | None:
        """``mlm_ppl`` and ``loss`` (MLM + NSP) from the means over every batch and rank; returns the loss."""
        logged = self.trainer.callback_metrics
        mlm, nsp = logged.get(f"{stage}/mlm_loss"), logged.get(f"{stage}/nsp_loss")
        if mlm is None:
            return None
        self.log(f"{stage}/mlm_ppl", mlm.exp())
        self.log(f"{stage}/loss", mlm + nsp, prog_bar=stage == "val")
        return mlm + nsp

    def on_validation_epoch_end(self):
        loss = self._log_totals("val")
        if loss is not None:
            self.log_best("val/loss", loss)
        if self.hparams.dashboard_sentences and not self.trainer.sanity_checking:
            self.log_predictions(self.hparams.dashboard_sentences)

    def on_test_epoch_end(self):
        self._log_totals("test")

    # ---- dashboards ----------------------------------------------------------------------------

    @torch.no_grad()
    def predict_masked(self, sentences: list[str], k: int = 5, seed: int = 0) -> list[dict]:
        """Mask ~15% of each sentence's tokens (a fixed draw; all of them shown as [MASK]) -> one row per
        masked position: the masked sentence, the position, the true token and the top-k predictions."""
        tok = self.require_tokenizer()
        cls_id, sep_id, mask_id = (tok.special_id(role) for role in ("cls", "sep", "mask"))
        max_len = self.model.config.max_position
        packed = [pack_pair(tok.encode(s), None, cls_id, sep_id, max_len)[0] for s in sentences]
        ids, valid = right_pad(packed, tok.pad_id, device=self.device)
        eligible = valid & ~torch.isin(ids, torch.tensor(list(tok.ids.values()), device=self.device))
        generator = torch.Generator(self.device).manual_seed(seed)
        _, labels = mask_tokens(ids, eligible, mask_id, tok.vocab_size, generator)
        selected = labels != IGNORE_INDEX
        masked = ids.masked_fill(selected, mask_id)
        with eval_mode(self.model):
            probs = self.model.mlm_logits(self.model(masked, valid)).softmax(-1)  # (B, T, V)
        rows = []
        for b, t in selected.nonzero().tolist():
            top = probs[b, t].topk(k)
            rows.append(
                {
                    "sentence": tok.decode(masked[b, valid[b]].tolist(), skip_special_tokens=False),
                    "position": t,
                    "true": tok.id_to_token(labels[b, t].item()),
                    "top": [
                        (tok.id_to_token(i), p) for i, p in zip(top.indices.tolist(), top.values.tolist())
                    ],
                }
            )
        return rows

    def log_predictions(self, sentences: list[str], k: int = 5) -> None:
        """The top-k table (one row per masked position, each prediction and its probability in columns of
        their own, so a punctuation token is not read as a separator) and the attention picture of
        ``sentences``. Every rank runs the forwards (under FSDP each needs them all); the dashboards take rank
        0's."""
        rows = self.predict_masked(sentences, k)
        ranked = [f"{name}{rank}" for rank in range(1, k + 1) for name in ("top", "p")]  # top1, p1, top2...
        log_table(
            self.trainer,
            f"val/mlm_top{k}",
            ["sentence", "position", "true", *ranked],
            [
                [r["sentence"], r["position"], r["true"], *(x for pair in r["top"] for x in pair)]
                for r in rows
            ],
        )
        tok = self.require_tokenizer()
        ids = [tok.special_id("cls"), *tok.encode(sentences[0]), tok.special_id("sep")]
        ids = ids[: self.model.config.max_position]
        with eval_mode(self.model):
            attention = self.model.attention_map(torch.tensor([ids], device=self.device))[0]  # (T, T)
        names = [tok.id_to_token(i) for i in ids]
        figure = attention_figure(attention, names, names, title="last-layer attention (mean over heads)")
        log_image(self.trainer, "val/attention_last_layer", figure)
