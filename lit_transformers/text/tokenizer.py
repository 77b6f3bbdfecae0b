"""Tokenizers built on HF ``tokenizers``: byte-level BPE, characters or WordPiece (BERT), with configurable
special tokens.

Every kind is a ``tokenizers.Tokenizer`` underneath, so one JSON file saves and reloads any of them. Which
special token plays which role (pad, bos, eos, unk; BERT adds cls, sep, mask) travels with it in
:meth:`Tokenizer.state`, the form checkpoints store.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import torch
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from lit_transformers.text.hub import read_hub_files, write_hub_files

log = logging.getLogger(__name__)

# role -> token string; GPT-style defaults. PAD != BOS != EOS so padding is never mistaken for a stop.
# Byte-level BPE encodes every byte, so only the char tokenizer adds UNK_TOKEN for unseen characters.
SPECIAL_TOKENS = {"pad": "<|pad|>", "bos": "<|bos|>", "eos": "<|endoftext|>"}
UNK_TOKEN = "<|unk|>"
# BERT's roles and strings, the default of kind="wordpiece" (and of vocab.txt files)
BERT_SPECIAL_TOKENS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
# Marian / OPUS-MT's: the decoder starts from the pad token, so BOS is "<pad>" too
MARIAN_SPECIAL_TOKENS = {"pad": "<pad>", "bos": "<pad>", "eos": "</s>", "unk": "<unk>"}
KINDS = ("bpe", "char", "wordpiece")
# Hub tokenizer classes whose texts start with BOS: CLIP's text tower reads <|startoftext|> caption <|endoftext|>
BOS_FIRST = ("CLIPTokenizer", "CLIPTokenizerFast")


class Tokenizer:
    """Thin wrapper over a ``tokenizers.Tokenizer`` exposing the special-token ids tasks need by role."""

    def __init__(
        self,
        backend: HFTokenizer,
        special_tokens: Mapping[str, str] = SPECIAL_TOKENS,
        chat_template: str | None = None,
        end_of_turn: Sequence[str] | None = None,
        add_bos: bool = False,
    ):
        """``chat_template``: the Jinja template conversations are rendered with (:mod:`.chat`);
        ``end_of_turn``: the tokens generation may stop at, by default EOS alone; ``add_bos``: :meth:`encode`
        starts every text with BOS (CLIP's tokenizer, :data:`BOS_FIRST`)."""
        backend.no_padding()  # our collators pad: a file's own fixed-length padding would pad every encode
        backend.no_truncation()
        self.backend = backend
        self.special_tokens = dict(special_tokens)
        self.chat_template = chat_template
        self.add_bos = add_bos
        eos = [self.special_tokens["eos"]] if "eos" in self.special_tokens else []
        self.end_of_turn = list(dict.fromkeys(eos if end_of_turn is None else end_of_turn))
        self.ids = {role: backend.token_to_id(token) for role, token in self.special_tokens.items()}
        absent = [self.special_tokens[role] for role, i in self.ids.items() if i is None]
        absent += [token for token in self.end_of_turn if backend.token_to_id(token) is None]
        if absent:
            raise ValueError(f"Tokenizer lacks special tokens {absent}; train it with these special_tokens")

    def special_id(self, role: str) -> int:
        if role not in self.ids:
            raise ValueError(f"This tokenizer has no {role!r} token (it has {sorted(self.ids)})")
        return self.ids[role]

    @property
    def pad_id(self) -> int:
        return self.special_id("pad")

    @property
    def bos_id(self) -> int:
        return self.special_id("bos")

    @property
    def eos_id(self) -> int:
        return self.special_id("eos")

    @property
    def end_of_turn_ids(self) -> list[int]:
        """The ids that end a turn (EOS, the model's other stop ids, its chat template's turn end, e.g.
        Llama-3's ``<|end_of_text|>`` and ``<|eot_id|>``): generation may stop at any of them."""
        return [self.backend.token_to_id(token) for token in self.end_of_turn]

    def id_to_token(self, i: int) -> str | None:
        return self.backend.id_to_token(i)

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        kind: str = "bpe",
        vocab_size: int = 4096,
        special_tokens: Mapping[str, str] | None = None,
        lowercase: bool = False,
    ) -> Tokenizer:
        """``special_tokens`` default to BERT's for wordpiece and GPT's otherwise; ``lowercase`` (wordpiece
        only) also strips accents, as BERT's uncased models do."""
        if special_tokens is None:
            special_tokens = BERT_SPECIAL_TOKENS if kind == "wordpiece" else SPECIAL_TOKENS
        if kind == "char":
            special_tokens = {**special_tokens, "unk": special_tokens.get("unk", UNK_TOKEN)}
        specials = list(special_tokens.values())
        if kind == "bpe":
            backend = HFTokenizer(models.BPE())
            backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            backend.decoder = decoders.ByteLevel()
            trainer = trainers.BpeTrainer(
                vocab_size=vocab_size,
                special_tokens=specials,
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: no unknowns
                show_progress=False,
            )
            backend.train_from_iterator(texts, trainer=trainer)
        elif kind == "char":
            chars = sorted(set().union(*(set(t) for t in texts)) - set(specials))
            vocab = {token: i for i, token in enumerate([*specials, *chars])}
            backend = HFTokenizer(models.WordLevel(vocab, unk_token=special_tokens["unk"]))
            backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
            backend.decoder = decoders.Fuse()  # join characters without spaces
            backend.add_special_tokens(specials)  # so decode(skip_special_tokens=True) drops them
        elif kind == "wordpiece":
            if "unk" not in special_tokens:
                raise ValueError("A WordPiece tokenizer needs an 'unk' special token")
            backend = HFTokenizer(models.WordPiece(unk_token=special_tokens["unk"]))
            _bert_pipeline(backend, lowercase)
            trainer = trainers.WordPieceTrainer(
                vocab_size=vocab_size, special_tokens=specials, show_progress=False
            )
            backend.train_from_iterator(texts, trainer=trainer)
        else:
            raise ValueError(f"Unknown tokenizer kind {kind!r}; choose one of {KINDS}")
        return cls(backend, special_tokens)

    @classmethod
    def load_or_train(
        cls,
        path: str | Path,
        texts: Callable[[], Iterable[str]],
        kind: str = "bpe",
        vocab_size: int = 4096,
        special_tokens: Mapping[str, str] | None = None,
        lowercase: bool = False,
    ) -> Tokenizer:
        """Load the tokenizer cached at ``path``, or train it on ``texts()`` and cache it atomically (a
        concurrent reader never sees half a file). Call it on one rank first (``prepare_data``), then on
        every rank, which then only loads."""
        path = Path(path)
        if special_tokens is None:
            special_tokens = BERT_SPECIAL_TOKENS if kind == "wordpiece" else SPECIAL_TOKENS
        if path.exists():
            return cls.from_file(path, special_tokens)
        tokenizer = cls.train(texts(), kind, vocab_size, special_tokens, lowercase)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tokenizer.save(tmp)
        tmp.replace(path)
        log.info("Trained %s tokenizer (%d tokens) -> %s", kind, tokenizer.vocab_size, path)
        return tokenizer

    @classmethod
    def for_data(
        cls,
        tokenizer_path: str | None,
        cache_dir: str | Path,
        identity: Callable[[], object],
        texts: Callable[[], Iterable[str]],
        kind: str,
        vocab_size: int,
        lowercase: bool = False,
    ) -> Tokenizer:
        """A datamodule's tokenizer: the file at ``tokenizer_path`` when one is given, else
        :meth:`load_or_train` on ``texts()``, cached under ``cache_dir`` by a hash of ``identity()`` (what
        changes the training texts: the data, the split, the seed), ``kind``, ``vocab_size`` and
        ``lowercase``. Both are callables so that a given ``tokenizer_path`` reads no data."""
        if tokenizer_path:
            return cls.from_file(tokenizer_path)
        key = json.dumps([identity(), kind, vocab_size, lowercase], default=str)
        name = f"{kind}-{vocab_size}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"
        cache = Path(cache_dir).expanduser() / "tokenizers" / name
        return cls.load_or_train(cache, texts, kind, vocab_size, lowercase=lowercase)

    @classmethod
    def from_file(
        cls,
        path: str | Path,
        special_tokens: Mapping[str, str] | None = None,
        checkpoint_key: str = "tokenizer",
    ) -> Tokenizer:
        """A ``tokenizer.json``, a ``.ckpt`` written by train.py (the tokenizer it was trained with, its
        ``checkpoint_key`` one: see :meth:`from_checkpoint`), a BERT ``vocab.txt``, or a Hugging Face checkpoint
        directory holding either file. The file's own padding and truncation are switched off (our collators
        pad). A Hugging Face directory's ``tokenizer_config.json`` (see :mod:`.hub`) gives the special tokens,
        the chat template and, with ``generation_config.json``, the end-of-turn tokens; without a pad token,
        it pads with EOS (TRL's rule: padding is masked by the attention mask, never by its id, so a real EOS
        stays a label). Without such a config ``special_tokens`` default to GPT's roles, or those of the first
        of BERT and Marian whose tokens the file has all of (always BERT's for vocab.txt)."""
        path = Path(path).expanduser()
        if path.is_dir():
            found = [path / name for name in ("tokenizer.json", "vocab.txt") if (path / name).is_file()]
            if not found:
                raise FileNotFoundError(f"No tokenizer.json or vocab.txt in {path}; pass a tokenizer file")
            path = found[0]
        if not path.is_file():
            raise FileNotFoundError(
                f"Tokenizer file {path} not found; pass a tokenizer.json, vocab.txt or .ckpt"
            )
        if path.suffix == ".ckpt":
            return cls.from_checkpoint(path, checkpoint_key)
        hub = read_hub_files(path.parent)
        if path.suffix == ".txt":  # BERT vocab.txt: one WordPiece token per line
            backend = HFTokenizer(models.WordPiece.from_file(str(path), unk_token="[UNK]"))
            _bert_pipeline(backend, hub.do_lower_case)
            guessed = BERT_SPECIAL_TOKENS
        else:
            backend = HFTokenizer.from_file(str(path))
            has = lambda tokens: all(backend.token_to_id(t) is not None for t in tokens.values())  # noqa: E731
            guessed = next(
                (
                    roles
                    for roles in (SPECIAL_TOKENS, BERT_SPECIAL_TOKENS, MARIAN_SPECIAL_TOKENS)
                    if has(roles)
                ),
                SPECIAL_TOKENS,
            )
        roles, end_of_turn = hub.special_tokens(backend, special_tokens, guessed)
        return cls(backend, roles, hub.chat_template, end_of_turn, hub.tokenizer_class in BOS_FIRST)

    @classmethod
    def from_checkpoint(cls, path: str | Path, key: str = "tokenizer") -> Tokenizer:
        """The tokenizer stored in a checkpoint's hyperparameters by a text task: its ``key`` one (a
        translation's ``source_tokenizer`` when its source side has its own), else its ``tokenizer``."""
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        saved = checkpoint.get("hyper_parameters", {})
        state = saved.get(key) or saved.get("tokenizer")
        if state is None:
            raise ValueError(f"{path} carries no tokenizer; it was not written by a text task")
        return cls.from_state(state)

    def state(self) -> dict:
        """Plain-data form (JSON string, special-token roles, chat template, end-of-turn tokens, whether texts
        start with BOS) that checkpoints store."""
        return {
            "json": self.backend.to_str(),
            "special_tokens": dict(self.special_tokens),
            "chat_template": self.chat_template,
            "end_of_turn": list(self.end_of_turn),
            "add_bos": self.add_bos,
        }

    @classmethod
    def from_state(cls, state: Mapping) -> Tokenizer:
        """Also a state written before chat templates (JSON and roles only): no template, EOS ends a turn, no
        BOS first."""
        return cls(
            HFTokenizer.from_str(state["json"]),
            state["special_tokens"],
            state.get("chat_template"),
            state.get("end_of_turn"),
            state.get("add_bos", False),
        )

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(path))

    def save_pretrained(self, directory: str | Path) -> None:
        """A Hugging Face tokenizer directory (:func:`.hub.write_hub_files`): what a ``to_hf`` export ships."""
        tokenizer_class = BOS_FIRST[0] if self.add_bos else "PreTrainedTokenizerFast"
        write_hub_files(
            Path(directory), self.backend, self.special_tokens, self.chat_template, tokenizer_class
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and self.state() == other.state()

    # ---- use ---------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids without EOS (the collators end sequences), with BOS first when ``add_bos``."""
        first = [self.bos_id] if self.add_bos else []
        return [first + e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)


def _bert_pipeline(backend: HFTokenizer, lowercase: bool) -> None:
    """BERT's text handling around a WordPiece model: clean text, split CJK characters, optionally lowercase
    and strip accents, split on whitespace and punctuation; decoding joins ``##`` continuations."""
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
