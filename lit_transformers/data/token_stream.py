"""The token stream of a causal-LM split: its documents, each between BOS and EOS, one after the other. Built in
memory for small corpora, or written once to token shards on disk (``lit-prepare``) and read back with constant
memory.

On disk: per split, raw token files ``<split>-<k>.bin`` (numpy ``uint16`` when the vocabulary fits, else
``uint32``); ``index.json`` lists them with their token counts, beside the ``tokenizer.json`` that wrote them. It is
the layout of nanoGPT's ``train.bin`` and Megatron-LM's indexed datasets (``numpy.memmap`` reads any of them). Windows
are read with one positioned read (``os.pread``) each, not through a memmap: a memmap's pages count in the process's
resident memory once touched, and the kernel maps tens of KB around each page fault, so random windows over a large
corpus would grow the resident set with the corpus; pread'd pages stay in the page cache, shared and reclaimable.

Why not litdata's ``optimize`` + ``TokensLoader`` (litdata installs here): its ``StreamingDataset`` is an iterable
dataset that shuffles, splits the data across ranks and workers and resumes through its own state, while training
here resumes exactly through torchdata's ``StatefulDataLoader`` and our ``ResumableSampler`` (``data/loaders.py``),
which need a map-style dataset. Windows over the shards are one: the sampler gives each DDP rank a disjoint
part of every epoch, dataloader workers split a rank's batches, and resuming is the sampler's position, exactly as for
the in-memory windows. litdata would also add boto3, torchvision and obstore to a project that reads local files.
"""

from __future__ import annotations

import bisect
import json
import logging
import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lit_transformers.text import Tokenizer

log = logging.getLogger(__name__)

INDEX = "index.json"
TOKENIZER = "tokenizer.json"
# the text one worker turns into one shard: large enough to amortise a task, small enough to share the corpus evenly
# among the workers
SHARD_CHARS = 8_000_000
# the text encoded at once: tokenizers' encodings take ~100 bytes per token, so a worker encodes a shard in parts
ENCODE_CHARS = 1_000_000


def document_tokens(tokenizer: Tokenizer, texts: Sequence[str]) -> list[int]:
    """BOS ... EOS around each document: generation starts prompts with BOS, so the model must see it."""
    encoded = tokenizer.encode_batch(list(texts))
    return [i for doc in encoded for i in (tokenizer.bos_id, *doc, tokenizer.eos_id)]


def token_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 2**16 else "uint32"


class ShardedTokens:
    """One split's token stream read from its shards: ``len`` and ``[start:stop]`` (an int64 tensor), like the
    in-memory stream, so ``TokenWindows`` cuts the same windows from either. A slice may span shards."""

    def __init__(self, files: list[Path], counts: list[int], dtype: str):
        self.files, self.dtype = files, dtype
        self.starts = [0, *np.cumsum(counts).tolist()]  # offset of each shard in the stream, then its length
        self.itemsize = np.dtype(dtype).itemsize
        # opened by the first read; pread moves no file position, so forked dataloader workers may share them
        self._descriptors: list[int] | None = None

    def __len__(self) -> int:
        return self.starts[-1]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_descriptors": None}  # spawned dataloader workers open the files themselves

    def __del__(self) -> None:
        for descriptor in getattr(self, "_descriptors", None) or []:
            os.close(descriptor)

    def __getitem__(self, window: slice) -> torch.Tensor:
        if self._descriptors is None:
            self._descriptors = [os.open(f, os.O_RDONLY) for f in self.files]
        start, stop = max(window.start or 0, 0), min(window.stop, len(self))
        shard = bisect.bisect_right(self.starts, start) - 1
        pieces = []
        while start < stop:
            offset, end = start - self.starts[shard], min(stop, self.starts[shard + 1])
            data = os.pread(self._descriptors[shard], (end - start) * self.itemsize, offset * self.itemsize)
            pieces.append(np.frombuffer(data, dtype=self.dtype))
            start, shard = end, shard + 1
        return torch.from_numpy(np.concatenate(pieces).astype(np.int64))


def read_shards(shards_dir: str | Path) -> tuple[dict[str, ShardedTokens], Tokenizer, dict]:
    """The token stream of every split, the tokenizer that wrote them and the index's settings."""
    root = Path(shards_dir).expanduser()
    if not (root / INDEX).is_file():
        raise FileNotFoundError(
            f"No token shards in {root} ({INDEX} missing); write them with "
            f"`lit-prepare data.shards_dir={root}` and the same data settings, or set data.shards_dir=null"
        )
    index = json.loads((root / INDEX).read_text())
    streams = {
        split: ShardedTokens(
            [root / s["file"] for s in shards], [s["tokens"] for s in shards], index["dtype"]
        )
        for split, shards in index["splits"].items()
    }
    return streams, Tokenizer.from_file(root / TOKENIZER), index["settings"]


_worker: dict = {}  # what each worker process reads and tokenizes with


def _start_worker(tokenizer_state: dict, read: Callable[[Any], str]) -> None:
    _worker.update(tokenizer=Tokenizer.from_state(tokenizer_state), read=read)


def _write_shard(task: tuple[Path, list, str]) -> int:
    path, documents, dtype = task
    texts = (_worker["read"](reference) for reference, _ in documents)
    count = 0
    with open(path, "wb") as shard:
        for part in _runs(texts, len, ENCODE_CHARS):
            tokens = np.asarray(document_tokens(_worker["tokenizer"], part), dtype=dtype)
            tokens.tofile(shard)
            count += len(tokens)
    return count


def _runs(documents: Iterable, size: Callable[[Any], int], limit: int) -> Iterator[list]:
    """Consecutive runs of documents of about ``limit`` characters (or bytes, as ``size`` measures) each."""
    run, total = [], 0
    for document in documents:
        run.append(document)
        total += size(document)
        if total >= limit:
            yield run
            run, total = [], 0
    if run:
        yield run


def write_shards(
    documents: dict[str, Sequence[tuple[Any, int]]],
    read: Callable[[Any], str],
    tokenizer: Tokenizer,
    shards_dir: str | Path,
    workers: int,
    settings: dict,
) -> dict:
    """Tokenize each split's documents (in order) into shards, in ``workers`` processes (0: in this one), and write
    the index last, so an interrupted prepare leaves no index that training would trust. A document is a
    (reference, characters) pair: ``read`` turns the reference (a file, a paragraph's byte range, a dataset row) into
    its text in the worker, so that the main process never holds the corpus."""
    root = Path(shards_dir).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    (root / INDEX).unlink(missing_ok=True)
    tokenizer.save(root / TOKENIZER)
    dtype = token_dtype(tokenizer.vocab_size)
    shards = [
        (split, f"{split}-{k:05d}.bin", run)
        for split, docs in documents.items()
        for k, run in enumerate(_runs(docs, itemgetter(1), SHARD_CHARS))
    ]
    tasks = [(root / name, run, dtype) for _, name, run in shards]
    if workers > 0:
        # one thread per worker process: the workers are the parallelism (and tokenizers warns after a fork)
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        with multiprocessing.Pool(workers, _start_worker, (tokenizer.state(), read)) as pool:
            counts = pool.map(_write_shard, tasks, chunksize=1)
    else:
        _start_worker(tokenizer.state(), read)
        counts = [_write_shard(task) for task in tasks]
    index = {"dtype": dtype, "settings": settings, "splits": {split: [] for split in documents}}
    for (split, name, _), count in zip(shards, counts):
        index["splits"][split].append({"file": name, "tokens": count})
    tmp = root / f"{INDEX}.tmp"
    tmp.write_text(json.dumps(index, indent=1))
    tmp.replace(root / INDEX)
    log.info(
        "Token shards -> %s: %s", root, {s: sum(x["tokens"] for x in v) for s, v in index["splits"].items()}
    )
    return index
