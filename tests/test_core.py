"""The stage-ready core: layering, text helpers, heads, padding-aware masks, cache reordering, named models
with new heads and frozen parts, and the tokenizer check between a parent checkpoint and the data."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest
import torch
from torch import nn

from lit_transformers.models import GPT, GPTConfig
from lit_transformers.nn import (
    ClassifierHead,
    ScalarHead,
    generate,
    padded_attention_mask,
    padded_position_ids,
    token_logprobs,
)
from lit_transformers.tasks import Task
from lit_transformers.text import eos_terminated, left_pad, pad_pairs, right_pad
from lit_transformers.train import train

from conftest import REPO, TINY_LM

CONFIG = GPTConfig(vocab_size=40, block_size=32, n_layer=2, n_head=2, d_model=16)
PACKAGE = REPO / "lit_transformers"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


OURS = "lit_transformers."


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("nn", (OURS + "text", OURS + "models", OURS + "tasks", OURS + "data", "lightning")),
        ("text", (OURS + "models", OURS + "tasks", OURS + "data", "lightning")),
        ("models", (OURS + "tasks", OURS + "data", "lightning")),
        ("tasks", (OURS + "data",)),
        ("data", (OURS + "tasks",)),
        # the data-task contract sits below both: it may name the tokenizer type, nothing above it
        ("contract.py", (OURS + "nn", OURS + "models", OURS + "tasks", OURS + "data", "lightning")),
    ],
)
def test_layers_never_import_upwards_or_sideways(layer, forbidden):
    files = [PACKAGE / layer] if layer.endswith(".py") else sorted((PACKAGE / layer).glob("*.py"))
    assert all(path.is_file() for path in files) and files
    offending = [
        f"{path.name} imports {name}"
        for path in files
        for name in _imports(path)
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    ]
    assert not offending


def test_tasks_get_their_data_only_through_connect_data():
    reaching = [
        path.name for path in sorted((PACKAGE / "tasks").glob("*.py")) if ".datamodule" in path.read_text()
    ]
    assert not reaching  # e.g. trainer.datamodule.tokenizer: an attribute no protocol of the contract states


def test_padding_helpers_place_tokens_and_masks():
    ids, valid = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and valid.tolist() == [[1, 1, 1], [0, 0, 1]]
    ids, valid = right_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and valid.tolist() == [[1, 1, 1], [1, 0, 0]]
    # EOS survives truncation: the caption's feature is read there
    assert eos_terminated([[5, 6, 7, 9], [8]], eos_id=2, pad_id=0, width=3).tolist() == [[5, 6, 2], [8, 2, 0]]
    pairs, _ = pad_pairs([[1, 2], [3]], [[4], [5, 6, 7]], pad_id=0)
    assert pairs.tolist() == [[1, 2, 0], [3, 0, 0], [4, 0, 0], [5, 6, 7]]
    with pytest.raises(ValueError, match="as many"):
        pad_pairs([[1]], [], pad_id=0)
    assert padded_position_ids(torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])).tolist() == [
        [0, 0, 0, 1],
        [0, 1, 2, 3],
    ]


def test_scalar_and_classifier_heads_compute_what_they_promise():
    torch.manual_seed(0)
    scalar = ScalarHead(99)
    assert scalar.proj.bias.item() == 0 and scalar.proj.weight.std().item() == pytest.approx(0.1, rel=0.2)
    hidden = torch.randn(2, 5, 99)
    assert scalar(hidden).shape == (2, 5)
    head = ClassifierHead(64, 3, dropout=0.0)
    linear = head[1]  # state-dict names "1.weight", "1.bias": the fine-tuning tasks' checkpoints keep them
    assert linear.bias.abs().max() == 0 and linear.weight.std().item() == pytest.approx(0.02, rel=0.3)
    for features in (torch.randn(4, 64), torch.randn(4, 6, 64)):  # pooled [CLS] or every token
        torch.testing.assert_close(head(features), features @ linear.weight.T + linear.bias)


@pytest.fixture(scope="module")
def gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(CONFIG).eval()


def test_padded_mask_and_positions_give_each_row_its_unpadded_logits(gpt):
    rows = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]
    ids, valid = left_pad(rows, pad_id=0)
    batch = gpt(ids, position_ids=padded_position_ids(valid), mask=padded_attention_mask(valid))
    for i, row in enumerate(rows):
        alone = gpt(torch.tensor([row]))[0]
        torch.testing.assert_close(batch[i, -len(row) :], alone, atol=1e-5, rtol=1e-5)


def test_token_logprobs_recompute_what_generate_sampled_under_left_padding(gpt):
    ids, valid = left_pad([[3, 4, 5, 6, 7], [8, 9]], pad_id=0)
    out = generate(gpt, ids, valid, max_new_tokens=6, temperature=0)  # greedy: each token is the argmax
    full_valid = torch.cat([valid, torch.ones(2, 6, dtype=torch.bool)], dim=1)
    logp = token_logprobs(gpt, out, full_valid)  # (B, T - 1)
    logits = gpt(out, position_ids=padded_position_ids(full_valid), mask=padded_attention_mask(full_valid))
    assert torch.equal(logits[:, ids.size(1) - 1 : -1].argmax(-1), out[:, ids.size(1) :])
    for b in range(2):  # the recomputed log-probs are the log-softmax at the sampled tokens, row by row
        row = out[b][full_valid[b]]
        alone = gpt(row[None])[0].double().log_softmax(-1)
        expected = alone[:-1].gather(-1, row[1:, None]).squeeze(-1)
        torch.testing.assert_close(logp[b, -len(row) + 1 :].double(), expected, atol=1e-5, rtol=1e-5)


def test_prefill_projects_only_the_last_position(gpt):
    ids = torch.randint(0, 40, (2, 9))
    torch.testing.assert_close(gpt(ids, last_only=True), gpt(ids)[:, -1:])


def test_kv_cache_reorder_equals_recomputation(gpt):
    torch.manual_seed(1)
    prompts = torch.randint(1, 40, (3, 6))
    caches = gpt.new_caches(3, 8)
    gpt(prompts, caches=caches)
    beams = torch.tensor([2, 0, 0])  # beam search keeps beam 2 once and beam 0 twice
    for cache in caches:
        cache.self_attn.reorder(beams)
    step = torch.tensor([[11], [12], [13]])
    cached = gpt(step, caches=caches)[:, -1]
    recomputed = gpt(torch.cat([prompts[beams], step], dim=1))[:, -1]
    torch.testing.assert_close(cached, recomputed, atol=1e-5, rtol=1e-5)


class Scorer(nn.Module):
    """A reward-style model: GPT body + scalar head read at the last position."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.body, self.head = GPT(config), ScalarHead(config.d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body.hidden_states(ids)[:, -1])


class ScorerTask(Task):
    new_heads = ("model.head",)
    frozen = ("reference",)

    def __init__(self, **task_args):
        super().__init__(**task_args)

    def build_models(self) -> dict[str, nn.Module]:
        return {"model": Scorer(CONFIG), "reference": GPT(CONFIG)}


OPTIMIZER = {"_target_": "torch.optim.AdamW", "lr": 1e-3}


def _save_gpt_checkpoint(path: Path) -> GPT:
    parent = GPT(CONFIG)
    torch.save({"state_dict": {f"model.{k}": v for k, v in parent.state_dict().items()}}, path)
    return parent


def test_reward_model_from_a_gpt_checkpoint_reports_its_new_head(tmp_path, caplog):
    parent = _save_gpt_checkpoint(tmp_path / "gpt.ckpt")
    task = ScorerTask(optimizer=OPTIMIZER, init_from={"model.body": str(tmp_path / "gpt.ckpt")})
    with caplog.at_level(logging.INFO):
        task.configure_model()
    for name, value in parent.state_dict().items():
        assert torch.equal(task.model.body.state_dict()[name], value), name
    assert task.hparams.init_from is None  # applied once; the task's own checkpoints carry the weights
    # the same checkpoint into the whole scorer: the head is missing from it, and declared new
    task = ScorerTask(optimizer=OPTIMIZER, init_from=str(tmp_path / "gpt.ckpt"))
    with pytest.raises(ValueError, match=r"missing keys: \['body\.blocks"):
        task.configure_model()  # GPT keys sit under "body." in the scorer: not a fit


def test_new_heads_are_the_only_keys_a_parent_may_lack(tmp_path, caplog):
    scorer_parent = Scorer(CONFIG)
    state = {f"model.{k}": v for k, v in scorer_parent.state_dict().items() if not k.startswith("head.")}
    torch.save({"state_dict": state}, tmp_path / "body_only.ckpt")
    task = ScorerTask(optimizer=OPTIMIZER, init_from=str(tmp_path / "body_only.ckpt"))
    with caplog.at_level(logging.INFO):
        task.configure_model()
    assert "new (not in the checkpoint): model.head.proj.bias, model.head.proj.weight" in caplog.text
    ScorerTask.new_heads, saved = (), ScorerTask.new_heads
    try:
        with pytest.raises(ValueError, match=r"missing keys: \['head.proj.bias', 'head.proj.weight'\]"):
            ScorerTask(optimizer=OPTIMIZER, init_from=str(tmp_path / "body_only.ckpt")).configure_model()
    finally:
        ScorerTask.new_heads = saved


def test_frozen_models_get_no_gradient_no_optimizer_slot_and_stay_in_eval():
    task = ScorerTask(optimizer=OPTIMIZER)
    task.configure_model()
    optimized = {id(p) for group in task.configure_optimizers().param_groups for p in group["params"]}
    assert optimized == {id(p) for p in task.model.parameters()}
    task.train()
    assert task.model.training and not task.reference.training  # dropout stays off in the frozen model
    ids = torch.randint(0, 40, (1, 4))
    (task.model(ids).sum() + task.reference(ids).sum()).backward()
    assert all(p.grad is None for p in task.reference.parameters())
    assert task.model.head.proj.weight.grad is not None
    keys = list(task.state_dict())
    assert len(keys) == len(set(keys)) and any(k.startswith("reference.") for k in keys)


def test_init_from_refuses_a_parent_trained_with_another_tokenizer(compose_cfg, tmp_path):
    parent_dir = tmp_path / "parent"
    cfg = compose_cfg(*TINY_LM, "test=false", "sample=null", "trainer.max_steps=1")
    cfg.callbacks.model_checkpoint.dirpath = str(parent_dir)
    train(cfg)
    parent = parent_dir / "last.ckpt"
    child = compose_cfg(
        *TINY_LM,
        "test=false",
        "sample=null",
        "trainer.max_steps=1",
        f"init_from={parent}",
        "data.vocab_size=280",
    )
    with pytest.raises(ValueError, match=f"set data.tokenizer_path={parent}"):
        train(child)
    # the fix the message names: train with the parent's tokenizer
    fixed = compose_cfg(
        *TINY_LM,
        "test=false",
        "sample=null",
        "trainer.max_steps=1",
        f"init_from={parent}",
        "data.vocab_size=280",
        f"data.tokenizer_path={parent}",
    )
    train(fixed)
