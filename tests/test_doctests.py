"""The ``Example:`` blocks in the docstrings run, in every module that has one, and say what they show."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("predictors", "hpo", "trainers")


def modules_with_examples() -> list[str]:
    """Every module of the packages whose source holds a doctest prompt, derived from the tree
    (a hand-kept list left examples unrun)."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if ">>> " in path.read_text(encoding="utf-8"):
                parts = path.relative_to(ROOT).with_suffix("").parts
                found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


MODULES = modules_with_examples()


def test_the_list_is_derived_and_covers_the_known_examples() -> None:
    assert {"predictors.ranking", "hpo.decisions.keep.evidence", "hpo.trials.simulator", "predictors.curves",
            "predictors.references"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.attempted > 0, f"{name}: no examples found"
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} example lines failed"
