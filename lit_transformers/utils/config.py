"""Config checks and strict instantiation: bad config fails fast with a message that names the fix."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import types
import typing
from pathlib import Path

from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

RESOLVED_CONFIG_ENV = "LIT_TRANSFORMERS_RESOLVED_CONFIG"


# a string the override grammar reads back as that string without quotes (not a number, bool or null)
BARE_STRING = re.compile(r"(?!(?:true|false|null|nan|inf)$)[A-Za-z_][\w./-]*", re.IGNORECASE)


def as_override(value) -> str:
    """``value`` as a command-line override writes it, in Hydra's grammar: ``null``, ``true``, plain strings bare and
    others quoted, ``[a, b]``, mappings with bare keys (``{r: 16, alpha: 32}``)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {as_override(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(as_override(item) for item in value) + "]"
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return str(value)  # 1e-05, inf: as the grammar reads them
    text = str(value)
    return text if BARE_STRING.fullmatch(text) else json.dumps(text)


class ConfigError(ValueError):
    """A problem with the composed config that the user fixes on the command line or in YAML."""


def check_required(cfg: DictConfig) -> None:
    missing = OmegaConf.missing_keys(cfg)
    if missing:
        keys = ", ".join(sorted(missing))
        raise ConfigError(
            f"Missing required value(s): {keys}. Set them on the command line, e.g. {sorted(missing)[0]}=..."
        )


# the run flags train.yaml owns; groups are checked against the signatures of their _target_s
TOP_LEVEL_TYPES = {"seed": int, "train": bool, "test": bool, "compile": bool, "trust_checkpoint": bool}


def _numeric_only(annotation) -> bool:
    """True when an annotation admits only plain classes and none of them is str (or a str parent)."""
    args = (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else (annotation,)
    )
    classes = [typing.get_origin(a) or a for a in args]
    return all(isinstance(c, type) for c in classes) and not any(issubclass(str, c) for c in classes)


def _check_signature(obj, node: DictConfig, full_key: str) -> None:
    """A string where the target's signature wants numbers/bools (``trainer.max_steps=abc``) is an error."""
    # a class's own arguments and those its __init__ passes on (**shared) to its bases' __init__s
    targets = (
        [c.__init__ for c in reversed(obj.__mro__) if "__init__" in vars(c)]
        if isinstance(obj, type)
        else [obj]
    )
    try:
        hints = {key: hint for target in targets for key, hint in typing.get_type_hints(target).items()}
    except Exception:  # noqa: BLE001 - unresolvable annotations: nothing to check against
        return
    for key in node:
        if key not in hints or OmegaConf.is_missing(node, key):
            continue
        value = node[key]
        if isinstance(value, str) and _numeric_only(hints[key]):
            raise ConfigError(f"{full_key}.{key}={value!r} has the wrong type: expected {hints[key]}")


def _fits(value, expected: type) -> bool:
    """``isinstance``, except that a bool is no int and an int is also a float (YAML reads ``1`` for 1.0)."""
    if isinstance(value, bool):
        return expected is bool
    return isinstance(value, expected) or (expected is float and isinstance(value, int))


def check_types(cfg: DictConfig, path: str = "", flags: dict[str, type] = TOP_LEVEL_TYPES) -> None:
    """Type-check the top-level ``flags`` (train.py's run flags unless given; null passes), every dataclass
    ``_target_`` (e.g. ``model``) against its fields, and every other ``_target_`` against its signature.

    Hydra already rejects overrides of keys that do not exist; this adds the types, so ``model.n_layer=abc``
    or ``data.batch_size=abc`` fails here instead of deep inside construction.
    """
    if not path:
        for key, expected in flags.items():
            value = cfg.get(key)
            if value is not None and not _fits(value, expected):
                raise ConfigError(f"{key}={value!r} has the wrong type: expected {expected.__name__}")
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
                values = {
                    k: v
                    for k, v in OmegaConf.to_container(node, resolve=True).items()
                    if not k.startswith("_")
                }
                try:
                    OmegaConf.merge(OmegaConf.structured(obj), values)
                except Exception as err:  # noqa: BLE001 - omegaconf validation errors
                    raise ConfigError(f"Invalid value in {full_key}: {err}".replace("\n", " ")) from err
            else:
                _check_signature(obj, node, full_key)
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


def resolve_once(cfg: DictConfig, save: bool = True) -> DictConfig:
    """Resolve interpolations once, in the launching process, and hand DDP children that exact config.

    Lightning restarts the script for each extra rank; re-resolving there would give ``${now:...}``
    and other interpolations new values. The parent saves the resolved config in the run directory and
    points children at it through an environment variable they inherit.

    torchrun and SLURM start every rank themselves: each resolves on its own, and only their rank 0 saves
    (``save=False`` elsewhere). They agree, because their run folder comes from the launcher's job id
    (``utils.cluster``), not from each rank's clock.
    """
    inherited = os.environ.get(RESOLVED_CONFIG_ENV)
    if inherited:
        return OmegaConf.load(inherited)
    OmegaConf.resolve(cfg)
    if not save:
        return cfg
    out = Path(cfg.paths.output_dir) / "config_resolved.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out)
    os.environ[RESOLVED_CONFIG_ENV] = str(out)
    return cfg
