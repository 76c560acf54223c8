"""Robustness of the predictor (issue 10): degenerate banks, interval coverage, L̂ and transfer.

Three measurements, all from the committed curve banks (no training), written to
``benchmarks/robustness.md`` (``--md``) and ``runs/benchmarks/robustness/robustness.json``:

1. **Degenerate banks** built from real reference curves (one TPP; two nearly equal TPPs,
   the second seed relabelled TPP 20.5; two curves; a constant-LR bank; curves with NaN
   tails): the five-parameter fit (m free, t̂ ∈ [0.05, 1]) on each, whether it is finite, what
   it fixed and logged, and a prediction at a TPP the bank lacks. ``--baseline REV`` runs the
   same fits with the ``predictors/`` package of git revision REV (e.g. the one before issue
   10) in a subprocess, for a before/after column.
2. **Coverage** of the stated ±1σ/±2σ intervals at s = 0.1/0.2/0.3 on the held-out audit bank
   (reference scale) and the three transfer banks (d 128 TPP 10, d 160 TPP 20, d 224 TPP 5/10),
   as the shipped predictor states them (cross-scale error off its scale) and with its
   in-scale error only.
3. **Irreducible loss**: transfer MAE / oracle on each transfer bank for the shipped predictor
   (L̂ = 0) and for one refitted on the same reference curves with L̂ fitted; and, without any
   predictor, the width-to-width drift of the TPP-20 pairs (d 160 vs d 64, same τ, η, B) when
   both are normalised with a common L̂ (scanned), to see whether any offset removes it.

Usage: ``python benchmarks/robustness.py [--baseline 2ee65b9] [--md benchmarks/robustness.md]``
(about 1–2 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from hpo.calibration import held_out  # noqa: E402
from hpo.calibration.calibrate import load_calibration_config  # noqa: E402
from hpo.calibration.fit import complete_curves  # noqa: E402
from hpo.trials.curve_bank import bank_curves, load_bank, run_id_of  # noqa: E402
from hpo.common.tables import markdown_table  # noqa: E402
from predictors import Controls, Curve, Predictor, equations, fit, score_curves  # noqa: E402
from predictors.io import atomic_write_json, atomic_write_text  # noqa: E402

FIT = {"t_min": 0.05, "fit_m": True}
FRACTIONS = (0.1, 0.2, 0.3)
SEED_NOISE = 0.0176  # normalised-curve seed noise at width 64 (docs/results.md, collapse ladder)
TRANSFER_BANKS = {
    "d 128, TPP 10 (3.9x)": ("configs/calibration/transfer_mid_bank.parquet", "configs/calibration/transfer_mid.yaml"),
    "d 160, TPP 20 (6.2x)": ("configs/calibration/transfer_tpp20_bank.parquet",
                             "configs/calibration/transfer_tpp20.yaml"),
    "d 224, TPP 5/10 (11.9x)": ("configs/calibration/transfer_bank.parquet", "configs/calibration/transfer.yaml"),
}


def calibration_curves(config: str, bank: Optional[str] = None) -> list[Curve]:
    """The completed bank curves of a calibration config's runs."""
    cfg = load_calibration_config(str(REPO_ROOT / config))
    frame = load_bank(REPO_ROOT / (bank or cfg.bank))
    return bank_curves(frame[frame["run_id"].isin({run_id_of(c) for c in cfg.runs()})])


def relabel(curves: Sequence[Curve], tokens_per_param: float) -> list[Curve]:
    return [Curve(c.t_hat, c.loss, dataclasses.replace(c.controls, tokens_per_param=tokens_per_param),
                  {**c.meta, "relabelled_tpp": tokens_per_param}) for c in curves]


def degenerate_banks() -> dict[str, tuple[list[Curve], str]]:
    """name → (curves, how the bank was built), from real reference curves."""
    reference = calibration_curves("configs/calibration/default.yaml")
    tpp20 = [c for c in reference if c.controls.tokens_per_param == 20.0]
    main = [c for c in tpp20 if c.meta.get("eta") == 0.01 and c.meta.get("batch_size") == 2048]
    seed1 = [c for c in main if c.meta.get("seed") == 1]
    seed2 = [c for c in main if c.meta.get("seed") == 2]
    frame = load_bank(REPO_ROOT / "configs/calibration/default_bank.parquet")
    cut = frame[frame["run_id"].isin({c.meta["name"] for c in seed1})].copy()
    tails = sorted(cut["run_id"].unique())[:2]
    cut.loc[cut["run_id"].isin(tails) & (cut["train_fraction"] > 0.6), "smoothed_loss"] = np.nan
    constant = bank_curves(load_bank(REPO_ROOT / "configs/calibration/constant_lr_bank.parquet"))
    by_tau = sorted(seed1, key=lambda c: c.controls.tau)
    return {
        "one TPP": (tpp20, f"the {len(tpp20)} TPP-20 curves of the default calibration (τ 0.05–1.6, η, B, seeds)"),
        "two nearly equal TPPs": (seed1 + relabel(seed2, 20.5),
                                  "6 TPP-20 curves (seed 1) + the 6 seed-2 curves relabelled TPP 20.5"),
        "two curves": ([by_tau[1], by_tau[4]], "two TPP-20 curves, τ 0.1 and 0.8"),
        "constant LR": (constant, f"{len(constant)} constant-LR tiny runs, TPP 20, τ 0.1/0.4/1.6 "
                                  "(configs/calibration/constant_lr.yaml)"),
        "NaN tails": (bank_curves(cut), "the 6 seed-1 TPP-20 curves, 2 of them NaN from t̂ = 0.6 on"),
    }


def fit_degenerate(curves: list[Curve]) -> dict[str, Any]:
    """The calibration's path on one bank: incomplete curves left out, five-parameter fit."""
    usable, notes = complete_curves(curves)
    try:
        result = fit(usable, **FIT)
    except ValueError as exc:
        return {"outcome": f"named error: {exc}", "notes": notes}
    p = result.predictor.params
    probe = usable[0]
    pred = result.predictor.predict_final(*probe.head(0.1), Controls(probe.controls.tau, 40.0))
    finite = all(math.isfinite(v) for v in (p.b_const, p.b_exp, p.q_const, p.q_exp, p.m, result.fit_mae,
                                            pred.final_loss, pred.uncertainty))
    return {"outcome": "finite" if finite else "NON-FINITE", "n_fitted": len(usable),
            "params": {k: v for k, v in p.to_dict().items() if k not in ("eps1", "eps2")},
            "fit_mae": result.fit_mae, "fixed": result.predictor.provenance.get("fixed_parameters", {}),
            "notes": notes + list(result.notes), "pred_tpp40_at_0.1": pred.final_loss,
            "true_final": probe.final_loss}


BASELINE_CHILD = r"""
import json, math, sys, warnings
import numpy as np
warnings.simplefilter("ignore")
from predictors import Controls, Curve, fit
try:  # where the schedules live since issue 18
    from predictors.schedules import Schedule
except ImportError:  # an older predictors/ takes them from trainers/ (extracted beside it)
    from trainers.schedules import Schedule
banks = json.load(open(sys.argv[1]))
out = {}
for name, rows in banks.items():
    curves = [Curve(np.array(r["t"]), np.array(r["y"]), Controls(r["tau"], r["tpp"], Schedule(r["schedule"], r["warmup"])))
              for r in rows]
    try:
        res = fit(curves, t_min=0.05, fit_m=True)
        p = res.predictor.params
        c = curves[0]
        t, y = c.head(0.1)
        pred = res.predictor.predict_final(t, y, Controls(c.controls.tau, 40.0)).final_loss
        vals = [p.b_const, p.b_exp, p.q_const, p.q_exp, p.m, res.fit_mae, pred]
        out[name] = {"outcome": "finite" if all(math.isfinite(v) for v in vals) else "NON-FINITE",
                     "params": {"b_const": p.b_const, "b_exp": p.b_exp, "q_const": p.q_const, "q_exp": p.q_exp, "m": p.m},
                     "fit_mae": res.fit_mae, "pred_tpp40_at_0.1": pred}
    except Exception as exc:
        out[name] = {"outcome": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out, default=str))
"""


def baseline_fits(rev: str, banks: dict[str, tuple[list[Curve], str]]) -> dict[str, Any]:
    """The same fits with ``predictors/`` as of git revision ``rev`` (a subprocess)."""
    with tempfile.TemporaryDirectory() as tmp:
        # Revisions before issue 18 kept the schedules in trainers/: extract them beside the old
        # predictors/ (this checkout's trainers/ no longer has them).
        listed = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-tree", "--name-only", rev,
                                 "trainers/__init__.py", "trainers/schedules.py"],
                                check=True, capture_output=True, text=True).stdout.split()
        paths = ["predictors"] + (listed if "trainers/schedules.py" in listed else [])
        archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", rev, *paths],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        data = {name: [{"t": c.t_hat.tolist(), "y": c.loss.tolist(), "tau": c.controls.tau,
                        "tpp": c.controls.tokens_per_param, "schedule": c.controls.schedule.name,
                        "warmup": c.controls.schedule.warmup_fraction} for c in curves]
                for name, (curves, _) in banks.items()}
        path = Path(tmp) / "banks.json"
        path.write_text(json.dumps(data))
        # The old packages first on the path, then this checkout.
        env = {**os.environ, "PYTHONPATH": f"{tmp}:{REPO_ROOT}"}
        done = subprocess.run([sys.executable, "-c", BASELINE_CHILD, str(path)], capture_output=True,
                              text=True, env=env, cwd=tmp, timeout=600)
        if done.returncode != 0:
            return {name: {"outcome": f"baseline failed: {done.stderr.strip()[-300:]}"} for name in banks}
        return json.loads(done.stdout.strip().splitlines()[-1])


def transfer_scores(predictors: dict[str, Predictor]) -> list[dict[str, Any]]:
    rows = []
    for bank_name, (bank, config) in TRANSFER_BANKS.items():
        curves = calibration_curves(config, bank)
        for label, predictor in predictors.items():
            try:
                s = score_curves(predictor, curves, t_min=FIT["t_min"])
                mae, oracle = float(s.curve_mae.mean()), float(s.oracle_curve_mae.mean())
                rows.append({"bank": bank_name, "predictor": label, "n": len(curves), "mae": mae,
                             "oracle": oracle, "ratio": mae / oracle})
            except ValueError as exc:
                rows.append({"bank": bank_name, "predictor": label, "n": len(curves), "error": str(exc)})
    return rows


def drift_scan(l0_values: Sequence[float]) -> list[dict[str, Any]]:
    """MAE over t̂ ∈ [0.2, 1] between each d-160 TPP-20 curve's L/L(1) and the model of it from
    the d-64 curve with the same τ, η, B and a common L̂: L̂/L(1) + (1 − L̂/L(1))·ℓ'_small, where
    ℓ'_small = (L − L̂)/(L(1) − L̂) of the small model (Eq. 1 with the offset)."""
    large = calibration_curves(TRANSFER_BANKS["d 160, TPP 20 (6.2x)"][1], TRANSFER_BANKS["d 160, TPP 20 (6.2x)"][0])
    small = [c for c in calibration_curves("configs/calibration/default.yaml")
             if c.controls.tokens_per_param == 20.0 and c.meta.get("eta") == 0.01 and c.meta.get("batch_size") == 2048]
    grid = np.linspace(0.2, 1.0, 200)
    rows = []
    for big in large:
        partners = [c for c in small if abs(c.controls.tau / big.controls.tau - 1) < 1e-6]
        for ref in partners:
            ell_big = np.interp(grid, big.t_hat, big.normalized)
            loss_ref = np.interp(grid, ref.t_hat, ref.loss)
            row = {"run": big.meta["name"], "reference": ref.meta["name"], "tau": big.controls.tau}
            for l0 in l0_values:
                reducible = equations.reducible_normalized_loss(loss_ref, ref.final_loss, l0)
                model = equations.loss_ratio_from_normalized(reducible, big.final_loss, l0)
                row[f"{l0:g}"] = float(np.mean(np.abs(model - ell_big)))
            rows.append(row)
    return rows


def _pct(v: Any, digits: int = 2) -> str:
    return "n/a" if v is None or not isinstance(v, (int, float)) or not math.isfinite(v) else f"{100 * v:.{digits}f}%"


def _params(d: Optional[dict]) -> str:
    if not d:
        return "—"
    return ", ".join(f"{k} {v:.3g}" for k, v in d.items() if k in ("q_const", "q_exp", "m", "b_exp"))


def render(report: dict[str, Any]) -> str:
    lines = ["# Predictor robustness (issue 10)", "",
             f"Generated by `python benchmarks/robustness.py{' --baseline ' + report['baseline'] if report['baseline'] else ''}`"
             f" (its run time is printed, not written here, so a rerun leaves this file unchanged). Seed noise of normalised curves at the reference width: "
             f"{100 * SEED_NOISE:.2f}% (docs/results.md, collapse ladder).", "",
             "## 1. Degenerate banks (five-parameter fit, t̂ ∈ [0.05, 1])", "",
             "`pred@0.1, TPP 40`: final loss predicted from the first 10% of the bank's first curve with "
             "its TPP replaced by 40 (a TPP no bank holds); its true final is given for scale.", ""]
    headers = ["bank", "how built", "now", "fixed / logged", "fit MAE", "q_exp, m", "pred@0.1, TPP 40 (true)"]
    if report["baseline"]:
        headers += [f"before ({report['baseline']})", "before: q_exp, m", "before: pred@0.1, TPP 40"]
    rows = []
    for name, row in report["degenerate"].items():
        now = row["now"]
        logged = "; ".join(now.get("notes", [])) or "—"
        cells = [name, row["how"], now["outcome"], logged, _pct(now.get("fit_mae")), _params(now.get("params")),
                 (f"{now['pred_tpp40_at_0.1']:.4f} ({now['true_final']:.4f})" if "pred_tpp40_at_0.1" in now else "—")]
        if report["baseline"]:
            before = row.get("before", {})
            cells += [before.get("outcome", "—"), _params(before.get("params")),
                      f"{before['pred_tpp40_at_0.1']:.4f}" if "pred_tpp40_at_0.1" in before else "—"]
        rows.append(cells)
    lines.append(markdown_table(headers, rows))
    coverage = [[bank, label, s, int(row["n"]), _pct(row["rms"]), _pct(row["1σ"], 0), _pct(row["2σ"], 0)]
                for bank, by_label in report["coverage"].items()
                for label, by_s in by_label.items()
                for s, row in by_s.items()]
    lines += ["", "## 2. Coverage of the stated intervals (shipped predictor)", "",
              "Fraction of true finals inside predicted ± z·σ (σ as `predict_final` states it). ‘as stated’: "
              "with the cross-scale error for runs off the predictor's scale (another TPP or model size); "
              "‘in-scale e(s) only’: what the predictor stated before it carried a cross-scale error.", "",
              markdown_table(["bank", "stated e(s)", "s", "n", "RMS error", "±1σ", "±2σ"], coverage)]
    transfer = [[row["bank"], row["predictor"], row["n"], row["error"], "", ""] if "error" in row else
                [row["bank"], row["predictor"], row["n"], _pct(row["mae"]), _pct(row["oracle"]), f"{row['ratio']:.2f}×"]
                for row in report["transfer"]]
    lines += ["", "## 3. Irreducible loss L̂ and transfer", "",
              f"Predictors: shipped (L̂ = 0); ‘L̂ fitted’ = refit on the same 42 reference curves with "
              f"L̂ free: {report['l0_predictor']}.", "",
              markdown_table(["held-out bank", "predictor", "n", "MAE", "oracle MAE", "ratio (target ≤ 2×)"], transfer)]
    l0s = report["drift_l0"]
    drift = [[row["run"], row["reference"], f"{row['tau']:g}", *(_pct(row[v]) for v in l0s)] for row in report["drift"]]
    means = {v: float(np.mean([r[v] for r in report["drift"]])) for v in l0s}
    drift.append(["mean", "", "", *(f"**{_pct(means[v])}**" for v in l0s)])
    lines += ["", "Width-to-width drift without a predictor (d 160 vs d 64 at TPP 20, same τ, η = 0.01, "
              "B = 2,048): MAE over t̂ ∈ [0.2, 1] between the d-160 curve's L/L(1) and the d-64 curve "
              "renormalised with a common L̂ (Eq. 1 with the offset).", "",
              markdown_table(["d-160 run", "d-64 run", "τ", *(f"L̂ = {v}" for v in l0s)], drift)]
    lines.append("")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
    start = time.time()
    banks = degenerate_banks()
    degenerate = {name: {"how": how, "now": fit_degenerate(curves)} for name, (curves, how) in banks.items()}
    if args.baseline:
        for name, row in baseline_fits(args.baseline, banks).items():
            degenerate[name]["before"] = row
    shipped = Predictor.load(REPO_ROOT / "hpo/data/predictors/default.json")
    audit_cfg = load_calibration_config(str(REPO_ROOT / "configs/calibration/audit.yaml"))
    audit = bank_curves(load_bank(REPO_ROOT / audit_cfg.bank))
    coverage = {"audit (d 64, TPP 20)": held_out.coverage_as_stated_and_in_scale(shipped, audit, FRACTIONS)}
    for name, (bank, config) in TRANSFER_BANKS.items():
        coverage[name] = held_out.coverage_as_stated_and_in_scale(shipped, calibration_curves(config, bank), FRACTIONS)
    reference = calibration_curves("configs/calibration/default.yaml")
    with_l0 = fit(reference, fit_irreducible=True, decision_fractions=(), **FIT).predictor
    p = with_l0.params
    l0_text = f"L̂ = {p.irreducible_loss:.4g}, m = {p.m:.4g}, fit MAE {_pct(with_l0.provenance['fit_mae'])}"
    transfer = transfer_scores({"shipped (L̂ = 0)": shipped, "L̂ fitted on the reference": with_l0})
    l0_values = [0.0, 0.25, 0.5, 0.75, 0.9]
    report = {"baseline": args.baseline, "degenerate": degenerate, "coverage": coverage,
              "l0_predictor": l0_text, "transfer": transfer, "drift": drift_scan(l0_values),
              "drift_l0": [f"{v:g}" for v in l0_values], "elapsed_s": time.time() - start}
    text = render(report)
    print(text)
    print(f"robustness: {report['elapsed_s']:.0f} s")
    out = Path(args.out)
    atomic_write_json(out / "robustness.json", report)
    atomic_write_text(out / "robustness.md", text)
    if args.md:
        atomic_write_text(args.md, text)
    return report


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", help="git revision whose predictors/ to run on the degenerate banks too")
    p.add_argument("--out", default="runs/benchmarks/robustness", help="output directory")
    p.add_argument("--md", help="also write the markdown here (benchmarks/robustness.md)")
    return p.parse_args(argv)


if __name__ == "__main__":
    run(parse_args())
