"""hpo calibrate --corpus DIR --budget TIME: the paper's protocol as one command (small runs of the
user's own corpus, a model at most a quarter of the sweep's size, within the budget)."""

from __future__ import annotations

import json

import pytest

from hpo.calibration import own_corpus
from hpo.calibration.own_corpus import FEWEST_RUNS, MIN_RUNS, WIDTHS, Probe, fit_seconds, parse_budget, plan
from hpo.service.cli import main


def test_the_plan_fits_the_budget_and_a_quarter_of_the_sweep() -> None:
    small = plan(budget_s=600, tokens_per_second=150_000)
    large = plan(budget_s=3600, tokens_per_second=150_000)
    assert small.estimated_s <= 600 and large.estimated_s <= 3600 and len(large.runs) >= len(small.runs) >= MIN_RUNS
    # A bigger sweep allows a wider reference model, never above a quarter of its size.
    wide = plan(budget_s=3600, tokens_per_second=150_000, sweep_params=1_600_000)
    assert wide.n_params <= 1_600_000 / 4 and wide.n_params > WIDTHS[0][1]
    assert plan(budget_s=3600, tokens_per_second=150_000).n_params <= 100_672 / 4
    # The first runs are a τ ladder at the centre (the shape), then η and B at fixed τ.
    assert [r for r in small.runs[:6]] == [{"tau": t} for t in (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)]
    assert parse_budget("15m") == 900 and parse_budget("1h") == 3600 and parse_budget("90") == 90


def test_the_estimate_is_its_parts_and_the_shortest_budget_holds_the_fewest_runs() -> None:
    # 150,000 tokens/s at 23,712 parameters x 20 TPP: 3.16 s of probe-speed training per run.
    p = plan(budget_s=240, tokens_per_second=150_000, setup_s=0.5, probe_s=4.0)
    train_s = 20 * 23_712 / 150_000
    assert p.round_s == pytest.approx(own_corpus.PARALLEL_SLOWDOWN * train_s + own_corpus.TRIAL_START_S + 0.5)
    assert p.fixed_s == pytest.approx(4.0 + own_corpus.FIXED_S)
    rounds = -(-len(p.runs) // 2)
    assert p.estimated_s == pytest.approx(p.fixed_s + fit_seconds(len(p.runs)) + rounds * p.round_s)
    assert p.estimated_s <= 240 < p.fixed_s + fit_seconds(len(p.runs) + 1) + (-(-(len(p.runs) + 1) // 2)) * p.round_s
    # The shortest budget it names holds exactly the fewest runs a calibration is made of.
    assert len(plan(p.shortest_s, 150_000, setup_s=0.5, probe_s=4.0).runs) == FEWEST_RUNS
    assert len(plan(p.shortest_s - 1, 150_000, setup_s=0.5, probe_s=4.0).runs) < FEWEST_RUNS


def test_a_budget_too_short_names_the_shortest_that_works_and_the_fixed_part(tmp_path, monkeypatch, capsys) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("some text " * 100)
    monkeypatch.setattr(own_corpus, "measure_throughput", lambda *a, **k: Probe(150_000, 0.5, 4.0))
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", "--corpus", str(corpus), "--budget", "30s", "--output-dir", "out"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    shortest = plan(30, 150_000, setup_s=0.5, probe_s=4.0).shortest_s
    assert len(err) == 1 and f"the shortest that works is {int(-(-shortest // 1))} s" in err[0], err
    assert f"{4.0 + own_corpus.FIXED_S:.0f} s of any calibration is fixed" in err[0] and "150,000 tokens/s" in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, words", [
    (["--corpus", "/no/such/dir", "--budget", "5m"], "--corpus: /no/such/dir: no such file or directory"),
    (["--corpus", ".", "--budget", "soon"], "--budget: 'soon' is not a duration"),
    (["--corpus", "."], "--corpus DIR and --budget TIME go together"),
])
def test_bad_calibrate_corpus_input_is_one_line_and_exit_2(argv, words, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.slow
def test_calibrate_on_a_small_corpus_writes_a_predictor_a_sweep_can_use(tmp_path, monkeypatch) -> None:
    # Real parts: the trainer's throughput probe, Ray, the fit. A tiny corpus of text files.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(20):
        (corpus / f"doc{i}.txt").write_text(("the quick brown fox jumps over the lazy dog %d. " % i) * 400)
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", "--corpus", str(corpus), "--budget", "6m", "--output-dir", "out"]) == 0
    predictor = json.loads((tmp_path / "out" / "predictor.json").read_text())
    assert predictor["provenance"]["calibration"] == "corpus_corpus"
    assert (tmp_path / "out" / "calibration.yaml").exists()
