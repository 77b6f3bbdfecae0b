"""Conversations (``[{"role", "content"}, ...]``, TRL's conversational records) rendered with a tokenizer's
``chat_template`` the way ``transformers``' ``apply_chat_template`` does: the template is Jinja, run in
``jinja2``'s immutable sandbox (chat templates come from the Hub, untrusted) with ``trim_blocks`` and
``lstrip_blocks``, ``raise_exception``, ``strftime_now``, a ``tojson`` that does not escape HTML, and the
``{% generation %}`` block that marks assistant text. Nothing here writes a format by hand: every token
comes from the template.

:func:`encode_chat` gives the ids and TRL's ``assistant_only_loss`` mask: labels only on the assistant turns.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from lit_transformers.nn.losses import IGNORE_INDEX

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizer

    from lit_transformers.text.tokenizer import Tokenizer

MESSAGE_ROLES = ("system", "user", "assistant", "tool")
# transformers' named special tokens: the template's bos_token, eos_token... and tokenizer_config.json's keys
SPECIAL_ROLES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
_GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")
_SENTINEL = "LIT_TRANSFORMERS_TURN_END_PROBE"


class _GenerationSpans(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body, and while :meth:`recording` is on, notes
    the (start, end) characters of that body in the output (transformers' ``AssistantTracker``)."""

    tags = {"generation"}

    def __init__(self, environment):
        super().__init__(environment)
        environment.extend(generation_spans=self)
        self.blocks: list[str] | None = None  # the output so far while recording
        self.spans: list[tuple[int, int]] = []

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

    def _mark(self, caller) -> str:
        text = caller()
        if self.blocks is not None:
            start = len("".join(self.blocks))
            self.spans.append((start, start + len(text)))
        return text

    @contextmanager
    def recording(self, blocks: list[str]):
        self.blocks, self.spans = blocks, []
        try:
            yield self.spans
        finally:
            self.blocks = None


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    """One environment per template (its generation-span recorder is the environment's), compiled once."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationSpans, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: (
        json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def check_messages(messages: object) -> list[dict]:
    """A conversation as plain dicts, or a one-paragraph error naming what is wrong and how to fix it."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError(
            f"A conversation must be a list of messages ({{'role': ..., 'content': ...}}), got "
            f"{type(messages).__name__}; give a 'messages' list, or plain-text fields (prompt/response) instead"
        )
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
            raise ValueError(
                f"Message {i} of the conversation is {message!r}; each message must be a mapping with a 'role' "
                "and a 'content' key, as TRL's conversational records are"
            )
        if message["role"] not in MESSAGE_ROLES:
            raise ValueError(
                f"Message {i} of the conversation has role {message['role']!r}; roles are {', '.join(MESSAGE_ROLES)}. "
                "Rename it in the data (ShareGPT's 'human'/'gpt' are 'user'/'assistant')"
            )
        if not isinstance(message["content"], str):
            raise ValueError(
                f"Message {i} of the conversation ({message['role']}) has content of type "
                f"{type(message['content']).__name__}; content must be a string: join a list of text parts into "
                "one string (images and other media are not supported)"
            )
        # keys set to None dropped, as transformers does: templates test for a key, not for a None value
        checked.append({key: value for key, value in message.items() if value is not None})
    return checked


def render(
    template: str,
    messages: Sequence[Mapping],
    special_tokens: Mapping[str, str],
    add_generation_prompt: bool = False,
) -> str:
    """The conversation as the template writes it; ``special_tokens`` (role -> token) are its ``bos_token``,
    ``eos_token``, ..."""
    return _render_with_spans(template, messages, special_tokens, add_generation_prompt)[0]


def _render_with_spans(
    template: str, messages: Sequence[Mapping], special_tokens: Mapping[str, str], add_generation_prompt: bool
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered text and the (start, end) characters of each of its ``{% generation %}`` blocks."""
    compiled = _compile(template)
    variables = {f"{role}_token": special_tokens[role] for role in SPECIAL_ROLES if role in special_tokens}
    variables.update(
        messages=list(messages), tools=None, documents=None, add_generation_prompt=add_generation_prompt
    )
    blocks: list[str] = []
    try:
        with compiled.environment.generation_spans.recording(blocks) as spans:
            for block in compiled.generate(**variables):  # one at a time: a span's start is the text so far
                blocks.append(block)
    except jinja2.exceptions.TemplateError as e:
        raise ValueError(
            f"The tokenizer's chat_template refused the conversation: {e}. Fix the records to follow the "
            "template's rule, or use a tokenizer whose template accepts them"
        ) from e
    return "".join(blocks), spans


def no_chat_template() -> ValueError:
    """The error of conversational records met without a chat template (a tokenizer trained here has none)."""
    return ValueError(
        "This tokenizer has no chat_template, so conversational records (role/content messages) cannot be "
        "rendered; set data.tokenizer_path=<a Hub dir with a chat template> (a Hugging Face tokenizer directory "
        "whose tokenizer_config.json or chat_template.jinja carries one, an instruct model's), or give "
        "plain-text records (prompt/response) instead"
    )


def _template_of(tokenizer: Tokenizer) -> str:
    if tokenizer.chat_template is None:
        raise no_chat_template()
    return tokenizer.chat_template


def render_chat(
    tokenizer: Tokenizer, messages: Sequence[Mapping], add_generation_prompt: bool = False
) -> str:
    """The text of ``apply_chat_template(messages, tokenize=False, add_generation_prompt=...)``."""
    return render(
        _template_of(tokenizer), check_messages(messages), tokenizer.special_tokens, add_generation_prompt
    )


@dataclass
class ChatTokens:
    ids: list[int]
    assistant_mask: list[bool]  # True on the tokens of assistant turns: the only ones trained on

    @property
    def labels(self) -> list[int]:
        """``ids`` with every token outside the assistant turns IGNORE_INDEX (unshifted, like ``ids``)."""
        return [i if keep else IGNORE_INDEX for i, keep in zip(self.ids, self.assistant_mask)]


def encode_chat(
    tokenizer: Tokenizer, messages: Sequence[Mapping], add_generation_prompt: bool = False
) -> ChatTokens:
    """Ids of the rendered conversation (its special tokens come from the template, so none are added, as in
    ``apply_chat_template``) and the mask of its assistant tokens: every token overlapping an assistant span."""
    template = _template_of(tokenizer)
    messages = check_messages(messages)
    text, spans = _render_with_spans(template, messages, tokenizer.special_tokens, add_generation_prompt)
    if not _GENERATION_BLOCK.search(template):  # the template marks no assistant text: find it by prefixes
        spans = _assistant_spans_by_prefixes(template, messages, tokenizer.special_tokens, text)
    encoding = tokenizer.backend.encode(text, add_special_tokens=False)
    mask = [any(start < b and end > a for a, b in spans) for start, end in encoding.offsets]
    return ChatTokens(encoding.ids, mask)


def encode_prompt_completion(
    tokenizer: Tokenizer, prompt: Sequence[Mapping], completion: Sequence[Mapping]
) -> tuple[list[int], list[int]]:
    """TRL's conversational prompt/completion records (DPO's and the reward model's ``prompt`` with its
    ``chosen`` or ``rejected`` messages): the ids of the prompt as generation sees it (ending in the generation
    prompt, e.g. ``<|im_start|>assistant\n``) and those of the completion after it, through its end-of-turn
    token. Each text is tokenized on its own, as TRL does, so the prompt's ids are exactly what a rollout
    starts from."""
    template = _template_of(tokenizer)
    prompt, completion = check_messages(prompt), check_messages(completion)
    if not completion:
        raise ValueError(
            "A conversational completion (chosen/rejected) is empty; give it its assistant message"
        )
    messages = [*prompt, *completion]
    start, end, text = _added_span(template, messages, len(prompt), len(messages), tokenizer.special_tokens)
    return tokenizer.encode(text[:start]), tokenizer.encode(text[start:end])


def _assistant_spans_by_prefixes(
    template: str, messages: list[dict], special_tokens: Mapping[str, str], text: str
) -> list[tuple[int, int]]:
    """Without ``{% generation %}`` blocks (most Hub templates), an assistant turn is what its message adds
    to the text (:func:`_added_span`)."""
    spans = []
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            start, end, through = _added_span(template, messages, i, i + 1, special_tokens)
            if not text.startswith(through):
                raise _not_a_prefix(i + 1)
            spans.append((start, end))
    return spans


def _added_span(
    template: str, messages: list[dict], start: int, stop: int, special_tokens: Mapping[str, str]
) -> tuple[int, int, str]:
    """The characters ``messages[start:stop]`` add, found as TRL's ``apply_chat_template`` splits a
    conversational prompt from its completion: the rendering of ``messages[:stop]`` minus that of the messages
    before with the generation prompt (the turn's header), less trailing whitespace (ChatML's newline after
    ``<|im_end|>``, which generation never produces: it stops at the end-of-turn token); and that rendering.
    This needs the template to render a prefix of the conversation as a prefix of the whole, which is checked."""
    before = render(template, messages[:start], special_tokens, add_generation_prompt=True)
    through = render(template, messages[:stop], special_tokens)
    if not through.startswith(before):
        raise _not_a_prefix(stop)
    return len(before), len(through.rstrip()), through


def _not_a_prefix(n: int) -> ValueError:
    return ValueError(
        f"The chat_template does not render the first {n} messages of this conversation as a prefix of the whole "
        "(templates that rewrite earlier turns, e.g. dropping past reasoning, do not), so the text a turn adds "
        "cannot be told apart; use a template that only appends turns (for SFT, one that wraps assistant content "
        "in {% generation %} ... {% endgeneration %} also does, as TRL's assistant_only_loss requires)"
    )


def turn_end_token(template: str, special_tokens: Mapping[str, str], backend: HFTokenizer) -> str | None:
    """The special token the template closes an assistant turn with (Llama-3's ``<|eot_id|>``, ChatML's
    ``<|im_end|>``, Mistral's ``</s>``): the first token after the content of a probe assistant message, when
    it is a special one. None when the template renders no such token (or refuses the probe)."""
    probe = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _SENTINEL}]
    try:
        text = render(template, probe, special_tokens)
    except ValueError:
        return None
    _, found, after = text.partition(_SENTINEL)
    ids = backend.encode(after, add_special_tokens=False).ids if found else []
    added = backend.get_added_tokens_decoder()
    if ids and ids[0] in added and added[ids[0]].special:
        return added[ids[0]].content
    return None
