"""benchmarks/monitor_public.py: the monitor at real scale (the packaged public 124M curves)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import monitor_public  # noqa: E402


def test_the_section_is_replaced_in_place_and_kept_by_the_small_scale_benchmark(tmp_path):
    doc = tmp_path / "monitor.md"
    doc.write_text("# Monitor\n\n## Predictor mode\n\nold table\n")
    monitor_public.write_section([monitor_public.HEADING, "", "first"], doc)
    monitor_public.write_section([monitor_public.HEADING, "", "second"], doc)
    text = doc.read_text()
    assert text.count(monitor_public.HEADING) == 1 and "second" in text and "first" not in text
    assert text.startswith("# Monitor\n\n## Predictor mode\n\nold table\n")
    # benchmarks/monitor.py rewrites everything above and appends what kept_section returns.
    assert monitor_public.kept_section(doc) == ["", monitor_public.HEADING, "", "second"]
    doc.write_text(text.replace("old table", "new table") + "\n## Real faults\n\nrows\n")
    monitor_public.write_section([monitor_public.HEADING, "", "third"], doc)
    assert "## Real faults\n\nrows" in doc.read_text() and "third" in doc.read_text()


def test_the_public_re_runs_pair_with_their_originals_only_when_one_seed_may_pair():
    # The grad_norm/ re-runs repeat their run's settings, seed and data order included: as
    # reference runs they pair with their original only when asked (same_seed), and only with it.
    from hpo.calibration.log_import import load_curve_bench
    from predictors.monitor import pair_changes, pair_contrasts

    logs = load_curve_bench(monitor_public.packaged_curves())
    by_name = {c.meta["name"]: c for c in logs.curves}
    pairs = [(by_name[a], by_name[b]) for a, b in sorted(logs.reruns.items())]
    assert len(pairs) == 4
    curves = [c for pair in pairs for c in pair]
    assert pair_changes(curves).shape[0] == 0
    assert pair_changes(curves, same_seed=True).shape[0] == 8
    assert pair_contrasts(curves, same_seed=True) == 4
    rerun, original = pairs[0]
    assert rerun.final_loss == pytest.approx(original.final_loss, rel=0.01)
