"""What a Hugging Face tokenizer directory says beside its ``tokenizer.json``, read as ``transformers`` reads
it: ``tokenizer_config.json`` (special tokens by role, ``chat_template``), the legacy
``special_tokens_map.json`` (overriding the config's roles, as ``transformers`` merges it),
``chat_template.jinja`` (where ``transformers`` >= 4.50 saves the template; it wins over the config's) and
``generation_config.json`` (``eos_token_id``: the ids generation stops at, often several). Added tokens
(``<|im_start|>``...) come from tokenizer.json, which holds them all wherever ``transformers`` writes one (the
config's ``added_tokens_decoder`` repeats them)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from lit_transformers.text.chat import SPECIAL_ROLES, turn_end_token

log = logging.getLogger(__name__)


@dataclass
class HubTokenizerFiles:
    directory: Path
    roles: dict[str, str] = field(default_factory=dict)  # role -> token, the ones the files name
    chat_template: str | None = None
    stop_ids: list[int] = field(default_factory=list)  # generation_config.json's eos_token_id
    do_lower_case: bool = True  # a vocab.txt's BERT normalisation (BERT's default: uncased)
    tokenizer_class: str | None = None  # transformers' class (CLIPTokenizer's texts start with BOS)

    def special_tokens(
        self, backend: HFTokenizer, given: Mapping[str, str] | None, guessed: Mapping[str, str]
    ) -> tuple[dict[str, str], list[str]]:
        """(role -> token, end-of-turn tokens) for ``backend``. The roles are ``given``, else the files', else
        ``guessed`` (when the files name none). Roles read from the files without a pad token pad with EOS
        (TRL's rule; our batches mask padding by the attention mask or the lengths, never by comparing ids, so
        a real EOS is still a label)."""
        roles = dict(given or self.roles or guessed)
        if not given and self.roles and "pad" not in roles and "eos" in roles:
            roles["pad"] = roles["eos"]
            log.info(
                "%s names no pad token: padding with its EOS %r (TRL's rule: padding is masked by the attention "
                "mask, so a real EOS is still trained on)",
                self.directory,
                roles["eos"],
            )
        return roles, self._end_of_turn(backend, roles)

    def _end_of_turn(self, backend: HFTokenizer, roles: Mapping[str, str]) -> list[str]:
        """EOS, then generation_config.json's eos_token_id(s), then the token the chat template closes an
        assistant turn with (a base model's config may stop only at EOS while its template ends turns with
        another token, e.g. Llama-3's ``<|eot_id|>``)."""
        stops = [roles["eos"]] if "eos" in roles else []
        for i in self.stop_ids:
            token = backend.id_to_token(i)
            if token is None:
                raise ValueError(
                    f"{self.directory}/generation_config.json stops at id {i}, which the tokenizer's "
                    f"{backend.get_vocab_size()} tokens lack; the files come from different models: restore "
                    "them from the model's Hub repository"
                )
            stops.append(token)
        if self.chat_template and (template_end := turn_end_token(self.chat_template, roles, backend)):
            stops.append(template_end)
        return list(dict.fromkeys(stops))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); restore it from the model's Hub repository") from e


def _content(token) -> str | None:
    """A special token as the files write it: a string, or an AddedToken dict with its ``content``."""
    return token.get("content") if isinstance(token, dict) else token


def _default_template(template) -> str | None:
    """The config's ``chat_template``: one string, or a list of named templates of which "default" is used."""
    if isinstance(template, list):
        return {t.get("name"): t.get("template") for t in template}.get("default")
    return template


def read_hub_files(directory: Path) -> HubTokenizerFiles:
    """The files of ``directory`` (none there: nothing configured, and the roles are guessed)."""
    config = _read_json(directory / "tokenizer_config.json")
    named = {**config, **_read_json(directory / "special_tokens_map.json")}
    roles = {role: _content(named.get(f"{role}_token")) for role in SPECIAL_ROLES}
    template_file = directory / "chat_template.jinja"
    template = template_file.read_text(encoding="utf-8") if template_file.is_file() else None
    stop = _read_json(directory / "generation_config.json").get("eos_token_id")
    return HubTokenizerFiles(
        directory,
        roles={role: token for role, token in roles.items() if token},
        chat_template=template or _default_template(config.get("chat_template")),
        stop_ids=[] if stop is None else [stop] if isinstance(stop, int) else list(stop),
        do_lower_case=bool(config.get("do_lower_case", True)),
        tokenizer_class=config.get("tokenizer_class"),
    )


def write_hub_files(
    directory: Path,
    backend: HFTokenizer,
    special_tokens: Mapping[str, str],
    chat_template: str | None,
    tokenizer_class: str = "PreTrainedTokenizerFast",
) -> None:
    """``tokenizer.json`` and a ``tokenizer_config.json`` naming the special tokens by role (ours are
    transformers' roles) and holding the chat template (where every transformers version reads it), so
    ``AutoTokenizer.from_pretrained`` and :func:`read_hub_files` both load the directory. Stop ids beyond EOS
    belong to the model's ``generation_config.json``, which its export writes."""
    directory.mkdir(parents=True, exist_ok=True)
    backend.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": tokenizer_class}  # CLIPTokenizer's texts start with BOS (see read_hub_files)
    config.update({f"{role}_token": token for role, token in special_tokens.items()})
    if chat_template is not None:
        config["chat_template"] = chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
