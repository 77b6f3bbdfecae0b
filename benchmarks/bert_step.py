"""Training-step throughput of our BERT (MLM + NSP) against ``transformers.BertForPreTraining`` holding the
same weights, on the same masked batches, alternating in one process.

    python benchmarks/bert_step.py                         # BERT-mini shape: 4 layers, 256 wide, batch 16 x 128
    python benchmarks/bert_step.py --n-layer 2 --d-model 128 --batch-size 32 --rounds 8

Both compute the same loss (MLM cross-entropy over the selected 15% + NSP cross-entropy) with exact GELU and
the same fused AdamW. Ours projects only the selected positions to the vocabulary; HF's
``BertForPreTraining`` projects every position and ignores the unselected ones in the loss. The two are
timed in rounds (``timing.quiet_rounds``: rotating order, busy rounds discarded and counted). Prints tokens/s (median over kept rounds) and the ours/HF ratio.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from timing import add_round_args, kept_note, quiet_rounds, ratio_spread

from lit_transformers.models import BERT
from lit_transformers.nn import IGNORE_INDEX
from lit_transformers.text import mask_tokens


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=2, help="timed optimizer steps per model per round")
    add_round_args(p, rounds=5, max_rounds=40)
    return p.parse_args()


def same_weight_pair(args):
    import transformers

    config = transformers.BertConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.d_model,
        num_hidden_layers=args.n_layer,
        num_attention_heads=args.n_head,
        intermediate_size=4 * args.d_model,
        max_position_embeddings=args.seq_len,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,  # dropout off in both: the same arithmetic, no RNG differences
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    hf = transformers.BertForPreTraining(config).train()
    return BERT.from_hf(hf).train(), hf


def batches(args, n: int):
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(5, args.vocab_size, (args.batch_size, args.seq_len), generator=g)
        ids[:, 0], ids[:, -1] = 2, 3
        valid = torch.ones_like(ids, dtype=torch.bool)
        eligible = ids >= 5
        masked, labels = mask_tokens(ids, eligible, 4, args.vocab_size, g, max_predictions=20)
        types = (torch.arange(args.seq_len) >= args.seq_len // 2).long().expand_as(ids).contiguous()
        nsp = torch.randint(0, 2, (args.batch_size,), generator=g)
        out.append((masked, valid, types, labels, nsp))
    return out


def make_steps(ours, hf):
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    opt_hf = torch.optim.AdamW(hf.parameters(), lr=1e-4, weight_decay=0.01, fused=True)

    def step_ours(ids, valid, types, labels, nsp):
        hidden = ours(ids, valid, types)
        selected = labels != IGNORE_INDEX
        mlm = F.cross_entropy(ours.mlm_logits(hidden[selected]), labels[selected])
        loss = mlm + F.cross_entropy(ours.nsp_logits(ours.pool(hidden)), nsp)
        loss.backward()
        opt_ours.step()
        opt_ours.zero_grad(set_to_none=True)
        return loss

    def step_hf(ids, valid, types, labels, nsp):
        out = hf(
            input_ids=ids,
            attention_mask=valid.long(),
            token_type_ids=types,
            labels=labels,
            next_sentence_label=nsp,
        )
        out.loss.backward()
        opt_hf.step()
        opt_hf.zero_grad(set_to_none=True)
        return out.loss

    return {"ours": step_ours, "hf": step_hf}


def main() -> None:
    args = parse_args()
    ours, hf = same_weight_pair(args)
    data = batches(args, args.steps)
    steps = make_steps(ours, hf)
    with torch.no_grad():  # same weights, same loss before any step
        ids, valid, types, labels, nsp = data[0]
        hidden = ours(ids, valid, types)
        sel = labels != IGNORE_INDEX
        ref = hf(
            input_ids=ids,
            attention_mask=valid.long(),
            token_type_ids=types,
            labels=labels,
            next_sentence_label=nsp,
        )
        ours_loss = F.cross_entropy(ours.mlm_logits(hidden[sel]), labels[sel]) + F.cross_entropy(
            ours.nsp_logits(ours.pool(hidden)), nsp
        )
        print(f"loss at identical weights: ours {ours_loss.item():.5f}, HF {ref.loss.item():.5f}")
    for step in steps.values():  # warm-up: allocator, optimizer state
        step(*data[0])

    tokens = args.steps * args.batch_size * args.seq_len
    run_all = {name: (lambda step=step: [step(*batch) for batch in data]) for name, step in steps.items()}
    seconds, busy = quiet_rounds(run_all, args)
    rates = {name: [tokens / t for t in times] for name, times in seconds.items()}

    print(
        f"BERT MLM+NSP training step, fp32, {torch.get_num_threads()} threads: n_layer={args.n_layer} "
        f"d_model={args.d_model} n_head={args.n_head} vocab={args.vocab_size}, batch {args.batch_size} x {args.seq_len}"
    )
    print(kept_note(seconds, busy))
    if not rates["ours"]:
        return
    for name, values in rates.items():
        print(
            f"  {name:<5} median {statistics.median(values):8.0f} tok/s  (min {min(values):.0f}, max {max(values):.0f})"
        )
    ratio, low, high = ratio_spread(rates["ours"], rates["hf"])
    print(f"  ours/HF: {ratio:.3f}x  (per round {low:.2f}-{high:.2f})")


if __name__ == "__main__":
    main()
