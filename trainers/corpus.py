"""Corpora on disk, without torch: which files a byte corpus reads, and token datasets
(nanoGPT's layout): find them, check them, fingerprint them; how many training tokens a
config's corpus holds. (trainers/data.py maps and samples them with torch.)

A token dataset is a directory holding ``train.bin`` and ``val.bin``: flat arrays of token
ids, uint16 by default (``data.token_dtype: uint32`` for vocabularies above 65,536), no
header. An optional ``meta.json`` beside them with ``vocab_size`` is checked against
``model.vocab_size``. (nanoGPT writes ``meta.pkl``; we never unpickle a file from outside.)

The fingerprint (sha256 of both files, token counts, the largest id) is read in 64 MiB
chunks, never the whole file at once, and cached in the corpus cache directory keyed by each
file's resolved path, size and modification time, so a sweep of many trials reads a large
dataset once. This module needs numpy only (no torch): the curve bank puts the hash into a
run's id without importing torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from predictors.io import atomic_write_bytes, dumps

TRAIN_FILE, VAL_FILE, META_FILE = "train.bin", "val.bin", "meta.json"
TOKEN_DTYPES: dict[str, type[np.unsignedinteger[Any]]] = {"uint16": np.uint16, "uint32": np.uint32}
#: The byte-level vocabulary: ``model.vocab_size`` of every corpus that is not a token dataset.
BYTE_VOCAB_SIZE = 256
_CHUNK_BYTES = 64 << 20


class DataError(ValueError):
    """A corpus that cannot be used; the message names the setting, the file and the value."""


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
    system = _system_folder(path)
    if system is not None:
        # Text of the machine's own configuration or binaries is no training corpus, and the
        # corpus cache would keep a private copy of it (140 MB for /etc, readable by the user).
        raise FileNotFoundError(f"data.corpus: {corpus!r} is the system folder {system}, not a corpus; "
                                "name a folder of your own text (or 'stdlib')")
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


#: Folders of the operating system itself: refused as a corpus (and anything at or above them).
SYSTEM_FOLDERS = ("/", "/etc", "/proc", "/sys", "/dev", "/run", "/boot", "/bin", "/sbin", "/lib", "/lib64",
                  "/usr", "/usr/bin", "/usr/lib", "/usr/sbin", "/var", "/var/log", "/var/lib", "/root", "/home",
                  "/tmp", "/srv", "/opt", "/mnt", "/media")
#: Of those, the ones whose every subfolder is refused too (/etc/ssl is still /etc).
_SYSTEM_TREES = ("/etc", "/proc", "/sys", "/dev", "/run", "/boot", "/bin", "/sbin", "/usr/bin", "/usr/sbin",
                 "/var/log", "/var/lib")


def _system_folder(path: Path) -> str | None:
    """The system folder ``path`` is (or lies in, for the trees of :data:`_SYSTEM_TREES`), else None."""
    resolved = path.resolve()
    if str(resolved) in SYSTEM_FOLDERS:
        return str(resolved)
    return next((tree for tree in _SYSTEM_TREES if resolved.is_relative_to(tree)), None)


def held_out_count(n_tokens: int, val_fraction: float) -> int:
    """Tokens a byte corpus holds out for validation: its last ``val_fraction`` (at least one)."""
    return max(1, int(round(val_fraction * n_tokens)))


def default_cache_dir() -> Path:
    return Path(os.environ.get("COLLAPSE_HPO_CACHE", Path.home() / ".cache" / "collapse-hpo"))


#: The corpus cache holds copies of whatever the corpus was (a user's private text, or a
#: system directory they named by mistake): its files are the user's alone, in a directory
#: only they can list.
CACHE_DIR_MODE, CACHE_FILE_MODE = 0o700, 0o600


def private_cache_dir(cache_dir: Path) -> Path:
    """Create ``cache_dir`` (0700); a directory this package owns (the default cache) is set
    to 0700 also when it exists from an earlier, world-readable version. A directory the user
    named is theirs: created 0700, but an existing one keeps its mode (its files are 0600)."""
    cache_dir.mkdir(mode=CACHE_DIR_MODE, parents=True, exist_ok=True)
    if cache_dir.resolve() == default_cache_dir().resolve() and cache_dir.stat().st_mode & 0o077:
        os.chmod(cache_dir, CACHE_DIR_MODE)
    return cache_dir


def private_cache_file(path: Path) -> Path:
    """Make a cache file written by an earlier version (0644) the user's alone (0600)."""
    if path.stat().st_mode & 0o077:
        os.chmod(path, CACHE_FILE_MODE)
    return path


def token_dataset_dir(corpus: str) -> Path | None:
    """The directory when ``data.corpus`` names a token dataset (train.bin and val.bin), else None."""
    if corpus == "stdlib":
        return None
    path = Path(corpus).expanduser()
    if path.is_dir() and (path / TRAIN_FILE).is_file() and (path / VAL_FILE).is_file():
        return path
    return None


@dataclass(frozen=True)
class TokenFingerprint:
    """What a run needs to know about a token dataset before it reads a window."""

    corpus_hash: str  # sha256 over train.bin then val.bin (with their lengths)
    n_train: int  # token ids in train.bin
    n_val: int
    max_id: int  # the largest id in either file
    meta_vocab_size: int | None  # meta.json's vocab_size, if the file exists


_MEMO: dict[tuple[Any, ...], TokenFingerprint] = {}


def _file_key(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


def _read_meta(directory: Path) -> int | None:
    meta = directory / META_FILE
    if not meta.is_file():
        return None
    try:
        value = json.loads(meta.read_text(encoding="utf-8"))["vocab_size"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"data.corpus: {meta} has no readable integer vocab_size ({exc!s})") from None
    if not isinstance(value, int) or isinstance(value, bool) or value < 2:
        raise DataError(f"data.corpus: {meta} vocab_size {value!r} is not an integer >= 2")
    return value


def _scan(path: Path, dtype: np.dtype[Any], digest: Any) -> tuple[int, int]:
    """Feed ``path`` into ``digest`` in chunks; return (ids in the file, largest id)."""
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise DataError(
            f"data.corpus: {path} holds {size} bytes, not a whole number of {dtype.name} ids "
            f"(data.token_dtype)")
    digest.update(f"{path.name}:{size}\n".encode())
    largest = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
            largest = max(largest, int(np.frombuffer(chunk, dtype=dtype).max()))
    return size // dtype.itemsize, largest


def fingerprint(directory: Path, token_dtype: str, cache_dir: Path | None = None) -> TokenFingerprint:
    """Hash, sizes and largest id of a token dataset (memoised; cached on disk in ``cache_dir``)."""
    dtype = np.dtype(TOKEN_DTYPES[token_dtype])
    files = [directory / TRAIN_FILE, directory / VAL_FILE]
    key = (token_dtype, *(_file_key(f) for f in files))
    meta = _read_meta(directory)
    if key in _MEMO:
        return TokenFingerprint(**{**asdict(_MEMO[key]), "meta_vocab_size": meta})
    cache_dir = cache_dir if cache_dir is not None else default_cache_dir()
    cache_file = cache_dir / f"tokens-{hashlib.sha1(repr(key).encode()).hexdigest()[:16]}.json"
    found: TokenFingerprint | None = None
    try:
        cached = json.loads(cache_file.read_text())
        found = TokenFingerprint(cached["corpus_hash"], int(cached["n_train"]), int(cached["n_val"]),
                                 int(cached["max_id"]), meta)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if found is None:
        digest = hashlib.sha256()
        digest.update(f"{token_dtype}\n".encode())
        n_train, max_train = _scan(files[0], dtype, digest)
        n_val, max_val = _scan(files[1], dtype, digest)
        found = TokenFingerprint(digest.hexdigest(), n_train, n_val, max(max_train, max_val), meta)
        try:
            private_cache_dir(cache_dir)
            atomic_write_bytes(cache_file, (dumps({k: v for k, v in asdict(found).items() if k != "meta_vocab_size"})
                                            + "\n").encode(), mode=CACHE_FILE_MODE)
        except OSError:
            pass  # a read-only cache only costs a re-read next time
    _MEMO[key] = found
    return found


def check_vocabulary(directory: Path, found: TokenFingerprint, vocab_size: int) -> None:
    """meta.json's vocab_size must equal ``model.vocab_size``, and every id must be below it."""
    if found.meta_vocab_size is not None and found.meta_vocab_size != vocab_size:
        raise DataError(
            f"model.vocab_size: {vocab_size} differs from vocab_size {found.meta_vocab_size} in "
            f"{directory / META_FILE}")
    if found.max_id >= vocab_size:
        raise DataError(
            f"model.vocab_size: {vocab_size} is too small for {directory}, which holds token id {found.max_id}")


def corpus_hash_of(data: dict[str, Any]) -> str | None:
    """The token dataset's hash for a config's ``data`` section (a dict), None for byte corpora.

    What the curve bank puts into a token-dataset run's id: the same config on other token
    files is another run.
    """
    directory = token_dataset_dir(str(data.get("corpus", "stdlib")))
    if directory is None:
        return None
    cache = data.get("cache_dir")
    return fingerprint(directory, str(data.get("token_dtype", "uint16")),
                       Path(cache).expanduser() if cache else None).corpus_hash


def training_tokens(data: dict[str, Any]) -> int:
    """Token ids in the training split of a config's ``data`` section (a dict), without
    reading a byte corpus's contents (file sizes) or hashing a token dataset twice."""
    corpus = str(data.get("corpus", "stdlib"))
    cache = data.get("cache_dir")
    cache_dir = Path(cache).expanduser() if cache else default_cache_dir()
    directory = token_dataset_dir(corpus)
    if directory is not None:
        return fingerprint(directory, str(data.get("token_dtype", "uint16")), cache_dir).n_train
    total = sum(f.stat().st_size for f in corpus_files(corpus, exclude=cache_dir))
    return total - held_out_count(total, float(data.get("val_fraction", 0.1)))
