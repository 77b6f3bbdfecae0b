"""Shared fixtures: compose the real Hydra config (as train.py does) with tiny, fast overrides."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import NamedTuple
from unittest import mock

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from lit_transformers.train import main as train_entry_point
from lit_transformers.train import train
from lit_transformers.utils.config import RESOLVED_CONFIG_ENV
from lit_transformers.utils.errors import USER_ERRORS

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
EXPERIMENTS = sorted(p.stem for p in (REPO / "lit_transformers" / "conf" / "experiment").glob("*.yaml"))
# InstructGPT stages run their fast_dev_run at tiny sizes in tests/test_instructgpt.py
INSTRUCT_EXPERIMENTS = ["gpt_sft", "gpt_reward", "gpt_ppo", "gpt_dpo", "gpt_grpo"]
LM_EXPERIMENTS = [
    name for name in EXPERIMENTS if name.startswith("gpt") and name not in INSTRUCT_EXPERIMENTS
]  # image ones: tests/test_vit, test_clip

# a run of a few small batches, validated and tested on two, without console tables: any family's tiny runs
TINY_TRAINER = [
    "data.batch_size=8",
    "trainer.max_steps=4",
    "trainer.log_every_n_steps=1",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "callbacks.progress_bar=null",
    "callbacks.model_summary=null",
]
# a GPT small enough that every stage of a run takes seconds on 2 CPU cores
TINY_LM = [
    "model.n_layer=1",
    "model.n_head=2",
    "model.d_model=32",
    "model.block_size=32",
    "data.vocab_size=300",
    *TINY_TRAINER,
    "sample.max_new_tokens=8",
    "callbacks.text_samples.max_new_tokens=8",
]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One tokenizer cache for the session: tokenizers are trained once, as in real use."""
    return tmp_path_factory.mktemp("cache")


def compose_train_cfg(*overrides: str, output_dir: Path, cache_dir: Path, resolve: bool = True) -> DictConfig:
    """The composed train config (as train.py composes it), writing into output_dir."""
    GlobalHydra.instance().clear()
    with initialize_config_module("lit_transformers.conf", version_base="1.3"):
        cfg = compose(
            "train", overrides=[f"paths.cache_dir={cache_dir}", *overrides], return_hydra_config=True
        )
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
        cfg.paths.log_dir = str(output_dir)
        del cfg.hydra  # read-only; its values live on in HydraConfig for ${hydra:...}
    if resolve:
        OmegaConf.resolve(cfg)
    return cfg


@pytest.fixture
def compose_cfg(tmp_path, cache_dir):
    """compose_cfg(*overrides) -> the composed train config, resolved, writing into tmp_path."""

    def _compose(*overrides: str, resolve: bool = True) -> DictConfig:
        return compose_train_cfg(*overrides, output_dir=tmp_path, cache_dir=cache_dir, resolve=resolve)

    yield _compose
    GlobalHydra.instance().clear()


def cli_env(env: dict | None = None) -> dict:
    """The environment of a fresh command line: this one's plus ``env``, unbuffered, with no config inherited
    from a run in this process, and tests/ importable, so a config can name a test's callback
    (``+callbacks.x._target_=test_resume.SeedByRank``)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), full_env.get("PYTHONPATH")) if p)
    full_env.pop(RESOLVED_CONFIG_ENV, None)
    return full_env


def run_cli(*args: str, cwd: Path | str = REPO, env: dict | None = None, timeout: int = 300):
    """Run the real command line (a fresh process, as a user would) and capture its output."""
    return subprocess.run(
        [*args], cwd=cwd, env=cli_env(env), capture_output=True, text=True, timeout=timeout, check=False
    )


def train_cli(*overrides: str, **kwargs):
    return run_cli(sys.executable, str(REPO / "train.py"), *overrides, **kwargs)


def run_main(main: Callable[[], object], *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """A command's Hydra ``main`` run in this process as its command line runs it (``args`` as argv, with ``env``
    added to the environment): its exit status and what it printed, as run_cli returns them, without the ~6 s of
    CPU that a fresh python spends importing torch and Lightning. The logging that Hydra sets up for the run is
    undone after it. What only a fresh process shows (signals, pipes, imports, the installed commands, DDP's
    child processes) needs run_cli."""
    root, hydra_logger = logging.getLogger(), logging.getLogger("hydra")
    saved = [(logger, logger.handlers[:], logger.level) for logger in (root, hydra_logger)]
    # Hydra's job logging (dictConfig) disables every logger that exists before it: the next test's caplog would
    # hear nothing from them
    existing = [
        logger for logger in logging.root.manager.loggerDict.values() if isinstance(logger, logging.Logger)
    ]
    disabled = [(logger, logger.disabled) for logger in existing]
    stdout, stderr = io.StringIO(), io.StringIO()
    returncode = 0
    GlobalHydra.instance().clear()
    with (
        mock.patch.object(sys, "argv", [main.__module__, *args]),
        mock.patch.dict(os.environ, env or {}),
        redirect_stdout(stdout),
        redirect_stderr(stderr),
    ):
        os.environ.pop(
            RESOLVED_CONFIG_ENV, None
        )  # as cli_env: no config inherited from a run in this process
        try:
            main()
        except SystemExit as exit:  # as Python's exit: a message is printed and exits 1
            if isinstance(exit.code, str):
                print(exit.code, file=sys.stderr)
            returncode = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
        finally:
            GlobalHydra.instance().clear()
            for logger, handlers, level in saved:
                for handler in set(logger.handlers) - set(handlers):
                    handler.close()  # the run's log file
                logger.handlers[:] = handlers
                logger.setLevel(level)
            for logger, was_disabled in disabled:
                logger.disabled = was_disabled
    return subprocess.CompletedProcess(
        [main.__module__, *args], returncode, stdout.getvalue(), stderr.getvalue()
    )


def train_main(*overrides: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``train.py *overrides`` run in this process: run_main of train.py's main."""
    return run_main(train_entry_point, *overrides, env=env)


def assert_short_error(result, *needles: str, max_lines: int = 20) -> None:
    """A command that exited 1 with a message of under ``max_lines`` lines naming every needle, no traceback."""
    output = result.stderr + result.stdout
    assert result.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    for needle in needles:
        assert needle in output, (needle, output[-3000:])
    assert len(output.strip().splitlines()) < max_lines, output


def assert_user_error(run, *needles: str) -> None:
    """``run()`` raises an error that the command line reports as one paragraph (utils.errors.report_user_errors,
    checked through a real command line by assert_short_error), naming every needle."""
    with pytest.raises(USER_ERRORS) as error:
        run()
    message = str(error.value)
    for needle in needles:
        assert needle in message, (needle, message)
    assert len(message.splitlines()) < 20, message


@pytest.fixture
def ddp_cli(tmp_path, cache_dir):
    """ddp_cli(*overrides, run_dir=tmp_path/"ddp") -> run_dir: train.py on two CPU processes (trainer=ddp_cpu) with
    the session's tokenizer cache, its run folder run_dir under paths.log_dir=tmp_path; the test fails, showing the
    end of stderr, unless the run succeeds. Mark such tests ``ddp`` and ``cli``."""

    def _run(*overrides: str, run_dir: Path | None = None, timeout: int = 300) -> Path:
        run_dir = run_dir or tmp_path / "ddp"
        result = train_cli(
            *overrides,
            "trainer=ddp_cpu",
            f"hydra.run.dir={run_dir}",
            f"paths.log_dir={tmp_path}",
            f"paths.cache_dir={cache_dir}",
            timeout=timeout,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return run_dir

    return _run


class TwoRankCall(NamedTuple):
    """A job of a launch of 2 processes other than a training run: ``function`` ("module.name", importable from
    tests/) called with ``arg`` on each rank, after the jobs before it, in the process group they started."""

    function: str
    arg: str


def train_on_two_ranks(*jobs: DictConfig | TwoRankCall) -> list[dict[str, float] | None]:
    """Each job in turn, in one launch of 2 processes (tests/ddp_worker.py): one start of the processes, their
    imports and their process group for all of them. A job is a resolved train config (its trainer ddp_cpu), saved
    as ddp_config.yaml in its paths.output_dir, where its run goes, or a TwoRankCall. Returns each run's final
    metrics (None for a call). Fails, showing the end of stderr, unless every job succeeds."""
    arguments, metrics = [], []
    for job in jobs:
        if isinstance(job, TwoRankCall):
            arguments.append(f"call:{job.function}:{job.arg}")
            metrics.append(None)
            continue
        path = Path(job.paths.output_dir) / "ddp_config.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(job, path)
        arguments.append(str(path))
        metrics.append(path.parent / "metrics.json")
    cwd = next((m.parent for m in metrics if m is not None), TESTS)
    GlobalHydra.instance().clear()  # the jobs' configs are composed: later tests in this process start clean
    result = run_cli(sys.executable, str(TESTS / "ddp_worker.py"), *arguments, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return [None if m is None else json.loads(m.read_text()) for m in metrics]


class _TwoRankGroup(NamedTuple):
    build: Callable[[Path, Path], tuple[list, Callable[[list], object]]]
    first: bool


# every group of 2-process jobs of the session, by the name of its fixture (two_rank_group)
TWO_RANK_GROUPS: dict[str, _TwoRankGroup] = {}


def two_rank_group(build=None, *, first: bool = False):
    """Decorates ``build(root, cache_dir) -> (jobs, finish)`` of a test module into a session fixture of its name
    whose value is ``finish(results)``, ``results`` being train_on_two_ranks' of ``jobs``. Every group that the
    session's selected tests use runs in one launch of 2 processes (two_rank_launch): each launch costs two
    fresh pythons (~12 s of CPU) before any job. ``build`` writes under ``root``; ``first``: its jobs come first in
    the launch (the first trainer starts rank 1 and the process group). Mark its tests ``ddp`` and ``cli``."""

    def register(build):
        name = build.__name__
        known = TWO_RANK_GROUPS.get(name)
        assert known is None or known.build.__qualname__ == build.__qualname__, f"two groups named {name}"
        TWO_RANK_GROUPS[name] = _TwoRankGroup(build, first)

        @pytest.fixture(name=name, scope="session")
        def group(two_rank_launch):
            return two_rank_launch[name]

        group.__doc__ = build.__doc__
        return group

    return register if build is None else register(build)


@pytest.fixture(scope="session")
def two_rank_launch(request, tmp_path_factory, cache_dir) -> dict[str, object]:
    """The value of every two_rank_group that a selected test uses, by name: their jobs in one launch of 2
    processes (the ``first`` group's first), each group building its jobs under a folder of its own."""
    used = {name for item in request.session.items for name in item.fixturenames if name in TWO_RANK_GROUPS}
    names = sorted((n for n in TWO_RANK_GROUPS if n in used), key=lambda n: not TWO_RANK_GROUPS[n].first)
    root = tmp_path_factory.mktemp("two_ranks")
    jobs, spans = [], {}
    for name in names:
        group_jobs, finish = TWO_RANK_GROUPS[name].build(root / name, cache_dir)
        spans[name] = (slice(len(jobs), len(jobs) + len(group_jobs)), finish)
        jobs += group_jobs
    results = train_on_two_ranks(*jobs)
    return {name: finish(results[span]) for name, (span, finish) in spans.items()}


@pytest.fixture(scope="session")
def tiny_lm_run(tmp_path_factory, cache_dir) -> Path:
    """The run folder of one tiny GPT training (TINY_LM, no test or sample), as train.py leaves it: checkpoints
    (last.ckpt at step 4), csv/ and config_resolved.yaml. Shared by the session: read it, never change it."""
    run_dir = tmp_path_factory.mktemp("tiny_lm_run")
    cfg = compose_train_cfg(*TINY_LM, "test=false", "sample=null", output_dir=run_dir, cache_dir=cache_dir)
    OmegaConf.save(cfg, run_dir / "config_resolved.yaml")  # as resolve_once leaves it in the run
    train(cfg)
    GlobalHydra.instance().clear()
    return run_dir
