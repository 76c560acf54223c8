"""Shared test setup: one CPU thread and a private corpus cache per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _single_thread_and_private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    # One thread: tests share a small machine, and results depend on the thread count.
    torch.set_num_threads(1)
    # The corpus cache goes to a temporary directory, never the user's ~/.cache.
    os.environ["COLLAPSE_HPO_CACHE"] = str(Path(tmp_path_factory.mktemp("corpus-cache")))
