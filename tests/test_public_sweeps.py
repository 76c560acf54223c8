"""benchmarks/public_sweeps.py and the packaged public curves: the bench's sweeps and noise come from
the packaged logs, defaults are chosen without the held-out schedule family, and a sweep far beyond
its predictor's sizes says so and ranks by the losses."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import public_sweeps  # noqa: E402
from hpo.trials.rule_replay import Row  # noqa: E402
from hpo.calibration.log_import import load_curve_bench, rerun_spread  # noqa: E402
from hpo.data import default_predictor_path, public_curves_path  # noqa: E402
from hpo.trials.replay import curve_sweeps  # noqa: E402
from predictors import Controls, Predictor  # noqa: E402


@pytest.fixture(scope="module")
def bench():
    return load_curve_bench(public_curves_path())


def test_the_packaged_curves_hold_24_sweeps_of_124m_and_24_calibration_runs(bench):
    calibration, big, corpus = public_sweeps.split(bench, public_sweeps.CALIBRATE_MAX_PARAMS)
    sweeps, _ = curve_sweeps(big)
    assert corpus == "slimpajama" and len(sweeps) == 24
    assert sorted({round(c.controls.n_params / 1e6) for c in calibration}) == [14, 27, 34, 61]
    assert len(calibration) == 24
    arms = sorted(len(v) for v in sweeps.values())
    assert arms[0] == 2 and arms[-1] == 5
    families = {public_sweeps.family(v[0]) for v in sweeps.values()}
    assert families == set(public_sweeps.FAMILIES)
    # No sweep mixes two experiments or holds one η twice.
    for members in sweeps.values():
        etas = [c.meta["eta"] for c in members]
        assert len(set(etas)) == len(etas) and len({c.meta["project"] for c in members}) == 1


def test_the_noise_yardstick_is_the_reruns_spread(bench):
    spread = rerun_spread(bench)
    assert len(spread["pairs"]) == 4
    assert spread["rms_difference"] == pytest.approx(0.00238, abs=5e-5)


def _row(sweep: str, family: str, setting: str, compute: float, ok: bool) -> Row:
    row = Row(sweep, 0, "collapse", setting, False, compute, 0.0 if ok else 0.1, "a", "a", ok, ok, best_kept=ok)
    row.bank = family
    return row


def test_the_held_out_family_never_chooses_its_own_default():
    # "cheap" is safe on every family but "wsd-long"; "dear" is safe everywhere. Held out,
    # wsd-long gets "cheap" (chosen on the others, where it is safe), even though it fails there;
    # every other family gets "dear", since wsd-long's failure of "cheap" counts against it.
    rows = []
    for family in ("cosine", "constant", "wsd-long"):
        for i in range(4):
            rows.append(_row(f"{family}{i}", family, "cheap", 0.2, family != "wsd-long"))
            rows.append(_row(f"{family}{i}", family, "dear", 0.6, True))
    held = public_sweeps.held_out_by_family(rows)
    assert held["wsd-long"]["chosen"] == "cheap"
    assert held["cosine"]["chosen"] == held["constant"]["chosen"] == "dear"
    assert all(r.bank == "wsd-long" for r in held["wsd-long"]["rows"])


def test_a_124m_sweep_with_the_cpu_predictor_says_so_and_ranks_by_the_losses():
    cpu = Predictor.load(default_predictor_path())
    note = cpu.off_scale_note(85e6)
    assert note is not None and "71× beyond" in note and note.count("\n") == 0
    order = cpu.ranking_order(0.3, "eta_fixed_lambda", [Controls(0.5, 30.0, n_params=85e6)])
    assert order.weight == 0.0 and "beyond the calibrated model sizes" in order.words
    insisted = Predictor.load(default_predictor_path())
    import dataclasses

    insisted = dataclasses.replace(insisted, trust_off_scale=True)
    assert "beyond the calibrated model sizes" not in insisted.ranking_order(
        0.3, "eta_fixed_lambda", [Controls(0.5, 30.0, n_params=85e6)]).words
    assert cpu.off_scale_note(1e6) is None


def test_the_packaged_predictor_follows_the_model_size():
    assert default_predictor_path().name == "default.json"
    assert default_predictor_path(2e5).name == "default.json"
    assert default_predictor_path(85e6).name == "public_lm.json"
    public = Predictor.load(default_predictor_path(85e6))
    assert public.off_scale_note(85e6) is None and public.metric == "val_loss"


def test_a_sweep_starts_with_one_line_on_its_predictor_and_warns_far_beyond_it(tmp_path):
    # The quickstart's 0.1M model with its packaged CPU predictor: one line, no warning. The same
    # sweep at 85M non-embedding parameters (d 768, 12 layers) with the CPU predictor named: a warning.
    import yaml

    from hpo.data import packaged_sweep
    from hpo.service.sweep import predictor_line
    from hpo.trials.sweep_config import load_sweep_config

    small = load_sweep_config(str(packaged_sweep("quickstart")))
    line = predictor_line(small, Predictor.load(small.predictor_path()))
    assert line.startswith("predictor: packaged default.json (fitted at N = 2.37e+04–1.2e+06); this sweep's N = ")
    assert "\n" not in line
    raw = yaml.safe_load(packaged_sweep("quickstart").read_text())
    raw["trainer"]["model"].update(d_model=768, n_layers=12, d_head=64)
    raw["predictor"] = str(default_predictor_path())
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(raw))
    big = load_sweep_config(str(path))
    assert big.n_params() > 8e7
    lines = predictor_line(big, Predictor.load(big.predictor_path())).splitlines()
    assert len(lines) == 2 and lines[1].startswith("warning: predictor fitted at N = 2.37e+04–1.2e+06")
    assert "ranks by the losses at the rung" in lines[1]
    # Without a predictor named, the sweep at 85M deciding on the validation loss gets the packaged
    # public-LM predictor; deciding on the training loss, the CPU one (the only one fitted on it),
    # and the warning says which metric would use the nearer one.
    del raw["predictor"]
    raw.setdefault("scheduler", {})["metric"] = "val_loss"
    raw["trainer"].pop("eval_every", None)  # deciding on val_loss evaluates at every report
    path.write_text(yaml.safe_dump(raw))
    assert load_sweep_config(str(path)).predictor_path().name == "public_lm.json"
    # Deciding on the training loss, 71x beyond the CPU predictor (the only one fitted on it): still
    # the public one, which the sweep's metric check refuses in one line naming the fix.
    raw["scheduler"]["metric"] = "loss"
    path.write_text(yaml.safe_dump(raw))
    assert load_sweep_config(str(path)).predictor_path().name == "public_lm.json"
