"""The InstructGPT chain in one command: pretrain -> SFT -> label -> reward model -> PPO (and GRPO, DPO), each training
stage a normal ``train.py`` run in its own subdirectory, each stage's best checkpoint feeding the next.

``label`` plays InstructGPT's labelers (lit_transformers/labeling.py): the judge ranks the SFT policy's samples into
the preference pairs that the reward model and DPO train on.

    lit-instructgpt                                         # the whole chain (= python -m lit_transformers.instructgpt)
    lit-instructgpt 'stages=[pretrain,sft,label,reward,ppo,dpo]'
    lit-instructgpt 'stages=[pretrain,sft,grpo]'            # GRPO rewarded by the judge: no reward model needed
    lit-instructgpt run_dir=<run>                           # resume: finished stages skipped, a stopped one resumed
    lit-instructgpt model=llama_nano                        # the chain on another model preset (pretrain builds it)
    lit-instructgpt init_from_hf=<dir> 'stages=[sft,label,reward,ppo]'   # from a Hugging Face decoder and its tokenizer

Each stage starts from the best checkpoint of the stage before it that trains its model (NEEDS), with that
checkpoint's tokenizer and model config, or from an ``init_from`` in its own overrides; a chain where a stage has
neither is refused before any stage runs. The chain's ``model`` (``model=<preset>``, ``model.*``) is the model that
pretrain builds; ``init_from_hf=<dir>`` starts the first stage from a Hugging Face decoder directory instead (its
architecture, weights and tokenizer; the chain's ``model.block_size`` sizes that stage's data), so a chain from it
needs no pretrain. A finished stage writes ``<run>/<stage>/stage.json`` (its best checkpoint and test metrics, paths
relative to ``run_dir``), so a rerun on the same ``run_dir``, from any directory, skips it. A stage stopped by a
signal (SIGTERM, Ctrl-C) writes ``interrupted.json`` beside its ``last.ckpt`` and prints the command that reruns the
chain, which resumes the stage from that step; any other unfinished stage's folder is moved aside and the stage
starts again. A failing stage stops the chain with its error. At the end the chain prints one table and writes
``<run>/summary.json``: ``{stage: {metric: value}}`` with each stage's test metrics. Stages run in this process, one
after the other (multi-process trainers belong to single-stage runs).
"""

from __future__ import annotations

import json
import logging
import shlex
import time
from pathlib import Path

import hydra
from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from lit_transformers.callbacks import Interrupted
from lit_transformers.labeling import label_comparisons
from lit_transformers.tasks.base import parent_model_config
from lit_transformers.train import train
from lit_transformers.utils.checkpoints import read_checkpoint
from lit_transformers.utils.config import ConfigError, as_override, check_required, check_types
from lit_transformers.utils.errors import report_user_errors
from lit_transformers.utils.run_folder import keep_earlier_csv_logs
from lit_transformers.utils.run_report import report_interruptions, this_command

log = logging.getLogger(__name__)

# the checkpoints each stage starts from: its init_from key ("model": the whole init_from of a one-model task; the
# label stage samples it) -> the stage that trains that model; the first one gives the tokenizer and model config
NEEDS = {
    "pretrain": {},
    "sft": {"model": "pretrain"},
    "label": {"model": "sft"},
    "reward": {"model": "sft"},
    # the RL stages' reward model only for a reward_model reward in their task.rewards (stage_needs): ppo and
    # grpo_rm are rewarded by the reward stage's model, ppo_judge and grpo by the judge
    "ppo": {"policy": "sft", "reward": "reward"},
    "ppo_judge": {"policy": "sft", "reward": "reward"},
    "grpo": {"policy": "sft", "reward": "reward"},
    "grpo_rm": {"policy": "sft", "reward": "reward"},
    "dpo": {"model": "sft"},
}
TRAINED = {
    "pretrain": "pretrained GPT",
    "sft": "SFT policy",
    "reward": "reward model",
}  # what each parent trains


def given_checkpoints(overrides: list[str]) -> dict[str, str]:
    """The init_from a stage's own overrides give it, by init_from key (see NEEDS)."""
    init_from = compose("train", overrides=overrides).init_from
    if init_from is None:
        return {}
    return {"model": init_from} if isinstance(init_from, str) else dict(init_from)


def stage_needs(cfg: DictConfig, stage: str) -> dict[str, str]:
    """``NEEDS[stage]``, less an RL stage's reward model when its ``task.rewards`` (the judge alone, say) do not
    use it."""
    if "reward" not in NEEDS[stage]:
        return NEEDS[stage]
    rewards = compose("train", overrides=[*cfg.stage_configs[stage], *cfg.common]).task.rewards
    if any("reward_model" in entry for entry in rewards):
        return NEEDS[stage]
    return {key: parent for key, parent in NEEDS[stage].items() if key != "reward"}


def check_sources(cfg: DictConfig) -> dict[str, dict[str, str]]:
    """Before any stage runs: every stage still to run needs each model it starts from (NEEDS) from a stage before
    it or from its own overrides; returns the checkpoints the overrides give, by stage. A stage without one is
    refused, naming the model and both fixes (a random policy or reward model would train for nothing)."""
    unknown = [stage for stage in cfg.stages if stage not in NEEDS]
    if unknown:
        raise ConfigError(f"Unknown chain stage {unknown[0]!r} in stages; choose from {list(NEEDS)}")
    check_start(cfg)
    given, before = {}, set()
    for stage in cfg.stages:
        spec = list(cfg.stage_configs[stage])
        finished = (Path(cfg.run_dir) / stage / "stage.json").is_file()
        missing = {
            key: parent
            for key, parent in stage_needs(cfg, stage).items()
            if parent not in before and not finished and key not in hub_source(cfg, stage)
        }
        if missing:
            given[stage] = given_checkpoints([*spec, *cfg.common])
            missing = {key: parent for key, parent in missing.items() if key not in given[stage]}
        if missing:
            raise missing_source(stage, missing, spec, cfg.stages)
        for key, path in given.get(stage, {}).items():
            if not Path(path).is_file():
                raise FileNotFoundError(
                    f"Chain stage {stage}: init_from {key} {path} not found; pass a .ckpt file"
                )
        before.add(stage)
    return given


def check_start(cfg: DictConfig) -> None:
    """``init_from_hf``, a Hugging Face decoder directory, starts the chain's first stage, which must train."""
    if cfg.init_from_hf and cfg.stages[0] == "label":
        raise ConfigError(
            f"init_from_hf={cfg.init_from_hf} starts the chain's first stage, but label samples a trained SFT "
            "checkpoint: begin stages with sft, e.g. 'stages=[sft,label,reward,ppo]'"
        )
    if cfg.init_from_hf and not Path(cfg.init_from_hf).is_dir():
        raise ConfigError(
            f"init_from_hf={cfg.init_from_hf} is not a directory; pass a Hugging Face causal LM directory "
            "(config.json, model.safetensors and its tokenizer files)"
        )


def hub_source(cfg: DictConfig, stage: str) -> dict[str, str]:
    """``{init_from key: directory}``: the Hugging Face decoder ``init_from_hf`` gives the chain's first stage in
    place of the checkpoint of its first model (NEEDS; pretrain's own model), with the directory's tokenizer."""
    if not cfg.init_from_hf or stage != cfg.stages[0]:
        return {}
    return {next(iter(NEEDS[stage]), "model"): cfg.init_from_hf}


def missing_source(stage: str, missing: dict[str, str], spec: list[str], stages: list[str]) -> ConfigError:
    """The refusal of a chain whose ``stage`` starts from ``missing`` models (init_from key -> parent stage)."""
    models = " and the ".join(
        f"{TRAINED[p]} (init_from{'' if k == 'model' else '.' + k})" for k, p in missing.items()
    )
    wanted = set(stages) | set(missing.values())
    needs = {
        **NEEDS,
        stage: missing,
    }  # the stage's own: GRPO's holds a reward model only for a reward_model reward
    while extra := {p for s in wanted for p in needs[s].values()} - wanted:  # the parents' parents too
        wanted |= extra
    given = [
        f"init_from=<{p}.ckpt>" if k == "model" else f"+init_from.{k}=<{p}.ckpt>" for k, p in missing.items()
    ]
    overrides = ",".join(f'"{o}"' for o in [*spec, *given])
    return ConfigError(
        f"Chain stage {stage} starts from the {models}, which no stage before it trains: put "
        f"{' and '.join(missing.values())} before {stage} in stages, e.g. "
        f"'stages=[{','.join(s for s in NEEDS if s in wanted)}]', or give {stage} the checkpoint{'s' * (len(missing) > 1)} in its overrides: "
        f"'stage_configs.{stage}=[{overrides}]'"
    )


def stage_overrides(stage: str, sources: dict[str, str], done: dict[str, dict]) -> list[str]:
    """The init_from (``sources``: init_from key -> checkpoint, or the first one a Hugging Face directory: see
    hub_source) and data overrides that feed a stage; the first source gives the tokenizer."""
    if not sources:
        return []
    primary = next(iter(sources.values()))
    overrides = [f"data.tokenizer_path='{primary}'"]
    if stage in ("reward", "dpo") and "label" in done:
        overrides += ["data.source=jsonl", f"data.path='{done['label']['comparisons']}'", "data.pool=all"]
    checkpoints = {key: path for key, path in sources.items() if not Path(path).is_dir()}
    if len(checkpoints) < len(
        sources
    ):  # the directory is every model of the stage it can be (PPO: also value)
        overrides.append(f"task.init_from_hf='{primary}'")
    if list(checkpoints) == ["model"]:
        return [*overrides, f"init_from='{primary}'"]
    if checkpoints:
        items = ", ".join(f"{key}: '{path}'" for key, path in checkpoints.items())
        overrides.append("init_from={" + items + "}")
    return overrides


def chain_keys(cfg: DictConfig, stage: str) -> list[str]:
    """The chain's keys as overrides of a stage, before the stage's own (which win): its instruction-data keys
    (``data.kinds=hard``) for every stage after pretrain, its ``lora`` for every one of them that trains. Null keys
    leave each stage its own."""
    if stage == "pretrain":
        return []
    given = {f"data.{key}": value for key, value in OmegaConf.to_container(cfg.data).items()}
    if stage != "label":
        given["task.lora"] = OmegaConf.to_container(cfg.lora) if cfg.lora is not None else None
    return [f"{key}={as_override(value)}" for key, value in given.items() if value is not None]


def compose_stage(overrides: list[str], output_dir: Path, parent: str | None) -> DictConfig:
    """A stage's train config, composed as train.py composes it, writing into ``output_dir``, its model config
    the ``parent`` checkpoint's (whose weights it starts from), so the data's lengths follow it too."""
    cfg = compose("train", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
        del cfg.hydra
        if parent:
            checkpoint = read_checkpoint(parent, "init_from", cfg.trust_checkpoint)
            taken = parent_model_config(checkpoint, cfg.model)
            if taken:
                log.info("Chain: the model config of %s: %s", parent, taken)
            cfg.model.update(taken)
    check_required(cfg)
    check_types(cfg)
    keep_earlier_csv_logs(cfg)  # a resumed stage keeps its earlier attempts' metrics
    OmegaConf.resolve(cfg)
    output_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, output_dir / "config_resolved.yaml")
    return cfg


# the keys of stage.json that name files, stored relative to run_dir
STAGE_FILES = ("checkpoint", "comparisons")


def write_stage(marker: Path, run_dir: Path, info: dict) -> None:
    """``<run>/<stage>/stage.json``: ``info`` with its files relative to ``run_dir``, not to this directory."""
    stored = {
        k: str(Path(v).resolve().relative_to(run_dir.resolve())) if k in STAGE_FILES else v
        for k, v in info.items()
    }
    marker.write_text(json.dumps(stored, indent=2))


def read_stage(marker: Path, run_dir: Path) -> dict:
    """A finished stage's ``stage.json``, its files under ``run_dir`` (absolute ones as they are); a file that
    is gone is refused here, naming the stage to rerun, not later by the stage that needs it."""
    info = json.loads(marker.read_text())
    for key in STAGE_FILES:
        if key in info:
            info[key] = str(run_dir / info[key])
            if not Path(info[key]).is_file():
                raise ConfigError(
                    f"{marker} names {key} {info[key]}, which does not exist; delete {marker} to run that"
                    " stage again"
                )
    return info


# the chain's model config (its model preset and model.* keys) as a preset of the model group, which the stage that
# builds its model composes, under that stage's own overrides
CHAIN_MODEL = "lit_instructgpt_chain"


def run_chain(cfg: DictConfig) -> dict[str, dict[str, float]]:
    run_dir = Path(cfg.run_dir)
    given = check_sources(cfg)
    ConfigStore.instance().store(group="model", name=CHAIN_MODEL, node=cfg.model)
    done: dict[str, dict] = {}
    for stage in cfg.stages:
        stage_dir = run_dir / stage
        marker, stopped = stage_dir / "stage.json", stage_dir / "interrupted.json"
        if marker.is_file():
            done[stage] = read_stage(marker, run_dir)
            log.info("Chain: %s already finished (%s), skipping", stage, marker)
            continue
        resume = []
        if stopped.is_file():  # stopped by a signal: continue from the step it saved, in the same folder
            interrupted = read_stage(stopped, run_dir)
            resume = [f"ckpt_path='{interrupted['checkpoint']}'"]
            log.info("Chain: %s was stopped at step %d; resuming it", stage, interrupted["step"])
        elif stage_dir.exists():
            # any other unfinished attempt: kept aside, so that its checkpoints cannot be mistaken for this one's
            aside = stage_dir.with_name(f"{stage}.incomplete-{int(time.time())}")
            stage_dir.rename(aside)
            log.warning(
                "Chain: %s did not finish before; its folder moved to %s, starting it again", stage, aside
            )
        hub = hub_source(cfg, stage)
        sources = hub | {
            key: done[parent]["checkpoint"] if parent in done else given[stage][key]
            for key, parent in stage_needs(cfg, stage).items()
            if key not in hub
        }
        # a stage that builds its model (pretrain, or from init_from_hf) has the chain's; the others their parent's
        preset = [f"model={CHAIN_MODEL}"] if hub or not sources else []
        overrides = [
            *preset,
            *chain_keys(cfg, stage),
            *cfg.stage_configs[stage],
            *cfg.common,
            *stage_overrides(stage, sources, done),
            *resume,
        ]
        log.info("Chain: stage %s -> %s\n  overrides: %s", stage, stage_dir, " ".join(overrides))
        parent = (
            None if hub else next(iter(sources.values()), None)
        )  # the checkpoint whose model config it takes
        stage_cfg = compose_stage(overrides, stage_dir, parent)
        if stage == "label":
            comparisons = stage_dir / "comparisons.jsonl"
            counts = label_comparisons(
                stage_cfg.init_from, stage_cfg.data, comparisons, **cfg.label, seed=stage_cfg.seed
            )
            write_stage(marker, run_dir, {"comparisons": str(comparisons), "test": counts})
            done[stage] = read_stage(marker, run_dir)
            continue
        try:
            result = train(stage_cfg)
        except Interrupted as stop:
            if stop.checkpoint:  # what a rerun of the chain resumes this stage from
                write_stage(stopped, run_dir, {"checkpoint": stop.checkpoint, "step": stop.step})
            raise
        if result.best_checkpoint is None:
            raise RuntimeError(
                f"Stage {stage} kept no best checkpoint for the next stage; it needs validation and"
                " checkpointing on (trainer.limit_val_batches > 0, callbacks.model_checkpoint set)"
            )
        test = {
            k.removeprefix("test/"): v for k, v in sorted(result.metrics.items()) if k.startswith("test/")
        }
        write_stage(marker, run_dir, {"checkpoint": result.best_checkpoint, "test": test})
        stopped.unlink(missing_ok=True)  # finished: deleting stage.json runs the stage again from the start
        done[stage] = read_stage(marker, run_dir)  # as a later run reads it
    summary = {stage: info["test"] for stage, info in done.items()}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print(summary_table(summary))
    print(f"\nsummary: {run_dir / 'summary.json'}")
    if any(run_dir.rglob("events.out.tfevents.*")):  # stages logged to TensorBoard: one view of them all
        print(f"TensorBoard, every stage: tensorboard --logdir {run_dir}")
    return summary


def summary_table(summary: dict[str, dict[str, float]]) -> str:
    rows = [(stage, metric, value) for stage, metrics in summary.items() for metric, value in metrics.items()]
    width = max([len(f"{s} {m}") for s, m, _ in rows] + [10])
    lines = [f"{'stage metric':<{width}}  test value", "-" * (width + 12)]
    lines += [f"{f'{s} {m}':<{width}}  {v:.4f}" for s, m, v in rows]
    return "\n".join(lines)


def chain(cfg: DictConfig) -> dict[str, dict[str, float]]:
    """Run the chain from a composed ``instructgpt`` config (also outside ``hydra.main``, e.g. in tests)."""
    if GlobalHydra.instance().is_initialized():
        return run_chain(cfg)
    with initialize_config_module("lit_transformers.conf", version_base="1.3"):
        return run_chain(cfg)


@hydra.main(version_base="1.3", config_path="pkg://lit_transformers.conf", config_name="instructgpt")
def main(cfg: DictConfig) -> None:
    # now: each stage's composition replaces Hydra's view of this command line
    run_dir = shlex.quote(f"run_dir={HydraConfig.get().runtime.output_dir}")
    command = " ".join([*this_command("run_dir"), run_dir])
    with report_interruptions(lambda checkpoint: command), report_user_errors():
        chain(cfg)


if __name__ == "__main__":
    main()
