"""The markdown-table renderer (hpo/common/tables.py)."""

import doctest

import pytest

import hpo.common.tables
from hpo.common.tables import markdown_table


def test_docstring_example_runs() -> None:
    assert doctest.testmod(hpo.common.tables).failed == 0


def test_pipes_are_escaped_and_rows_checked() -> None:
    # A "|" inside a cell must not split it; a short row is an error, not a shifted table.
    assert "a\\|b" in markdown_table(["x"], [["a|b"]])
    with pytest.raises(ValueError, match="one cell per header"):
        markdown_table(["x", "y"], [["only one"]])
    assert markdown_table(["x"], [[1]], pad=False).splitlines()[1] == "|---|"
