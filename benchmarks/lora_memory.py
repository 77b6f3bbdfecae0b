"""Peak memory (RSS) of one PPO iteration and one DPO step, full fine-tuning against ``task.lora``, on the GPT-mini
and Llama-mini presets (``conf/model/gpt_mini.yaml``, ``llama_mini.yaml``), each run in a fresh process.

    python benchmarks/lora_memory.py                           # both presets, PPO and DPO, full and LoRA r=8
    python benchmarks/lora_memory.py --presets llama_mini --stages dpo --lora-r 16

Each run builds the task as training does (``configure_model``: ``init_from`` files of a random base, the LoRA
adapters), then fits one PPO iteration (rollout of ``--new-tokens`` for ``--batch-size`` prompts, scoring, one
update; ``num_ppo_epochs=1``) or one DPO step (``--batch-size`` pairs of ``--pair-length`` tokens) in a Lightning
Trainer on the CPU, fp32. Reported: the task's parameters (all, and those that train), the process's RSS after
the imports, after the models are built, and its peak (``ru_maxrss``), which holds the optimizer's state and the
activations of the step (children run with a fixed ``MALLOC_MMAP_THRESHOLD_``, see below). Full PPO holds four models (policy, reference, reward, value); under LoRA the reference
is the policy's base with the adapters off, and the optimizer's AdamW state covers the adapters (and the value's
head) only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

# glibc's malloc raises its mmap threshold as large blocks are freed, after which freed tensors stay in the heap
# and the peak RSS depends on fragmentation (LoRA's extra small temporaries moved it by ~200 MiB, with equal
# saved activations); a fixed threshold returns every large tensor to the system when freed
MALLOC_ENV = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", nargs="+", default=["gpt_mini", "llama_mini"])
    p.add_argument("--stages", nargs="+", default=["ppo", "dpo"], choices=["ppo", "dpo"])
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=8, help="PPO prompts, or DPO pairs")
    p.add_argument("--prompt-length", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32, help="PPO response length")
    p.add_argument("--pair-length", type=int, default=128, help="DPO chosen / rejected sequence length")
    p.add_argument("--one", nargs=3, metavar=("STAGE", "PRESET", "MODE"), help=argparse.SUPPRESS)
    return p.parse_args()


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def preset(name: str, vocab_size: int) -> dict:
    """The model group's config ``name`` as train.py composes it, dropout off (PPO's and DPO's experiments)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module("lit_transformers.conf", version_base="1.3"):
        spec = OmegaConf.to_container(compose("train", overrides=[f"model={name}"]).model, resolve=True)
    return spec | {"vocab_size": vocab_size, "dropout": 0.0}


def one_run(args: argparse.Namespace, stage: str, preset_name: str, mode: str) -> dict:
    """Build and fit one stage in this process; its parameters and RSS figures."""
    import lightning as L
    import peft  # noqa: F401  (in both modes: the library's own memory belongs to the baseline)
    import torch
    from torch.utils.data import DataLoader

    from lit_transformers.data.instructions import collate
    from lit_transformers.models import GPT
    from lit_transformers.tasks import DPOTask, PPOTask
    from lit_transformers.tasks.specs import build_config
    from lit_transformers.text import Tokenizer

    imported = rss_mb()
    torch.manual_seed(0)
    tokenizer = Tokenizer.train(["the of and to a in is for that with as on be by"] * 10, kind="char")
    spec = preset(preset_name, args.vocab_size)
    base = Path(tempfile.mkdtemp()) / "base.pt"
    torch.save(GPT(build_config(spec)).state_dict(), base)
    common = {
        "model": spec,
        "optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-5},
        "tokenizer": tokenizer.state(),
        "lora": {"r": args.lora_r, "alpha": 2 * args.lora_r} if mode == "lora" else None,
        "max_new_tokens": args.new_tokens,
    }
    g = torch.Generator().manual_seed(1)
    words = lambda n: torch.randint(4, tokenizer.vocab_size, (n,), generator=g).tolist()  # noqa: E731
    prompts = [[tokenizer.bos_id, *words(args.prompt_length - 1)] for _ in range(args.batch_size)]
    if stage == "ppo":
        task = PPOTask(**common, init_from={"policy": str(base), "reward": str(base)}, num_ppo_epochs=1)
        items = [{"prompt": p} for p in prompts]
    else:
        task = DPOTask(**common, init_from=str(base))
        response = args.pair_length - args.prompt_length
        items = [{"prompt": p, "chosen": words(response), "rejected": words(response)} for p in prompts]
        items = [item | {"index": i} for i, item in enumerate(items)]
    task.configure_model()
    built = rss_mb()
    fmt = "prompts" if stage == "ppo" else "pairs"
    loader = DataLoader(
        items, batch_size=args.batch_size, collate_fn=lambda b: collate(b, fmt, tokenizer.pad_id)
    )
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(task, train_dataloaders=loader)
    return {
        "params": sum(p.numel() for p in task.parameters()),
        "trained": sum(p.numel() for p in task.parameters() if p.requires_grad),
        "imported": imported,
        "built": built,
        "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
    }


def main() -> None:
    args = parse_args()
    if args.one:
        print(json.dumps(one_run(args, *args.one)))
        return
    passed = sys.argv[1:]
    print(
        f"Peak RSS (MiB), one PPO iteration ({args.batch_size} prompts, {args.new_tokens} new tokens) and one DPO "
        f"step ({args.batch_size} pairs of {args.pair_length} tokens), fp32 on the CPU, vocab {args.vocab_size}, "
        f"LoRA r={args.lora_r}; each run a fresh process"
    )
    head = ("preset", "stage", "mode", "params", "trained", "imports", "built", "peak", "peak-imports")
    print(f"{head[0]:<12}{head[1]:<6}{head[2]:<6}" + "".join(f"{h:>13}" for h in head[3:]))
    for preset_name in args.presets:
        for stage in args.stages:
            peaks = {}
            for mode in ("full", "lora"):
                command = [sys.executable, __file__, *passed, "--one", stage, preset_name, mode]
                run = subprocess.run(command, capture_output=True, text=True, check=True, env=MALLOC_ENV)
                r = json.loads(run.stdout.strip().splitlines()[-1])
                peaks[mode] = r["peak"] - r["imported"]
                print(
                    f"{preset_name:<12}{stage:<6}{mode:<6}{r['params'] / 1e6:>12.2f}M{r['trained'] / 1e6:>12.3f}M"
                    f"{r['imported']:>13.0f}{r['built']:>13.0f}{r['peak']:>13.0f}{peaks[mode]:>13.0f}"
                )
            print(f"{'':<24}LoRA / full, above the imports: {peaks['lora'] / peaks['full']:.2f}")


if __name__ == "__main__":
    main()
