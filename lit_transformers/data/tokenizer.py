"""Tokenizers built on HF ``tokenizers``: byte-level BPE or characters, with distinct PAD/BOS/EOS ids.

Both kinds are a ``tokenizers.Tokenizer`` underneath, so one JSON file saves and reloads either.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

PAD, BOS, EOS, UNK = "<|pad|>", "<|bos|>", "<|endoftext|>", "<|unk|>"
KINDS = ("bpe", "char")


class Tokenizer:
    """Thin wrapper exposing the ids our tasks need (``pad_id`` != ``eos_id`` by construction)."""

    def __init__(self, backend: HFTokenizer):
        self.backend = backend
        ids = {token: backend.token_to_id(token) for token in (PAD, BOS, EOS)}
        if any(i is None for i in ids.values()):
            raise ValueError(f"Tokenizer lacks special tokens {[t for t, i in ids.items() if i is None]}")
        self.pad_id, self.bos_id, self.eos_id = ids[PAD], ids[BOS], ids[EOS]

    @classmethod
    def train(cls, texts: Iterable[str], kind: str = "bpe", vocab_size: int = 4096) -> Tokenizer:
        if kind == "bpe":
            backend = HFTokenizer(models.BPE())
            backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            backend.decoder = decoders.ByteLevel()
            trainer = trainers.BpeTrainer(
                vocab_size=vocab_size,
                special_tokens=[PAD, BOS, EOS],
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: no <unk>
                show_progress=False,
            )
            backend.train_from_iterator(texts, trainer=trainer)
        elif kind == "char":
            chars = sorted(set().union(*(set(t) for t in texts)))
            vocab = {token: i for i, token in enumerate([PAD, BOS, EOS, UNK, *chars])}
            backend = HFTokenizer(models.WordLevel(vocab, unk_token=UNK))
            backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
            backend.decoder = decoders.Fuse()  # join characters without spaces
            backend.add_special_tokens([PAD, BOS, EOS, UNK])  # so decode(skip_special_tokens=True) drops them
        else:
            raise ValueError(f"Unknown tokenizer kind {kind!r}; choose one of {KINDS}")
        return cls(backend)

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        return cls(HFTokenizer.from_file(str(path)))

    @classmethod
    def from_str(cls, json_str: str) -> Tokenizer:
        return cls(HFTokenizer.from_str(json_str))

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(path))

    def to_str(self) -> str:
        return self.backend.to_str()

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
