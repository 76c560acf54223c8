"""Corpora: bytes or token ids, no download, memory-mapped, split and sampled deterministically.

* ``corpus: stdlib`` (default) is the running interpreter's standard-library ``*.py``
  sources (tests, site-packages and build-specific files excluded), concatenated in sorted
  path order. It changes with the Python version, so its sha256 and the version are
  recorded with every run.
* A directory holding ``train.bin`` and ``val.bin`` is a token dataset (flat uint16/uint32
  ids, nanoGPT's layout; trainers.corpus.py): both files are memory-mapped as they are,
  never loaded whole, and ``val.bin`` is the validation split.
* Any other value is a text file or a directory of files (all non-hidden files, sorted by
  relative path).

The concatenated bytes are cached once as ``corpus-<sha256>.bin`` and memory-mapped as
uint8. The last ``val_fraction`` of the bytes is the validation split; validation uses a
fixed set of evenly spaced windows, training draws windows uniformly at random with a
``torch.Generator`` seeded by ``data_seed`` (not the init seed), so every trial of a sweep
with the same data seed sees the same stream.
"""

from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from predictors.io import atomic_write_bytes
from trainers.config import DataConfig
from trainers.corpus import (
    BYTE_VOCAB_SIZE,
    CACHE_FILE_MODE,
    TOKEN_DTYPES,
    TRAIN_FILE,
    VAL_FILE,
    DataError,
    check_vocabulary,
    corpus_files,
    default_cache_dir,
    held_out_count,
    private_cache_dir,
    private_cache_file,
    stdlib_files,
    fingerprint,
    token_dataset_dir,
)

@dataclass(frozen=True)
class Corpus:
    """The corpus tokens and where they came from.

    Byte corpora: ``tokens`` is every byte (uint8) and `splits` holds out the last
    ``val_fraction``. Token datasets: ``tokens`` is train.bin and ``val_tokens`` val.bin.
    """

    tokens: torch.Tensor  # shares memory with the memory-mapped file
    path: Path  # the file the tokens map (the byte cache, or train.bin)
    corpus_hash: str  # sha256 of the bytes (token datasets: of both files)
    source: str  # the data.corpus setting
    n_files: int
    python_version: str
    vocab_size: int = BYTE_VOCAB_SIZE
    token_dtype: str = "uint8"
    val_tokens: torch.Tensor | None = None

    @property
    def n_tokens(self) -> int:
        held_out = self.val_tokens.numel() if self.val_tokens is not None else 0
        return int(self.tokens.numel() + held_out)

    def splits(self, val_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(train, validation) token ids."""
        if self.val_tokens is not None:
            return self.tokens, self.val_tokens
        return split_corpus(self.tokens, val_fraction)

    def describe(self) -> dict[str, Any]:
        out = {
            "corpus": self.source,
            "corpus_hash": self.corpus_hash,
            "corpus_files": self.n_files,
            "corpus_bytes": self.n_tokens,
            "python_version": self.python_version,
            "vocab_size": self.vocab_size,
            "token_dtype": self.token_dtype,
        }
        if self.val_tokens is not None:
            # A token dataset counts ids, not bytes.
            out["corpus_bytes"] = self.n_tokens * self.tokens.element_size()
            out["corpus_tokens"] = self.n_tokens
        return out


_LOADED: dict[tuple[str, ...], Corpus] = {}


def _map_tokens(path: Path, dtype: Any) -> torch.Tensor:
    # mode "c" (copy-on-write) gives a writable view without ever writing the file back,
    # which is what torch.from_numpy wants; pages are read only when a window touches them.
    return torch.from_numpy(np.memmap(path, dtype=dtype, mode="c"))


def load_token_dataset(config: DataConfig, directory: Path, vocab_size: int, cache_dir: Path) -> Corpus:
    """Memory-map a token dataset's train.bin and val.bin after checking them against V."""
    found = fingerprint(directory, config.token_dtype, cache_dir)
    check_vocabulary(directory, found, vocab_size)
    key = (str(directory.resolve()), config.token_dtype, found.corpus_hash)
    if key in _LOADED:
        return _LOADED[key]
    dtype = TOKEN_DTYPES[config.token_dtype]
    corpus = Corpus(
        tokens=_map_tokens(directory / TRAIN_FILE, dtype),
        path=directory / TRAIN_FILE,
        corpus_hash=found.corpus_hash,
        source=config.corpus,
        n_files=2,
        python_version=platform.python_version(),
        vocab_size=vocab_size,
        token_dtype=config.token_dtype,
        val_tokens=_map_tokens(directory / VAL_FILE, dtype),
    )
    _LOADED[key] = corpus
    return corpus


def load_corpus(config: DataConfig, vocab_size: int = BYTE_VOCAB_SIZE) -> Corpus:
    """Read, hash, cache and memory-map the corpus (memoised per process).

    ``vocab_size`` is ``model.vocab_size``: 256 for a byte corpus, the tokenizer's V for a
    token dataset (checked against its meta.json and its ids).
    """
    cache_dir = Path(config.cache_dir).expanduser() if config.cache_dir else default_cache_dir()
    directory = token_dataset_dir(config.corpus)
    if directory is not None:
        return load_token_dataset(config, directory, vocab_size, cache_dir)
    if vocab_size != BYTE_VOCAB_SIZE:
        raise DataError(
            f"model.vocab_size: {vocab_size} needs a token dataset, but data.corpus {config.corpus!r} "
            f"is read as bytes (V = 256); a token dataset is a directory with {TRAIN_FILE} and {VAL_FILE}")
    files = corpus_files(config.corpus, exclude=cache_dir)
    if not files:
        raise ValueError(f"data.corpus: {config.corpus!r} contains no files")
    # Reading and hashing ~12 MB takes ~0.05 s, so the hash is always computed from the
    # current files: the cache can never serve stale bytes.
    raw = b"".join(path.read_bytes() for path in files)
    if len(raw) < 2:
        raise ValueError(f"data.corpus: {config.corpus!r} holds fewer than 2 bytes")
    digest = hashlib.sha256(raw).hexdigest()
    key = (str(cache_dir), digest)
    if key in _LOADED:
        return _LOADED[key]
    private_cache_dir(cache_dir)
    path = cache_dir / f"corpus-{digest}.bin"
    if not path.exists() or path.stat().st_size != len(raw):
        # Atomic, so concurrent trials never map a half-written file; 0600: a copy of the corpus.
        atomic_write_bytes(path, raw, mode=CACHE_FILE_MODE)
    else:
        private_cache_file(path)
    corpus = Corpus(
        tokens=_map_tokens(path, np.uint8),
        path=path,
        corpus_hash=digest,
        source=config.corpus,
        n_files=len(files),
        python_version=platform.python_version(),
    )
    _LOADED[key] = corpus
    return corpus


def passes_over_data(total_tokens: int, train_tokens: int) -> float:
    """Epochs: how many times a run of ``total_tokens`` reads its training split, on average."""
    return total_tokens / train_tokens


def repeated_data_warning(total_tokens: int, train_tokens: int, corpus: str) -> str | None:
    """One warning line when a run reads its training split more than once, else None.

    Windows are drawn at random, so more than one pass means repeated tokens: the training
    loss then runs below the validation loss and says less about it.
    """
    epochs = passes_over_data(total_tokens, train_tokens)
    if epochs <= 1.0:
        return None
    return (f"warning: repeated data: {total_tokens:,} training tokens from a {train_tokens:,}-token training "
            f"split of data.corpus {corpus!r} = {epochs:.2f} passes (epochs > 1)")


def split_corpus(tokens: torch.Tensor, val_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation): the last ``val_fraction`` of the bytes is held out."""
    n_val = held_out_count(tokens.numel(), val_fraction)
    return tokens[:-n_val], tokens[-n_val:]


def _windows(tokens: torch.Tensor, starts: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets (n, seq_len) int64 for windows starting at ``starts``."""
    index = starts[:, None] + torch.arange(seq_len + 1)
    chunk = tokens[index].long()
    return chunk[:, :-1], chunk[:, 1:]


class TrainSampler:
    """Uniformly random training windows from a seeded generator (state is checkpointed)."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, data_seed: int) -> None:
        if tokens.numel() < seq_len + 1:
            raise ValueError(f"data: the training split ({tokens.numel()} tokens) is shorter than one window")
        self.tokens = tokens
        self.seq_len = seq_len
        self.generator = torch.Generator().manual_seed(data_seed)

    def sample(self, n_sequences: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw one optimizer step's windows; independent of how they are micro-batched."""
        high = self.tokens.numel() - self.seq_len
        starts = torch.randint(0, high, (n_sequences,), generator=self.generator)
        return _windows(self.tokens, starts, self.seq_len)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.generator.set_state(state["generator"])


def validation_windows(tokens: torch.Tensor, seq_len: int, n_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed validation set: ⌈n_tokens/seq_len⌉ evenly spaced windows (fewer if the split is short)."""
    available = tokens.numel() - seq_len
    if available < 1:
        raise ValueError(f"data: the validation split ({tokens.numel()} tokens) is shorter than one window")
    wanted = max(1, -(-n_tokens // seq_len))
    # Non-overlapping when the split is long enough, evenly spread over all of it.
    count = min(wanted, max(1, available // seq_len))
    starts = torch.linspace(0, available - 1, count).long()
    return _windows(tokens, starts, seq_len)
