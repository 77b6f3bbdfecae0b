"""Supervised fine-tuning (InstructGPT stage 1): next-token loss on the completion only, and the judge's
verdict on greedy generations for held-out prompts."""

from __future__ import annotations

import logging

from lit_transformers.models import GPTConfig
from lit_transformers.tasks.causal_lm import CausalLMTask
from lit_transformers.tasks.instruct import JudgeMetrics, decode_responses, rollout
from lit_transformers.utils.dashboards import log_table

log = logging.getLogger(__name__)


class SFTTask(CausalLMTask):
    """:class:`CausalLMTask` on prompt/completion batches (prompt labels are IGNORE_INDEX, so only the
    completion and its EOS are learned), plus ``val/judge_exact`` and ``val/judge_score`` (and ``test/``)
    of greedy responses when the data carries answers.

    Args: ``max_new_tokens`` for the judged generations; the rest as in :class:`CausalLMTask`.
    """

    def __init__(self, model: dict | GPTConfig, max_new_tokens: int = 16, **task_args):
        super().__init__(model, **task_args)
        self.val_judge, self.test_judge = JudgeMetrics(), JudgeMetrics()

    def configure_model(self) -> None:
        if not self._built and not self.hparams.init_from:
            log.warning("SFT starts from random weights: no init_from (pass a pretrained GPT checkpoint)")
        super().configure_model()

    def _judge(self, batch, stage: str, metrics: JudgeMetrics, batch_idx: int) -> None:
        if batch.get("answers") is None:
            return
        tok = self.require_tokenizer()
        out = rollout(self.model, tok, batch["prompt_ids"], batch["prompt_mask"], self.hparams.max_new_tokens)
        texts = decode_responses(tok, out.responses, out.response_mask)
        verdicts = metrics.update(texts, batch["answers"])
        self.log(f"{stage}/judge_exact", metrics.exact, on_epoch=True, prog_bar=stage == "val")
        self.log(f"{stage}/judge_score", metrics.score, on_epoch=True)
        if batch_idx == 0 and not self.trainer.sanity_checking:
            prompts = [tok.decode(p[m].tolist()) for p, m in zip(batch["prompt_ids"], batch["prompt_mask"])]
            rows = [(p, t, a, v[1]) for p, t, a, v in zip(prompts, texts, batch["answers"], verdicts)][:8]
            log_table(self.trainer, f"{stage}/samples", ["prompt", "response", "answer", "judge_score"], rows)

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        self._judge(batch, "val", self.val_judge, batch_idx)

    def test_step(self, batch, batch_idx):
        super().test_step(batch, batch_idx)
        self._judge(batch, "test", self.test_judge, batch_idx)
