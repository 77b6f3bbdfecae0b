"""LoRA adapters out of our models: :func:`save_peft_adapter` writes them in peft's own format
(``adapter_config.json`` + ``adapter_model.safetensors``) against the Hugging Face model ``to_hf`` exports, so
``PeftModel.from_pretrained`` reproduces our logits, or writes the merged full weights; :func:`export_lora` does it
for a task's model."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from torch import nn

from lit_transformers.tasks.lora import lora_spec, without_adapters

log = logging.getLogger(__name__)


def _hf_tensors(weight) -> tuple[str, ...]:
    """The HF tensors one of ours is (several where ours fuses them), without the aliases of tied ones."""
    return weight.hf if isinstance(weight.hf, tuple) else (weight.hf,)


def _layer_suffix(hf_name: str) -> str:
    """``model.layers.3.self_attn.q_proj`` -> ``self_attn.q_proj``: a target name for every layer."""
    return re.sub(r"^.*?\.\d+\.", "", hf_name)


def export_lora(task, save_dir: str | Path, merge: bool = False) -> Path:
    """:func:`save_peft_adapter` of a LoRA causal-LM task (``SFTTask.load_from_checkpoint(ckpt)``): its GPT's
    adapters, with the ``modules_to_save`` inside the GPT."""
    saved = lora_spec(task.hparams.lora).modules_to_save or ()
    inside = [path.removeprefix("model.") for path in saved if path.startswith("model.")]
    return save_peft_adapter(task.model, save_dir, merge, inside)


def save_peft_adapter(
    model: nn.Module, save_dir: str | Path, merge: bool = False, modules_to_save=()
) -> Path:
    """Write ``model``'s (a GPT with adapters) adapters in peft's format (``adapter_config.json`` +
    ``adapter_model.safetensors``), named for the Hugging Face model ``model.to_hf()`` exports, so that
    ``PeftModel.from_pretrained(hf_model, save_dir)`` computes as ``model``. Our fused projections (q/k/v,
    gate/up) are one adapter: on HF's separate projections each gets its A and its rows of B, which is the same
    update. ``modules_to_save``: ``model``'s submodules trained in full, written whole. With ``merge``, the full
    merged weights instead (``to_hf``'s ``save_pretrained``), trained modules included."""
    save_dir = Path(save_dir)
    if merge:
        without_adapters(model, merge=True).to_hf(save_dir)
        log.info(
            "Wrote merged full weights to %s: each adapted weight is W + B A * alpha / r, and every other weight "
            "(modules_to_save, trained in full, among them) as trained; load it without peft",
            save_dir,
        )
        return save_dir
    from peft import LoraConfig
    from peft.tuners.lora import LoraLayer
    from safetensors.torch import save_file

    from lit_transformers.models import hf_convert

    name_map = model.hf_converter().name_map(model.config)
    by_ours = {weight.ours: weight for weight in name_map.weights}
    tensors, targets, layer, transposed = {}, set(), None, False
    for name, layer in ((n, m) for n, m in model.named_modules() if isinstance(m, LoraLayer)):
        weight = by_ours[f"{name}.weight"]
        transposed |= weight.layout == "transposed"  # GPT-2's Conv1D: peft's fan_in_fan_out
        hf_names = [key.removesuffix(".weight") for key in _hf_tensors(weight)]
        lora_a, lora_b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        parts = lora_b.split(list(weight.split)) if weight.split else lora_b.chunk(len(hf_names))
        for hf_name, part in zip(hf_names, parts):
            tensors[f"base_model.model.{hf_name}.lora_A.weight"] = lora_a.detach().clone()
            tensors[f"base_model.model.{hf_name}.lora_B.weight"] = part.detach().contiguous().clone()
            targets.add(_layer_suffix(hf_name))
    if layer is None:
        raise ValueError("The model has no LoRA adapters to save; train it with task.lora set")
    saved_hf = set()
    if modules_to_save:
        hf_state = hf_convert.state_to_hf(without_adapters(model, merge=False).state_dict(), name_map)
        for path in modules_to_save:
            for param in model.get_submodule(path).state_dict():
                for key in _hf_tensors(by_ours[f"{path}.{param}"]):
                    tensors[f"base_model.model.{key}"] = hf_state[key].detach().clone()
                    saved_hf.add(key.rsplit(".", 1)[0])
    config = LoraConfig(
        r=layer.r["default"],
        lora_alpha=layer.lora_alpha["default"],
        lora_dropout=getattr(layer.lora_dropout["default"], "p", 0.0),
        target_modules=sorted(targets),
        modules_to_save=sorted(saved_hf) or None,
        fan_in_fan_out=transposed,
        task_type="CAUSAL_LM",
    )
    config.save_pretrained(str(save_dir))
    save_file(tensors, str(save_dir / "adapter_model.safetensors"))
    return save_dir
