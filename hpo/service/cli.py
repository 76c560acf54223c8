"""The ``hpo`` command line: train, sweep, resume, report; calibrate, monitor, replay; submit, status,
answer, logs, stop.

Every command validates its input first and exits with status 2 and one message naming
the field (and file) at fault, before anything is written. No message, and no traceback,
shows the user part (a password) of a URI (``hpo.tracking.uri.strip_credentials``).
Ray and torch are imported inside the commands that need them, after validation.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Optional, Sequence

from pydantic import ValidationError

from hpo.data import sweep_config_path
from hpo.common.errors import InputError, input_error_behind
from hpo.common.overrides import ConfigError, apply_overrides, check_safe_name, format_validation_error, read_yaml
from hpo.common.paths import check_output_dir
from hpo.service.replay import add_parser as add_replay_parser
from hpo.tracking.uri import INVALID_HOST, host_rejected_message, strip_credentials


def _cmd_train(args: argparse.Namespace) -> int:
    from trainers.config import TrainConfig
    from trainers.corpus import DataError
    from trainers.runner import run_to_directory

    raw = apply_overrides(read_yaml(args.config), args.set or [])
    try:
        config = TrainConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, args.config)) from None
    output = check_output_dir(args.output if args.output is not None else f"runs/train/{Path(args.config).stem}",
                              "--output")
    _check_train_memory(config, args.config)
    try:
        summary = run_to_directory(config, output, progress=not args.quiet)
    except DataError as exc:  # raised while building the run, before anything is written
        raise ConfigError(f"{args.config}: {exc}") from None
    print(f"status: {summary.get('status')}; wrote {output.resolve()}")
    return 0 if summary.get("status") != "diverged" else 1


def _check_train_memory(config: Any, source: str) -> None:
    """``hpo train``: the run's estimated peak memory (``trainers.memory``) must fit this machine."""
    from trainers.corpus import training_tokens
    from trainers.memory import estimate_train_memory, machine_memory_mb

    try:
        data_tokens = training_tokens(config.data.model_dump())
    except Exception:  # noqa: BLE001 - the run's own data loading names a corpus problem
        data_tokens = 0
    estimate, machine = estimate_train_memory(config, data_tokens), machine_memory_mb()
    if estimate.total_mb > machine:
        raise ConfigError(f"{source}: batch_size: {config.batch_size:,} tokens a step ({config.micro_batch_tokens:,} a "
                          f"forward pass): the run needs {estimate.describe()}, above this machine's "
                          f"{machine:,.0f} MB; lower batch_size or set micro_batch_size (gradients are accumulated)")


def _cmd_sweep(args: argparse.Namespace) -> int:
    from hpo.service.sweep import run_sweep
    from hpo.trials.sweep_config import load_sweep_config

    overrides = list(args.set or [])
    if args.audit:
        overrides.append("scheduler.mode=audit")
    if args.output is not None:  # quoted: `--output ""` stays an empty path (refused), not null (the default)
        overrides.append(f"output_dir={json.dumps(args.output, ensure_ascii=False)}")
    config = load_sweep_config(sweep_config_path(args.config), overrides=tuple(overrides))
    # run_sweep checks everything that can fail without writing (hpo.service.sweep.preflight_sweep)
    # before it imports Ray or MLflow or writes a file.
    return _finish(run_sweep(config, address=args.address))


def _cmd_resume(args: argparse.Namespace) -> int:
    from hpo.service.sweep import resume_sweep

    return _finish(resume_sweep(args.output_dir, address=args.address))


def _finish(outcome: dict) -> int:
    """Print the outcome; the exit status: 0 done, 1 trial errors or every trial diverged,
    130 interrupted (resumable)."""
    _print_outcome(outcome)
    if outcome.get("interrupted"):
        print(f"error: sweep interrupted; continue it with `hpo resume {outcome['output']}`", file=sys.stderr)
        return 130
    if outcome.get("all_diverged"):
        n = len(outcome["diverged"])
        print(f"error: every trial diverged ({n} of {n}); no configuration to pick (lower the learning rates?)",
              file=sys.stderr)
        return 1
    return 1 if outcome["errors"] else 0


def _cmd_report(args: argparse.Namespace) -> int:
    from hpo.reporting.report import print_report, write_report

    directory = Path(args.output_dir)
    if not (directory / "scheduler_state.json").exists():
        raise ConfigError(f"{directory}: not a sweep output directory (no scheduler_state.json)")
    check_output_dir(directory / "report", "report folder")  # a file in its place, an unwritable sweep folder
    report = write_report(directory)
    print_report(report)
    from hpo.service.sweep import upload_pending

    sent = upload_pending(directory.resolve())  # what the sweep could not send to its server
    if sent:
        print(sent)
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from hpo.calibration.calibrate import calibrate, calibrate_from_curves, preflight_outputs, user_curves_config

    overrides = tuple(args.set or [])
    if args.output_dir is not None:  # quoted, as for hpo sweep --output
        overrides += (f"output_dir={json.dumps(args.output_dir)}",)
    if args.predictor_out is not None:
        overrides += (f"predictor_out={json.dumps(args.predictor_out)}",)
    if args.corpus is not None or args.budget is not None:
        return _calibrate_own_corpus(args, overrides)
    if args.config:
        _check_calibration_name(args.config, overrides)
    if args.from_curves or args.from_mlflow or args.from_logs:
        from hpo.calibration.curve_import import CurveImportError, load_curves_file, load_mlflow_curves
        from hpo.calibration.log_import import LogImportError, load_log_dir

        if sum(bool(x) for x in (args.from_curves, args.from_mlflow, args.from_logs)) > 1:
            raise ConfigError("--from-curves, --from-mlflow and --from-logs: give one of them")
        label = (Path(args.from_curves).stem if args.from_curves else Path(args.from_logs).resolve().name
                 if args.from_logs else f"mlflow_{args.from_mlflow}")
        if args.from_logs and not args.config and not any(o.startswith("fit.t_min=") for o in overrides):
            # Training logs are evaluated every few hundred steps: a short run's first point can
            # come after 5% of training. The fit starts at the scheduler's earliest rung instead.
            overrides = ("fit.t_min=0.1",) + overrides
        config = user_curves_config(label, args.config, overrides)
        try:
            check_safe_name(config.name)
        except ValueError as exc:
            raise ConfigError(f"name: {exc}") from None
        if args.from_logs:  # training logs hold the validation loss a sweep decides on
            config.metric = "val_loss" if args.metric == "loss" else args.metric
        if args.from_mlflow and args.metric in ("loss", "val_loss"):
            # A sweep's runs log both losses: the predictor records the one it was fitted on
            # (predictors.run_keys.METRIC_COLUMNS), which a sweep deciding on it must match.
            config.metric = args.metric
        preflight_outputs(config)  # before the curves are read and fitted (minutes for a large file)
        try:
            if args.from_logs:
                imported = load_log_dir(args.from_logs, metric=config.metric).imported
            elif args.from_curves:
                imported = load_curves_file(args.from_curves, smoothing_fraction=args.smoothing_fraction)
            else:
                imported = load_mlflow_curves(args.from_mlflow, tracking_uri=args.tracking_uri, metric=args.metric,
                                              smoothing_fraction=args.smoothing_fraction)
        except (CurveImportError, LogImportError) as exc:
            raise ConfigError(str(exc)) from None
        print(f"calibration from {imported.source}: {len(imported.curves)} complete curves")
        summary = calibrate_from_curves(imported, config)
    else:
        if not args.config:
            raise ConfigError("calibrate: give a calibration CONFIG, --from-curves FILE, --from-logs DIR or "
                              "--from-mlflow ID")
        summary = calibrate(args.config, overrides, fit_only=args.fit_only)
    if summary.get("predictor") is None:
        return 0  # a bank-only calibration (predictor_out: null) printed its own summary
    print(f"calibration: {summary['n_curves']} curves, chosen mode {summary['chosen_mode']}")
    for note in summary.get("notes", []):
        print(f"  note: {note}")
    for mode, info in summary["modes"].items():
        print(f"  {mode}: fit MAE {100 * info['fit_mae']:.2f}%, oracle MAE {100 * info['oracle_mae']:.2f}%")
        for note in info.get("fit_notes", []):
            print(f"    fit log: {note}")
        for scheme, by_label in info.get("coverage", {}).items():
            for label, by_s in by_label.items():
                cells = ", ".join(f"s={s}: {100 * c['2σ']:.0f}%" for s, c in by_s.items())
                print(f"    ±2σ coverage, {scheme}, {label}: {cells}")
        for kind, row in ((info.get("ranking_error") or {}).get("kinds") or {}).items():
            cells = ", ".join(f"s={s:g}: {100 * v:.1f}%" for s, v in zip(row["stop_fractions"], row["scale"]))
            print(f"    ranking scale, {kind} sweeps ({row['n_pairs'][0]} pairs): {cells}")
            if row.get("weight") is not None:
                order = ", ".join(f"s={s:g}: w {w:g}" for s, w in zip(row["stop_fractions"], row["weight"]))
                print(f"      order used (w = 1 predicted finals, 0 losses at the rung): {order}")
        noise = (info.get("ranking_error") or {}).get("seed_noise")
        if noise is not None:
            print(f"    seed noise of a final (the default tolerance): {100 * noise:.2f}%")
    print(f"predictor: {summary['predictor']}\nreport: {summary['report_dir']}")
    return 0


def _cmd_monitor(args: argparse.Namespace) -> int:
    import json
    import time

    from hpo.calibration.curve_import import CurveImportError, load_curves_file
    from hpo.data import default_predictor_path
    from hpo.monitor.command import CurveSource, ReferenceBands, follow, monitor_runs, plot_residuals, status_line
    from predictors import Predictor
    from predictors.curves import controls_with_size
    from predictors.references import ReferenceCurves

    started = time.perf_counter()
    source = CurveSource(args.curves, args.from_mlflow, args.job, args.tracking_uri, args.address, args.metric,
                         args.smoothing_fraction)
    if args.follow and (args.json or args.output):
        raise ConfigError("monitor: --follow prints status changes; it takes neither --json nor --output")
    if not (args.every > 0 and args.every < 86400):
        raise ConfigError(f"--every: must be a number of seconds in (0, 86400), got {args.every!r}")
    predictor_path = Path(args.predictor) if args.predictor else default_predictor_path()
    if not predictor_path.exists():
        raise ConfigError(f"--predictor: no such file {predictor_path}")
    try:
        predictor = Predictor.load(predictor_path)
    except ValueError as exc:
        raise ConfigError(f"--predictor: {exc}") from None
    references = None
    bands = None
    if args.reference:
        try:
            refs = load_curves_file(args.reference, smoothing_fraction=args.smoothing_fraction).curves
        except CurveImportError as exc:
            raise ConfigError(str(exc)) from None
        references = ReferenceCurves.from_curves(refs, extrapolation="hold")
        if not references.curves:
            raise ConfigError(f"--reference {args.reference}: no reference curve reports n_params")
        bands = ReferenceBands.of(predictor, refs, references)
    output = Path(args.output) if args.output else None
    if output is not None and output.exists() and not output.is_dir():
        raise ConfigError(f"--output: {output} exists and is not a directory")
    if args.follow:
        try:
            follow(source, predictor, references, every=args.every, bands=bands)
        except KeyboardInterrupt:
            print("stopped following (Ctrl-C)")
        return 0
    imported, _ = source.read()
    if imported is None:
        raise ConfigError(f"--job {args.job}: no trial has logged {args.metric!r} yet (try --follow)")
    runs = monitor_runs(imported.curves, predictor, references, bands)
    rows = [row for _, _, row in runs]

    def band_for(curve: Any) -> Any:
        return predictor.monitor_band if bands is None else bands.for_run(controls_with_size(curve))[0]

    plots = plot_residuals(runs, band_for, output) if output is not None else []
    band = predictor.monitor_band if bands is None else bands.stored
    if args.json:
        print(json.dumps({"runs": rows, "notes": imported.notes, "source": imported.source,
                          "band": {"n_curves": band.n_curves, "source": band.source, "rule": band.rule.to_dict()},
                          "plots": [str(p) for p in plots]}, indent=2, allow_nan=False))
        return 0
    width = max(len(r["run_id"]) for r in rows)
    for row in rows:
        print(f"{row['run_id']:<{width}}  {status_line(row)}")
    print(f"{sum(r['alarm'] for r in rows)} alarm(s) in {len(rows)} run(s); band: {band.source} ({band.n_curves} "
          f"runs or pairs), rule: {band.rule.describe()}; "
          f"{time.perf_counter() - started:.1f} s")
    for note in imported.notes:
        print(f"  note: {note}")
    if plots:
        print(f"plots: {output}")
    return 0


# ----------------------------------------------------------------------------- Ray Jobs (hpo.service.jobs)


def _cmd_submit(args: argparse.Namespace) -> int:
    from hpo.service.jobs import submit

    sub = submit(args.config, tuple(args.set or []), address=args.address, tracking_uri=args.tracking_uri,
                 storage=args.storage, working_dir=args.working_dir)
    links = sub.links()
    print(f"job: {sub.job_id}\nMLflow experiment: {sub.experiment} (id {sub.experiment_id}) at {sub.tracking_uri}\n"
          f"outputs: {sub.output_dir}\nRay dashboard: {links['ray_dashboard']}\nMLflow UI: {links['mlflow_ui']}\n"
          f"follow it: hpo status {sub.job_id}; hpo answer {sub.job_id}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    import json

    from hpo.tracking.cluster import connect
    from hpo.service.jobs import format_state, job_state, list_jobs

    cluster = connect(args.address)
    ids = [args.job] if args.job else [j.submission_id for j in list_jobs(cluster)]
    states = [job_state(cluster, job_id, args.tracking_uri) for job_id in ids]
    if args.json:
        print(json.dumps(states if not args.job else states[0], indent=1))
    elif not states:
        print(f"no sweeps submitted to {cluster.url}")
    else:
        print("\n".join(format_state(s) for s in states))
    return 0


def _cmd_answer(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console

    from hpo.decisions.early_answer import format_early_answer
    from hpo.service.jobs import ANSWERED, STILL_RUNNING, answer

    shown: set[str] = set()

    def waiting(state: dict) -> None:
        if state["state"] not in shown and not args.json:
            shown.add(state["state"])
            print(f"waiting for the early answer of {args.job} ({state['state']}) ...", file=sys.stderr, flush=True)

    code, state = answer(args.job, address=args.address, tracking_uri=args.tracking_uri, wait=args.wait,
                         timeout_s=args.timeout, on_wait=waiting)
    if code == ANSWERED:
        early = state["published"]["early_answer"]
        if args.json:
            print(json.dumps(early, indent=1))
        else:
            Console().print(format_early_answer(early))
    elif code == STILL_RUNNING:
        print(f"{args.job}: {state['state']}, no early answer yet", file=sys.stderr)
    else:
        why = f": {state['error']}" if state.get("error") else ""
        print(f"error: {args.job} ended ({state['state']}) without an early answer{why}", file=sys.stderr)
    return code


def _cmd_logs(args: argparse.Namespace) -> int:
    from hpo.service.jobs import logs

    logs(args.job, address=args.address, follow=args.follow, write=lambda text: print(text, end="", flush=True))
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    from hpo.service.jobs import stop

    result = stop(args.job, address=args.address, tracking_uri=args.tracking_uri)
    if result["already_ended"]:
        print(f"{args.job} has already ended ({result['state']}); nothing to stop")
    else:
        print(f"stopped {args.job} ({result['state']}); {result['runs_killed']} MLflow run(s) ended KILLED, "
              "the stop recorded on the parent run")
    return 0


def _add_cluster_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", help="the Ray head's dashboard address, http://HEAD:8265 (default: "
                                          "RAY_ADDRESS, else http://127.0.0.1:8265)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI; for an existing "
                                               "job, else the one it was submitted with)")


def _check_calibration_name(config: str, overrides: tuple[str, ...]) -> None:
    """A calibration's name becomes folder names (its Ray experiment, runs/calibration/<name>):
    refuse one that could leave them ('../x') before anything runs."""
    raw = apply_overrides(read_yaml(config), overrides)
    try:
        check_safe_name(raw.get("name", "calibration"))
    except ValueError as exc:
        raise ConfigError(f"{config}: name: {exc}") from None


def _print_outcome(outcome: dict) -> None:
    from hpo.reporting.report import print_report

    if outcome.get("interrupted"):
        # Said before the report, which would otherwise read like a finished sweep's.
        print(f"sweep INTERRUPTED: the report below is partial (trials still running were saved); "
              f"continue with `hpo resume {outcome['output']}`", flush=True)
    print_report(outcome["report"])
    for trial in outcome.get("diverged", []):
        config = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in (trial.get("config") or {}).items() if not str(k).startswith("_"))
        where = f" at t̂ = {trial['diverged_at']:.3g}" if trial.get("diverged_at") is not None else ""
        print(f"diverged: trial {trial['trial_id']} ({config}){where}")
    for error in outcome["errors"]:
        print(f"trial error: {error}", file=sys.stderr)
    if outcome.get("mlflow"):
        print(outcome["mlflow"]["text"])
    use = outcome.get("slot_use")
    if use:
        print(f"trial slots busy: {100 * use['share']:.0f}% ({use['busy_s']:.0f} s of training in "
              f"{use['wall_s']:.0f} s on {use['slots']} slot(s))")
    print(f"outputs: {outcome['output']}")


def _calibrate_own_corpus(args: argparse.Namespace, overrides: tuple[str, ...]) -> int:
    """``hpo calibrate --corpus DIR --budget 15m``: the paper's protocol (``hpo.calibration.own_corpus``)."""
    from hpo.calibration.calibrate import calibrate
    from hpo.calibration.own_corpus import corpus_config, fit_seconds, parse_budget
    import yaml

    if args.corpus is None or args.budget is None or args.config or args.from_curves or args.from_mlflow \
            or args.from_logs:
        raise ConfigError("calibrate: --corpus DIR and --budget TIME go together, without CONFIG or --from-*")
    budget = parse_budget(args.budget)
    if args.sweep_params is not None and args.sweep_params <= 0:
        raise ConfigError(f"--sweep-params: must be a positive parameter count, got {args.sweep_params}")
    tpp = 20.0
    for item in overrides:
        if item.startswith("trainer.tokens_per_param="):
            tpp = float(item.split("=", 1)[1])
    from hpo.calibration.own_corpus import corpus_label
    from hpo.common.paths import check_output_dir

    out = check_output_dir(args.output_dir or f"runs/calibration/corpus_{corpus_label(args.corpus)}", "--output-dir")
    print(f"calibrate --corpus: measuring this machine's throughput on {args.corpus} ...", flush=True)
    config, chosen = corpus_config(args.corpus, budget, str(out), tokens_per_param=tpp,
                                   sweep_params=args.sweep_params or 100_672)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "calibration.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    print(f"calibrate --corpus: {len(chosen.runs)} runs at d_model {chosen.model['d_model']} "
          f"({chosen.n_params:,} parameters, TPP {tpp:g}), about {chosen.estimated_s / 60:.1f} min of a "
          f"{budget / 60:.1f}-min budget ({chosen.fixed_s:.0f} s fixed, the fit {fit_seconds(len(chosen.runs)):.0f} s, "
          f"{chosen.round_s:.0f} s per round of 2 runs); config {path}", flush=True)
    summary = calibrate(str(path), overrides)
    print(f"calibration: {summary['n_curves']} curves; predictor {summary['predictor']} "
          f"(a sweep uses it with `predictor: {summary['predictor']}` in its config)")
    return 0


def _add_calibrate_parser(sub: Any) -> None:
    calibrate = sub.add_parser("calibrate", help="run reference curves, bank them, fit the predictor")
    calibrate.add_argument("config", nargs="?", help="YAML calibration config (with --from-*: its fit settings)")
    calibrate.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field")
    calibrate.add_argument("--fit-only", action="store_true", help="refit from the curve bank only")
    calibrate.add_argument("--from-curves", metavar="FILE",
                           help="calibrate on your own curves: CSV or parquet (columns: configs/curves/README.md)")
    calibrate.add_argument("--from-mlflow", metavar="EXPERIMENT_ID", help="calibrate on the runs of an MLflow experiment")
    calibrate.add_argument("--from-logs", metavar="DIR", help="calibrate on a folder of training logs (W&B run exports "
                           "as JSON; cooldowns joined onto their parents; validation loss, or --metric train_loss)")
    calibrate.add_argument("--tracking-uri", help="MLflow tracking URI for --from-mlflow (default: MLFLOW_TRACKING_URI, "
                                "else ./mlflow.db or ./mlruns if there)")
    calibrate.add_argument("--metric", default="loss", help="loss metric name for --from-mlflow (default loss; loss "
                                "or val_loss is recorded in the predictor as the metric it was fitted on)")
    calibrate.add_argument("--smoothing-fraction", type=float, default=0.0,
                           help="smooth imported losses over this fraction of each run's tokens (default 0: "
                                "already smoothed)")
    calibrate.add_argument("--predictor-out", help="predictor JSON to write (default: predictor.json "
                           "in the report directory; give the shipped file's path to replace it)")
    calibrate.add_argument("--output-dir", help="report directory (default runs/calibration/<name>)")
    calibrate.add_argument("--corpus", metavar="DIR", help="calibrate on small runs of your own corpus (the "
                           "paper's protocol): picks the model (≤ 1/4 of the sweep's size) and runs to fit --budget")
    calibrate.add_argument("--budget", metavar="TIME", help="with --corpus: wall time to spend (15m, 900s, 1h)")
    calibrate.add_argument("--sweep-params", type=int, help="with --corpus: the sweep's model size in "
                           "non-embedding parameters (default 100,672, the quickstart's)")
    calibrate.set_defaults(func=_cmd_calibrate)


def _add_monitor_parser(sub: Any) -> None:
    monitor = sub.add_parser("monitor", help="watch runs' curves against the collapse shape (residual, band, alarm)")
    monitor.add_argument("curves", nargs="?", help="curve file (CSV/parquet, the --from-curves format; runs in "
                                                   "progress too)")
    monitor.add_argument("--from-mlflow", metavar="EXPERIMENT_ID", help="the runs of an MLflow experiment instead")
    monitor.add_argument("--tracking-uri", help="MLflow tracking URI for --from-mlflow")
    monitor.add_argument("--metric", default="loss", help="the loss metric for --from-mlflow (default loss)")
    monitor.add_argument("--reference", metavar="REF", help="reference curves of matching controls (same format; "
                                                           "default: the predictor's curve)")
    monitor.add_argument("--predictor", metavar="P", help="predictor JSON (default: the shipped one)")
    monitor.add_argument("--smoothing-fraction", type=float, default=0.0,
                         help="smooth raw losses by a trailing mean over this fraction of each run (default 0)")
    monitor.add_argument("--job", metavar="JOB_ID", help="the trials of a sweep submitted with hpo submit "
                         "(read from MLflow as hpo status finds them; with --address)")
    monitor.add_argument("--address", help="Ray dashboard address for --job (default: RAY_ADDRESS)")
    monitor.add_argument("--follow", action="store_true", help="re-read every --every seconds until the runs end "
                         "(or Ctrl-C); print only status changes")
    monitor.add_argument("--every", type=float, default=10.0, help="seconds between reads with --follow (default 10)")
    monitor.add_argument("--json", action="store_true", help="print {\"runs\": [...]} as JSON")
    monitor.add_argument("--output", metavar="DIR", help="write a residual plot per run into DIR")
    monitor.set_defaults(func=_cmd_monitor)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train one run of the µP/CompleteP GPT")
    train.add_argument("--config", required=True, help="YAML train config")
    train.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field")
    train.add_argument("--output", help="output directory (default runs/train/<config name>)")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(func=_cmd_train)

    sweep = sub.add_parser("sweep", help="run a sweep with early stopping by predicted final loss")
    sweep.add_argument("config", help="YAML sweep config, or the name of a packaged one (quickstart)")
    sweep.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or local)")
    sweep.add_argument("--audit", action="store_true", help="stop nothing; record decisions only")
    sweep.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field")
    sweep.add_argument("--output", help="output directory (overrides output_dir)")
    sweep.set_defaults(func=_cmd_sweep)

    resume = sub.add_parser("resume", help="continue an interrupted sweep (a directory you trust: Ray's "
                                           "experiment state in it is unpickled)")
    resume.add_argument("output_dir", help="the interrupted sweep's output directory (its output_dir, e.g. runs/quickstart)")
    resume.add_argument("--address", help="Ray cluster address")
    resume.set_defaults(func=_cmd_resume)

    report = sub.add_parser("report", help="write and print the report of a sweep (and send MLflow records "
                            "its tracking server was away for)")
    report.add_argument("output_dir", help="a sweep's output directory (holds scheduler_state.json)")
    report.set_defaults(func=_cmd_report)
    _add_monitor_parser(sub)

    _add_calibrate_parser(sub)
    add_replay_parser(sub)

    submit = sub.add_parser("submit", help="run a sweep as a Ray Job on a cluster (validated here first)")
    submit.add_argument("config", help="YAML sweep config, or the name of a packaged one (quickstart)")
    submit.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field")
    submit.add_argument("--storage", help="directory on the cluster's shared storage for the outputs (default: "
                                          "HPO_STORAGE); the sweep writes <storage>/<job id>")
    submit.add_argument("--working-dir", help="ship this directory as the job's working dir (e.g. a checkout of "
                                              "collapse-hpo); default: the cluster's installed package")
    _add_cluster_options(submit)
    submit.set_defaults(func=_cmd_submit)

    status = sub.add_parser("status", help="submitted sweeps: state, rung progress, compute, early answer")
    status.add_argument("job", nargs="?", help="a job id (default: every sweep submitted to the cluster)")
    status.add_argument("--json", action="store_true", help="print JSON")
    _add_cluster_options(status)
    status.set_defaults(func=_cmd_status)

    answer = sub.add_parser("answer", help="the early answer of a submitted sweep (exit 0: answered, 3: still "
                                           "running, 1: ended without one)")
    answer.add_argument("job", help="the job id `hpo submit` printed (hpo status lists them)")
    answer.add_argument("--wait", action=argparse.BooleanOptionalAction, default=True,
                        help="block until the answer exists or the job ends (default); --no-wait: ask once")
    answer.add_argument("--timeout", type=float, help="give up waiting after this many seconds (exit 3)")
    answer.add_argument("--json", action="store_true", help="print the answer as JSON (predicted_best.json)")
    _add_cluster_options(answer)
    answer.set_defaults(func=_cmd_answer)

    logs = sub.add_parser("logs", help="the log of a submitted sweep")
    logs.add_argument("job", help="the job id `hpo submit` printed (hpo status lists them)")
    logs.add_argument("--follow", action="store_true", help="keep printing until the job ends")
    _add_cluster_options(logs)
    logs.set_defaults(func=_cmd_logs)

    stop = sub.add_parser("stop", help="stop a submitted sweep; its MLflow runs end KILLED")
    stop.add_argument("job", help="the job id `hpo submit` printed (hpo status lists them)")
    _add_cluster_options(stop)
    stop.set_defaults(func=_cmd_stop)
    return parser


#: errno values of a full or read-only disk, said in one line instead of a traceback.
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from hpo.decisions.scheduler_state import StateFileError

    try:
        return int(args.func(args))
    except (InputError, StateFileError) as exc:  # ConfigError, TrackingUriError, CurveBankError, ...
        print(f"error: {strip_credentials(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in DISK_ERRORS:
            print(strip_credentials(traceback.format_exc()), file=sys.stderr, end="")
            return 1
        # A disk that filled (or turned read-only) mid-command: what was written is consistent
        # (atomic writes), so a sweep continues with `hpo resume` once there is room.
        where = exc.filename or getattr(args, "output_dir", None) or "the output folder"
        print(f"error: {where}: {exc.strerror or exc}; free space (or make it writable) and run the command "
              "again (`hpo resume DIR` for a sweep)", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - a bug or an outside failure: the traceback, without passwords
        error = input_error_behind(exc)
        if error is not None:  # raised in Ray Tune's loop (a report-contract error), wrapped by Ray
            if not getattr(error, "announced", False):
                print(f"error: {strip_credentials(str(error))}", file=sys.stderr)
            return 2
        if INVALID_HOST in str(exc):  # a server refusing our Host header after the up-front check
            print(f"error: {host_rejected_message('MLflow', _tracking_uri_in_use(args))}", file=sys.stderr)
            return 2
        print(strip_credentials(traceback.format_exc()), file=sys.stderr, end="")
        return 1


def _tracking_uri_in_use(args: argparse.Namespace) -> str:
    """The MLflow server this command talks to: --tracking-uri, else the one MLflow was set to
    in this process (a sweep's config), else MLFLOW_TRACKING_URI."""
    uri = getattr(args, "tracking_uri", None)
    mlflow = sys.modules.get("mlflow")
    if not uri and mlflow is not None:
        current = mlflow.get_tracking_uri()
        uri = current if current.startswith(("http://", "https://")) else None
    return uri or os.environ.get("MLFLOW_TRACKING_URI", "the tracking server")


if __name__ == "__main__":
    sys.exit(main())
