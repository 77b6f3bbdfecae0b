"""Causal language modelling (GPT pretraining, and the SFT stage later): next-token cross-entropy."""

from __future__ import annotations

import torch

from lit_transformers.contract import TokenizedText
from lit_transformers.models import GPT, GPTConfig
from lit_transformers.nn import generate, token_mean
from lit_transformers.tasks.base import Task, eval_mode
from lit_transformers.tasks.specs import config_spec
from lit_transformers.text import left_pad, render_chat


def decoder_spec(model: dict | GPTConfig, init_from_hf: str | None) -> dict:
    """The model spec a GPT task records (before the base records its arguments as hyperparameters): that of
    the Hugging Face causal LM directory ``init_from_hf`` when given (its config.json, weights unread), so a
    resumed or reloaded run rebuilds the checkpoint's architecture without the directory, with ``model``'s
    ``activation_checkpointing`` (how the run trains); else ``model``'s."""
    spec = config_spec(model)
    if not init_from_hf:
        return spec
    from lit_transformers.models.hf_convert import read_hf_config
    from lit_transformers.models.hf_decoder import decoder_converter

    hf = decoder_converter(init_from_hf).config_from_hf(read_hf_config(init_from_hf, "causal LM"))
    return config_spec(hf) | {"activation_checkpointing": bool(spec.get("activation_checkpointing"))}


def load_hf_decoder(task: Task, path: str, what: str) -> GPT:
    """``GPT.from_hf(path)`` for ``task`` (its ``trust_checkpoint``), checked against the run's tokenizer; ``what``
    names the model in the log. float32, whatever the checkpoint's dtype: trainer.precision (bf16-true,
    bf16-mixed) decides what runs in bf16, and the optimizer keeps float32 weights under bf16-mixed. Applied
    once: ``init_from_hf`` is cleared, and the task's checkpoints rebuild the model from ``hparams.model``."""
    model = GPT.from_hf(path, task.hparams.trust_checkpoint, dtype=torch.float32)
    if task.hparams.init_from_hf:
        task.check_hf_vocabulary(model.config.vocab_size, what)
        task.hparams.init_from_hf = None
    return model


def build_decoder(task: Task, what: str) -> GPT:
    """The task's decoder: its ``init_from_hf`` directory's (:func:`load_hf_decoder`), else a new GPT from
    ``hparams.model`` at the tokenizer's vocabulary."""
    if task.hparams.init_from_hf:
        return load_hf_decoder(task, task.hparams.init_from_hf, what)
    return GPT(task.text_model_config(vocab_size=lambda tok: tok.vocab_size))


class CausalLMTask(Task):
    """Args: ``model``, the GPT config spec (``vocab_size: null`` takes the tokenizer's); ``init_from_hf``: a
    Hugging Face GPT-2 / Llama / Qwen2 / Mistral directory whose config replaces the spec and whose weights
    initialise the model (train with its tokenizer: ``data.tokenizer_path=<the same directory>``); the rest as
    in :class:`Task`."""

    data_needs = (TokenizedText,)
    context_field = "block_size"

    def __init__(self, model: dict | GPTConfig, init_from_hf: str | None = None, **task_args):
        model = decoder_spec(model, init_from_hf)
        super().__init__(**task_args)
        self.track_best("val/loss", "min")

    def build_model(self) -> GPT:
        return build_decoder(self, "GPT")

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids)

    def _step(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed token loss, token count) of a batch of input ids and next-token labels; packed batches
        (SFT) add ``position_ids`` and a block-diagonal ``attention_mask``."""
        return self.model(
            batch["input_ids"],
            position_ids=batch.get("position_ids"),
            mask=batch.get("attention_mask"),
            labels=batch["labels"],
        )

    def training_step(self, batch, batch_idx):
        total, count = self._step(batch)
        loss = token_mean(total, count)
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        return loss

    def _eval_step(self, batch, stage: str) -> None:
        total, count = self._step(batch)
        # token-weighted (sum of token losses / token count, over batches and ranks): val/ppl is exactly
        # exp(val/loss), and padded or prompt-masked batches weigh by their real targets
        self.log_mean(f"{stage}/loss", token_mean(total, count), count, prog_bar=stage == "val")

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, "test")

    def on_validation_epoch_end(self):
        self.log_ppl("val")
        self.log_best("val/loss")

    def on_test_epoch_end(self):
        self.log_ppl("test")

    def log_ppl(self, stage: str) -> None:
        loss = self.trainer.callback_metrics.get(f"{stage}/loss")
        if loss is not None:
            self.log(f"{stage}/ppl", loss.exp(), prog_bar=stage == "val")

    def encode_prompts(self, prompts: list[str], chat: bool = False) -> list[list[int]]:
        """Each prompt's ids, after BOS when the tokenizer has one (Qwen2's has none); with ``chat``, each prompt as a user message rendered with the tokenizer's
        chat template and its generation prompt, as ``apply_chat_template(..., add_generation_prompt=True)``
        (the template writes the BOS)."""
        tok = self.require_tokenizer()
        if chat:
            user_turn = lambda p: [{"role": "user", "content": p}]  # noqa: E731
            return [tok.encode(render_chat(tok, user_turn(p), add_generation_prompt=True)) for p in prompts]
        bos = [tok.bos_id] if "bos" in tok.ids else []
        return [bos + tok.encode(p) for p in prompts]

    @torch.no_grad()
    def sample(
        self,
        prompts: list[str],
        max_new_tokens: int = 64,
        temperature: float = 0.8,
        top_k: int | None = 50,
        top_p: float | None = None,
        seed: int | None = None,
        chat: bool = False,
    ) -> list[str]:
        """Continue each prompt (:meth:`encode_prompts`) until any of the tokenizer's ``end_of_turn_ids``; returns
        only the generated text (with ``chat``: the assistant's reply)."""
        tok = self.require_tokenizer()
        ids, valid = left_pad(self.encode_prompts(prompts, chat), tok.pad_id, device=self.device)
        max_new_tokens = min(max_new_tokens, self.model.config.block_size - ids.size(1))
        generator = torch.Generator(device=self.device).manual_seed(seed) if seed is not None else None
        with eval_mode(self.model):
            out = generate(
                self.model,
                ids,
                valid,
                max_new_tokens,
                temperature,
                top_k,
                top_p,
                eos_id=tok.end_of_turn_ids,
                pad_id=tok.pad_id,
                generator=generator,
            )
        return [tok.decode(row[ids.size(1) :].tolist()) for row in out]
