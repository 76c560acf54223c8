"""benchmarks/decisions.py: the default is chosen leave-one-corpus-out (the held-out corpus is
never read to choose it, nor to measure the order error it is scored with), and equal-quality
compute is the cheapest setting that is safe."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import decisions  # noqa: E402
from benchmarks.decisions_replay import Bank  # noqa: E402
from hpo.trials.rule_replay import Row  # noqa: E402


def _row(setting: str, compute: float, ok: bool, method: str = "collapse", default: bool = False) -> Row:
    return Row("batch_fixed_lambda", 1, method, setting, default, compute, 0.0 if ok else 0.1, "a", "a", ok, ok,
               best_kept=ok, n_trials=5)


def test_equal_quality_is_the_cheapest_safe_setting() -> None:
    rows = [_row("cheap", 0.2, False), *[_row("mid", 0.3, True) for _ in range(10)], _row("dear", 0.6, True)]
    rows += [_row("cheap", 0.2, True) for _ in range(9)]
    compute, label = decisions.equal_quality(rows, "collapse")
    assert label == "mid" and abs(compute - 0.3) < 1e-9  # cheap keeps the best 9/10: not safe
    assert decisions.equal_quality(rows, "asha") is None


def test_the_held_out_corpus_never_chooses_the_default_nor_measures_its_order_error(monkeypatch) -> None:
    corpora = {"a.yaml": "stdlib", "b.yaml": "perl", "c.yaml": "cheaders"}
    order_banks: dict[str, list[str]] = {}
    selected_on: dict[str, list[str]] = {}

    def fake_order(predictor, configs, *_, **__):  # (the metric: not read here)
        return ("predictor without", tuple(sorted(configs)))

    def fake_replay(config, predictor, **_):
        rows = [_row("z 0", 0.2, corpora[config] != "perl"), _row("z 1", 0.4, True)]
        meta = {"corpus": corpora[config], "n_trials": 5, "kinds": ["batch_fixed_lambda"]}
        order_banks.setdefault(config, []).append(predictor)
        return Bank(config, rows, {}, {}, [], meta)

    real_select = decisions.select_default

    def spy_select(rows_by_corpus):
        selected_on.setdefault("calls", []).append(sorted(rows_by_corpus))
        return real_select(rows_by_corpus)

    monkeypatch.setattr(decisions, "bank_corpus", lambda c: corpora[c])
    monkeypatch.setattr(decisions, "with_order_error_from", fake_order)
    monkeypatch.setattr(decisions, "replay_bank", fake_replay)
    monkeypatch.setattr(decisions, "select_default", spy_select)
    loco = decisions.leave_one_corpus_out(list(corpora), "shipped", "stdlib", quick=True, families=[], started=0.0)
    # The order error for each held-out corpus comes from banks of neither it nor the fit's corpus.
    assert order_banks["a.yaml"][0] == ("predictor without", ("b.yaml", "c.yaml"))  # stdlib held out
    assert order_banks["a.yaml"][1] == ("predictor without", ("c.yaml",))  # perl held out
    assert order_banks["a.yaml"][2] == ("predictor without", ("b.yaml",))  # cheaders held out
    # The default for each corpus is chosen on the others only.
    assert selected_on["calls"] == [["cheaders", "perl"], ["cheaders", "stdlib"], ["perl", "stdlib"]]
    # Perl's cheap setting loses its best: chosen without perl, the cheap one; with perl, not.
    assert loco["perl"]["chosen"] == "z 0" and loco["stdlib"]["chosen"] == "z 1"
