"""Tokenizers as the Hub saves them: directories written by ``transformers``' ``save_pretrained`` (tiny
``tokenizers`` models wrapped in ``PreTrainedTokenizerFast``) load with their special tokens, chat template and
end-of-turn ids, encode like ``transformers`` and render conversations as ``apply_chat_template`` does."""

import logging

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from lit_transformers.text import IGNORE_INDEX, Tokenizer, encode_chat, encode_prompt_completion, render_chat

from conftest import assert_user_error

transformers = pytest.importorskip("transformers")

TEXTS = [
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog.",
    "Hello, how are you today? I am fine, thank you.",
    "Tell me a joke about tokenizers and padding.",
] * 10
LLAMA3 = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CHATML = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Meta-Llama-3-8B-Instruct's chat_template, verbatim
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# Qwen2-Instruct's (ChatML, a default system message), verbatim
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)
# the same two formats with their assistant text in {% generation %} blocks (as TRL's training templates do)
LLAMA3_GENERATION = (
    "{% for message in messages %}{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}{{ '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n' }}{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}{% else %}{{ message['content'] | trim + "
    "'<|eot_id|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
CHATML_GENERATION = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n' }}{% endif %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\n' }}{% else %}{{ message['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello, how are you today?"},
    {"role": "assistant", "content": "I am fine, thank you."},
    {"role": "user", "content": "Tell me a joke about tokenizers."},
    {"role": "assistant", "content": "A man is eating padding."},
]


def _bpe(specials: list[str]) -> HFTokenizer:
    backend = HFTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(TEXTS, trainer=trainer)
    return backend


def _save(directory, backend: HFTokenizer, stop_tokens=(), save_jinja_files=True, **tokens):
    """``directory`` written by transformers: the tokenizer (its special tokens and chat template as ``tokens``)
    and, given ``stop_tokens``, a generation_config.json stopping at them."""
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **tokens)
    hf.save_pretrained(str(directory), save_jinja_files=save_jinja_files)
    if stop_tokens:
        ids = [hf.convert_tokens_to_ids(t) for t in stop_tokens]
        transformers.GenerationConfig(eos_token_id=ids).save_pretrained(str(directory))
    return transformers.AutoTokenizer.from_pretrained(str(directory))


def _llama3_backend() -> HFTokenizer:
    """Llama-3's special tokens, and a post-processor adding BOS (which transformers applies by default)."""
    backend = _bpe(LLAMA3)
    backend.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)]
    )
    return backend


def _llama3(directory, template=LLAMA3_TEMPLATE, **options):
    """A Llama-3-Instruct-style directory: BOS added by a post-processor, EOS <|eot_id|>, no pad token, and a
    generation config stopping at <|end_of_text|> and <|eot_id|>."""
    stops = ["<|end_of_text|>", "<|eot_id|>"]
    return _save(
        directory,
        _llama3_backend(),
        stops,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        chat_template=template,
        **options,
    )


def _chatml(directory, template=CHATML_TEMPLATE, eos="<|im_end|>", **options):
    """A Qwen2-style directory: no BOS, pad <|endoftext|>, ChatML template."""
    return _save(
        directory, _bpe(CHATML), eos_token=eos, pad_token="<|endoftext|>", chat_template=template, **options
    )


# ---- tokenizer.json as saved ---------------------------------------------------------------------


def _bert_wordpiece() -> HFTokenizer:
    return Tokenizer.train(TEXTS, kind="wordpiece", vocab_size=200, lowercase=True).backend


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_a_tokenizer_json_saved_with_padding_and_truncation_encodes_like_transformers(tmp_path, family):
    """sentence-transformers ship tokenizer.json with padding to 128 on: encode must give the text's ids only."""
    backend = _bert_wordpiece() if family == "bert" else _llama3_backend()
    pad = "[PAD]" if family == "bert" else "<|end_of_text|>"
    backend.enable_padding(pad_id=backend.token_to_id(pad), pad_token=pad, length=128)
    backend.enable_truncation(max_length=4)
    roles = (
        dict(pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
        if family == "bert"
        else dict(bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
    )
    hf = _save(tmp_path, backend, **roles)
    assert HFTokenizer.from_file(str(tmp_path / "tokenizer.json")).padding["length"] == 128  # saved padded
    text = "A man is eating food. The quick brown fox."
    expected = hf(text, add_special_tokens=False)["input_ids"]
    assert len(expected) > 4 and hf.pad_token_id not in expected
    for path in (tmp_path, tmp_path / "tokenizer.json"):
        ours = Tokenizer.from_file(path)
        assert ours.encode(text) == expected
        assert ours.encode_batch([text, "A man"]) == [
            expected,
            hf("A man", add_special_tokens=False)["input_ids"],
        ]
    if family == "llama":  # transformers adds BOS by default, ours never: hence add_special_tokens=False
        assert hf(text)["input_ids"] == [ours.bos_id, *expected]
    else:
        assert ours.special_tokens == {
            "pad": "[PAD]",
            "unk": "[UNK]",
            "cls": "[CLS]",
            "sep": "[SEP]",
            "mask": "[MASK]",
        }


# ---- special tokens, end of turn, padding --------------------------------------------------------


@pytest.mark.parametrize(
    "save_jinja_files", [True, False], ids=["chat_template.jinja", "in tokenizer_config"]
)
def test_special_tokens_and_end_of_turn_ids_come_from_the_saved_directory(tmp_path, save_jinja_files):
    hf = _llama3(tmp_path / "llama", save_jinja_files=save_jinja_files)
    ours = Tokenizer.from_file(tmp_path / "llama")
    assert (ours.bos_id, ours.eos_id) == (hf.bos_token_id, hf.eos_token_id)
    assert ours.chat_template == hf.chat_template == LLAMA3_TEMPLATE
    stops = transformers.GenerationConfig.from_pretrained(str(tmp_path / "llama")).eos_token_id
    assert sorted(ours.end_of_turn_ids) == sorted({hf.eos_token_id, *stops})
    assert ours.decode([*ours.encode("A man"), *ours.end_of_turn_ids]) == "A man"  # all special

    hf = _chatml(tmp_path / "qwen", save_jinja_files=save_jinja_files)
    ours = Tokenizer.from_file(tmp_path / "qwen")
    assert (ours.pad_id, ours.eos_id) == (hf.pad_token_id, hf.eos_token_id)
    assert "bos" not in ours.special_tokens and hf.bos_token is None
    assert ours.end_of_turn_ids == [hf.convert_tokens_to_ids("<|im_end|>")]


@pytest.mark.parametrize(
    "save_jinja_files", [True, False], ids=["chat_template.jinja", "in tokenizer_config"]
)
def test_of_several_named_chat_templates_the_default_one_is_used(tmp_path, save_jinja_files):
    templates = {"default": CHATML_TEMPLATE, "tool_use": "{{ raise_exception('tools') }}"}
    hf = _chatml(tmp_path, template=templates, save_jinja_files=save_jinja_files)
    assert hf.chat_template == templates
    assert Tokenizer.from_file(tmp_path).chat_template == CHATML_TEMPLATE


def test_a_base_models_end_of_turn_comes_from_its_chat_template(tmp_path):
    """A base Qwen2 tokenizer's EOS is <|endoftext|>, yet its template ends assistant turns with <|im_end|>:
    generation after SFT on that template must stop at either."""
    hf = _chatml(tmp_path, eos="<|endoftext|>")
    ours = Tokenizer.from_file(tmp_path)
    assert ours.end_of_turn_ids == [hf.eos_token_id, hf.convert_tokens_to_ids("<|im_end|>")]


def test_without_a_pad_token_padding_uses_eos_and_the_log_says_so(tmp_path, caplog):
    hf = _llama3(tmp_path)
    assert hf.pad_token is None
    with caplog.at_level(logging.INFO, logger="lit_transformers"):
        ours = Tokenizer.from_file(tmp_path)
    assert ours.pad_id == ours.eos_id == hf.eos_token_id
    assert "names no pad token: padding with its EOS '<|eot_id|>'" in caplog.text


# ---- chat templates ------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama3", "chatml"])
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_rendered_conversations_equal_transformers_apply_chat_template(
    tmp_path, family, add_generation_prompt
):
    hf = (_llama3 if family == "llama3" else _chatml)(tmp_path)
    ours = Tokenizer.from_file(tmp_path)
    for messages in (CONVERSATION, CONVERSATION[1:3], CONVERSATION[:4]):
        options = dict(add_generation_prompt=add_generation_prompt)
        text = hf.apply_chat_template(messages, tokenize=False, **options)
        assert render_chat(ours, messages, **options) == text
        ids = hf.apply_chat_template(messages, tokenize=True, return_dict=True, **options)["input_ids"]
        assert encode_chat(ours, messages, **options).ids == ids


@pytest.mark.parametrize(
    "family, template, generation_template, end",
    [
        ("llama3", LLAMA3_TEMPLATE, LLAMA3_GENERATION, "<|eot_id|>"),
        ("chatml", CHATML_TEMPLATE, CHATML_GENERATION, "<|im_end|>"),
    ],
    ids=["llama3", "chatml"],
)
def test_assistant_only_labels_cover_exactly_the_assistant_turns(
    tmp_path, family, template, generation_template, end
):
    """Against transformers' assistant mask of the {% generation %} variant of the same template (which renders
    the same text): our mask from the generation blocks, and our mask of the Hub template found by prefixes."""
    build = _llama3 if family == "llama3" else _chatml
    hf = build(tmp_path / "generation", template=generation_template)
    reference = hf.apply_chat_template(CONVERSATION, return_dict=True, return_assistant_tokens_mask=True)
    assert hf.apply_chat_template(
        CONVERSATION, tokenize=False, chat_template=template
    ) == hf.apply_chat_template(CONVERSATION, tokenize=False)
    expected = [bool(m) for m in reference["assistant_masks"]]
    assert sum(expected) > 0
    build(tmp_path / "hub", template=template)
    for directory in ("generation", "hub"):
        chat = encode_chat(Tokenizer.from_file(tmp_path / directory), CONVERSATION)
        assert chat.ids == reference["input_ids"]
        assert chat.assistant_mask == expected, directory
        assert chat.labels == [i if m else IGNORE_INDEX for i, m in zip(chat.ids, expected)]
    ours = Tokenizer.from_file(tmp_path / "hub")
    trained = ours.decode([i for i in chat.labels if i != IGNORE_INDEX], skip_special_tokens=False)
    assert trained == f"I am fine, thank you.{end}A man is eating padding.{end}"


@pytest.mark.parametrize("family", ["llama3", "chatml"])
def test_a_conversational_prompt_and_completion_split_where_generation_starts(tmp_path, family):
    """DPO's and the reward model's records: the prompt's ids are transformers' with the generation prompt, the
    completion's follow them in the whole conversation's ids, through the end-of-turn token."""
    hf = (_llama3 if family == "llama3" else _chatml)(tmp_path)
    ours = Tokenizer.from_file(tmp_path)
    prompt, completion = CONVERSATION[:4], CONVERSATION[4:]
    prompt_ids, completion_ids = encode_prompt_completion(ours, prompt, completion)
    assert (
        prompt_ids
        == hf.apply_chat_template(prompt, add_generation_prompt=True, return_dict=True)["input_ids"]
    )
    whole = hf.apply_chat_template(CONVERSATION, return_dict=True)["input_ids"]
    assert whole[: len(prompt_ids) + len(completion_ids)] == prompt_ids + completion_ids
    assert (
        hf.decode(whole[len(prompt_ids) + len(completion_ids) :]).strip() == ""
    )  # ChatML's newline after the turn
    end = "<|eot_id|>" if family == "llama3" else "<|im_end|>"
    assert ours.decode(completion_ids, skip_special_tokens=False) == f"A man is eating padding.{end}"


# ---- refusals ------------------------------------------------------------------------------------


def test_bad_conversations_are_refused_naming_the_fix(tmp_path):
    _chatml(tmp_path)
    ours = Tokenizer.from_file(tmp_path)
    unknown_role = [{"role": "user", "content": "hi"}, {"role": "gpt", "content": "hello"}]
    assert_user_error(
        lambda: render_chat(ours, unknown_role), "role 'gpt'", "system, user, assistant, tool", "Rename"
    )
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert_user_error(lambda: encode_chat(ours, parts), "content of type list", "join a list of text parts")
    assert_user_error(
        lambda: encode_chat(ours, [{"role": "user"}]), "a mapping with a 'role' and a 'content' key"
    )
    plain = Tokenizer.train(TEXTS, vocab_size=300)
    assert_user_error(lambda: encode_chat(plain, CONVERSATION), "no chat_template", "set data.tokenizer_path")


def test_a_template_that_rewrites_earlier_turns_needs_generation_blocks_for_assistant_labels(tmp_path):
    counting = (
        "{{ messages | length }}{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    )
    _chatml(tmp_path, template=counting)
    ours = Tokenizer.from_file(tmp_path)
    with pytest.raises(
        ValueError, match="does not render the first 3 messages.*prefix of the whole.*generation"
    ):
        encode_chat(ours, CONVERSATION)
    with pytest.raises(ValueError, match="does not render the first 5 messages"):
        encode_prompt_completion(ours, CONVERSATION[:4], CONVERSATION[4:])


def test_a_template_that_raises_is_reported_with_its_message(tmp_path):
    strict = "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{{ m['content'] }}{% endfor %}"
    _chatml(tmp_path, template=strict)
    with pytest.raises(ValueError, match="chat_template refused the conversation: System role not supported"):
        render_chat(Tokenizer.from_file(tmp_path), CONVERSATION)


# ---- checkpoints ---------------------------------------------------------------------------------


def test_a_checkpoints_tokenizer_keeps_its_chat_template_and_end_of_turn_ids(tmp_path):
    _llama3(tmp_path / "hf")
    tokenizer = Tokenizer.from_file(tmp_path / "hf")
    torch.save({"hyper_parameters": {"tokenizer": tokenizer.state()}}, tmp_path / "last.ckpt")
    reloaded = Tokenizer.from_file(tmp_path / "last.ckpt")
    assert reloaded == tokenizer
    assert reloaded.chat_template == LLAMA3_TEMPLATE and reloaded.end_of_turn_ids == tokenizer.end_of_turn_ids
    assert encode_chat(reloaded, CONVERSATION) == encode_chat(tokenizer, CONVERSATION)


def test_a_state_written_before_chat_templates_still_loads():
    tokenizer = Tokenizer.train(TEXTS, vocab_size=300)
    old = {"json": tokenizer.backend.to_str(), "special_tokens": dict(tokenizer.special_tokens)}
    reloaded = Tokenizer.from_state(old)
    assert reloaded == tokenizer
    padded = HFTokenizer.from_str(old["json"])
    padded.enable_padding(pad_id=tokenizer.pad_id, pad_token="<|pad|>", length=64)  # a Hub file's, trained on
    assert Tokenizer.from_state({**old, "json": padded.to_str()}).encode("A man") == tokenizer.encode("A man")
    assert reloaded.chat_template is None and reloaded.end_of_turn_ids == [tokenizer.eos_id]


@pytest.mark.parametrize("source", ["hub", "trained"])
def test_save_pretrained_writes_a_directory_transformers_loads(tmp_path, source):
    if source == "hub":
        original = _llama3(tmp_path / "hub")
        ours = Tokenizer.from_file(tmp_path / "hub")
    else:
        ours = Tokenizer.train(TEXTS, vocab_size=300)
    ours.save_pretrained(tmp_path / "export")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "export"))
    text = "A man is eating food."
    assert hf(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id) == (ours.pad_id, ours.bos_id, ours.eos_id)
    reloaded = Tokenizer.from_file(tmp_path / "export")
    assert (reloaded.special_tokens, reloaded.chat_template) == (ours.special_tokens, ours.chat_template)
    if source == "hub":
        options = dict(add_generation_prompt=True, return_dict=True)
        assert hf.apply_chat_template(CONVERSATION, **options) == original.apply_chat_template(
            CONVERSATION, **options
        )
    else:
        assert reloaded == ours
