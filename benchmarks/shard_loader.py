"""Is the token-shard loader ever the bottleneck? Its rate against the model's training rate, in tokens/s.

    lit-prepare data.shards_dir=/tmp/shards data.vocab_size=8192        # once (any corpus: data.corpus.*)
    python benchmarks/shard_loader.py --shards-dir /tmp/shards           # GPT-mini (gpt_step.py's size), 16 x 256

Iterates the shard data module's training loader (shuffled and resumable, as training iterates it, in this process:
``data.num_workers=0``) for ``--batches`` batches, then times ``--steps`` training steps of the GPT on its first
batches (fused AdamW, as ``gpt_step.py``), and prints windows/s, tokens/s of both and the loader's headroom.
"""

from __future__ import annotations

import argparse
import time

import torch
from gpt_step import make_step

from lit_transformers.data import CausalLMDataModule
from lit_transformers.models import GPT, GPTConfig

from gpt_pair import add_model_args


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards-dir", required=True, help="a folder written by lit-prepare")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--batches", type=int, default=500, help="loader batches timed")
    p.add_argument("--steps", type=int, default=4, help="training steps timed (after one warm-up step)")
    add_model_args(p, 256, "context (tokens per window)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    datamodule = CausalLMDataModule(
        shards_dir=args.shards_dir, block_size=args.block_size, batch_size=args.batch_size
    )
    datamodule.setup()
    loader = iter(datamodule.train_dataloader())
    start = time.perf_counter()
    batches = [next(loader) for _ in range(args.batches)]
    loader_s = time.perf_counter() - start

    config = GPTConfig(
        vocab_size=max(args.vocab_size, datamodule.tokenizer.vocab_size),
        block_size=args.block_size,
        n_layer=args.n_layer,
        n_head=args.n_head,
        d_model=args.d_model,
        dropout=0.0,
    )
    step = make_step(GPT(config).train(), lambda m, x: m(x), fused=True)
    step(batches[0]["input_ids"], batches[0]["labels"])  # warm-up: allocator, optimizer state
    start = time.perf_counter()
    for batch in batches[1 : args.steps + 1]:
        step(batch["input_ids"], batch["labels"])
    model_s = time.perf_counter() - start

    tokens_per_batch = args.batch_size * args.block_size
    loader_rate = args.batches * tokens_per_batch / loader_s
    model_rate = args.steps * tokens_per_batch / model_s
    print(
        f"shards {args.shards_dir}: {len(datamodule.datasets['train'])} training windows of {args.block_size}"
    )
    print(f"loader: {args.batches * args.batch_size / loader_s:9.0f} windows/s  {loader_rate:11.0f} tokens/s")
    print(f"model:  {args.steps * args.batch_size / model_s:9.1f} windows/s  {model_rate:11.0f} tokens/s")
    print(f"headroom: the loader is {loader_rate / model_rate:.0f}x faster than training")


if __name__ == "__main__":
    main()
