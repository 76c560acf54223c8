"""Sweep config validation: every error names its field, nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hpo.common.overrides import ConfigError, apply_overrides
from hpo.trials.sweep_config import load_sweep_config
from predictors.equations import power_lines_tau

BASE = {
    "name": "t",
    "trainer": {
        "model": {"d_model": 64, "n_layers": 2, "d_head": 32, "seq_len": 64},
        "tokens_per_param": 20, "batch_size": 2048, "tau": 0.3,
    },
    "search_space": {"lr": {"grid": [0.005, 0.01]}},
}


def _error(data: dict, *overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_sweep_config(data=data, overrides=overrides)
    return str(info.value)


def test_shipped_sweep_configs_validate() -> None:
    # Every shipped sweep config loads and holds the intended control fixed.
    for path in sorted(Path("configs/sweeps").glob("*.yaml")):
        config = load_sweep_config(path)
        assert config.search_space, path


def test_unknown_top_level_key_is_named() -> None:
    # A misspelt key is an error naming it, never a silent default.
    assert "schedular" in _error({**BASE, "schedular": {}})


def test_search_both_tau_and_weight_decay_rejected() -> None:
    # Only one of weight_decay and tau may be searched.
    data = {**BASE, "search_space": {"tau": {"grid": [0.1]}, "weight_decay": {"grid": [0.1]}}}
    assert "search_space" in _error(data)


def test_non_searchable_key_rejected() -> None:
    # Searching something the sweep cannot vary is an error naming the key.
    assert "dropout" in _error({**BASE, "search_space": {"dropout": {"grid": [0.1]}}})


def test_trial_values_are_validated_before_running() -> None:
    # A grid value that makes a trial invalid (batch not divisible by seq_len) is caught up front.
    data = {**BASE, "search_space": {"batch_size": {"grid": [2048, 1000]}}}
    message = _error(data)
    assert "batch_size" in message and "1000" in message


def test_non_positive_lr_in_grid_names_field() -> None:
    # lr <= 0 in the search space is reported with the field name.
    assert "lr" in _error({**BASE, "search_space": {"lr": {"grid": [0.01, -1.0]}}})


def test_rungs_must_be_increasing_fractions() -> None:
    # Decision fractions outside (0, 1) are refused, naming scheduler.rungs.
    assert "scheduler.rungs" in _error(BASE, "scheduler.rungs=[0.1, 1.5]")


def test_rungs_are_checked_by_the_schedulers_own_rule() -> None:
    # One home for the rung check: a rung at t̂ = 1 (it would decide after every trial
    # finished) is refused by the sweep config and by CollapseScheduler with the same words.
    from hpo.decisions.scheduler_contract import check_rungs

    with pytest.raises(ValueError) as direct:
        check_rungs([0.5, 1.0])
    message = _error(BASE, "scheduler.rungs=[0.5, 1.0]")
    assert "scheduler.rungs" in message and str(direct.value).removeprefix("rungs: ") in message
    assert check_rungs((0.1, 0.2)) == [0.1, 0.2]


def test_loguniform_needs_increasing_bounds() -> None:
    # A log-uniform range must have 0 < low < high.
    assert "search_space.lr" in _error({**BASE, "search_space": {"lr": {"loguniform": [0.1, 0.01]}}})


def test_weight_decay_search_releases_tau() -> None:
    # Searching weight_decay drops the fixed tau so τ follows λ.
    data = {**BASE, "search_space": {"weight_decay": {"grid": [0.1, 0.3]}}}
    config = load_sweep_config(data=data)
    trial = config.trial_trainer({"weight_decay": 0.1})
    assert "tau" not in trial and trial["weight_decay"] == 0.1


def test_power_lines_tau_resolves() -> None:
    # tau: power_lines sets τ from the (third-party) Power Lines law at the trainer's TPP.
    data = {**BASE, "trainer": {**BASE["trainer"], "tau": "power_lines", "tokens_per_param": 80}}
    config = load_sweep_config(data=data)
    assert config.base_trainer()["tau"] == pytest.approx(power_lines_tau(80))


def test_set_overrides_parse_yaml_values() -> None:
    # --set parses values as YAML and creates nested sections.
    out = apply_overrides({"a": {"b": 1}}, ["a.b=2.5", "c.d=[1, 2]"])
    assert out == {"a": {"b": 2.5}, "c": {"d": [1, 2]}}


def test_missing_file_is_named(tmp_path: Path) -> None:
    # A missing config file gives an error naming the path.
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_sweep_config(tmp_path / "nope.yaml")


def test_non_mapping_yaml_rejected(tmp_path: Path) -> None:
    # A YAML file that is not a mapping gives one clear error naming the file.
    path = tmp_path / "list.yaml"
    path.write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(ConfigError, match="list.yaml"):
        load_sweep_config(path)


def test_margin_defaults_to_calibrated_and_bad_margins_name_the_field() -> None:
    # The keep-margin defaults to the predictor's calibrated ranking error; a fixed log margin
    # works; a negative number, an unknown word or a mapping is refused in one line naming the
    # field, as is a negative margin_z (the collapse rule's knob: its constructor says so).
    assert load_sweep_config(data=BASE).scheduler.margin == "calibrated"
    assert load_sweep_config(data=BASE, overrides=("scheduler.margin=0.02",)).scheduler.margin == 0.02
    for bad in ("scheduler.margin=-1", "scheduler.margin=wide", "scheduler.margin={0.25: 1.0}"):
        message = _error(BASE, bad)
        assert "scheduler.margin" in message and "\n" not in message.strip()
    for bad in ("scheduler.margin_z=-2", "scheduler.rule.margin_z=-2", "scheduler.rule={name: collapse, margin_z: -2}"):
        message = _error(BASE, bad)
        assert "scheduler.rule" in message and "margin_z: must be" in message and "\n" not in message.strip()
    assert load_sweep_config(data=BASE, overrides=("scheduler.rule.margin_z=1",)).scheduler.rule["margin_z"] == 1.0


def test_tolerance_defaults_to_the_seed_noise_and_is_in_loss_units() -> None:
    # scheduler.tolerance: None (the predictor's measured seed noise) by default, a loss
    # difference when given; a negative one is refused naming the field.
    assert load_sweep_config(data=BASE).scheduler.tolerance is None
    assert load_sweep_config(data=BASE, overrides=("scheduler.tolerance=0.01",)).scheduler.tolerance == 0.01
    assert "scheduler.tolerance" in _error(BASE, "scheduler.tolerance=-0.1")


def test_a_sweeps_artifacts_stay_in_its_output_folder(tmp_path) -> None:
    # With a custom SQLite (or database) store MLflow's default artifact root is ./mlruns in
    # the driver's working directory; the sweep points new experiments at its own folder.
    from bad_input_cases import sweep_config
    from hpo.service.sweep import artifact_location
    from hpo.trials.sweep_config import load_sweep_config

    for uri, expected in ((None, True), (f"sqlite:///{tmp_path}/m.db", True),
                          ("postgresql://db/mlflow", True), ("http://127.0.0.1:5000", False)):
        changes = {"mlflow.tracking_uri": uri} if uri else {}
        config = load_sweep_config(data=sweep_config(output_dir=str(tmp_path / "out"), **changes), source="s.yaml")
        where = artifact_location(config, tmp_path / "out")
        assert (where == (tmp_path / "out" / "mlartifacts").as_uri()) if expected else where is None, uri


def test_limits_are_stated_and_can_be_raised() -> None:
    # Trial counts and TPP beyond the stated limits are refused up front, naming the limit;
    # raising it runs them. A name that reads as a number stays a name.
    from bad_input_cases import sweep_config
    from hpo.common.overrides import ConfigError
    from hpo.trials.sweep_config import load_sweep_config

    with pytest.raises(ConfigError, match=r"3 x 4 grid point\(s\) = 12 trials, above limits.max_trials 10"):
        load_sweep_config(data=sweep_config(num_samples=3, **{"search_space.lr": {"grid": [0.01, 0.02, 0.03, 0.04]},
                                                            "limits.max_trials": 10}), source="s.yaml")
    assert load_sweep_config(data=sweep_config(num_samples=3, **{"limits.max_trials": 10}), source="s.yaml")
    with pytest.raises(ConfigError, match="tokens_per_param: 50 is above limits.max_tokens_per_param 40"):
        load_sweep_config(data=sweep_config(**{"trainer.tokens_per_param": 50, "limits.max_tokens_per_param": 40}),
                          source="s.yaml")
    assert load_sweep_config(data=sweep_config(name="nan"), source="s.yaml").name == "nan"
    for text in ("inf", "-Infinity", " NaN "):
        with pytest.raises(ConfigError, match="trainer.tau: .* is not a finite number"):
            load_sweep_config(data=sweep_config(**{"trainer.tau": text}), source="s.yaml")


def test_a_boolean_is_not_a_number() -> None:
    # pydantic reads `tau: true` as 1.0 and `batch_size: true` as 1: a typo that would train.
    assert "tau: Value error, true is a boolean, not a number" in _error(BASE, "trainer.tau=true")
    assert "boolean" in _error(BASE, "search_space.lr.grid=[0.01, true]")
    assert "boolean" in _error(BASE, "scheduler.reduction_factor=true")
    assert load_sweep_config(data=BASE, overrides=("monitor.enabled=false",)).monitor.enabled is False


def test_empty_search_space_and_empty_output_dir_are_refused() -> None:
    assert "search_space: Value error, empty" in _error({**BASE, "search_space": {}})
    assert "search_space: Value error, empty" in _error({k: v for k, v in BASE.items() if k != "search_space"})
    assert "output_dir: Value error, empty path" in _error({**BASE, "output_dir": ""})


def test_experiment_name_longer_than_mlflow_takes_is_refused() -> None:
    assert "mlflow.experiment: Value error, 501 characters" in _error({**BASE, "mlflow": {"experiment": "x" * 501}})
    assert load_sweep_config(data={**BASE, "mlflow": {"experiment": "x" * 500}}).mlflow.experiment == "x" * 500


def test_metric_is_the_train_or_the_validation_loss() -> None:
    # scheduler.metric names a loss the trainer reports at every result: the smoothed training
    # loss (default) or the validation loss, which then is evaluated at every report.
    assert load_sweep_config(data=BASE).scheduler.metric == "loss"
    assert "eval_every" not in load_sweep_config(data=BASE).base_trainer()
    config = load_sweep_config(data=BASE, overrides=("scheduler.metric=val_loss", "trainer.log_every=7"))
    assert config.base_trainer()["eval_every"] == 7
    assert config.trial_trainer({"lr": 0.01})["eval_every"] == 7
    every_other = _error(BASE, "scheduler.metric=val_loss", "trainer.log_every=5", "trainer.eval_every=10")
    assert "scheduler.metric" in every_other and "trainer.eval_every" in every_other and "(5)" in every_other
    unknown = _error(BASE, "scheduler.metric=accuracy")
    assert "scheduler.metric" in unknown and "'accuracy'" in unknown and "val_loss" in unknown
