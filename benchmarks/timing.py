"""The benchmarks' one timing loop: rounds that rotate the order of the methods compared, each method's seconds
in each round, and rounds during which other processes used the CPU (from ``/proc/stat``) discarded and
counted, since this machine is shared. The methods of one round run back to back, so the machine's drift
between rounds, which moves every method's speed by several percent, cancels in per-round ratios."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable


def add_round_args(p: argparse.ArgumentParser, rounds: int, max_rounds: int, *aliases: str) -> None:
    """``--rounds`` (or its ``aliases``, e.g. an older ``--repeats``), ``--max-rounds`` and ``--busy``."""
    p.add_argument("--rounds", *aliases, dest="rounds", type=int, default=rounds, help="kept rounds")
    p.add_argument(
        "--max-rounds", type=int, default=max_rounds, help="give up after this many rounds (busy machine)"
    )
    p.add_argument(
        "--busy",
        type=float,
        default=0.05,
        help="discard a round when others used this share of the CPU (1: keep every round)",
    )


def cpu_jiffies() -> tuple[int, int]:
    """(non-idle jiffies of the whole machine, jiffies of this process) so far."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    machine = sum(fields) - fields[3] - fields[4]  # minus idle and iowait
    with open("/proc/self/stat") as f:
        own = f.read().rsplit(")", 1)[1].split()
    return machine, int(own[11]) + int(own[12])  # utime + stime (all threads)


def seconds_of(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def quiet_rounds(
    methods: dict[str, Callable[[], object]], args: argparse.Namespace, self_timed: bool = False
) -> tuple[dict[str, list[float]], int]:
    """Seconds of each method in up to ``args.rounds`` kept rounds, and how many rounds were discarded.

    A round in which other processes used more than ``args.busy`` of the machine's CPU time is discarded; after
    ``args.max_rounds`` rounds the loop gives up. ``self_timed``: each method returns the seconds of the part
    it times itself (the steps after its own warm-up, say), instead of the seconds of the whole call.
    """
    names, seconds, discarded = list(methods), {name: [] for name in methods}, 0
    for r in range(args.max_rounds):
        if len(seconds[names[0]]) == args.rounds:
            break
        order = names[r % len(names) :] + names[: r % len(names)]
        machine0, own0 = cpu_jiffies()
        start, times = time.perf_counter(), {}
        for name in order:
            t0 = time.perf_counter()
            timed = methods[name]()
            times[name] = timed if self_timed else time.perf_counter() - t0
        wall = time.perf_counter() - start
        machine1, own1 = cpu_jiffies()
        others = (machine1 - machine0) - (own1 - own0)  # jiffies (1/100 s) used by other processes
        if others / 100 > args.busy * wall * os.cpu_count():
            discarded += 1
            continue
        for name, t in times.items():
            seconds[name].append(t)
    return seconds, discarded


def kept_note(seconds: dict[str, list[float]], discarded: int) -> str:
    """What the rounds kept, for the report; empty rounds say how to measure anyway."""
    kept = len(next(iter(seconds.values())))
    if not kept:
        return (
            f"every one of {discarded} rounds ran while the machine was busy; nothing measured (see --busy)"
        )
    return f"kept {kept} rounds, discarded {discarded} busy ones"


def ratio_spread(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Median, min and max over rounds of a / b (rates of one round)."""
    ratios = [x / y for x, y in zip(a, b)]
    return statistics.median(ratios), min(ratios), max(ratios)
