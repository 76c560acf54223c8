"""How model size enters the shipped predictor (hpo/calibration/size_choice.py): the choice within noise."""

from __future__ import annotations

from hpo.calibration.size_choice import pick_within_noise


def test_size_method_falls_back_to_the_simpler_when_the_gain_is_within_noise() -> None:
    # Leave-one-size-out scores per held-out size (N: mean RMS over s ≤ 0.3), simplest method first.
    # The trend's lower mean comes from one size's luck (it loses at another): within noise,
    # so the simpler method is shipped, and the rule says why.
    lucky = {"reference curves": {1e4: 0.050, 1e5: 0.006, 1e6: 0.007, 4e6: 0.008},
             "surrogate": {1e4: 0.050, 1e5: 0.005, 1e6: 0.006, 4e6: 0.007},
             "size term": {1e4: 0.004, 1e5: 0.012, 1e6: 0.006, 4e6: 0.007}}
    name, why = pick_within_noise(lucky)
    assert name == "reference curves" and "within 2 standard errors" in why and "size term scored lower" in why
    # The same mean gain, won at every size by about the same margin: the complex method.
    steady = {"reference curves": {1e4: 0.020, 1e5: 0.021, 1e6: 0.019, 4e6: 0.020},
              "surrogate": {1e4: 0.020, 1e5: 0.021, 1e6: 0.019, 4e6: 0.020},
              "size term": {1e4: 0.005, 1e5: 0.005, 1e6: 0.004, 4e6: 0.006}}
    assert pick_within_noise(steady)[0] == "size term"
    # A gain over the surrogate but not over the nearer simpler method: that simpler method.
    middle = {"reference curves": {1e4: 0.030, 1e5: 0.031, 1e6: 0.029},
              "surrogate": {1e4: 0.010, 1e5: 0.011, 1e6: 0.009},
              "size term": {1e4: 0.002, 1e5: 0.016, 1e6: 0.003}}
    assert pick_within_noise(middle)[0] == "surrogate"
    # One size in common: the noise is unknown and the simplest stands.
    assert pick_within_noise({"reference curves": {1e5: 0.02}, "size term": {1e5: 0.001}})[0] == (
        "reference curves")
