"""Translation with the encoder-decoder Transformer: teacher forcing on the right-shifted target with
label-smoothed cross-entropy, sacreBLEU BLEU and chrF of decoded validation and test sets."""

from __future__ import annotations

import dataclasses
import logging

import torch

from lit_transformers.contract import ParallelText
from lit_transformers.models import Seq2SeqConfig, Seq2SeqTransformer
from lit_transformers.nn import token_mean
from lit_transformers.nn.attention import recorded_attention
from lit_transformers.tasks.base import Task, eval_mode
from lit_transformers.tasks.evaluation import CorpusScore
from lit_transformers.tasks.specs import config_spec
from lit_transformers.text import Tokenizer, right_pad
from lit_transformers.utils.dashboards import log_image, log_table
from lit_transformers.utils.figures import attention_figure

log = logging.getLogger(__name__)


class TranslationTask(Task):
    """Args: ``model``, the Seq2SeqTransformer config spec (vocabulary size and special ids null: the
    tokenizer's); ``init_from_hf``: a Hugging Face Marian (OPUS-MT) directory whose config replaces the spec
    and whose weights initialise the model (train with its tokenizer: ``data.tokenizer_path=<it>``);
    ``label_smoothing`` ε; decoding: ``val_beam_size`` (1: greedy, fast enough to run at every
    validation), ``test_beam_size``, GNMT ``length_penalty`` α, hypotheses of at most source length +
    ``max_extra_tokens``; ``num_examples`` validation sentences shown on dashboards; the rest as in
    :class:`Task`.

    ``train/loss`` is the label-smoothed objective; ``val/loss`` and ``test/loss`` are the plain token
    cross-entropy (so ``ppl`` = exp(loss) is a perplexity). With ``test_beam_size`` > 1 the test also logs
    greedy scores (``test/bleu_greedy``), and always the identity baseline (hypothesis = source).
    """

    data_needs = (ParallelText,)

    def __init__(
        self,
        model: dict | Seq2SeqConfig,
        init_from_hf: str | None = None,
        label_smoothing: float = 0.1,
        val_beam_size: int = 1,
        test_beam_size: int = 4,
        length_penalty: float = 0.6,
        max_extra_tokens: int = 50,
        num_examples: int = 4,
        source_tokenizer: dict | None = None,
        **task_args,
    ):
        if init_from_hf:  # the architecture is the checkpoint's: recorded now, so a resumed run matches it
            from lit_transformers.models.hf_marian import read_config

            model = read_config(init_from_hf, task_args.get("trust_checkpoint", False))
        model = config_spec(model)  # before the base records the arguments as hyperparameters
        super().__init__(**task_args)
        self.source_tokenizer = Tokenizer.from_state(source_tokenizer) if source_tokenizer else None
        self.scores = torch.nn.ModuleDict(
            {
                f"{stage}_{kind}": CorpusScore(kind)
                for stage in ("val", "test", "test_greedy", "test_identity")
                for kind in ("bleu", "chrf")
            }
        )
        self.track_best("val/bleu", "max")
        self._signature_logged = False  # once per run, at its first fit or test

    def build_model(self) -> Seq2SeqTransformer:
        if self.hparams.init_from_hf:
            model = Seq2SeqTransformer.from_hf(self.hparams.init_from_hf, self.hparams.trust_checkpoint)
            self.check_hf_vocabulary(model.config.vocab_size, "Marian model")
            self.hparams.init_from_hf = None  # checkpoints of this task rebuild it from hparams.model
            return model
        config = self.text_model_config(
            vocab_size=lambda tok: tok.vocab_size,
            pad_id=lambda tok: tok.pad_id,
            bos_id=lambda tok: tok.bos_id,
            eos_id=lambda tok: tok.eos_id,
        )
        source = self.attach_source_tokenizer()
        if source is not None:
            if config.share_embeddings:
                raise ValueError(
                    "data.joint_vocab=false gives the source its own vocabulary; set model.share_embeddings=false"
                )
            config = dataclasses.replace(config, src_vocab_size=config.src_vocab_size or source.vocab_size)
        return Seq2SeqTransformer(config)

    def attach_source_tokenizer(self) -> Tokenizer | None:
        """The source side's own tokenizer (None with one joint vocabulary): the datamodule's when training
        (then recorded in the hyperparameters, so checkpoints carry it), else the checkpoint's."""
        source = self.data.source_tokenizer if self.data is not None else None
        if source is not None and source is not self.data.tokenizer:
            self.source_tokenizer = source
            self.hparams.source_tokenizer = source.state()
        return self.source_tokenizer

    def encode_sources(self, sentences: list[str]) -> list[list[int]]:
        """Source token ids + EOS, with the source side's tokenizer."""
        tok = self.source_tokenizer or self.require_tokenizer()
        return [[*ids, self.model.config.eos_id] for ids in tok.encode_batch(sentences)]

    def forward(self, src_ids: torch.Tensor, tgt_ids: torch.Tensor, src_valid: torch.Tensor) -> torch.Tensor:
        return self.model(src_ids, tgt_ids, src_valid)

    def _step(self, batch: dict, label_smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed token loss, token count) of a batch, the pair CausalLMTask._step returns."""
        return self.model(
            batch["src_ids"],
            batch["tgt_ids"],
            batch["src_valid"],
            labels=batch["labels"],
            label_smoothing=label_smoothing,
        )

    def training_step(self, batch, batch_idx):
        total, count = self._step(batch, self.hparams.label_smoothing)
        loss = token_mean(total, count)
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        real = batch["src_valid"].sum() + batch["tgt_valid"].sum()
        slots = batch["src_valid"].numel() + batch["tgt_valid"].numel()
        self.log("train/padding", 1 - real / slots, on_step=True, on_epoch=False)  # share of wasted positions
        return loss

    # ---- evaluation ------------------------------------------------------------------------------

    def translate(self, src_ids: torch.Tensor, src_valid: torch.Tensor, beam_size: int) -> list[str]:
        tok = self.require_tokenizer()
        h = self.hparams
        hypotheses = self.model.translate(src_ids, src_valid, beam_size, h.length_penalty, h.max_extra_tokens)
        return [tok.decode(ids) for ids in hypotheses]

    @torch.no_grad()
    def translate_texts(self, sentences: list[str], beam_size: int = 1, batch_size: int = 32) -> list[str]:
        """Translations of raw sentences, decoded in batches of similar length (less padding); an empty
        sentence translates to an empty one."""
        tok = self.require_tokenizer()
        encoded = self.encode_sources(sentences)
        order = sorted((i for i, s in enumerate(sentences) if s.strip()), key=lambda i: len(encoded[i]))
        translations = [""] * len(sentences)
        with eval_mode(self.model):
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                src_ids, src_valid = right_pad([encoded[i] for i in rows], tok.pad_id, device=self.device)
                for i, text in zip(rows, self.translate(src_ids, src_valid, beam_size)):
                    translations[i] = text
        return translations

    def _score(self, stage: str, hypotheses: list[str], references: list[str]) -> None:
        self.scores[f"{stage}_bleu"].update(hypotheses, references)
        self.scores[f"{stage}_chrf"].update(hypotheses, references)

    def _eval_step(self, batch: dict, stage: str, beam_size: int) -> None:
        total, count = self._step(batch, 0.0)
        self.log_mean(f"{stage}/loss", token_mean(total, count), count, prog_bar=stage == "val")
        references = batch["tgt_text"]
        self._score(stage, self.translate(batch["src_ids"], batch["src_valid"], beam_size), references)
        if stage == "test":
            if beam_size > 1:
                self._score(
                    "test_greedy", self.translate(batch["src_ids"], batch["src_valid"], 1), references
                )
            self._score("test_identity", batch["src_text"], references)

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, "val", self.hparams.val_beam_size)

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, "test", self.hparams.test_beam_size)

    def _log_scores(self, stage: str) -> None:
        loss = self.trainer.callback_metrics.get(f"{stage}/loss")
        if loss is not None:
            self.log(f"{stage}/ppl", loss.exp())
        names = {
            "val": "val/{}",
            "test": "test/{}",
            "test_greedy": "test/{}_greedy",
            "test_identity": "test/{}_identity",
        }
        for key, name in names.items():
            if not key.startswith(stage):
                continue
            for kind in ("bleu", "chrf"):
                metric = self.scores[f"{key}_{kind}"]
                if metric.update_called:
                    self.log(name.format(kind), metric.compute(), prog_bar=key == "val")
                metric.reset()

    def _log_signatures(self) -> None:
        """sacreBLEU's signatures (version, tokenizer, smoothing: what makes scores comparable), once per run,
        on the console and with every dashboard's hyperparameters."""
        if self._signature_logged:
            return
        signatures = {
            f"sacrebleu/{kind}": self.scores[f"val_{kind}"].signature() for kind in ("bleu", "chrf")
        }
        log.info("sacreBLEU signatures: %s", signatures)
        for logger in self.loggers:
            logger.log_hyperparams(signatures)
        self._signature_logged = True

    def on_fit_start(self) -> None:
        super().on_fit_start()
        self._log_signatures()

    def on_test_start(self) -> None:
        self._log_signatures()

    def on_validation_epoch_end(self):
        self._log_scores("val")
        self.log_best("val/bleu")
        self.log_examples()

    def on_test_epoch_end(self):
        self._log_scores("test")

    # ---- dashboards ------------------------------------------------------------------------------

    def log_examples(self) -> None:
        """A few fixed validation sentences with their reference, greedy hypothesis and sentence chrF as a
        table, and the cross-attention of the first one as a picture (target tokens x source tokens, last
        decoder layer, averaged over heads). Every rank runs the forwards (under FSDP each needs them all);
        the dashboards take rank 0's."""
        n = self.hparams.num_examples
        examples = self.data.fixed_examples(n) if n and self.data is not None else []
        if not examples or self.trainer.sanity_checking:
            return
        hypotheses = self.translate_texts([source for source, _ in examples])
        chrf = self.scores["val_chrf"].scorer  # the corpus chrF's settings, per sentence
        log_table(
            self.trainer,
            "val/translations",
            ["source", "reference", "hypothesis", "chrF"],
            [(s, r, h, chrf.sentence_score(h, [r]).score) for (s, r), h in zip(examples, hypotheses)],
            decimals={"chrF": 1},  # as sacreBLEU prints it
        )
        tok = self.require_tokenizer()
        source = torch.tensor(self.encode_sources([examples[0][0]]), device=self.device)
        target = torch.tensor([[self.model.config.bos_id, *tok.encode(hypotheses[0])]], device=self.device)
        probs = cross_attention_map(self.model, source, target)  # (T, S)
        labels = lambda t, ids: [t.decode([i], skip_special_tokens=False) for i in ids]  # noqa: E731
        figure = attention_figure(
            probs,
            labels(tok, target[0].tolist()),
            labels(self.source_tokenizer or tok, source[0].tolist()),
            title="cross-attention of the first example (last decoder layer, mean over heads)",
            x_label="source token",
            y_label="target token (greedy hypothesis)",
        )
        log_image(self.trainer, "val/cross_attention", figure)


@torch.no_grad()
def cross_attention_map(
    model: Seq2SeqTransformer, src_ids: torch.Tensor, tgt_ids: torch.Tensor
) -> torch.Tensor:
    """(T, S) cross-attention probabilities of the last decoder layer, averaged over heads, for one source
    (1, S) and target prefix (1, T) (teacher-forced)."""
    with eval_mode(model), recorded_attention(model.decoder[-1].cross_attn) as probs:
        model(src_ids, tgt_ids)
    return probs[0][0].mean(dim=0)
