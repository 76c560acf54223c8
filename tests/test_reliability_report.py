"""``benchmarks/reliability.py --only-concurrency`` replaces its own section of the report and nothing else."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from reliability_concurrency import SECTION, replace_section, section  # noqa: E402

REPORT = "# R\n\n## kill\n\nkills\n\n## Concurrent appends to one curve bank\n\nappends\n\n## Bad input\n\nbad\n"


def _rows(failed: list[str]) -> list[dict]:
    return [{"code": "this branch", "case": "two sweeps", "exits": "tiny 0, tiny-b 2", "line": "error: in use",
             "held": ["1 ran"], "failed": failed, "seconds": 51.2}]


def _ref() -> dict:
    return {"decisions": [("trial 1", "trial 2"), ("trial 1",)], "compute": 0.45, "wall_s": 47.0}


def test_the_section_goes_before_bad_input_then_is_replaced_in_place() -> None:
    first = replace_section(REPORT, section(_rows([]), _ref(), "trial 1"))
    assert first.index("appends") < first.index(SECTION) < first.index("## Bad input")
    assert "**1 of 1 cases hold.**" in first and first.endswith("bad\n")
    second = replace_section(first, section(_rows(["sweep.yaml changed"]), _ref(), "trial 1", note="again"))
    assert second.count(SECTION) == 1 and "**0 of 1 cases hold.**" in second and "1 of 1" not in second
    assert second.replace(second[second.index(SECTION):second.index("## Bad input")], "") == \
        first.replace(first[first.index(SECTION):first.index("## Bad input")], "")
    assert "| sweep.yaml changed |" in second


def test_a_failed_case_is_a_row_that_says_so() -> None:
    lines = "\n".join(section(_rows(["work trained twice"]), _ref(), "trial 1"))
    assert "work trained twice" in lines and "| nothing |" not in lines
