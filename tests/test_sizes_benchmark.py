"""benchmarks/sizes.py on the committed width-ladder bank: every method is scored on the held-out
widths, through the calibration a user would run, and too few widths is a clear error."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("sizes_benchmark", REPO / "benchmarks" / "sizes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


# The benchmark's own report (20 s on 2 cores): with the slow tests in .ci/run.
@pytest.mark.slow
def test_sizes_report_scores_every_method_on_the_largest_widths(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    md = tmp_path / "sizes.md"
    # One split (the headline one: calibrate on the 4 smallest widths); the benchmark runs all.
    assert _module().main(["--md", str(md), "--splits", "4"]) == 0
    text = md.read_text()
    rows = {}
    for label in ("surrogate (no size term)", "size term", "reference curves, size-term trend",
                  "nearest width (reference curves, held)", "oracle"):
        line = next(line for line in text.splitlines() if line.startswith(f"| {label}"))
        rows[label] = [cell.strip() for cell in line.strip("|").split("|")]
    # Every method's curve MAE is scored, reference curves included, against one oracle.
    assert all(cells[1].endswith("%") for cells in rows.values()), rows
    assert "beyond the largest calibrated size" in text
    # Coverage is shown beside the interval it covers, and by distance beyond the calibration.
    assert "stated ±2σ (mean)" in text and "## Coverage by distance" in text and "| 2–4×" in text
    assert "outside their stated ±2σ:" in text  # the misses listed one by one (or "none")
    # The band against the error it states, and the curve MAE per distance (issue 28).
    assert "±2σ / RMS error (target ≤ 2.5×)" in text and "| curve MAE (× oracle)" in text
    # The targets over every split: the default's MAE at s ≤ 0.3 against the best single method's
    # (1.00× where it is the best), and whether it is ever worse than the nearest width.
    targets = text.split("## Targets, over every split")[1].split("## Coverage by distance")[0]
    chosen = next(line for line in targets.splitlines() if line.startswith("| chosen"))
    cells = [cell.strip() for cell in chosen.strip("|").split("|")]
    assert cells[3].endswith("%") and cells[4].endswith("×") and float(cells[4][:-1]) >= 1.0
    assert cells[5] in ("yes",) or cells[5].startswith("no (s = ")


def test_too_few_widths_is_refused(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert _module().main(["--held", "9", "--md", "/dev/null"]) == 2
    assert "widths banked" in capsys.readouterr().err


def test_predictors_as_they_ship_are_scored_per_width(tmp_path, monkeypatch, capsys):
    # --predictors: no calibration; each file predicts every ladder width as it is, and each row
    # says whether that width is one of its calibrated sizes (issue 28): the shipped predictor holds
    # every ladder width (in-sample), a 0.1M predictor calibrated on other runs holds one.
    monkeypatch.chdir(REPO)
    md = tmp_path / "shipped.md"

    def calibrated_column(predictor: str) -> dict[str, str]:
        assert _module().main(["--predictors", predictor, "--md", str(md)]) == 0
        rows = [line for line in md.read_text().splitlines() if line.startswith("|") and "%" in line]
        cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
        assert [c[1] for c in cells][-1] == "all widths" and len(cells) == 7  # six ladder widths and the pool
        return {c[1]: c[2] for c in cells[:-1]}

    shipped = calibrated_column("hpo/data/predictors/default.json")
    assert set(shipped.values()) == {"yes, these runs (in-sample)"}, shipped
    one_size = calibrated_column("configs/predictors/reference_wide.json")
    assert one_size["100,672"] == "yes, other runs" and one_size["1,198,176"] == "no"
    assert _module().main(["--predictors", str(tmp_path / "none.json"), "--md", str(md)]) == 2
    assert "none.json: no such file" in capsys.readouterr().err
