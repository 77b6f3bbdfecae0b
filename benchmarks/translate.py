"""Translation decoding speed: our greedy and beam search (KV-cached and uncached) against
``transformers`` ``MarianMTModel.generate`` on the same weights (ours converted with ``from_hf``).

    python benchmarks/translate.py                          # d_model 256, 3+3 layers, batches of 16
    python benchmarks/translate.py --threads 1 --busy 1     # on a shared, loaded machine
    python benchmarks/translate.py --d-model 512 --layers 6 --d-ff 2048 --heads 8   # transformer_base shape

Sources are random real tokens, 10-30 long, one length per batch (length-bucketed, as training batches are).
A random model never emits EOS, so every translation runs to its length limit, source length +
``--max-extra`` (0 by default: a real translation is about as long as its source); ours and Marian decode the
same number of tokens. Both beam searches rank finished hypotheses with a length penalty, but not the same
one: ours is GNMT's ((5 + |Y|) / 6)^alpha, Marian's generate() divides by |Y|^length_penalty; without EOS every
hypothesis has the limit's length, so neither changes the work done.

The methods are timed in rounds (``timing.quiet_rounds``: rotating order, busy rounds discarded and counted).
Prints sentences/s per method (median over kept rounds)
and the median per-round ratios ours/Marian and cached/uncached.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from timing import add_round_args, kept_note, quiet_rounds, ratio_spread

from lit_transformers.models import Seq2SeqTransformer

PAD, EOS = 0, 1  # Marian's pad also starts the decoder (OPUS-MT: pad = decoder start)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=3, help="encoder layers = decoder layers")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--batches", type=int, default=4, help="batches per round, lengths spread over 10-30")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--alpha", type=float, default=0.6, help="length penalty (GNMT's for us, Marian's own)")
    p.add_argument("--max-extra", type=int, default=0, help="translation limit: source length + this")
    add_round_args(p, rounds=5, max_rounds=12)
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's); 1 on a loaded machine, where a parallel op waits for a "
        "descheduled second thread and every method runs 5-10x slower and noisier",
    )
    return p.parse_args()


def same_weight_pair(args):
    """A random ``MarianMTModel`` (SiLU, scaled embeddings, shared vocabulary: OPUS-MT's shape) and ours
    converted from it."""
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=args.vocab_size,
        d_model=args.d_model,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.d_ff,
        decoder_ffn_dim=args.d_ff,
        max_position_embeddings=512,
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=PAD,
        decoder_start_token_id=PAD,
        eos_token_id=EOS,
        forced_eos_token_id=None,  # ours does not force EOS at the limit
    )
    hf = MarianMTModel(config).eval()
    return Seq2SeqTransformer.from_hf(hf).eval(), hf


def source_batches(args, n: int) -> list[torch.Tensor]:
    """``n`` batches of random real tokens (no PAD/EOS), lengths spread evenly over 10-30."""
    g = torch.Generator().manual_seed(1)
    lengths = torch.linspace(10, 30, n).round().long().tolist()
    return [torch.randint(2, args.vocab_size, (args.batch_size, length), generator=g) for length in lengths]


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ours, hf = same_weight_pair(args)
    batches = source_batches(args, args.batches)

    def run_ours(beam: int, cache: bool = True):
        return [
            ours.translate(
                src, beam_size=beam, alpha=args.alpha, max_extra_tokens=args.max_extra, use_cache=cache
            )
            for src in batches
        ]

    def run_marian(beam: int):
        out = []
        for src in batches:
            tokens = hf.generate(
                src,
                num_beams=beam,
                do_sample=False,
                **({"length_penalty": args.alpha} if beam > 1 else {}),
                max_new_tokens=src.size(1) + args.max_extra,
            )
            hypotheses = [row[1:] for row in tokens.tolist()]  # without the decoder start token
            out.append([h[: h.index(EOS)] if EOS in h else h for h in hypotheses])
        return out

    methods = {
        "ours greedy": lambda: run_ours(1),
        "marian greedy": lambda: run_marian(1),
        f"ours beam-{args.beam}": lambda: run_ours(args.beam),
        f"marian beam-{args.beam}": lambda: run_marian(args.beam),
        "ours greedy no cache": lambda: run_ours(1, cache=False),
        f"ours beam-{args.beam} no cache": lambda: run_ours(args.beam, cache=False),
    }
    with torch.inference_mode():
        same = {beam: run_ours(beam) == run_marian(beam) for beam in (1, args.beam)}  # also the warm-up
        seconds, busy = quiet_rounds(methods, args)
    sentences = len(batches) * args.batch_size
    rates = {name: [sentences / t for t in times] for name, times in seconds.items()}

    print(
        f"\nTranslation decoding (fp32, {torch.get_num_threads()} threads): d_model={args.d_model} "
        f"layers={args.layers}+{args.layers} heads={args.heads} d_ff={args.d_ff} vocab={args.vocab_size} "
        f"batch={args.batch_size} source lengths 10-30, limit source length + {args.max_extra}, alpha={args.alpha}"
    )
    print(kept_note(seconds, busy))
    if not rates["ours greedy"]:
        return
    print(f"{'method':<24}{'median sentences/s':>19}")
    for name, values in rates.items():
        print(f"{name:<24}{statistics.median(values):>19.1f}")

    def ratio(a: str, b: str) -> float:
        return ratio_spread(rates[a], rates[b])[0]

    for beam, label in ((1, "greedy"), (args.beam, f"beam-{args.beam}")):
        print(
            f"ours / marian {label}: {ratio(f'ours {label}', f'marian {label}'):.2f}x  (target >= 1.2x); "
            f"tokens identical: {'yes' if same[beam] else 'NO'}"
        )
        print(f"ours {label} cached / uncached: {ratio(f'ours {label}', f'ours {label} no cache'):.2f}x")


if __name__ == "__main__":
    main()
