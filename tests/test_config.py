"""TrainConfig validation (errors name the field) and the derived RunControls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from predictors.equations import adamw_timescale
from trainers.config import (
    ModelConfig,
    TrainConfig,
    default_ffn_dim,
    load_train_config,
    override,
    run_controls,
)

REPO = Path(__file__).resolve().parents[1]


def _named_fields(error: ValidationError) -> set[str]:
    """Fields an error names: its location, or the field a validator message starts with."""
    names = set()
    for item in error.errors():
        names.add(".".join(str(part) for part in item["loc"]))
        message = item["msg"].removeprefix("Value error, ")
        names.add(message.split(":", 1)[0])
    return names


def _config(**updates: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"model": {"d_model": 64, "n_layers": 2, "seq_len": 64}, "batch_size": 2048, "tau": 0.3}
    data.update(updates)
    return data


def test_unknown_top_level_key_is_named() -> None:
    # A misspelt key is an error that names it.
    with pytest.raises(ValidationError) as error:
        TrainConfig.model_validate(_config(learning_rate=0.1))
    assert "learning_rate" in _named_fields(error.value)


def test_unknown_nested_key_is_named() -> None:
    # Unknown keys inside a section are errors too, with the section in the location.
    with pytest.raises(ValidationError) as error:
        TrainConfig.model_validate(_config(model={"width": 64}))
    assert "model.width" in _named_fields(error.value)


@pytest.mark.parametrize("field", ["lr", "tau", "tokens_per_param", "batch_size"])
@pytest.mark.parametrize("value", [0, -1])
def test_non_positive_values_name_the_field(field: str, value: float) -> None:
    # lr, tau, TPP and batch must be > 0; the error names the field.
    with pytest.raises(ValidationError) as error:
        TrainConfig.model_validate(_config(**{field: value}))
    assert field in _named_fields(error.value)


@pytest.mark.parametrize(
    ("updates", "field"),
    [
        ({"warmup_fraction": 1.5}, "warmup_fraction"),
        ({"warmup_fraction": -0.1}, "warmup_fraction"),
        ({"warmup_fraction": 1.0}, "warmup_fraction"),  # nothing left after warmup
        ({"decay_fraction": 1.2}, "decay_fraction"),
        ({"data": {"val_fraction": 1.0}}, "data.val_fraction"),
        ({"data": {"val_fraction": -0.2}}, "data.val_fraction"),
    ],
)
def test_fractions_outside_unit_interval_name_the_field(updates: dict, field: str) -> None:
    # Fractions must lie in [0, 1] (warmup < 1, validation in (0, 1)); the error names the field.
    with pytest.raises(ValidationError) as error:
        TrainConfig.model_validate(_config(**updates))
    assert field in _named_fields(error.value)


def test_batch_not_divisible_by_seq_len_is_named() -> None:
    # B is in tokens and must be whole sequences.
    with pytest.raises(ValidationError) as error:
        TrainConfig.model_validate(_config(batch_size=2000))
    assert "batch_size" in _named_fields(error.value)


def test_micro_batch_must_divide_batch() -> None:
    # Gradient accumulation needs B to be a whole number of micro-batches.
    with pytest.raises(ValidationError) as error:
        TrainConfig.model_validate(_config(micro_batch_size=1536))
    assert "micro_batch_size" in _named_fields(error.value)


def test_both_tau_and_weight_decay_is_an_error() -> None:
    # τ and λ are two names for one degree of freedom: give exactly one.
    with pytest.raises(ValidationError) as error:
        TrainConfig.model_validate(_config(weight_decay=0.1))
    assert "tau, weight_decay" in _named_fields(error.value)


def test_neither_tau_nor_weight_decay_is_an_error() -> None:
    # ... and at least one.
    data = _config()
    del data["tau"]
    with pytest.raises(ValidationError) as error:
        TrainConfig.model_validate(data)
    assert "tau, weight_decay" in _named_fields(error.value)


def test_heads_given_twice_is_an_error() -> None:
    # d_head and n_heads are alternatives.
    with pytest.raises(ValidationError) as error:
        ModelConfig(d_model=64, d_head=32, n_heads=2)
    assert "model.d_head, model.n_heads" in _named_fields(error.value)


def test_total_tokens_are_whole_steps_near_tpp() -> None:
    controls = run_controls(TrainConfig.model_validate(_config()))
    # D = steps·B exactly, and D/N is within half a batch of the requested TPP.
    assert controls.total_tokens == controls.total_steps * controls.batch_size
    assert abs(controls.total_tokens - 20 * controls.n_params) <= controls.batch_size / 2
    assert controls.tokens_per_param == controls.total_tokens / controls.n_params


def test_tau_and_weight_decay_round_trip() -> None:
    from_tau = run_controls(TrainConfig.model_validate(_config(tau=0.25)))
    # λ solved from τ gives back τ through Eq. 2, and a config holding that λ has the same τ.
    assert adamw_timescale(from_tau.batch_size, from_tau.lr, from_tau.weight_decay, from_tau.total_tokens) == pytest.approx(0.25)
    from_lambda = run_controls(TrainConfig.model_validate(_config(tau=None, weight_decay=from_tau.weight_decay)))
    assert from_lambda.tau == pytest.approx(0.25)


def test_hidden_lr_and_decay_scale_with_width() -> None:
    controls = run_controls(TrainConfig.model_validate(_config(model={"d_model": 256, "seq_len": 64, "base_d_model": 64})))
    # Hidden matrices see η/m_N and λ·m_N, so their product equals the base product.
    assert controls.width_multiplier == 4.0
    assert controls.eta_hidden == pytest.approx(controls.lr / 4)
    assert controls.eta_hidden * controls.lambda_hidden == pytest.approx(controls.lr * controls.weight_decay)


def test_controls_dict_is_flat_and_has_the_report_keys() -> None:
    flat = run_controls(TrainConfig.model_validate(_config(schedule="wsd"))).to_dict()
    # The schedule is flattened into the keys the predictor's Controls reads.
    assert flat["schedule"] == "wsd" and flat["warmup_fraction"] == 0.1 and flat["decay_fraction"] == 0.2
    assert all(not isinstance(value, dict) for value in flat.values())
    assert {"tau", "tokens_per_param", "n_params", "total_tokens"} <= set(flat)


def test_default_ffn_dim_is_multiple_of_16_near_8_thirds() -> None:
    # d_ff defaults to 8/3·d rounded to a multiple of 16.
    for d_model in (32, 64, 96, 128, 256, 768):
        d_ff = default_ffn_dim(d_model)
        assert d_ff % 16 == 0 and abs(d_ff - 8 * d_model / 3) <= 8


def test_load_yaml_and_shipped_configs(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(_config(lr=0.003)))
    # A YAML file validates to the same config as the mapping.
    assert load_train_config(path) == TrainConfig.model_validate(_config(lr=0.003))
    # The shipped configs validate.
    for name in ("tiny.yaml", "reference.yaml"):
        assert load_train_config(REPO / "configs" / "train" / name).tokens_per_param == 20


def test_override_revalidates_and_switches_tau_for_weight_decay() -> None:
    config = TrainConfig.model_validate(_config())
    changed = override(config, {"model.d_model": 128, "weight_decay": 0.1})
    # Dotted keys reach nested fields; setting λ clears τ; bad values still fail.
    assert changed.model.d_model == 128 and changed.tau is None and changed.weight_decay == 0.1
    with pytest.raises(ValidationError) as error:
        override(config, {"lr": -1.0})
    assert "lr" in _named_fields(error.value)


def test_schedule_floor_and_cooldown_shape_reach_the_trainer_schedule() -> None:
    # cosine to 10% and a WSD 1-sqrt cooldown: the config builds them, the flat dict carries them.
    cosine = TrainConfig.model_validate(_config(schedule="cosine", final_fraction=0.1))
    assert cosine.lr_schedule.at(1.0) == pytest.approx(0.1)
    wsd = TrainConfig.model_validate(_config(schedule="wsd", decay_fraction=0.2, decay_shape="sqrt"))
    assert wsd.lr_schedule.decay_shape == "sqrt" and wsd.lr_schedule.at(0.9) == pytest.approx(1 - 0.5 ** 0.5)
    flat = run_controls(wsd).to_dict()
    assert (flat["schedule"], flat["decay_shape"], flat["final_fraction"]) == ("wsd", "sqrt", 0.0)


@pytest.mark.parametrize(
    ("updates", "field"),
    [({"final_fraction": 1.0}, "final_fraction"), ({"final_fraction": -0.1}, "final_fraction"),
     ({"decay_shape": "cubic"}, "decay_shape"), ({"schedule": "logged"}, "schedule")],
)
def test_bad_floor_shape_or_logged_schedule_name_the_field(updates: dict, field: str) -> None:
    # A trainer runs named schedules only; a floor of 1 or an unknown shape is named.
    with pytest.raises(ValidationError) as error:
        TrainConfig.model_validate(_config(**updates))
    assert field in _named_fields(error.value)
