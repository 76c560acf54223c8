"""The project's one markdown-table renderer (reports, calibration, benchmarks)."""

from __future__ import annotations

from typing import Any, Sequence


def cell(value: Any) -> str:
    """A value as table text: ``|`` escaped (it would end the cell), None as an em dash."""
    if value is None:
        return "—"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence[Any], rows: Sequence[Sequence[Any]], *, pad: bool = True) -> str:
    """A markdown table of ``rows`` under ``headers``; each cell is ``str()``-ed by :func:`cell`.

    With ``pad`` (default) columns are padded to a common width so the table also reads as
    plain text in a terminal or log.

    Example:
        >>> print(markdown_table(["s", "regret"], [[0.1, "0.0021"], [0.2, None]]))
        | s   | regret |
        |-----|--------|
        | 0.1 | 0.0021 |
        | 0.2 | —      |
    """
    text = [[cell(h) for h in headers]] + [[cell(c) for c in row] for row in rows]
    if any(len(r) != len(headers) for r in text):
        raise ValueError("markdown_table: every row needs one cell per header")
    if not pad:
        lines = ["| " + " | ".join(r) + " |" for r in text]
        return "\n".join([lines[0], "|" + "|".join("---" for _ in headers) + "|", *lines[1:]])
    widths = [max(len(r[i]) for r in text) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(text[0]), sep, *(line(r) for r in text[1:])])
