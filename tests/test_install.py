"""A normal (non-editable) install works from any directory: build a wheel, install it into a
temporary target, and run a cut-down `hpo sweep quickstart` from a folder outside the
repository with only that target on the path (the packaged predictor and sweep config are
found with importlib.resources, not next to a checkout).

About two minutes on 2 busy cores, so it is marked slow; `.ci/run` runs it after the suite.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# What the wheel is built from: the package sources and the files pyproject.toml reads.
SOURCES = ("pyproject.toml", "README.md", "hpo", "trainers", "predictors")


@pytest.mark.slow
def test_wheel_install_runs_the_quickstart_from_outside_the_repository(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:  # a copy, so the build writes nothing into the checkout
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy2
        copy(REPO / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                            if (REPO / name).is_dir() else {}))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", RAY_USAGE_STATS_ENABLED="0")
    # Built as `pip install .` builds (an isolated build environment from PyPI).
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "-w", str(tmp_path / "dist"), str(source)], check=True, env=env, timeout=600)
    (wheel,) = (tmp_path / "dist").glob("collapse_hpo-*.whl")
    target = tmp_path / "target"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                    str(wheel)], check=True, env=env, timeout=600)
    assert (target / "hpo" / "data" / "predictors" / "default.json").is_file()
    assert not (target / "configs").exists()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env["PYTHONPATH"] = str(target)
    where = subprocess.run([sys.executable, "-c", "import hpo, hpo.data; print(hpo.__file__); "
                            "print(hpo.data.default_predictor_path())"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    assert all(line.startswith(str(target)) for line in where.stdout.split()), where.stdout
    run = subprocess.run(
        [sys.executable, str(target / "bin" / "hpo"), "sweep", "quickstart", "--output", "out",
         "--set", "trainer.tokens_per_param=2", "--set", "search_space.lr={grid: [0.01, 0.02]}",
         "--set", "scheduler.rungs=[0.5]", "--set", "ray.num_cpus=2"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    state = json.loads((elsewhere / "out" / "scheduler_state.json").read_text())
    assert len(state["trials"]) == 2 and state["rungs"][0]["decided"]
    assert (elsewhere / "out" / "report" / "report.md").exists()
