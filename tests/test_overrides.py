"""YAML configs and `--set` values read strictly and within bounds (hpo.common.overrides)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpo.common.overrides import MAX_YAML_DEPTH, ConfigError, apply_overrides, read_yaml

BOMB = "l0: &l0 [a, a, a, a, a, a, a, a, a]\n" + "".join(
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9))


@pytest.mark.parametrize("text, problem", [
    ("a: &x [1, *x]\n", "recursive alias"),
    ("a: &x {b: *x}\n", "recursive alias"),
    ("a: " + "[" * 1000 + "]" * 1000 + "\n", "nested deeper than"),
    ("a:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(1000)) + "  " * 1001 + "v: 1\n", "nested deeper than"),
    ("a: " + "[" * (MAX_YAML_DEPTH + 5) + "]" * (MAX_YAML_DEPTH + 5) + "\n", "nested deeper than"),
    (BOMB, "aliases are expanded"),
])
def test_hostile_yaml_is_one_error_naming_the_file_within_seconds(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    began = time.perf_counter()
    with pytest.raises(ConfigError, match=f"s.yaml: not valid YAML: .*{problem}"):
        read_yaml(str(path))
    assert time.perf_counter() - began < 10  # the bomb used to give no answer in 120 s


def test_shared_aliases_within_bounds_still_load(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("base: &b {lr: 0.01, tau: 0.3}\none: *b\ntwo: {<<: *b, seed: 2}\n")
    assert read_yaml(str(path)) == {"base": {"lr": 0.01, "tau": 0.3}, "one": {"lr": 0.01, "tau": 0.3},
                                    "two": {"lr": 0.01, "tau": 0.3, "seed": 2}}


@pytest.mark.parametrize("value, problem", [
    ("&a [*a]", "recursive alias"),
    ("[" * 1000 + "]" * 1000, "nested deeper than"),
    ("{" + "a: {" * 999 + "}" * 1000, "nested deeper than"),
])
def test_hostile_set_values_are_refused_with_a_short_line(value: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=f"--set trainer.tau: cannot parse value .*{problem}") as caught:
        apply_overrides({}, [f"trainer.tau={value}"])
    assert len(str(caught.value)) < 300  # a 2,000-character value is not echoed whole
