"""Screenshots of TensorBoard as a user opens it: every family trained briefly with ``logger=many``, TensorBoard
served on 127.0.0.1, and its tabs saved as PNGs by headless Chromium. Not part of the test suite: it takes about
ten minutes on two CPU cores.

    python scripts/dashboard_screenshots.py                          # every family -> /tmp/dashboard_screenshots
    python scripts/dashboard_screenshots.py --out shots --families gpt vit
    python scripts/dashboard_screenshots.py --skip-training          # screenshots of the runs already in --out

Writes ``<out>/runs/<family>/`` (each family's run folder; ``instructgpt`` holds one folder per stage) and
``<out>/<family>_<tab>.png`` for the tabs scalars, time series, custom scalars, images, text and hparams.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# a few dozen steps of each family at toy sizes: enough points for a curve, two validations, pictures and tables
SHORT = [
    "trainer.max_steps=20",
    "trainer.val_check_interval=10",
    "trainer.log_every_n_steps=2",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "logger=many",
]
TINY_GPT = [
    "model.n_layer=1",
    "model.n_head=2",
    "model.d_model=32",
    "model.block_size=32",
    "data.vocab_size=300",
]
TINY_BERT = ["model.n_layer=1", "model.n_head=2", "model.d_model=32", "model.d_ff=64", "data.vocab_size=400"]
FAMILIES = {
    "gpt": [
        *TINY_GPT,
        "data.batch_size=8",
        "sample.max_new_tokens=8",
        "callbacks.text_samples.max_new_tokens=8",
    ],
    "bert": ["experiment=bert_pretrain", *TINY_BERT, "data.max_seq_len=48", "data.dupe_factor=1"],
    "bert_classify": [
        "experiment=bert_classify",
        *TINY_BERT,
        "data.val_fraction=0.2",
        "data.test_fraction=0.2",
    ],
    "translation": [
        "experiment=translation",
        "data.vocab_size=300",
        "data.max_tokens=2048",
        "model.max_len=1024",  # the longest pair of the de catalogs at a 300-token vocabulary: all are scored
        "model.n_encoder_layer=1",
        "model.n_decoder_layer=1",
        "model.d_model=32",
        "model.n_head=2",
        "model.d_ff=64",
        "task.test_beam_size=2",
        "task.max_extra_tokens=4",
        "task.scheduler.warmup_steps=2",
    ],
    "vit": ["experiment=vit"],
    "clip": ["experiment=clip", "data.batch_size=32"],
}
# the InstructGPT chain (pretrain, SFT, label, reward model, PPO, DPO) at the sizes of tests/test_chain.py
CHAIN = ["model.n_layer=1", "model.n_head=2", "model.d_model=32", "label.max_new_tokens=4"]
CHAIN_STAGES = {  # each stage's train.py overrides (conf/instructgpt.yaml: stage_configs)
    "pretrain": ["sample=null", "data.vocab_size=300"],
    "sft": ["experiment=gpt_sft", "data.n_examples=120", "task.max_new_tokens=4"],
    "label": ["experiment=gpt_reward", "data.n_examples=120"],
    "reward": ["experiment=gpt_reward", "data.n_examples=120"],
    "ppo": ["experiment=gpt_ppo", "data.n_examples=120", "task.max_new_tokens=4"],
    "dpo": ["experiment=gpt_dpo", "data.n_examples=120", "task.max_new_tokens=4"],
}
CHAIN_COMMON = [  # every stage
    "trainer.max_steps=4",
    "trainer.val_check_interval=2",
    "trainer.log_every_n_steps=1",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1",
    "data.batch_size=4",
    "sample=null",
    "logger=many",
]


def hydra_list(overrides: list[str]) -> str:
    """A list of overrides as one Hydra override's value: each quoted, as ``=`` is not allowed bare in a list."""
    return "[" + ",".join(f"'{o}'" for o in overrides) + "]"


# TensorBoard's tabs, as the address after '#'
TABS = {
    "scalars": "scalars",
    "timeseries": "timeseries",
    "custom_scalars": "custom_scalars",
    "images": "images",
    "text": "text",
    "hparams": "hparams",
}


def train(family: str, run_dir: Path, cache_dir: Path) -> bool:
    """Train ``family`` into ``run_dir``; whether it succeeded (its output: ``<run_dir>.log``)."""
    if family == "instructgpt":
        command = [sys.executable, "-m", "lit_transformers.instructgpt", *CHAIN]
        command += [f"stage_configs.{stage}={hydra_list(o)}" for stage, o in CHAIN_STAGES.items()]
        command.append(f"common={hydra_list([*CHAIN_COMMON, f'paths.cache_dir={cache_dir}'])}")
        command.append(f"run_dir={run_dir}")
    else:
        command = [sys.executable, str(REPO / "train.py"), *FAMILIES[family], *SHORT]
        command += [f"hydra.run.dir={run_dir}", f"paths.cache_dir={cache_dir}"]
    print(f"[{family}] training: {' '.join(command[1:])}", flush=True)
    log = run_dir.with_suffix(".log")
    with open(log, "w") as out:
        done = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode:
        print(f"[{family}] training failed (exit {done.returncode}); see {log}", flush=True)
    return done.returncode == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(logdir: Path) -> tuple[subprocess.Popen, str]:
    """TensorBoard on ``logdir``, once it answers; (its process, its address)."""
    port = free_port()
    command = ["tensorboard", "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(f"{url}/data/runs", timeout=2).read()
            return server, url
        except OSError:
            time.sleep(0.5)
    server.kill()
    sys.exit(f"TensorBoard did not answer on {url}")


def screenshot(url: str, png: Path, window: str) -> None:
    with tempfile.TemporaryDirectory() as profile:  # a new empty profile: nothing cached from an earlier shot
        command = [
            "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}", f"--window-size={window}", "--virtual-time-budget=15000",
            f"--screenshot={png}", url,
        ]  # fmt: skip
        subprocess.run(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, check=False
        )
    print(f"  {png}" if png.is_file() else f"  {png}: Chromium saved nothing", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/dashboard_screenshots"))
    parser.add_argument("--families", nargs="+", default=[*FAMILIES, "instructgpt"])
    parser.add_argument("--skip-training", action="store_true", help="reuse the runs already in --out")
    parser.add_argument("--window", default="1600,1200", help="Chromium's window size, width,height")
    args = parser.parse_args()
    unknown = set(args.families) - {*FAMILIES, "instructgpt"}
    if unknown:
        sys.exit(f"Unknown families {sorted(unknown)}; choose from {[*FAMILIES, 'instructgpt']}")
    if shutil.which("chromium") is None or shutil.which("tensorboard") is None:
        sys.exit("Needs chromium and tensorboard on PATH (apt install chromium; pip install tensorboard)")
    runs, cache_dir = args.out / "runs", args.out / "cache"
    runs.mkdir(parents=True, exist_ok=True)
    failed = []
    for family in args.families:
        run_dir = runs / family
        if not args.skip_training:
            shutil.rmtree(run_dir, ignore_errors=True)
            if not train(family, run_dir, cache_dir):
                failed.append(family)
                continue
        server, url = serve(run_dir)
        try:
            print(f"[{family}] TensorBoard at {url}", flush=True)
            for name, tab in TABS.items():
                screenshot(f"{url}/#{tab}", args.out / f"{family}_{name}.png", args.window)
        finally:
            server.terminate()
            server.wait()
    if failed:
        sys.exit(f"Training failed for {failed}: no screenshots of them")


if __name__ == "__main__":
    main()
