"""Supervised fine-tuning (InstructGPT stage 1): next-token loss on the completion only, and the judge's
verdict on greedy generations for held-out prompts."""

from __future__ import annotations

from lit_transformers.models import GPTConfig
from lit_transformers.tasks.causal_lm import CausalLMTask, decoder_spec
from lit_transformers.tasks.instruct import decode_responses, log_judged, rollout


class SFTTask(CausalLMTask):
    """:class:`CausalLMTask` on prompt/completion batches (prompt labels are IGNORE_INDEX, so only the
    completion and its EOS are learned), plus ``val/judge_exact`` and ``val/judge_score`` (and ``test/``)
    of greedy responses when the data carries answers.

    Args: ``max_new_tokens`` for the judged generations; the rest as in :class:`CausalLMTask`.
    """

    init_from_hint = "pass a pretrained GPT checkpoint"

    def __init__(
        self, model: dict | GPTConfig, max_new_tokens: int = 16, init_from_hf: str | None = None, **task_args
    ):
        # the hyperparameters are recorded from this frame too: its model must be the directory's already
        model = decoder_spec(model, init_from_hf)
        super().__init__(model, init_from_hf=init_from_hf, **task_args)

    def _judge(self, batch, stage: str, batch_idx: int) -> None:
        if batch.get("answers") is None:
            return
        tok = self.require_tokenizer()
        out = rollout(self.model, tok, batch["prompt_ids"], batch["prompt_mask"], self.hparams.max_new_tokens)
        texts = decode_responses(tok, out.responses, out.response_mask)
        log_judged(self, batch, stage, batch_idx, texts, {}, prog_bar=("judge_exact",))

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        self._judge(batch, "val", batch_idx)

    def test_step(self, batch, batch_idx):
        super().test_step(batch, batch_idx)
        self._judge(batch, "test", batch_idx)
