"""Speed of the predictor: fit time (4- and 5-parameter) and per-call alignment latency.

    python benchmarks/predictor_speed.py [--curves 100] [--points 1000] [--calls 2000]
    python benchmarks/predictor_speed.py --alignment-study     # the study in docs/predictor.md

Curves are synthetic (the surrogate with m = 0.15 and 0.3% noise, over 10 τ × 5 TPP × 2
schedules), so the numbers measure speed, not accuracy. Run single-threaded
(OMP_NUM_THREADS=1) for numbers comparable with the "< 30 s on one core" target. Latency is
reported both as wall time and as thread CPU time: on a shared machine the wall-time p99 is
dominated by preemption.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpo.common.tables import markdown_table  # noqa: E402
from predictors import (  # noqa: E402
    AlignSettings,
    Controls,
    Curve,
    Predictor,
    SurrogateParams,
    fit,
    normalized_surrogate,
    smooth_loss,
)
from predictors.nqm import nqm_sample_loss  # noqa: E402
from predictors.schedules import Schedule  # noqa: E402


def make_curves(n_curves: int, n_points: int, seed: int = 0) -> list[Curve]:
    rng = np.random.default_rng(seed)
    truth = SurrogateParams(0.3, -0.3, 2.0, -0.2, m=0.15)
    t = np.linspace(1.0 / n_points, 1.0, n_points)
    grid = [(tau, tpp, s) for s in ("linear", "cosine") for tpp in (20, 80, 200, 320, 1280)
            for tau in np.geomspace(0.02, 1.0, 10)]
    curves = []
    for i in range(n_curves):
        tau, tpp, s = grid[i % len(grid)]
        c = Controls(float(tau), float(tpp), Schedule(s))
        y = 2.0 * normalized_surrogate(t, c, truth) * (1.0 + rng.normal(0.0, 0.003, t.size))
        curves.append(Curve(t, y, c, {"n_params": 100_000}))
    return curves


# --------------------------------------------------------------------------- alignment study
STUDY_STEPS = 2000
STUDY_FRACS = (0.1, 0.2, 0.3, 0.5)
STUDY_METHODS: dict[str, tuple[AlignSettings, bool]] = {
    **{f"{o} [0.02,s]": (AlignSettings(o, 0.0, 0.02, 3), False) for o in ("log", "l2", "l1")},
    **{f"{o} [s/2,s]": (AlignSettings(o, 0.5, 0.0, 3), False) for o in ("log", "l2", "l1")},
    **{f"{o} [0.8s,s]": (AlignSettings(o, 0.8, 0.0, 3), False) for o in ("log", "l2", "l1")},
    "L(s)/l(s)": (AlignSettings("log", 1.0, 0.0, 1), False),
    "log [0.8s,s] lag-matched": (AlignSettings("log", 0.8, 0.0, 3), True),
}


def _study_surrogate(truth, taus, tpps, noise, seed, window, transient=0.0):
    """Surrogate curves (+ an optional early transient), per-step noise, trailing smoothing."""
    rng = np.random.default_rng(seed)
    t = np.arange(1, STUDY_STEPS + 1) / STUDY_STEPS
    out = []
    for tpp in tpps:
        for tau in taus:
            c = Controls(float(tau), float(tpp))
            ell = normalized_surrogate(t, c, truth) + transient * np.exp(-t / 0.02)
            y = (2.0 + 0.3 * rng.random()) * ell * (1.0 + rng.normal(0.0, noise, t.size))
            out.append(Curve(t, smooth_loss(t, y, window_tokens=window), c, {"group": tpp}))
    return out


def _study_nqm(taus, seed, window):
    """NQM curves (L = 1 + NQM loss, D2Z, 256 sampled coordinates), trailing smoothing."""
    rng = np.random.default_rng(seed)
    t = np.arange(1, STUDY_STEPS + 1) / STUDY_STEPS
    out = []
    for tau in taus:
        y = 1.0 + nqm_sample_loss(t, tau, Schedule(), noise_var=0.02, theta0_sq=1.0, steps=STUDY_STEPS,
                                  dims=256, rng=rng)
        out.append(Curve(t, smooth_loss(t, y, window_tokens=window), Controls(float(tau), 20.0), {"group": 20}))
    return out


def _study_errors(pred: Predictor, tests: list[Curve], window: float) -> dict[str, list[float]]:
    rows = {}
    for name, (settings, lag) in STUDY_METHODS.items():
        p = Predictor(pred.params, pred.m_fitted, settings)
        errs: dict[float, list[float]] = {s: [] for s in STUDY_FRACS}
        for c in tests:
            for s in STUDY_FRACS:
                t, y = c.head(s)
                f = p.predict_final(t, y, c.controls, smoothing_window=window if lag else 0.0).final_loss
                errs[s].append(f / c.final_loss - 1.0)
        rows[name] = [float(np.sqrt(np.mean(np.square(errs[s])))) for s in STUDY_FRACS]
    return rows


def alignment_study() -> None:
    """RMS relative error of the predicted final loss, by alignment method and stop fraction.

    Reference curves fit the predictor; test curves (other τ, other noise) are predicted.
    """
    taus = np.geomspace(0.02, 1.0, 8)
    tpps = (20, 80, 200)
    m05 = SurrogateParams(0.3, -0.3, 2.0, -0.2, m=0.05)
    m15 = SurrogateParams(0.3, -0.3, 2.0, -0.2, m=0.15)
    scenarios = []
    for window, noise in ((0.02, 0.0), (0.02, 0.03), (0.005, 0.03)):
        ref = _study_surrogate(m05, taus, tpps, noise, 1, window)
        test = _study_surrogate(m05, taus * 1.13, tpps, noise, 2, window)
        scenarios.append((f"A: surrogate truth, noise {noise:.0%}/step, window {window:.1%}, 4-param", ref, test, False, window))
    for window in (0.02, 0.005):
        ref = _study_surrogate(m15, taus, tpps, 0.03, 3, window, transient=0.5)
        test = _study_surrogate(m15, taus * 1.13, tpps, 0.03, 4, window, transient=0.5)
        for fm in (False, True):
            scenarios.append((f"B: m=0.15 + early transient, 3%/step, window {window:.1%}, {'5' if fm else '4'}-param",
                              ref, test, fm, window))
    ntaus = np.geomspace(0.05, 1.0, 8)
    ref, test = _study_nqm(ntaus, 5, 0.02), _study_nqm(ntaus * 1.1, 6, 0.02)
    for fm in (False, True):
        scenarios.append((f"C: NQM (1 + NQM loss, D2Z), window 2.0%, {'5' if fm else '4'}-param", ref, test, fm, 0.02))
    for title, ref, test, fm, window in scenarios:
        r = fit(ref, fit_m=fm, decision_fractions=())
        rows = _study_errors(r.predictor, test, window)
        print(f"\n{title} (fitted m = {r.predictor.params.m:.3f}, fit MAE {100 * r.fit_mae:.2f}%)")
        print(markdown_table(["method", "RMS rel. error of the predicted final at s = 0.1 / 0.2 / 0.3 / 0.5 (%)"],
                             [[name, " / ".join(f"{100 * x:.2f}" for x in e)] for name, e in rows.items()]))
        sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--curves", type=int, default=100)
    ap.add_argument("--points", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--partial-points", type=int, default=300, help="points in each predict_final input")
    ap.add_argument("--alignment-study", action="store_true", help="run the alignment study instead")
    args = ap.parse_args()
    if args.alignment_study:
        alignment_study()
        return

    curves = make_curves(args.curves, args.points)
    out: dict[str, object] = {
        "curves": args.curves,
        "points_per_curve": args.points,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
    }
    results = {}
    for label, fit_m in (("fit_4param", False), ("fit_5param", True)):
        t0 = time.perf_counter()
        c0 = time.process_time()
        r = fit(curves, fit_m=fit_m)
        results[label] = r
        out[label] = {
            "wall_s": round(time.perf_counter() - t0, 3),
            "cpu_s": round(time.process_time() - c0, 3),
            "iterations": r.iterations,
            "fit_mae": round(r.fit_mae, 6),
            "oracle_mae": round(r.oracle_mae, 6),
            "m": round(r.predictor.params.m, 4),
        }

    pred = results["fit_4param"].predictor
    c = curves[0]
    n = min(args.partial_points, c.t_hat.size)
    t_hat, loss = c.t_hat[:n], c.loss[:n]
    for _ in range(200):  # warm up caches and the interpreter
        pred.predict_final(t_hat, loss, c.controls)
    wall = np.empty(args.calls)
    cpu = np.empty(args.calls)
    for i in range(args.calls):
        a, b = time.perf_counter(), time.thread_time()
        pred.predict_final(t_hat, loss, c.controls)
        wall[i] = time.perf_counter() - a
        cpu[i] = time.thread_time() - b
    out["predict_final"] = {
        "calls": args.calls,
        "points": n,
        "wall_median_us": round(float(np.median(wall)) * 1e6, 1),
        "wall_p99_us": round(float(np.percentile(wall, 99)) * 1e6, 1),
        "cpu_median_us": round(float(np.median(cpu)) * 1e6, 1),
        "cpu_p99_us": round(float(np.percentile(cpu, 99)) * 1e6, 1),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
