"""What the README and the CI script promise about the project itself: the Ray pin it quotes is
pyproject's, every test kept out of the default run (marked slow) runs in `.ci/run`, and every
positional argument of the CLI says what it is in `--help`."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_ray_pin_quoted_in_the_readme_is_pyprojects() -> None:
    pin = re.search(r'"(ray\[[^"]*)"', (REPO / "pyproject.toml").read_text()).group(1)
    quoted = re.findall(r"`(ray\[[^`]*)`", (REPO / "README.md").read_text())
    assert quoted and all(q == pin for q in quoted), (quoted, pin)


def test_every_slow_test_runs_in_ci() -> None:
    # A test marked slow is left out of `python -m pytest`; .ci/run must run it (one of them,
    # test_compiled_run_matches_eager_and_resumes, ran nowhere).
    slow_files = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "tests").glob("test_*.py")
                        if "@pytest.mark.slow" in p.read_text())
    assert slow_files
    runs = [shlex.split(line) for line in (REPO / ".ci" / "run").read_text().splitlines()
            if "pytest" in line and not line.lstrip().startswith("#")]
    slow_runs = [args for args in runs if "-m" in args and args[args.index("-m") + 1] in ("slow", "pytest")
                 and "slow" in args]
    assert slow_runs, runs
    for args in slow_runs:
        paths = [a for a in args if a.startswith("tests")]
        missing = [f for f in slow_files if paths and not any(f == p or f.startswith(p.rstrip("/") + "/")
                                                               for p in paths)]
        assert not missing, f".ci/run's slow run leaves out {missing}"


def test_every_positional_argument_has_help() -> None:
    from hpo.service.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    bare = [f"{name} {action.dest}" for name, sub in commands.items() for action in sub._actions
            if not action.option_strings and not action.help]
    assert not bare, f"positional arguments without help: {bare}"


def test_the_readme_is_one_screen_of_user_text() -> None:
    # A README a user reads in minutes: at most 300 lines, no issue numbers (they mean nothing
    # to a user; results and their history live in docs/).
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert not re.findall(r"(?i)\bissues? \d+", readme)


def test_the_readme_quickstart_block_is_the_recorded_output() -> None:
    # The block a user compares with their terminal is what `hpo sweep quickstart` printed in a
    # real run (benchmarks/quickstart_output.py writes docs/quickstart_output.txt and the block).
    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- quickstart output -->", 1)[1].split("```", 2)[1].split("\n", 1)[1]
    recorded = (REPO / "docs" / "quickstart_output.txt").read_text()
    assert block == recorded
    assert "Early answer (at 30% of training)" in block and "compute used: " in block
