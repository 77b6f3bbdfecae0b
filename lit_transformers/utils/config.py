"""Config checks and strict instantiation: bad config fails fast with a message that names the fix."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

RESOLVED_CONFIG_ENV = "LIT_TRANSFORMERS_RESOLVED_CONFIG"


class ConfigError(ValueError):
    """A problem with the composed config that the user fixes on the command line or in YAML."""


def check_required(cfg: DictConfig) -> None:
    missing = OmegaConf.missing_keys(cfg)
    if missing:
        keys = ", ".join(sorted(missing))
        raise ConfigError(f"Missing required value(s): {keys}. Set them on the command line, e.g. {sorted(missing)[0]}=...")


def check_types(cfg: DictConfig, path: str = "") -> None:
    """Type-check every node whose ``_target_`` is a dataclass (e.g. ``model``) against its fields.

    Hydra already rejects overrides of keys that do not exist; this adds the field types, so
    ``model.n_layer=abc`` fails here instead of deep inside model construction.
    """
    for key, node in cfg.items_ex(resolve=False) if isinstance(cfg, DictConfig) else []:
        if not isinstance(node, DictConfig):
            continue
        full_key = f"{path}{key}"
        target = node.get("_target_")
        if isinstance(target, str):
            try:
                obj = get_object(target)
            except Exception as err:  # noqa: BLE001 - hydra raises several types for a bad path
                raise ConfigError(f"{full_key}._target_={target!r} cannot be imported: {err}") from err
            if dataclasses.is_dataclass(obj):
                values = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if not k.startswith("_")}
                try:
                    OmegaConf.merge(OmegaConf.structured(obj), values)
                except Exception as err:  # noqa: BLE001 - omegaconf validation errors
                    raise ConfigError(f"Invalid value in {full_key}: {err}".replace("\n", " ")) from err
        check_types(node, f"{full_key}.")


def instantiate_group(group: DictConfig | None, name: str) -> list:
    """Build every entry of a ``callbacks``/``logger`` group. Entries set to null are dropped on purpose;
    an entry without ``_target_`` is an error (never skipped silently)."""
    objects = []
    for key, entry in (group or {}).items():
        if entry is None:
            continue
        if not isinstance(entry, DictConfig) or "_target_" not in entry:
            raise ConfigError(
                f"{name}.{key} has no _target_; every {name} entry must name a class with _target_ "
                f"(or set {name}.{key}=null to drop it)"
            )
        objects.append(instantiate(entry, _convert_="all"))
    return objects


def resolve_once(cfg: DictConfig) -> DictConfig:
    """Resolve interpolations once, in the launching process, and hand DDP children that exact config.

    Lightning restarts the script for each extra rank; re-resolving there would give ``${now:...}``
    and other interpolations new values. The parent saves the resolved config in the run directory and
    points children at it through an environment variable they inherit.
    """
    inherited = os.environ.get(RESOLVED_CONFIG_ENV)
    if inherited:
        return OmegaConf.load(inherited)
    OmegaConf.resolve(cfg)
    out = Path(cfg.paths.output_dir) / "config_resolved.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out)
    os.environ[RESOLVED_CONFIG_ENV] = str(out)
    return cfg
