"""Transfer study: score a predictor fitted at a small reference scale on a larger model's curves.

The paper ("Scaling with Collapse", Table 11) fits the collapse surrogate ℓ̂ on small models
and asks whether it still describes the normalised loss curves of a much larger one. This is
the CPU-scale analogue: the shipped predictor (``hpo/data/predictors/default.json``, fitted on
the 42 d_model-64 curves of ``configs/calibration/default.yaml``) is scored, unchanged, on
held-out d_model-224 runs (``configs/calibration/transfer.yaml``, ~12x the non-embedding
parameters), trained with ``hpo calibrate configs/calibration/transfer.yaml``.

Per held-out curve:

* predictor MAE: mean |ℓ̂(t̂) − ℓ(t̂)| over t̂ ∈ [t_min, 1], ℓ = L/L(1), computed by
  ``predictors.score_curves`` — the fit's own resampling, normalisation and window, so the
  numbers compare directly with the calibration's "fit MAE" (t_min defaults to the predictor's
  fit window);
* oracle MAE: the same with b and q free for that curve (same m, ε1, ε2; the fit's oracle
  search), i.e. the best any (b, q) rule could do with this functional form;
* ratio = predictor / oracle (paper's target: ≤ 2×, judged on the macro averages);
* decision error at s ∈ {0.1, 0.2, 0.3, 0.5}: (predicted − true)/true final loss, predicted by
  ``Predictor.predict_final`` from the history a ``CollapseScheduler`` has at rung s (every
  point up to and including the first with t̂ ≥ s, default segment); true = last finite
  ``smoothed_loss``.

Aggregates (macro averages, RMS decision error) are given by TPP and overall, for the held-out
bank and — as in-sample context, since the predictor was fitted on it — the reference bank.

Outputs under ``--out``: ``transfer.md``, ``transfer.json`` and ``normalized.png`` (held-out ℓ
vs ℓ̂, coloured by τ, one panel per TPP).

Usage:
    python benchmarks/transfer.py
    python benchmarks/transfer.py --bank configs/calibration/default_bank.parquet --out /tmp/t
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from hpo.calibration import held_out  # noqa: E402
from hpo.calibration.calibrate import load_calibration_config  # noqa: E402
from hpo.trials.curve_bank import bank_curves, load_bank, run_id_of  # noqa: E402
from predictors.prediction import predict_at_rung  # noqa: E402
from hpo.common.tables import markdown_table  # noqa: E402
from predictors import Curve, Predictor, equations, score_curves  # noqa: E402
from predictors.io import atomic_write_json, atomic_write_text, atomic_write_with  # noqa: E402
from predictors.predictor import DECISION_FRACTIONS  # noqa: E402

# Paper Table 11's bar: the predictor's MAE within 2× of the oracle's.
TARGET_RATIO = 2.0
DEFAULT_T_MIN = 0.05
DEFAULT_GRID_POINTS = 200


class TransferError(ValueError):
    """A bank cannot be scored (missing, unreadable or without completed curves)."""


@dataclass(frozen=True)
class CurveScore:
    """One scored curve (MAEs are of ℓ = L/L(1); decision errors are relative, NaN = none)."""

    run_id: str
    d_model: Optional[int]
    n_params: Optional[float]
    tokens_per_param: float
    tau: float
    final_loss: float
    mae: float
    oracle_mae: float
    ratio: float
    decision_error: dict[float, float]


# ------------------------------------------------------------------------ loading


def load_curves(path: Path) -> tuple[list[Curve], dict[str, int]]:
    """The completed curves of the bank at ``path`` and the run count per status.

    Raises ``TransferError`` (naming the file) when it is missing or holds no completed curve.
    """
    if not path.exists():
        raise TransferError(f"{path}: no such curve bank")
    frame = load_bank(path)  # a malformed file raises CurveBankError naming it
    statuses: dict[str, int] = {}
    if len(frame):
        per_run = frame.groupby("run_id")["status"].first()
        statuses = {str(k): int(v) for k, v in per_run.value_counts().items()}
    curves = bank_curves(frame)
    if not curves:
        raise TransferError(f"{path}: no completed curves in the bank (runs by status: {statuses or 'none'})")
    return curves, statuses


def configured_run_ids(config_path: Path) -> tuple[set[str], Path]:
    """Run ids a calibration config lists, and its bank path (resolved from the repo root)."""
    config = load_calibration_config(str(config_path))
    bank = Path(config.bank)
    return {run_id_of(c) for c in config.runs()}, (bank if bank.is_absolute() else REPO_ROOT / bank)


# ------------------------------------------------------------------------ scoring


def decision_error(predictor: Predictor, curve: Curve, stop_fraction: float) -> float:
    """(predicted − true)/true final loss at rung ``stop_fraction``, predicted exactly as the
    scheduler does (``predictors.prediction.predict_at_rungs`` on the curve's (t̂, smoothed loss) points).

    NaN where the scheduler would have no prediction: too few points, or the predictor failed
    (the scheduler keeps such a trial rather than raising).
    """
    controls = curve.controls.to_dict()  # what the scheduler stores for a trial (n_params included)
    history = zip(curve.t_hat.tolist(), curve.loss.tolist())
    t, y = zip(*history)
    final = predict_at_rung(predictor, t, y, controls, stop_fraction).final_loss
    return math.nan if final is None else final / curve.final_loss - 1.0


def _meta_number(curve: Curve, key: str) -> Optional[float]:
    value = curve.meta.get(key)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def score_bank(
    predictor: Predictor,
    curves: Sequence[Curve],
    *,
    t_min: float,
    grid_points: int = DEFAULT_GRID_POINTS,
    fractions: Sequence[float] = DECISION_FRACTIONS,
) -> list[CurveScore]:
    """Predictor MAE, oracle MAE, their ratio and the decision errors of every curve.

    Raises ``TransferError`` when ``curves`` is empty, ``ValueError`` when a curve does not
    cover [t_min, 1] (the message names it).
    """
    curves = list(curves)
    if not curves:
        raise TransferError("score_bank: no curves to score")
    # The fit's own MAE and oracle code, so held-out numbers compare with the calibration's.
    scores = score_curves(predictor, curves, t_min=t_min, t_max=1.0, grid_points=grid_points)
    out = []
    for i, curve in enumerate(curves):
        mae, oracle = float(scores.curve_mae[i]), float(scores.oracle_curve_mae[i])
        d_model = _meta_number(curve, "d_model")
        out.append(CurveScore(
            run_id=str(curve.meta.get("name", i)),
            d_model=None if d_model is None else int(d_model),
            n_params=_meta_number(curve, "n_params"),
            tokens_per_param=float(curve.controls.tokens_per_param),
            tau=float(curve.controls.tau),
            final_loss=curve.final_loss,
            mae=mae,
            oracle_mae=oracle,
            ratio=mae / oracle if oracle > 0 else math.inf,
            decision_error={float(s): decision_error(predictor, curve, float(s)) for s in fractions},
        ))
    return out


def direct_collapse(curves: Sequence[Curve], reference: Sequence[Curve], t_min: float) -> list[dict[str, Any]]:
    """Each held-out curve against every reference curve with the same TPP, τ and η (any B).

    This needs no predictor: if the normalised curves of the two model sizes differ by much
    more than seed noise, collapse itself fails across the size jump and no predictor fitted
    at the reference can transfer. MAE of ℓ over [t_min, 1] and over the paper's [0.2, 1].
    """
    def key(c: Curve) -> tuple:
        # B is not in the key: τ = B/(η·λ·D) already accounts for it, and a reference at a
        # smaller B (more optimizer steps) is exactly what this check wants to compare.
        return (round(c.controls.tokens_per_param, 3), round(c.controls.tau, 4), _meta_number(c, "eta"))

    rows = []
    for curve in curves:
        for ref in (r for r in reference if key(r) == key(curve)):
            row = {"run_id": str(curve.meta.get("name")), "reference_run_id": str(ref.meta.get("name")),
                   "tokens_per_param": curve.controls.tokens_per_param, "tau": curve.controls.tau,
                   "batch_size": _meta_number(curve, "batch_size"),
                   "reference_batch_size": _meta_number(ref, "batch_size"),
                   "final_loss": curve.final_loss, "reference_final_loss": ref.final_loss}
            for lo in (t_min, 0.2):
                grid = np.linspace(lo, 1.0, DEFAULT_GRID_POINTS)
                gap = np.interp(grid, curve.t_hat, curve.normalized) - np.interp(grid, ref.t_hat, ref.normalized)
                row[f"mae_from_{lo:g}"] = float(np.mean(np.abs(gap)))
            rows.append(row)
    return rows


def _rms(values: Sequence[float]) -> float:
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=np.float64)
    return float(np.sqrt(np.mean(v**2))) if v.size else math.nan


def _mean(values: Sequence[float]) -> float:
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=np.float64)
    return float(v.mean()) if v.size else math.nan


def summarize(rows: Sequence[CurveScore], label: str) -> dict[str, Any]:
    """Macro averages of one group: MAE, oracle MAE, their ratio, RMS and mean decision error."""
    mae = _mean([r.mae for r in rows])
    oracle = _mean([r.oracle_mae for r in rows])
    fractions = sorted({s for r in rows for s in r.decision_error})
    ratio = mae / oracle if oracle > 0 else math.inf
    return {
        "group": label,
        "n_curves": len(rows),
        "mae": mae,
        "oracle_mae": oracle,
        "ratio": ratio,
        "meets_target": bool(ratio <= TARGET_RATIO),
        "decision_rms": {s: _rms([r.decision_error.get(s, math.nan) for r in rows]) for s in fractions},
        "decision_bias": {s: _mean([r.decision_error.get(s, math.nan) for r in rows]) for s in fractions},
    }


def aggregate(rows: Sequence[CurveScore]) -> list[dict[str, Any]]:
    """One summary per TPP (ascending), then the overall one."""
    tpps = sorted({round(r.tokens_per_param) for r in rows})
    groups = [summarize([r for r in rows if round(r.tokens_per_param) == t], f"TPP {t}") for t in tpps]
    return groups + [summarize(rows, "all")]


def median_params(rows: Sequence[CurveScore]) -> Optional[float]:
    values = [r.n_params for r in rows if r.n_params is not None]
    return float(np.median(values)) if values else None


# ------------------------------------------------------------------------ output


def _pct(value: Optional[float], signed: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{100 * value:+.2f}%" if signed else f"{100 * value:.2f}%"


def curve_table(rows: Sequence[CurveScore], fractions: Sequence[float]) -> str:
    headers = ["run", "d_model", "N", "TPP", "τ", "pred MAE", "oracle MAE", "ratio",
               *(f"err@{s:g}" for s in fractions)]
    body = [[r.run_id, str(r.d_model) if r.d_model is not None else "n/a",
             f"{r.n_params:,.0f}" if r.n_params is not None else "n/a",
             f"{r.tokens_per_param:g}", f"{r.tau:g}", _pct(r.mae), _pct(r.oracle_mae), f"{r.ratio:.2f}x",
             *(_pct(r.decision_error.get(s), signed=True) for s in fractions)]
            for r in sorted(rows, key=lambda r: (r.tokens_per_param, r.tau, r.run_id))]
    return markdown_table(headers, body)


def aggregate_table(groups: Sequence[dict[str, Any]], fractions: Sequence[float]) -> str:
    headers = ["group", "n", "pred MAE", "oracle MAE", f"ratio (target ≤ {TARGET_RATIO:g}x)",
               *(f"RMS err@{s:g}" for s in fractions)]
    body = [[g["group"], str(g["n_curves"]), _pct(g["mae"]), _pct(g["oracle_mae"]),
             f"{g['ratio']:.2f}x {'ok' if g['meets_target'] else 'MISSED'}",
             *(_pct(g["decision_rms"].get(s)) for s in fractions)] for g in groups]
    return markdown_table(headers, body)


def plot_normalized(curves: Sequence[Curve], predictor: Predictor, t_min: float, path: Path) -> None:
    """Observed ℓ (solid) vs ℓ̂ (dashed), coloured by log τ, one panel per TPP."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    tpps = sorted({round(c.controls.tokens_per_param) for c in curves})
    taus = [c.controls.tau for c in curves]
    # A degenerate LogNorm (one τ) would divide by zero; widen it a little.
    norm = LogNorm(vmin=min(taus) / 1.01, vmax=max(taus) * 1.01)
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(1, len(tpps), figsize=(4.5 * len(tpps) + 1, 4), squeeze=False, layout="constrained")
    lows, highs = [], []
    for ax, tpp in zip(axes[0], tpps):
        mine = [c for c in curves if round(c.controls.tokens_per_param) == tpp]
        for curve in sorted(mine, key=lambda c: c.controls.tau):
            colour = cmap(norm(curve.controls.tau))
            mask = curve.t_hat >= t_min
            t, ell = curve.t_hat[mask], curve.normalized[mask]
            ax.plot(t, ell, color=colour, lw=1.2, label=f"τ={curve.controls.tau:g}")
            predicted = predictor.loss_curve(t, curve.controls, curve.final_loss)
            ax.plot(t, equations.normalized_loss(predicted, curve.final_loss), color=colour, lw=1, ls="--")
            lows.append(float(ell.min()))
            highs.append(float(ell.max()))
        ax.set_title(f"TPP ≈ {tpp} (solid: run, dashed: predictor)")
        ax.set_xlabel("training fraction t")
        ax.set_ylabel("L(t)/L(1)")
        if len(mine) <= 8:  # beyond that the colour bar is the legend
            ax.legend(fontsize=7)
    for ax in axes[0]:
        ax.set_ylim(min(lows) - 0.01, min(max(highs), 2.0) + 0.02)
    fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=list(axes[0]), label="τ")
    atomic_write_with(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


def write_outputs(out: Path, report: dict[str, Any], markdown: str) -> None:
    atomic_write_text(out / "transfer.md", markdown)
    atomic_write_json(out / "transfer.json", report)


# ------------------------------------------------------------------------ main


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bank", type=Path, default=REPO_ROOT / "configs/calibration/transfer_bank.parquet",
                        help="held-out curve bank")
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "configs/calibration/transfer.yaml",
                        help="the held-out calibration config (to report how many of its runs are banked)")
    parser.add_argument("--predictor", type=Path, default=REPO_ROOT / "hpo/data/predictors/default.json")
    parser.add_argument("--reference-bank", type=Path, default=REPO_ROOT / "configs/calibration/default_bank.parquet",
                        help="the bank the predictor was fitted on (in-sample context)")
    parser.add_argument("--reference-config", type=Path, default=REPO_ROOT / "configs/calibration/default.yaml",
                        help="the calibration the predictor was fitted by: only its runs count as in-sample context")
    parser.add_argument("--t-min", type=float, default=None,
                        help="start of the MAE window (default: the predictor's fit window, else 0.05)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs/benchmarks/transfer")
    return parser.parse_args(argv)


def fit_settings(predictor: Predictor, t_min: Optional[float]) -> tuple[float, int]:
    """The MAE window start and grid size the predictor was fitted with (for comparable MAEs)."""
    window = predictor.provenance.get("fit_window")
    if t_min is None:
        t_min = float(window[0]) if isinstance(window, (list, tuple)) and window else DEFAULT_T_MIN
    grid = predictor.provenance.get("grid_points", DEFAULT_GRID_POINTS)
    return float(t_min), int(grid) if isinstance(grid, (int, float)) else DEFAULT_GRID_POINTS


def completeness_note(args: argparse.Namespace, curves: Sequence[Curve], statuses: dict[str, int]) -> str:
    """How many of the config's runs are banked and completed (the bank may still be filling)."""
    try:
        wanted, config_bank = configured_run_ids(args.config)
    except Exception as exc:  # noqa: BLE001 - the config is context only; scoring goes on
        return f"(could not read {args.config}: {exc})"
    if config_bank.resolve() != args.bank.resolve():
        return f"(bank is not {args.config.name}'s bank; completeness not checked)"
    present = sum(1 for c in curves if c.meta.get("name") in wanted)
    note = f"{present} of {len(wanted)} runs listed in {args.config.name} are banked and completed"
    if statuses.get("diverged"):
        note += f"; {statuses['diverged']} diverged run(s) not scored"
    if present < len(wanted):
        note += f"; scoring the {len(curves)} present"
    return note


def run(args: argparse.Namespace) -> dict[str, Any]:
    predictor = Predictor.load(args.predictor)
    t_min, grid_points = fit_settings(predictor, args.t_min)
    curves, statuses = load_curves(args.bank)
    note = completeness_note(args, curves, statuses)
    print(f"held-out bank {args.bank}: {note}")
    ref_curves, _ = load_curves(args.reference_bank)
    collapse_rows = direct_collapse(curves, ref_curves, t_min)
    # The reference bank may hold curves of other calibrations (e.g. TPP 5/10 runs that the
    # shipped predictor never saw): in-sample context means the predictor's own runs only.
    fitted_on, _ = configured_run_ids(args.reference_config)
    ref_curves = [c for c in ref_curves if c.meta.get("name") in fitted_on]
    if not ref_curves:
        raise TransferError(f"{args.reference_bank}: none of {args.reference_config}'s runs are banked")
    fractions = list(DECISION_FRACTIONS)

    rows = score_bank(predictor, curves, t_min=t_min, grid_points=grid_points, fractions=fractions)
    ref_rows = score_bank(predictor, ref_curves, t_min=t_min, grid_points=grid_points, fractions=fractions)
    held, ref = aggregate(rows), aggregate(ref_rows)
    n_held, n_ref = median_params(rows), median_params(ref_rows)
    ratio = n_held / n_ref if n_held and n_ref else None
    shipped = predictor.decision_error

    lines = [
        "# Transfer: reference-scale predictor on held-out larger-model curves",
        "",
        f"Predictor `{args.predictor}` (fitted on {predictor.provenance.get('n_curves', '?')} curves, "
        f"fit MAE {_pct(predictor.provenance.get('fit_mae'))}, oracle {_pct(predictor.provenance.get('oracle_mae'))}).",
        f"Held-out bank `{args.bank}`: {note}.",
        f"Reference bank `{args.reference_bank}`: the {len(ref_curves)} curves of `{args.reference_config.name}` "
        "(the predictor's own calibration).",
        f"N held-out / N reference = {n_held or float('nan'):,.0f} / {n_ref or float('nan'):,.0f} = "
        + (f"**{ratio:.1f}x** non-embedding parameters." if ratio else "n/a."),
        f"MAE of ℓ = L/L(1) over t̂ ∈ [{t_min:g}, 1] on a {grid_points}-point grid (the fit's definition); "
        "oracle = b, q free per curve, same m. err@s = (predicted − true)/true final loss from the "
        "scheduler's history at rung s.",
        "",
        "## Held-out curves",
        "",
        curve_table(rows, fractions),
        "",
        "## Held-out aggregate (macro averages; RMS decision error)",
        "",
        aggregate_table(held, fractions),
        "",
        "## Reference aggregate (in-sample: the predictor was fitted on these)",
        "",
        aggregate_table(ref, fractions),
        "",
        "## Direct collapse check (no predictor): held-out vs reference curve, same TPP, τ, η",
        "",
        markdown_table(
            ["run", "reference run", "TPP", "τ", "B / reference B", "final", "reference final",
             f"MAE of ℓ from {t_min:g}", "MAE of ℓ from 0.2"],
            [[r["run_id"], r["reference_run_id"], f"{r['tokens_per_param']:g}", f"{r['tau']:g}",
              f"{r['batch_size']:.0f} / {r['reference_batch_size']:.0f}", f"{r['final_loss']:.4f}",
              f"{r['reference_final_loss']:.4f}", _pct(r[f"mae_from_{t_min:g}"]), _pct(r["mae_from_0.2"])]
             for r in collapse_rows]),
        "",
    ]
    if shipped is not None:
        lines += [f"Shipped decision error ({shipped.source}, {shipped.statistic}): "
                  + ", ".join(f"s={s:g}: {_pct(e)}" for s, e in zip(shipped.stop_fractions, shipped.rel_error)), ""]
    coverage = held_out.coverage_as_stated_and_in_scale(predictor, curves)
    lines += ["## Coverage of the stated intervals on the held-out curves", "",
              "Fraction of true finals inside predicted ± z·σ, σ as `predict_final` states it: with the "
              "predictor's cross-scale error for these off-scale runs, and with its in-scale error only "
              "(what a predictor without a cross-scale error states).", "",
              held_out.coverage_markdown(coverage), ""]
    markdown = "\n".join(lines)
    print(markdown)

    report = {
        "predictor": str(args.predictor),
        "bank": str(args.bank),
        "reference_bank": str(args.reference_bank),
        "t_min": t_min,
        "grid_points": grid_points,
        "target_ratio": TARGET_RATIO,
        "completeness": note,
        "statuses": statuses,
        "n_params_heldout": n_held,
        "n_params_reference": n_ref,
        "param_ratio": ratio,
        "curves": [asdict(r) for r in rows],
        "aggregate": held,
        "reference_aggregate": ref,
        "direct_collapse": collapse_rows,
        "shipped_decision_error": None if shipped is None else shipped.to_dict(),
        "coverage": coverage,
    }
    write_outputs(args.out, report, markdown)
    plot_normalized(curves, predictor, t_min, args.out / "normalized.png")
    print(f"\nwrote {args.out / 'transfer.md'}, transfer.json, normalized.png")
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except (TransferError, ValueError, FileNotFoundError) as exc:
        # One line naming the file, not a traceback: these are input problems.
        print(f"transfer: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
