"""Token datasets (train.bin / val.bin): checked against V, memory-mapped, trained on, resumed
bit-exactly, banked with their vocabulary and corpus hash; and epochs counted."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hpo.trials.curve_bank import run_id_of
from trainers.config import DataConfig, TrainConfig, load_train_config
from trainers.data import load_corpus
from trainers.runner import run_to_directory
from trainers.corpus import DataError
from trainers.train import Trainer

GPT2_VOCAB = 50_257


def write_token_dataset(directory: Path, vocab: int = GPT2_VOCAB, n_train: int = 40_000, n_val: int = 4_000,
                        dtype: Any = np.uint16, meta: int | None = GPT2_VOCAB, seed: int = 0) -> Path:
    """A learnable synthetic stream over 64 ids spread across the whole vocabulary (the largest
    included): each id follows from the one before, 1 time in 8 a random one of the 64 instead."""
    rng = np.random.default_rng(seed)
    used = np.linspace(0, vocab - 1, 64).round().astype(np.int64)
    n = n_train + n_val
    state = np.empty(n, dtype=np.int64)
    state[0] = 63
    noise = rng.integers(0, 64, n)
    jump = rng.random(n) < 0.125
    for i in range(1, n):
        state[i] = noise[i] if jump[i] else (state[i - 1] * 5 + 3) % 64
    ids = used[state]
    directory.mkdir(parents=True, exist_ok=True)
    ids[:n_train].astype(dtype).tofile(directory / "train.bin")
    ids[n_train:].astype(dtype).tofile(directory / "val.bin")
    if meta is not None:
        (directory / "meta.json").write_text(json.dumps({"vocab_size": meta}))
    return directory


def _config(corpus: Path, cache: Path, **updates: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "model": {"d_model": 32, "n_layers": 2, "d_head": 16, "seq_len": 32, "base_d_model": 32,
                  "vocab_size": GPT2_VOCAB},
        "data": {"corpus": str(corpus), "cache_dir": str(cache)},
        "batch_size": 256,
        "tokens_per_param": 0.25,
        "lr": 0.02,
        "tau": 0.3,
        "log_every": 4,
        "eval_every": 8,
        "eval_tokens": 1024,
        "smoothing_tokens": 2048,
        "threads": 1,
        "device": "cpu",
    }
    data.update(updates)
    return data


def test_a_token_dataset_is_memory_mapped_and_checked_against_the_vocabulary(tmp_path: Path) -> None:
    corpus = write_token_dataset(tmp_path / "tokens")
    loaded = load_corpus(DataConfig(corpus=str(corpus), cache_dir=str(tmp_path / "cache")), GPT2_VOCAB)
    train, val = loaded.splits(0.1)
    # train.bin and val.bin as they are (val.bin is the held-out split, val_fraction unused), ids not bytes.
    assert train.dtype == torch.uint16 and train.numel() == 40_000 and val.numel() == 4_000
    assert int(train[0]) == GPT2_VOCAB - 1
    assert loaded.describe()["vocab_size"] == GPT2_VOCAB and loaded.describe()["corpus_tokens"] == 44_000
    # Memory-mapped, not read into memory: a write into the file shows through the tensor.
    with open(corpus / "train.bin", "r+b") as handle:
        handle.seek(2)
        handle.write(np.uint16(12345).tobytes())
    assert int(train[1]) == 12345

    # meta.json must agree with model.vocab_size, and every id must fit in it.
    with pytest.raises(DataError, match=r"model.vocab_size: 50000 differs from vocab_size 50257 in .*meta.json"):
        load_corpus(DataConfig(corpus=str(corpus), cache_dir=str(tmp_path / "cache")), 50_000)
    no_meta = write_token_dataset(tmp_path / "no_meta", meta=None)
    with pytest.raises(DataError, match="too small .* holds token id 50256"):
        load_corpus(DataConfig(corpus=str(no_meta), cache_dir=str(tmp_path / "cache")), 50_000)
    # A byte corpus has V = 256: another vocab_size is refused, naming the field.
    with pytest.raises(DataError, match="model.vocab_size: 1000 needs a token dataset"):
        load_corpus(DataConfig(), 1000)
    # A file that is not whole ids of the declared width is named.
    (corpus / "val.bin").write_bytes(b"\x00" * 5)
    with pytest.raises(DataError, match=r"val.bin holds 5 bytes, not a whole number of uint16 ids"):
        load_corpus(DataConfig(corpus=str(corpus), cache_dir=str(tmp_path / "cache")), GPT2_VOCAB)


def test_uint32_ids_and_the_uint16_limit(tmp_path: Path) -> None:
    corpus = write_token_dataset(tmp_path / "big", vocab=100_000, dtype=np.uint32, meta=100_000,
                                 n_train=3000, n_val=500)
    loaded = load_corpus(DataConfig(corpus=str(corpus), token_dtype="uint32", cache_dir=str(tmp_path / "c")), 100_000)
    assert loaded.tokens.dtype == torch.uint32 and int(loaded.tokens[0]) == 99_999
    with pytest.raises(ValueError, match="data.token_dtype: uint16 ids stop at 65,535"):
        TrainConfig.model_validate({"tau": 0.3, "model": {"vocab_size": 100_000}})


def test_gpt2_vocabulary_run_trains_and_resumes_bit_exactly(tmp_path: Path) -> None:
    corpus = write_token_dataset(tmp_path / "tokens")
    config = _config(corpus, tmp_path / "cache")
    uninterrupted = Trainer(config).run()
    first = Trainer(config)
    first.train_interval()
    first.train_interval()
    first.save_checkpoint(tmp_path / "ckpt")
    resumed = Trainer(config)
    resumed.load_checkpoint(tmp_path / "ckpt")
    records = resumed.run()
    assert len(records) == len(uninterrupted) > 3
    for a, b in zip(records, uninterrupted):
        for key in ("step", "train_loss", "smoothed_loss", "val_loss", "lr"):
            assert a[key] == b[key] or (math.isnan(a[key]) and math.isnan(b[key])), (key, a, b)
    # It learned: from ln V (a uniform guess over 50,257 ids) well down, on held-out val.bin too.
    assert uninterrupted[-1]["val_loss"] < math.log(GPT2_VOCAB) - 1.0 < uninterrupted[0]["train_loss"]
    assert resumed.model.embed.weight.shape == resumed.model.lm_head.weight.shape == (GPT2_VOCAB, 32)


def test_controls_and_run_id_carry_the_vocabulary_and_corpus_hash(tmp_path: Path, capsys: Any) -> None:
    corpus = write_token_dataset(tmp_path / "tokens", n_train=3000, n_val=1000)
    config = _config(corpus, tmp_path / "cache", tokens_per_param=0.3)
    summary = run_to_directory(config, tmp_path / "run", progress=False)
    assert summary["vocab_size"] == GPT2_VOCAB and summary["token_dtype"] == "uint16"
    assert summary["n_embedding_params"] == 2 * GPT2_VOCAB * 32
    assert len(summary["corpus_hash"]) == 64
    # ~7k tokens read from 3,000 training ids: over two passes, recorded and warned about once.
    assert summary["epochs"] == pytest.approx(summary["total_tokens"] / 3000) and summary["epochs"] > 2
    warnings = [line for line in capsys.readouterr().err.splitlines() if "repeated data" in line]
    assert len(warnings) == 1 and f"{summary['epochs']:.2f} passes" in warnings[0]

    resolved = load_train_config(config).model_dump(mode="json")
    first = run_id_of(resolved)
    # Another vocabulary is another run; so are other token files under the same path.
    assert run_id_of({**resolved, "model": {**resolved["model"], "vocab_size": 50_304}}) != first
    write_token_dataset(corpus, n_train=3000, n_val=1000, seed=1)
    assert run_id_of(resolved) != first


def test_byte_level_run_ids_are_unchanged_by_the_new_fields() -> None:
    # vocab_size 256 and token_dtype uint16 are left out of a byte-level run's id, so every
    # run banked before they existed keeps its id (the shipped banks still match).
    resolved = TrainConfig.model_validate({"tau": 0.3}).model_dump(mode="json")
    assert resolved["model"]["vocab_size"] == 256 and resolved["data"]["token_dtype"] == "uint16"
    before = {**resolved, "model": {k: v for k, v in resolved["model"].items() if k != "vocab_size"},
              "data": {k: v for k, v in resolved["data"].items() if k != "token_dtype"}}
    assert run_id_of(resolved) == run_id_of(before)


def test_a_single_pass_run_prints_no_warning(tmp_path: Path, capsys: Any) -> None:
    corpus = write_token_dataset(tmp_path / "tokens")
    trainer = Trainer(_config(corpus, tmp_path / "cache", tokens_per_param=0.2))
    assert 0 < trainer.epochs < 1
    assert "repeated data" not in capsys.readouterr().err


def test_hpo_train_refuses_a_vocabulary_mismatch_in_one_line(tmp_path: Path, capsys: Any) -> None:
    import yaml

    from hpo.service.cli import main

    corpus = write_token_dataset(tmp_path / "tokens", n_train=2000, n_val=500)
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(_config(corpus, tmp_path / "cache", model={"vocab_size": 50_304})))
    output = tmp_path / "out"
    assert main(["train", "--config", str(config_path), "--output", str(output)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.vocab_size: 50304 differs from vocab_size 50257" in err[0]
    assert not output.exists()


def _sweep(corpus: Path, cache: Path, **trainer: Any) -> Any:
    from hpo.trials.sweep_config import load_sweep_config

    base = {k: v for k, v in _config(corpus, cache).items() if k not in ("threads", "device")}
    base.update(trainer)
    # limits.min_steps 1: these sweeps of a few steps only feed the data checks, never train.
    return load_sweep_config(data={"name": "tokens", "trainer": base, "limits": {"min_steps": 1},
                                   "search_space": {"lr": {"grid": [0.01, 0.02]},
                                                    "batch_size": {"grid": [128, 256]}}})


def test_a_sweep_checks_the_vocabulary_and_warns_once_about_repeated_data(tmp_path: Path) -> None:
    from hpo.common.overrides import ConfigError
    from hpo.service.sweep import check_data

    corpus = write_token_dataset(tmp_path / "tokens", n_train=3000, n_val=1000)
    # One line for the whole sweep, from its longest trial (D rounds to whole steps of each batch size).
    warning = check_data(_sweep(corpus, tmp_path / "c", tokens_per_param=0.3))
    assert warning is not None and "passes (epochs > 1)" in warning and "\n" not in warning
    assert check_data(_sweep(corpus, tmp_path / "c", tokens_per_param=0.05)) is None
    # A vocabulary that does not fit the token files fails before any trial starts.
    with pytest.raises(ConfigError, match="tokens: trainer.model.vocab_size: 50000 differs"):
        check_data(_sweep(corpus, tmp_path / "c", model={**_config(corpus, tmp_path)["model"], "vocab_size": 50_000}))


def test_calibration_report_names_the_runs_that_repeated_data() -> None:
    from hpo.calibration.report import _repeated_markdown, repeated_data
    from predictors import Controls, Curve

    def curve(name: str, epochs: float) -> Any:
        controls = Controls(tau=0.3, tokens_per_param=20.0)
        return Curve(np.array([0.5, 1.0]), np.array([2.0, 1.9]), controls, meta={"name": name, "epochs": epochs})

    info = repeated_data([curve("a", 0.4), curve("b", 6.2), curve("c", float("nan"))])
    assert info["known"] == 2 and info["runs"] == {"b": 6.2}
    text = " ".join(_repeated_markdown(info, 3))
    assert "1 of 2 reference runs read their training split more than once" in text and "b (6.2)" in text
    assert "none" in " ".join(_repeated_markdown(repeated_data([curve("a", 0.4)]), 1))
