"""Tokenizers built on HF ``tokenizers``: byte-level BPE or characters, with configurable special tokens.

Both kinds are a ``tokenizers.Tokenizer`` underneath, so one JSON file saves and reloads either. Which
special token plays which role (pad, bos, eos, unk; BERT adds cls, sep, mask) travels with it in
:meth:`Tokenizer.state`, the form checkpoints store.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import torch
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

log = logging.getLogger(__name__)

# role -> token string; GPT-style defaults. PAD != BOS != EOS so padding is never mistaken for a stop.
# Byte-level BPE encodes every byte, so only the char tokenizer adds UNK_TOKEN for unseen characters.
SPECIAL_TOKENS = {"pad": "<|pad|>", "bos": "<|bos|>", "eos": "<|endoftext|>"}
UNK_TOKEN = "<|unk|>"
KINDS = ("bpe", "char")


class Tokenizer:
    """Thin wrapper over a ``tokenizers.Tokenizer`` exposing the special-token ids tasks need by role."""

    def __init__(self, backend: HFTokenizer, special_tokens: Mapping[str, str] = SPECIAL_TOKENS):
        self.backend = backend
        self.special_tokens = dict(special_tokens)
        self.ids = {role: backend.token_to_id(token) for role, token in self.special_tokens.items()}
        absent = [self.special_tokens[role] for role, i in self.ids.items() if i is None]
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

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        kind: str = "bpe",
        vocab_size: int = 4096,
        special_tokens: Mapping[str, str] = SPECIAL_TOKENS,
    ) -> Tokenizer:
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
        special_tokens: Mapping[str, str] = SPECIAL_TOKENS,
    ) -> Tokenizer:
        """Load the tokenizer cached at ``path``, or train it on ``texts()`` and cache it atomically (a
        concurrent reader never sees half a file). Call it on one rank first (``prepare_data``), then on
        every rank, which then only loads."""
        path = Path(path)
        if path.exists():
            return cls.from_file(path, special_tokens)
        tokenizer = cls.train(texts(), kind, vocab_size, special_tokens)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tokenizer.save(tmp)
        tmp.replace(path)
        log.info("Trained %s tokenizer (%d tokens) -> %s", kind, tokenizer.vocab_size, path)
        return tokenizer

    @classmethod
    def from_file(cls, path: str | Path, special_tokens: Mapping[str, str] = SPECIAL_TOKENS) -> Tokenizer:
        """A ``tokenizer.json``, or a ``.ckpt`` written by train.py (the tokenizer it was trained with)."""
        path = Path(path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"Tokenizer file {path} not found; pass a tokenizer.json or a .ckpt")
        if path.suffix == ".ckpt":
            return cls.from_checkpoint(path)
        return cls(HFTokenizer.from_file(str(path)), special_tokens)

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> Tokenizer:
        """The tokenizer stored in a checkpoint's hyperparameters by a text task."""
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        state = checkpoint.get("hyper_parameters", {}).get("tokenizer")
        if state is None:
            raise ValueError(f"{path} carries no tokenizer; it was not written by a text task")
        return cls.from_state(state)

    def state(self) -> dict:
        """Plain-data form (JSON string + special-token roles) that checkpoints store."""
        return {"json": self.backend.to_str(), "special_tokens": dict(self.special_tokens)}

    @classmethod
    def from_state(cls, state: Mapping) -> Tokenizer:
        return cls(HFTokenizer.from_str(state["json"]), state["special_tokens"])

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(path))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and self.state() == other.state()

    # ---- use ---------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
