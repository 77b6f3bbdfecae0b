"""task.lora: peft adapters on our modules compute as peft's on the Hugging Face model, only they train and are
saved, their checkpoints rebuild (and insist on) their base, and a LoRA run resumes exactly."""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path

import lightning
import pytest
import torch
from torch import nn

from lit_transformers.generate import language_model
from lit_transformers.models import BERT, GPT, BERTConfig, GPTConfig
from lit_transformers.models.backbone import create_backbone
from lit_transformers.models.clip import CLIP, CLIPConfig
from lit_transformers.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from lit_transformers.tasks.causal_lm import CausalLMTask
from lit_transformers.tasks.contrastive import ContrastiveTask
from lit_transformers.tasks.image_classification import ImageClassificationTask
from lit_transformers.tasks.lora import LoRASpec, adapters_disabled, add_adapters, without_adapters
from lit_transformers.tasks.lora_export import export_lora, save_peft_adapter
from lit_transformers.tasks.sequence_classification import SequenceClassificationTask
from lit_transformers.tasks.sft import SFTTask
from lit_transformers.tasks.specs import config_spec
from lit_transformers.tasks.translation import TranslationTask
from lit_transformers.train import train

from test_instructgpt import TINY, TINY_DATA, TINY_TASK
from test_resume import _assert_same_training, _train_in

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

ADAM = {"_target_": "torch.optim.AdamW", "lr": 1e-3}
TINY_GPT = dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, d_model=16)
# ours fused <- HF separate projections, per layer (the exported Llama's names)
LLAMA_PARTS = {
    "attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "attn.out_proj": ("self_attn.o_proj",),
    "mlp.fc": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.proj": ("mlp.down_proj",),
}


def _llama() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query: q, k, v split unequally
        max_position_embeddings=32,
    )
    return transformers.LlamaForCausalLM(config).eval()


def _adapt(ours: GPT) -> GPT:
    add_adapters(ours, LoRASpec(r=4, alpha=8), "model")
    for name, param in ours.named_parameters():
        if "lora_B" in name:  # peft starts B at zero; random, so the adapters change the logits
            nn.init.normal_(param, std=0.2)
    return ours


def _adapted_llama() -> GPT:
    return _adapt(GPT.from_hf(_llama(), dtype=torch.float32).eval())


def _loss(logits: torch.Tensor) -> torch.Tensor:
    weights = torch.linspace(-1, 1, logits.numel()).view_as(logits)
    return (logits * weights).sum()


def test_our_lora_computes_as_peft_on_the_exported_hf_model_logits_and_gradients(tmp_path):
    ours = _adapted_llama()
    save_peft_adapter(ours, tmp_path)
    hf = peft.PeftModel.from_pretrained(_llama(), tmp_path, is_trainable=True).eval()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    logits, hf_logits = ours(ids), hf(ids).logits
    assert (logits - ours.__class__.from_hf(_llama())(ids)).abs().max() > 1e-2  # the adapters do something
    torch.testing.assert_close(logits, hf_logits, atol=1e-4, rtol=0)
    _loss(logits).backward()
    _loss(hf_logits).backward()
    hf_params = dict(hf.named_parameters())
    for i in range(2):
        for fused, parts in LLAMA_PARTS.items():
            adapter = ours.blocks[i].get_submodule(fused)
            hf_names = [f"base_model.model.model.layers.{i}.{part}" for part in parts]
            # one shared A: its gradient sums those of HF's per-projection A copies; B's rows split as the weight's
            hf_a = sum(hf_params[f"{name}.lora_A.default.weight"].grad for name in hf_names)
            hf_b = torch.cat([hf_params[f"{name}.lora_B.default.weight"].grad for name in hf_names])
            torch.testing.assert_close(adapter.lora_A["default"].weight.grad, hf_a, atol=1e-4, rtol=0)
            torch.testing.assert_close(adapter.lora_B["default"].weight.grad, hf_b, atol=1e-4, rtol=0)


def test_gpt2_layout_adapters_load_on_hf_conv1d(tmp_path):
    def gpt2():
        torch.manual_seed(0)
        config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4)
        return transformers.GPT2LMHeadModel(config).eval()

    ours = GPT.from_hf(gpt2(), dtype=torch.float32).eval()
    _adapt(ours)
    save_peft_adapter(ours, tmp_path)
    hf = peft.PeftModel.from_pretrained(gpt2(), tmp_path).eval()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids), atol=1e-4, rtol=0)


def test_merged_export_is_a_plain_hf_model_with_our_logits(tmp_path):
    ours = _adapted_llama()
    save_peft_adapter(ours, tmp_path, merge=True)
    assert not (tmp_path / "adapter_config.json").exists()
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids), atol=1e-5, rtol=0)
        with adapters_disabled(ours):  # the frozen base, as a reference model reads it
            torch.testing.assert_close(ours(ids), GPT.from_hf(_llama())(ids), atol=1e-5, rtol=0)


def test_modules_to_save_are_exported_whole_for_peft(tmp_path):
    ours = _adapted_llama()
    nn.init.normal_(ours.ln_f.weight, mean=1.0, std=0.5)  # trained in full: HF's model.norm must take it
    save_peft_adapter(ours, tmp_path, modules_to_save=["ln_f"])
    hf = peft.PeftModel.from_pretrained(_llama(), tmp_path).eval()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids), atol=1e-4, rtol=0)


def _base_file(tmp_path: Path, model: nn.Module, name: str = "base.pt") -> str:
    path = tmp_path / name
    torch.save(model.state_dict(), path)
    return str(path)


def _gpt_task(tmp_path: Path, lora: dict | None, seed: int = 0, **config) -> CausalLMTask:
    torch.manual_seed(seed)
    spec = GPTConfig(**{**TINY_GPT, **config})
    base = _base_file(tmp_path, GPT(spec), f"gpt_{seed}.pt")
    task = CausalLMTask(model=spec, optimizer=ADAM, init_from=base, lora=lora)
    task.configure_model()
    return task


def _optimized(task) -> set[int]:
    return {id(p) for group in task.configure_optimizers().param_groups for p in group["params"]}


def test_only_adapters_train_and_are_optimized_gpt(tmp_path):
    task = _gpt_task(tmp_path, {"r": 4})
    trainable = {name for name, p in task.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert {n.split(".lora_")[0].split(".", 3)[-1] for n in trainable} == {
        "attn.qkv_proj",
        "attn.out_proj",
        "mlp.fc",
        "mlp.proj",
    }
    assert _optimized(task) == {id(p) for p in task.parameters() if p.requires_grad}


def test_bert_classifier_trains_adapters_and_its_new_classifier(tmp_path):
    spec = BERTConfig(vocab_size=50, max_position=16, n_layer=1, n_head=2, d_model=16, d_ff=32)
    base = _base_file(tmp_path, BERT(BERTConfig(**{**vars(spec), "pretraining_heads": False})))
    task = SequenceClassificationTask(
        model=config_spec(spec), class_names=["a", "b"], optimizer=ADAM, init_from=base, lora={}
    )
    task.configure_model()
    trainable = {name for name, p in task.named_parameters() if p.requires_grad}
    assert {n for n in trainable if not n.startswith("classifier.")} == {
        n for n in trainable if ".lora_A." in n or ".lora_B." in n
    }
    assert {"classifier.1.weight", "classifier.1.bias"} <= trainable
    assert not any(n.startswith("model.pooler") or "base_layer" in n for n in trainable)
    assert _optimized(task) == {id(p) for p in task.parameters() if p.requires_grad}


def _vit_task(tmp_path: Path) -> ImageClassificationTask:
    backbone = {"name": "vit_tiny_patch16_224", "img_size": 32, "depth": 2}
    torch.manual_seed(0)
    base = _base_file(tmp_path, create_backbone(**backbone, num_classes=3))  # timm pretrained on our classes
    backbone |= {"pretrained": True, "pretrained_file": base}
    return ImageClassificationTask(
        model={"backbone": backbone}, class_names=list("abc"), optimizer=ADAM, lora={}
    )


def _translation_task(tmp_path: Path) -> TranslationTask:
    spec = Seq2SeqConfig(64, max_len=16, n_encoder_layer=1, n_decoder_layer=1, n_head=2, d_model=16, d_ff=32)
    spec = dataclasses.replace(spec, pad_id=0, bos_id=1, eos_id=2)
    base = _base_file(tmp_path, Seq2SeqTransformer(spec))
    return TranslationTask(model=spec, optimizer=ADAM, init_from=base, lora={})


def _clip_task(tmp_path: Path) -> ContrastiveTask:
    image = {"name": "vit_tiny_patch16_224", "img_size": 32, "depth": 1}
    spec = CLIPConfig(image, 16, 64, 2, context_length=8, text_width=16, text_layers=1, text_heads=2)
    base = _base_file(tmp_path, CLIP(spec))
    return ContrastiveTask(model=spec, optimizer=ADAM, init_from=base, lora={})


VIT_LAYERS = {"attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"}  # timm's names, in every block
OUR_LAYERS = {"attn.qkv_proj", "attn.out_proj", "mlp.fc", "mlp.proj"}  # nn.blocks' names
CROSS = {"cross_attn.q_proj", "cross_attn.kv_proj", "cross_attn.out_proj"}


@pytest.mark.parametrize(
    "make, adapted, heads",
    [
        pytest.param(_vit_task, VIT_LAYERS, {"model.head.weight", "model.head.bias"}, id="vit"),
        pytest.param(_translation_task, OUR_LAYERS | CROSS, set(), id="translation"),
        pytest.param(_clip_task, OUR_LAYERS | VIT_LAYERS, set(), id="clip-both-towers"),
    ],
)
def test_every_family_adapts_its_attention_and_mlp_projections_by_default(tmp_path, make, adapted, heads):
    task = make(tmp_path)
    task.configure_model()
    trained = {name for name, p in task.named_parameters() if p.requires_grad}
    assert heads <= trained and all(".lora_" in n for n in trained - heads)
    layers = {re.sub(r"^.*?\.\d+\.", "", n.split(".lora_")[0]) for n in trained - heads}  # blocks.{i}.<layer>
    assert layers == adapted
    if make is _clip_task:
        assert any(n.startswith("model.visual.") for n in trained) and any(
            n.startswith("model.blocks.") for n in trained
        )
    assert _optimized(task) == {id(p) for p in task.parameters() if p.requires_grad}
    checkpoint = {"state_dict": task.state_dict()}
    task.on_save_checkpoint(checkpoint)
    assert set(checkpoint["state_dict"]) >= trained  # what trains is saved; the base is named instead
    assert str(tmp_path / "base.pt") in checkpoint["lora_base"]["source"]


def _saved_size(task) -> int:
    checkpoint = {"state_dict": task.state_dict()}
    task.on_save_checkpoint(checkpoint)
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    return buffer.tell()


def test_lora_checkpoint_of_gpt_mini_is_under_5_percent_of_the_full_one(tmp_path):
    mini = dict(vocab_size=4096, block_size=256, n_layer=6, n_head=6, d_model=384)  # conf/model/gpt_mini.yaml
    full, lora = _gpt_task(tmp_path, None, **mini), _gpt_task(tmp_path, {"r": 8}, **mini)
    assert _saved_size(lora) < 0.05 * _saved_size(full)


def test_lora_checkpoint_refuses_another_base_naming_its_own(tmp_path):
    task = _gpt_task(tmp_path, {"r": 4}, seed=0)
    checkpoint = {"state_dict": task.state_dict()}
    task.on_save_checkpoint(checkpoint)
    other = _gpt_task(tmp_path, {"r": 4}, seed=1)
    with pytest.raises(ValueError, match=f"trained on the base init_from={tmp_path / 'gpt_0.pt'}"):
        other.on_load_checkpoint(checkpoint)


def test_lora_on_a_hugging_face_base_reloads_from_its_directory(tmp_path):
    _llama().save_pretrained(tmp_path / "llama")
    task = CausalLMTask(model={}, optimizer=ADAM, init_from_hf=str(tmp_path / "llama"), lora={"r": 4})
    task.configure_model()
    nn.init.normal_(task.model.blocks[0].attn.qkv_proj.lora_B["default"].weight)  # as if trained
    checkpoint = {
        "state_dict": task.state_dict(),
        "hyper_parameters": dict(task.hparams),
        "pytorch-lightning_version": lightning.__version__,
    }
    task.on_save_checkpoint(checkpoint)
    assert checkpoint["lora_base"]["source"] == f"init_from_hf={tmp_path / 'llama'}"
    torch.save(checkpoint, tmp_path / "lora.ckpt")
    reloaded = CausalLMTask.load_from_checkpoint(tmp_path / "lora.ckpt", weights_only=True)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(reloaded.model.eval()(ids), task.model.eval()(ids), rtol=0, atol=0)


def test_a_target_module_that_matches_nothing_lists_the_module_names(tmp_path):
    with pytest.raises(ValueError, match=r"\['attn.q_proj'\] match no module") as error:
        _gpt_task(tmp_path, {"target_modules": ["attn.q_proj"]})
    assert "blocks.{i}.attn.qkv_proj" in str(error.value) and "lm_head" in str(error.value)


def test_unknown_modules_to_save_and_keys_are_named(tmp_path):
    with pytest.raises(ValueError, match="modules_to_save names 'model.head', which CausalLMTask lacks"):
        _gpt_task(tmp_path, {"modules_to_save": ["model.head"]})
    with pytest.raises(ValueError, match=r"unknown keys \['rank'\]; its keys are \['r', 'alpha'"):
        _gpt_task(tmp_path, {"rank": 4})


def test_lora_without_a_pretrained_base_is_refused():
    task = CausalLMTask(model=GPTConfig(**TINY_GPT), optimizer=ADAM, lora={"r": 4})
    with pytest.raises(ValueError, match="set init_from=<checkpoint>, task.init_from_hf"):
        task.configure_model()


def test_lora_on_a_frozen_model_is_refused(tmp_path):
    class FrozenLM(CausalLMTask):
        frozen = ("model",)

    torch.manual_seed(0)
    base = _base_file(tmp_path, GPT(GPTConfig(**TINY_GPT)))
    task = FrozenLM(model=GPTConfig(**TINY_GPT), optimizer=ADAM, init_from=base, lora={"r": 4})
    with pytest.raises(ValueError, match="task.lora on model, which FrozenLM keeps frozen"):
        task.configure_model()


LORA_RUN = ["task.lora={r:4,alpha:8}"]
# the stage sizes of test_instructgpt, on tiny_lm_run's GPT (TINY_LM) as the base
SFT_TINY = [
    *(o for o in TINY if not o.startswith("model.block_size")),
    *TINY_DATA,
    *TINY_TASK,
    "model.block_size=32",
    "data.max_prompt_length=20",
]


def test_lora_run_resumes_exactly_and_its_checkpoint_reloads_on_its_base(compose_cfg, tmp_path, tiny_lm_run):
    base = tiny_lm_run / "checkpoints" / "last.ckpt"
    lora = [*LORA_RUN, f"init_from={base}"]
    _train_in(compose_cfg, tmp_path / "straight", *lora)
    step_4 = tmp_path / "straight" / "checkpoints" / "step_000004.ckpt"
    _train_in(compose_cfg, tmp_path / "resumed", f"ckpt_path={step_4}", *lora)
    _assert_same_training(tmp_path / "straight", tmp_path / "resumed", range(4, 8))

    last = tmp_path / "straight" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)
    assert saved["lora_base"]["source"] == f"init_from={base}"
    weights = [k for k in saved["state_dict"] if k.startswith("model.")]
    assert weights and all(
        ".lora_" in k for k in weights
    )  # adapters only: the base is rebuilt from init_from
    reloaded = CausalLMTask.load_from_checkpoint(last, weights_only=True)
    for name, value in reloaded.state_dict().items():
        expected = saved["state_dict"].get(name)
        if expected is not None:
            torch.testing.assert_close(value, expected, rtol=0, atol=0, msg=name)

    # init_from of an adapter checkpoint: its base with its adapters merged, a full model of the same logits
    spec = {**saved["hyper_parameters"]["model"], "vocab_size": reloaded.model.config.vocab_size}
    child = CausalLMTask(model=spec, optimizer=ADAM, init_from=str(last))
    child.configure_model()
    ids = torch.randint(0, spec["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(child.model.eval()(ids), reloaded.model.eval()(ids), atol=1e-5, rtol=0)


def test_sft_with_lora_trains_through_the_command_line_config(compose_cfg, tmp_path, tiny_lm_run):
    base = tiny_lm_run / "checkpoints" / "last.ckpt"
    cfg = compose_cfg(
        "experiment=gpt_sft",
        *SFT_TINY,
        *LORA_RUN,
        f"init_from={base}",
        f"data.tokenizer_path={base}",
    )
    result = train(
        cfg
    )  # tested on its best checkpoint: adapters reloaded onto the base rebuilt from init_from
    assert torch.isfinite(torch.tensor(result.metrics["test/loss"]))
    saved = torch.load(result.best_checkpoint, weights_only=True)
    assert saved["lora_base"]["source"] == f"init_from={base}"
    assert all(".lora_" in k for k in saved["state_dict"] if k.startswith("model."))
    # the trained adapters, exported for peft, compute on the exported base (GPT-2 layout) as in our task
    task = SFTTask.load_from_checkpoint(result.best_checkpoint, weights_only=True).eval()
    for name, param in task.model.named_parameters():
        if "lora_B" in name:  # two warmup steps barely move B: as if trained longer
            nn.init.normal_(param, std=0.2)
    export_lora(task, tmp_path / "adapter")
    hf_base = without_adapters(task.model, merge=False).to_hf()
    hf = peft.PeftModel.from_pretrained(hf_base, tmp_path / "adapter").eval()
    ids = torch.randint(0, task.model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, task.model(ids), atol=1e-4, rtol=0)
    # lit-generate and lit-export read the checkpoint as its base with the adapters merged
    generating = language_model(str(result.best_checkpoint)).eval()
    reloaded = SFTTask.load_from_checkpoint(result.best_checkpoint, weights_only=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(generating.model(ids), reloaded.model(ids), atol=1e-5, rtol=0)
