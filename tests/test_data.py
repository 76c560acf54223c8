"""The byte corpus: file selection, hashing and caching, split, seeded sampling, entropy."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch

from trainers.config import DataConfig
from trainers.data import (
    TrainSampler,
    corpus_files,
    load_corpus,
    split_corpus,
    stdlib_files,
    validation_windows,
)


def test_stdlib_selection_is_sorted_library_code() -> None:
    files = stdlib_files()
    relative = [p.as_posix() for p in files]
    # Hundreds of *.py files, in sorted order, with no tests, installed packages or build files.
    assert len(files) > 300 and relative == sorted(relative)
    assert all(p.suffix == ".py" for p in files)
    for part in ("/test/", "/tests/", "/site-packages/", "/idle_test/", "/_sysconfigdata"):
        assert not any(part in name for name in relative), part


def test_stdlib_corpus_is_hashed_cached_and_memory_mapped() -> None:
    corpus = load_corpus(DataConfig())
    raw = b"".join(p.read_bytes() for p in stdlib_files())
    # The recorded hash is the sha256 of the concatenated bytes, which the tokens hold.
    assert corpus.corpus_hash == hashlib.sha256(raw).hexdigest()
    assert corpus.n_tokens == len(raw) and corpus.tokens.dtype == torch.uint8
    assert bytes(corpus.tokens[:1000].numpy()) == raw[:1000]
    # The bytes are cached under the cache dir, keyed by hash, and the tensor maps that file.
    cached = Path(os.environ["COLLAPSE_HPO_CACHE"]) / f"corpus-{corpus.corpus_hash}.bin"
    assert corpus.path == cached and cached.stat().st_size == len(raw)
    # The description records what a run needs to be reproduced.
    assert set(corpus.describe()) == {"corpus", "corpus_hash", "corpus_files", "corpus_bytes", "python_version",
                                      "vocab_size", "token_dtype"}


def test_user_directory_is_read_in_sorted_order(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_bytes(b"second ")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "z.txt").write_bytes(b"first ")
    (tmp_path / "c.txt").write_bytes(b"third")
    (tmp_path / ".hidden").write_bytes(b"never")
    config = DataConfig(corpus=str(tmp_path), cache_dir=str(tmp_path / "cache"))
    corpus = load_corpus(config)
    # Files are concatenated in sorted relative-path order; hidden files are skipped.
    assert bytes(corpus.tokens.numpy()) == b"first second third"
    # The cache, here inside the corpus directory, is never read back as corpus text.
    assert corpus.path.parent == tmp_path / "cache"
    assert load_corpus(config).corpus_hash == corpus.corpus_hash
    # A single file works too.
    assert corpus_files(str(tmp_path / "c.txt")) == [tmp_path / "c.txt"]


def test_corpus_cache_is_the_users_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The cache holds a copy of whatever corpus was read (a corpus of /etc once put lines of
    # /etc/shadow into a world-readable ~/.cache): files 0600 in a 0700 directory.
    import stat

    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "secret.txt").write_bytes(b"private words " * 10)
    default = tmp_path / "home-cache"
    default.mkdir(mode=0o755)
    default.chmod(0o755)  # as an earlier version left it
    monkeypatch.setenv("COLLAPSE_HPO_CACHE", str(default))
    old = os.umask(0o022)
    try:
        corpus = load_corpus(DataConfig(corpus=str(tmp_path / "text")))
        named = load_corpus(DataConfig(corpus=str(tmp_path / "text"), cache_dir=str(tmp_path / "new" / "cache")))
    finally:
        os.umask(old)
    for path in (corpus.path, named.path):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700, path.parent
    # A copy left 0644 by an earlier version is made private when it is next used.
    from trainers import data

    named.path.chmod(0o644)
    data._LOADED.clear()
    load_corpus(DataConfig(corpus=str(tmp_path / "text"), cache_dir=str(tmp_path / "new" / "cache")))
    assert stat.S_IMODE(named.path.stat().st_mode) == 0o600


def test_missing_corpus_names_the_field() -> None:
    # An unknown path is an error naming data.corpus.
    with pytest.raises(FileNotFoundError, match="data.corpus"):
        corpus_files("/no/such/corpus")


def test_validation_split_is_the_tail() -> None:
    tokens = torch.arange(100, dtype=torch.uint8)
    train, val = split_corpus(tokens, 0.1)
    # The last 10% of the bytes are held out; nothing is lost or shared.
    assert torch.equal(val, tokens[90:]) and torch.equal(train, tokens[:90])


def test_sampler_is_seeded_by_data_seed_and_resumable() -> None:
    tokens = torch.randint(0, 256, (10_000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    first, same, other = (TrainSampler(tokens, 16, seed) for seed in (7, 7, 8))
    a, b, c = first.sample(4), same.sample(4), other.sample(4)
    # The same data seed gives the same windows; another seed gives others.
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])
    # Targets are the inputs shifted by one byte.
    assert torch.equal(a[0][:, 1:], a[1][:, :-1])
    # Restoring the generator state replays the stream exactly.
    state = first.state_dict()
    expected = first.sample(4)[0]
    same.load_state_dict(state)
    assert torch.equal(same.sample(4)[0], expected)


def test_validation_windows_are_fixed_and_inside_the_split() -> None:
    tokens = torch.arange(250, dtype=torch.uint8)
    inputs, targets = validation_windows(tokens, seq_len=10, n_tokens=45)
    # ⌈45/10⌉ = 5 evenly spaced windows, deterministic, within the split.
    assert inputs.shape == (5, 10)
    assert torch.equal(inputs, validation_windows(tokens, 10, 45)[0])
    assert int(targets.max()) <= 249 and int(inputs[0, 0]) == 0
