"""Byte-level corpus: no download, cached, memory-mapped, split and sampled deterministically.

* ``corpus: stdlib`` (default) is the running interpreter's standard-library ``*.py``
  sources (tests, site-packages and build-specific files excluded), concatenated in sorted
  path order. It changes with the Python version, so its sha256 and the version are
  recorded with every run.
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
import os
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from predictors.io import atomic_write_bytes
from trainers.config import DataConfig

# Directories never taken from the standard library: tests (not library code), installed
# packages, byte-code caches, and the build's config-* directory (machine specific).
_STDLIB_EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
# Build-specific modules whose contents differ between installs of one Python version.
_STDLIB_EXCLUDED_PREFIXES = ("_sysconfigdata",)


def stdlib_files() -> list[Path]:
    """The standard-library ``*.py`` files of this interpreter, sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[str] = []
    for directory, subdirs, files in os.walk(root):
        # Pruning in place stops os.walk from descending into excluded trees.
        subdirs[:] = [d for d in subdirs if d not in _STDLIB_EXCLUDED_DIRS and not d.startswith("config-")]
        relative = Path(directory).relative_to(root)
        found += [
            (relative / name).as_posix()
            for name in files
            if name.endswith(".py") and not name.startswith(_STDLIB_EXCLUDED_PREFIXES)
        ]
    return [root / name for name in sorted(found)]


def corpus_files(corpus: str, exclude: Path | None = None) -> list[Path]:
    """Resolve the ``data.corpus`` setting to a sorted list of files.

    In a directory, hidden files and directories (``.git``, ...) are skipped, and so is
    everything under ``exclude`` (the corpus cache, should it live inside the corpus).
    """
    if corpus == "stdlib":
        return stdlib_files()
    path = Path(corpus).expanduser()
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"data.corpus: {corpus!r} is neither 'stdlib' nor an existing file or directory")
    excluded = exclude.resolve() if exclude is not None else None
    found = []
    for file in path.rglob("*"):
        relative = file.relative_to(path)
        if not file.is_file() or any(part.startswith(".") for part in relative.parts):
            continue
        if excluded is not None and file.resolve().is_relative_to(excluded):
            continue
        found.append(file)
    return sorted(found, key=lambda p: p.relative_to(path).as_posix())


def default_cache_dir() -> Path:
    return Path(os.environ.get("COLLAPSE_HPO_CACHE", Path.home() / ".cache" / "collapse-hpo"))


@dataclass(frozen=True)
class Corpus:
    """The concatenated corpus bytes and where they came from."""

    tokens: torch.Tensor  # uint8, shares memory with the memory-mapped cache file
    path: Path  # the cache file the tokens map
    corpus_hash: str  # sha256 of the bytes
    source: str  # the data.corpus setting
    n_files: int
    python_version: str

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.numel())

    def describe(self) -> dict[str, Any]:
        return {
            "corpus": self.source,
            "corpus_hash": self.corpus_hash,
            "corpus_files": self.n_files,
            "corpus_bytes": self.n_tokens,
            "python_version": self.python_version,
        }


_LOADED: dict[tuple[str, str], Corpus] = {}


def load_corpus(config: DataConfig) -> Corpus:
    """Read, hash, cache and memory-map the corpus (memoised per process)."""
    cache_dir = Path(config.cache_dir).expanduser() if config.cache_dir else default_cache_dir()
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
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"corpus-{digest}.bin"
    if not path.exists() or path.stat().st_size != len(raw):
        # Atomic, so concurrent trials never map a half-written file.
        atomic_write_bytes(path, raw)
    # mode "c" (copy-on-write) gives a writable view without ever writing the file back,
    # which is what torch.from_numpy wants.
    array = np.memmap(path, dtype=np.uint8, mode="c")
    corpus = Corpus(
        tokens=torch.from_numpy(array),
        path=path,
        corpus_hash=digest,
        source=config.corpus,
        n_files=len(files),
        python_version=platform.python_version(),
    )
    _LOADED[key] = corpus
    return corpus


def split_corpus(tokens: torch.Tensor, val_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation): the last ``val_fraction`` of the bytes is held out."""
    n_val = max(1, int(round(val_fraction * tokens.numel())))
    return tokens[:-n_val], tokens[-n_val:]


def _windows(tokens: torch.Tensor, starts: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-byte targets (n, seq_len) int64 for windows starting at ``starts``."""
    index = starts[:, None] + torch.arange(seq_len + 1)
    chunk = tokens[index].long()
    return chunk[:, :-1], chunk[:, 1:]


class TrainSampler:
    """Uniformly random training windows from a seeded generator (state is checkpointed)."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, data_seed: int) -> None:
        if tokens.numel() < seq_len + 1:
            raise ValueError(f"data: the training split ({tokens.numel()} bytes) is shorter than one window")
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
        raise ValueError(f"data: the validation split ({tokens.numel()} bytes) is shorter than one window")
    wanted = max(1, -(-n_tokens // seq_len))
    # Non-overlapping when the split is long enough, evenly spread over all of it.
    count = min(wanted, max(1, available // seq_len))
    starts = torch.linspace(0, available - 1, count).long()
    return _windows(tokens, starts, seq_len)
