"""The ``Example:`` blocks in the docstrings of the public entry points run, and say what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest

# Modules whose docstrings carry runnable examples (each example runs in well under 2 s).
MODULES = ("predictors.predictor", "predictors.controls", "predictors.fit", "hpo.curve_import", "hpo.tables", "hpo.scheduler",
           "hpo.output_lock", "hpo.tracking")


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.attempted > 0, f"{name}: no examples found"
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} example lines failed"
