"""The InstructGPT stages: data and judge, SFT masking, reward read-out, PPO and DPO tasks, the chain."""

from __future__ import annotations

import json
import sys
import types

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import LambdaCallback

from lit_transformers.data.instructions import (
    InstructionDataModule,
    collate,
    read_hub,
    read_jsonl,
    split_records,
)
from lit_transformers.models import GPT, GPTConfig, ScalarGPT
from lit_transformers.nn import IGNORE_INDEX, token_cross_entropy
from lit_transformers.text import left_pad, right_pad
from lit_transformers.text.instructions import TASKS, judge, make_examples
from lit_transformers.train import train

from conftest import INSTRUCT_EXPERIMENTS

CONFIG = GPTConfig(vocab_size=40, block_size=24, n_layer=1, n_head=2, d_model=16)
WORDS = ["ash", "oak", "elm", "fir", "yew", "bay"]

# stage sizes that run in seconds on 2 CPU cores
TINY = [
    "model.n_layer=1",
    "model.n_head=2",
    "model.d_model=32",
    "model.block_size=48",
    "data.batch_size=4",
    "trainer.max_steps=2",
    "trainer.val_check_interval=1",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1",
    "trainer.log_every_n_steps=1",
    "callbacks.progress_bar=null",
    "callbacks.model_summary=null",
    "sample=null",
]
TINY_DATA = ["data.n_examples=120", "data.vocab_size=300"]
TINY_TASK = ["task.max_new_tokens=4"]


# ---- data and judge ------------------------------------------------------------------------------------


def test_judge_exact_and_graded_by_hand():
    assert judge(" elm oak ash", "elm oak ash") == (1.0, 1.0)
    assert judge("elm ash oak", "elm oak ash") == (0.0, pytest.approx(1 / 3))
    assert judge("elm oak", "elm oak ash") == (0.0, pytest.approx(2 / 3))  # truncated
    assert judge("elm oak ash fir", "elm oak ash") == (0.0, pytest.approx(3 / 4))  # extra text
    assert judge("3", "4") == (0.0, pytest.approx(0.75))  # numbers: 1 - |error| / answer
    assert judge("", "4") == (0.0, 0.0)


def test_corruptions_are_plausible_and_never_right():
    for kind in TASKS:
        for example in make_examples(WORDS, 50, [kind], seed=0):
            wrong, answer = example["rejected"], example["answer"]
            assert wrong.split() != answer.split() and judge(wrong, answer)[0] == 0.0
    examples = make_examples(WORDS, 100, seed=1)
    assert len({e["prompt"] for e in examples}) == 100
    assert all(judge(e["completion"], e["answer"]) == (1.0, 1.0) for e in examples)


def test_malformed_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "chosen": "b"}\n')
    with pytest.raises(ValueError, match=r"pairs.jsonl:2: no key 'rejected'"):
        read_jsonl(path, ("prompt", "chosen", "rejected"))
    path.write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(ValueError, match=r"pairs.jsonl:2: not valid JSON"):
        read_jsonl(path, ("prompt",))


def test_prompt_pools_are_disjoint_shares_of_train_and_a_split_field_overrides_the_hash():
    records = [{"prompt": f"p{i}", "answer": "a"} for i in range(400)]
    records += [{"prompt": "p7", "answer": "b"}]  # a second record of one prompt stays with its first
    shares = {"sft": 0.25, "preference": 0.5, "rl": 0.25}
    whole = split_records(records, 0.1, 0.1, seed=0)
    pools = {name: split_records(records, 0.1, 0.1, 0, name, shares) for name in shares}
    for part in pools.values():  # val and test are every stage's
        assert part["val"] == whole["val"] and part["test"] == whole["test"]
    train = [{r["prompt"] for r in pools[name]["train"]} for name in shares]
    assert sum(map(len, train)) == len({r["prompt"] for r in whole["train"]})  # disjoint, covering train
    assert set().union(*train) == {r["prompt"] for r in whole["train"]}
    assert [len(t) for t in train] == [80, 160, 80]
    assert sum(r["prompt"] == "p7" for part in whole.values() for r in part) == 2
    assert len({split for split, part in whole.items() for r in part if r["prompt"] == "p7"}) == 1
    # records that name their split keep it, whatever the hash says
    given = [r | {"split": "test" if i < 3 else "train"} for i, r in enumerate(records[:10])]
    assert [r["prompt"] for r in split_records(given, 0.1, 0.1, 0)["test"]] == ["p0", "p1", "p2"]
    with pytest.raises(ValueError, match=r"record 1: split='dev'"):
        split_records([given[0], given[1] | {"split": "dev"}], 0.1, 0.1, 0)


def test_jsonl_records_in_trl_format_become_batches(tmp_path):
    path = tmp_path / "pairs.jsonl"
    records = [
        {"prompt": f"Say {w}:", "chosen": f" {w}", "rejected": f" not {w}", "answer": w} for w in WORDS * 4
    ]
    path.write_text("\n".join(json.dumps(r) for r in records))
    dm = InstructionDataModule(
        format="pairs",
        source="jsonl",
        path=str(path),
        tokenizer="char",
        batch_size=4,
        cache_dir=str(tmp_path),
    )
    dm.prepare_data()
    dm.setup()
    batch = next(iter(dm.val_dataloader()))
    assert batch["pair_ids"].shape[0] == 2 * batch["prompt_ids"].shape[0]
    assert set(batch["answers"]) <= set(WORDS)
    # response tokens: after the prompt, real, chosen rows first
    n = batch["prompt_ids"].shape[0]
    first = batch["response_mask"][0].nonzero()[0].item()
    assert batch["pair_ids"][0, first - 1] != dm.tokenizer.pad_id
    assert batch["response_mask"][:n].sum() < batch["response_mask"][n:].sum()  # " not w" is longer


def test_hub_dataset_with_trl_columns_is_read_and_bad_rows_are_named(monkeypatch):
    class Dataset(list):
        column_names = ["prompt", "completion"]

    rows = Dataset([{"prompt": "Say ash:", "completion": " ash"}, {"prompt": "Say oak:", "completion": None}])
    fake = types.SimpleNamespace(load_dataset=lambda name, subset, data_files=None, split=None: rows)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(ValueError, match=r"me/sft\[1\]: column 'completion' is missing"):
        read_hub("me/sft", None, "train", ("prompt", "completion"))
    rows.pop()
    assert read_hub("me/sft", None, "train", ("prompt", "completion")) == [
        dict(rows[0]) | {"where": "me/sft[0]"}
    ]
    with pytest.raises(KeyError, match="no column"):
        read_hub("me/sft", None, "train", ("prompt", "chosen", "rejected"))


# ---- SFT -------------------------------------------------------------------------------------------------


def _sft_batch():
    items = [
        {"prompt": [1, 5, 6], "completion": [7, 8, 2], "answer": "x"},
        {"prompt": [1, 9], "completion": [10, 2], "answer": "y"},
    ]
    return collate(items, "sft", pad_id=0)


def test_sft_labels_cover_only_the_completion_and_its_eos():
    batch = _sft_batch()
    assert batch["input_ids"].tolist() == [[1, 5, 6, 7, 8], [1, 9, 10, 2, 0]]
    I = IGNORE_INDEX  # noqa: E741
    assert batch["labels"].tolist() == [[I, I, 7, 8, 2], [I, 10, 2, I, I]]
    assert batch["prompt_ids"].tolist() == [[1, 5, 6], [0, 1, 9]]  # left-padded for generation


def test_sft_loss_ignores_prompt_tokens_and_matches_a_hand_computation():
    torch.manual_seed(0)
    model = GPT(CONFIG)
    batch = _sft_batch()
    logits = model(batch["input_ids"])
    total, count = token_cross_entropy(logits, batch["labels"])
    assert count == 5
    # changing the prompt tokens' labels (they are ignored) changes nothing
    other = batch["labels"].clone()
    other[0, :2] = IGNORE_INDEX
    assert token_cross_entropy(logits, other)[0] == total
    # the response token "8" of row 0, predicted at position 3: -log softmax(logits[0, 3])[8]
    hand = -logits[0, 3].log_softmax(-1)[8]
    only = torch.full_like(batch["labels"], IGNORE_INDEX)
    only[0, 3] = 8
    assert token_cross_entropy(logits, only)[0].item() == pytest.approx(hand.item(), rel=1e-5)
    # and the prompt really is masked: labelling it changes the loss
    leaked = batch["labels"].clone()
    leaked[0, :2] = torch.tensor([5, 6])
    assert token_cross_entropy(logits, leaked)[0] > total


def test_packed_samples_never_attend_across_boundaries_and_lose_nothing():
    torch.manual_seed(0)
    model = GPT(CONFIG).eval()
    items = [
        {"prompt": [1, 5, 6], "completion": [7, 8, 2], "answer": "x"},
        {"prompt": [1, 9], "completion": [10, 2], "answer": "y"},
        {"prompt": [1, 11, 12, 13], "completion": [14, 2], "answer": "z"},
    ]
    packed = collate(items, "sft", pad_id=0, packing=True, width=12)
    assert packed["input_ids"].tolist() == [
        [1, 5, 6, 7, 8, 1, 9, 10, 0, 0, 0, 0],
        [1, 11, 12, 13, 14, 0, 0, 0, 0, 0, 0, 0],
    ]
    assert packed["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 0, 0, 0]
    logits = model(packed["input_ids"], position_ids=packed["position_ids"], mask=packed["attention_mask"])
    # the second sample of row 0 sees only itself: same logits as alone
    alone = model(torch.tensor([[1, 9, 10]]))  # inputs: the last token (EOS) is only a label
    torch.testing.assert_close(logits[0, 5:8], alone[0], rtol=1e-5, atol=1e-5)
    # without the block-diagonal mask it would see the first sample
    leaky = model(packed["input_ids"], position_ids=packed["position_ids"])
    assert not torch.allclose(leaky[0, 5:8], alone[0], atol=1e-4)
    padded = collate(items, "sft", pad_id=0)
    loss_packed = token_cross_entropy(logits, packed["labels"])
    loss_padded = token_cross_entropy(model(padded["input_ids"]), padded["labels"])
    assert loss_packed[1] == loss_padded[1] == 7
    assert loss_packed[0].item() == pytest.approx(loss_padded[0].item(), rel=1e-5)


# ---- reward model ----------------------------------------------------------------------------------------


def test_reward_is_read_at_the_last_real_token_under_right_and_left_padding():
    torch.manual_seed(0)
    model = ScalarGPT(CONFIG).eval()
    seqs = [[1, 5, 6, 7], [1, 9]]
    alone = [model.score(torch.tensor([s]), torch.ones(1, len(s), dtype=torch.bool)).item() for s in seqs]
    for pad in (right_pad, left_pad):
        ids, valid = pad(seqs, 0)
        assert model.score(ids, valid).tolist() == pytest.approx(alone, abs=1e-5), pad.__name__
    ids, valid = right_pad(seqs, 0)
    assert model.score(ids, valid)[1].item() == pytest.approx(model(ids, valid)[1, 1].item())
    assert model.head.proj.bias.item() == 0.0


# ---- the stages through the real config -----------------------------------------------------------------


def _stage_cfg(compose_cfg, experiment: str, *extra: str):
    task = TINY_TASK if experiment in ("gpt_sft", "gpt_ppo", "gpt_dpo", "gpt_grpo") else []
    return compose_cfg(f"experiment={experiment}", *TINY, *TINY_DATA, *task, *extra)


@pytest.mark.parametrize("experiment", [*INSTRUCT_EXPERIMENTS, "gpt_sft packed"])
def test_every_stage_runs_fast_dev_run(compose_cfg, experiment):
    experiment, *packed = experiment.split()
    metrics = train(
        _stage_cfg(compose_cfg, experiment, "debug=fdr", *(["data.packing=true"] if packed else []))
    ).metrics
    assert metrics and all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    expected = {
        "gpt_sft": ["test/loss", "test/judge_exact", "test/judge_score"],
        "gpt_reward": ["test/accuracy", "test/margin", "test/reward_mean", "test/reward_std"],
        "gpt_ppo": [
            "objective/scores",
            "objective/kl",
            "policy/clipfrac",
            "test/judge_score",
            "test/kl",
            "test/rm_score",
        ],
        "gpt_dpo": [
            "rewards/chosen",
            "rewards/margins",
            "test/judge_exact",
            "test/kl",
            "test/rewards/accuracies",
        ],
        "gpt_grpo": ["reward", "reward_std", "kl", "train/time/generation_s", "test/judge_exact", "test/kl"],
    }[experiment]
    assert set(expected) <= set(metrics), sorted(metrics)


def _fit(cfg, **trainer_args):
    """A stage's task fitted on its data by a quiet CPU trainer without validation -> (task, trainer, data)."""
    datamodule = instantiate(cfg.data, _convert_="all")
    task = instantiate(cfg.task, _recursive_=False, _convert_="all")
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        limit_val_batches=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        **trainer_args,
    )
    task.connect_data(datamodule)
    trainer.fit(task, datamodule=datamodule)
    return task, trainer, datamodule


def _fit_ppo(compose_cfg, *extra: str):
    cfg = _stage_cfg(compose_cfg, "gpt_ppo", "task.num_ppo_epochs=2", "task.num_mini_batches=2", *extra)
    task, trainer, _ = _fit(cfg, max_steps=4)
    return task, trainer


def test_ppo_ratio_is_one_on_the_first_minibatch_and_frozen_models_get_no_gradient(compose_cfg):
    task, trainer = _fit_ppo(compose_cfg, "task.missing_eos_penalty=3.0")
    assert trainer.global_step == 4  # one rollout batch: 2 epochs x 2 minibatches
    assert task.first_ratio.item() == 1.0  # exactly: old log-probs came from the same minibatch forward
    for name in ("reference", "reward"):
        module = getattr(task, name)
        assert not module.training and all(
            not p.requires_grad and p.grad is None for p in module.parameters()
        )
    # the policy moved away from the reference it started as; the reward model stayed the value's twin
    assert any(not torch.equal(p, q) for p, q in zip(task.policy.parameters(), task.reference.parameters()))
    assert any(not torch.equal(p, q) for p, q in zip(task.value.parameters(), task.reward.parameters()))
    optimized = {id(p) for group in task.optimizers().param_groups for p in group["params"]}
    assert optimized == {id(p) for m in (task.policy, task.value) for p in m.parameters()}
    # responses without EOS lose missing_eos_penalty from the reward model's score
    prompt = [task.tokenizer.bos_id, *task.tokenizer.encode("Sort the words: a b\nAnswer:")]
    ids, mask = left_pad([prompt, prompt[:4]], task.tokenizer.pad_id)
    exp = task.make_experience({"prompt_ids": ids, "prompt_mask": mask}, torch.arange(2), 2)
    raw = task.reward.score(exp["sequences"], exp["attention_mask"])
    torch.testing.assert_close(exp["scores"], raw - 3.0 * (~exp["has_eos"]).float())


def test_ppo_on_the_judge_holds_no_reward_model_and_scores_each_response_by_its_answer(compose_cfg):
    task, trainer = _fit_ppo(
        compose_cfg, "task.rewards=[{judge: 1.0}]", "task.missing_eos_penalty=3.0", "task.temperature=1e-3"
    )  # a near-greedy policy: the same prompt gets the same response twice
    assert trainer.global_step == 4 and task.first_ratio.item() == 1.0
    assert "reward" not in task.model_names and not hasattr(task, "reward")
    optimized = {id(p) for group in task.optimizers().param_groups for p in group["params"]}
    assert optimized == {id(p) for m in (task.policy, task.value) for p in m.parameters()}
    tok = task.tokenizer
    prompt = [tok.bos_id, *tok.encode("Sort the words: b a\nAnswer:")]
    ids, mask = left_pad([prompt, prompt], tok.pad_id)
    batch = {"prompt_ids": ids, "prompt_mask": mask, "answers": ["-", "-"]}
    first = task.make_experience(batch, torch.arange(2), 2)
    response = tok.decode(first["sequences"][0, ids.size(1) :][first["mask"][0]].tolist())
    # the first response is its own right answer, the second is wrong
    exp = task.make_experience(batch | {"answers": [response, response + " x"]}, torch.arange(2), 2)
    torch.testing.assert_close(exp["sequences"], first["sequences"])
    penalty = 3.0 * (~exp["has_eos"]).float()
    torch.testing.assert_close(exp["scores"], torch.tensor([1.0, 0.0]) - penalty)


def test_ppo_refuses_a_reward_checkpoint_its_rewards_do_not_use(compose_cfg, tmp_path):
    cfg = _stage_cfg(
        compose_cfg,
        "gpt_ppo",
        "task.rewards=[{judge: 1.0}]",
        f"init_from={{policy: {tmp_path}/a.ckpt, reward: {tmp_path}/b.ckpt}}",
    )
    task = instantiate(cfg.task, _recursive_=False, _convert_="all")
    with pytest.raises(ValueError, match=r"names a reward model, but task.rewards=.*drop init_from.reward"):
        task._load_init_from(cfg.task.init_from)


def test_dpo_computes_each_reference_logprob_once(compose_cfg):
    cfg = _stage_cfg(compose_cfg, "gpt_dpo", "data.n_examples=40", "data.pool=all")
    calls = []
    count_reference_calls = LambdaCallback(
        on_train_start=lambda _, task: task.reference.register_forward_hook(lambda *_: calls.append(1))
    )
    task, trainer, datamodule = _fit(cfg, max_epochs=2, callbacks=[count_reference_calls])
    n_train = len(datamodule.datasets["train"])
    assert trainer.global_step == 2 * -(-n_train // 4)  # two epochs of batches of 4 pairs...
    assert len(calls) == -(-n_train // 4)  # ...and the reference ran in the first only
    batch = datamodule.collate(datamodule.datasets["train"][:4])
    with torch.no_grad():
        direct = torch.stack(task._sequence_logprobs(task.reference, batch), 1)
    cached = torch.stack([task.reference_cache[("train", i)] for i in range(4)])
    torch.testing.assert_close(cached, direct)


def test_the_stages_show_the_step_bar_of_every_experiment_across_epochs(compose_cfg, capfd):
    default = compose_cfg().callbacks.progress_bar
    for experiment in INSTRUCT_EXPERIMENTS:
        assert compose_cfg(f"experiment={experiment}").callbacks.progress_bar == default, experiment
    shown = [o for o in TINY if not o.startswith("callbacks.progress_bar")]
    cfg = compose_cfg("experiment=gpt_sft", *shown, *TINY_DATA, *TINY_TASK, "test=false")
    datamodule = instantiate(cfg.data)
    datamodule.setup()
    steps = len(datamodule.train_dataloader()) + 2  # into a second epoch
    cfg.trainer.max_steps = cfg.trainer.val_check_interval = steps
    capfd.readouterr()
    train(cfg)
    shown = "".join(capfd.readouterr())
    # one bar to the last step, not one bar per epoch ("Epoch 1: 100%| 6/6" of TQDM)
    assert f"{steps}/{steps}" in shown and "Epoch" not in shown, shown[-2000:]
