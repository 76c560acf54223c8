"""Reliability under faults and bad input (issue 14): writes ``benchmarks/reliability.md``.

Five measurements, each with the real CLI in real processes:

1. **kill -9 of the driver, then ``hpo resume``**, at three points of the tiny sweep of the
   test suite (``tests/sweep_fixtures.tiny_sweep``: 4 LRs at fixed τ, sync rungs 0.2 / 0.4,
   halving, margin 0): before any trial ends, mid-sweep (after the first decision, while the
   survivors train towards the second rung) and right after the first decision. The killed
   folder is *copied* and the copy resumed. Each is compared with an uninterrupted run of the
   same sweep: trial outcomes, rung decisions, MLflow runs, compute (optimizer intervals
   actually trained, counted from the MLflow loss histories, so work done twice counts twice),
   and whether the original folder was left untouched.
2. **Concurrent appends to one curve bank**: P processes appending N one-run frames each to
   the same parquet file, repeated; runs that survive and whether the file stays readable.
3. **The bad-input table** (``tests/bad_input_cases.py``, the same cases as
   ``tests/test_bad_input.py``): exit status, the one line printed, and whether anything was
   written.
4. **Concurrent drivers and a killed trial worker** (``benchmarks/reliability_concurrency.py``):
   ``hpo resume`` while the sweep's driver runs, two ``hpo sweep`` / two ``hpo calibrate`` into one
   folder at once, and SIGKILL of the Ray worker training a trial; each compared as in 1.
5. **Cluster faults** (``benchmarks/reliability_faults.py``): the MLflow tracking server stopped for
   60 s mid-sweep and restarted, a Ray worker node SIGKILLed under a submitted job, the driver
   SIGKILLed while it writes the scheduler state (and a state writer killed in a loop).
6. Scheduler cost: the table ``benchmarks/scheduler_cost.py --md benchmarks/scheduler_cost.md`` wrote
   (quoted from that file, which says when and how it was measured).

``--baseline REV`` runs sections 1 and 2 also with the code of git revision REV (e.g. the
commit before this work), for a before/after comparison.

Usage: ``python benchmarks/reliability.py [--baseline REV] [--md benchmarks/reliability.md]``
(about 15 minutes on 2 busy cores; twice that with a baseline). ``--only-bad-input`` reruns
section 3 alone (about two minutes) into the existing report, ``--only-concurrency`` section 4
(about five minutes), ``--only-faults`` section 5 (about fifteen minutes on 2 busy cores: two
``mlflow server`` and two Ray node start-ups are most of it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "tests"))

from hpo.common.tables import markdown_table  # noqa: E402

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
from reliability_runs import KILL_POINTS, Code, _compare, _rungs, kill_and_resume, uninterrupted  # noqa: E402


WRITER = """
import importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("bank_under_test", sys.argv[1])
bank = importlib.util.module_from_spec(spec); spec.loader.exec_module(bank)
path, prefix, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
t = np.linspace(0.05, 1.0, 5)
points = [{"step": i, "tokens": int(x * 2e4), "train_fraction": float(x), "train_loss": 2 / x**0.1,
           "smoothed_loss": 2 / x**0.1, "val_loss": float("nan"), "lr": 0.01} for i, x in enumerate(t)]
run = {c: 0 for c in bank.RUN_COLUMNS}
run.update(sweep="s", schedule="linear", corpus_hash="x", status="completed", config_json="{}")
for i in range(n):
    bank.append_runs(path, [bank.curve_frame({**run, "run_id": f"{prefix}{i}", "tau": 0.1 + i}, points)])
"""


def concurrent_appends(module: Path, pythonpath: Path, processes: int, appends: int, repeats: int) -> dict[str, Any]:
    """``processes`` writers × ``appends`` appends each, ``repeats`` times; what survived."""
    import pandas as pd

    kept, unreadable, writer_failures = [], 0, 0
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "bank.parquet"
            writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(module), str(path), f"p{k}_", str(appends)],
                                        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                       for k in range(processes)]
            writer_failures += sum(w.wait(timeout=900) != 0 for w in writers)
            try:
                kept.append(pd.read_parquet(path)["run_id"].nunique())
            except Exception:  # noqa: BLE001 - an unreadable bank is the result being measured
                unreadable += 1
                kept.append(0)
    expected = processes * appends
    return {"processes": processes, "appends": appends, "repeats": repeats, "expected": expected,
            "kept": kept, "unreadable": unreadable, "writer_failures": writer_failures,
            "lost": sum(expected - k for k in kept)}


# ----------------------------------------------------------------------------- the report


def _baseline(rev: str, into: Path) -> Code:
    """The files of git revision ``rev`` needed to run a sweep, unpacked into ``into``."""
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", rev, "hpo", "trainers", "predictors",
                              "configs/predictors"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return Code(f"before ({rev})", into)


def render(results: dict[str, Any]) -> str:
    out = ["# Reliability under faults and bad input", "",
           f"Written by `python benchmarks/reliability.py{results['args']}` "
           f"({results['minutes']:.0f} min on this machine, {results['when']}). Real processes throughout: "
           "the `hpo` CLI, a local Ray, MLflow on SQLite.", ""]
    ref = results["uninterrupted"]
    out += ["## kill -9 of the driver, then `hpo resume`", "",
            "The tiny sweep of the test suite (4 LRs at fixed τ, sync rungs t̂ = 0.2 / 0.4, halving, margin 0). "
            "Each run is killed (SIGKILL of the driver's process group: driver, local Ray, trials) at the point "
            "named, its folder is copied elsewhere and `hpo resume <copy>` continues the copy. Compared with an "
            "uninterrupted run of the same sweep: trial outcomes (status and stop fraction per trial), the "
            "survivors of each rung, the MLflow runs, and the compute actually trained (optimizer intervals "
            "logged, so work done twice counts twice, as a share of training every trial to the end).", "",
            f"Uninterrupted: {len(ref['outcomes'])} trials, survivors {_rungs(ref['decisions'])}, "
            f"{ref['parents']} parent + {ref['children']} trial runs ({'/'.join(ref['statuses'])}), "
            f"compute {100 * ref['compute']:.1f}%, {ref['wall_s']:.0f} s.", ""]
    rows = []
    for code_label, scenarios in results["kills"].items():
        for s in scenarios:
            c = _compare(ref, s)
            killed = f"{s['killed']['decided']} rung(s) decided, t̂ ≤ {s['killed']['t_max']:.2f}"
            rows.append([code_label, s["point"], killed, s.get("records_in", "copy"),
                         f"{s['resume_rc']}" + (f" ({s['resume_tail'][0][:80]})" if s["resume_tail"] else ""),
                         c["trials"], c["decisions"], c["mlflow"], c["compute"],
                         "yes" if s["original_untouched"] else "**no: the resume wrote into it**",
                         f"{s['resume_wall_s']:.0f}"])
    out += [markdown_table(["code", "killed", "state at kill", "records read from", "resume exit", "trials",
                            "decisions", "MLflow runs", "compute", "original untouched", "resume s"], rows), ""]
    out += ["How to read it. *Records read from*: where the resumed sweep kept its scheduler state and MLflow "
            "runs; code that wrote into the original folder is measured there. Compute above the uninterrupted "
            "run is work trained twice: a trial killed between checkpoints goes back to its newest complete "
            "checkpoint on disk (a rung's pause checkpoint, else every 25 intervals, else step 0), so killed "
            "before any trial ends the first intervals of every trial are trained again, and killed mid-sweep the "
            "survivors go back to their pause checkpoints at t̂ = 0.2. Killed right after a decision, the "
            "survivors that waited at the rung continue from their pause checkpoints; the trial whose arrival "
            "decided the rung is not paused (that saves a save and restore per rung), so if it survived it goes "
            "back to its newest checkpoint, and nothing was trained twice only when it was a loser; compute can come out "
            "slightly below the uninterrupted run because a trial that the decision stopped is ended at once on "
            "resume instead of finishing the interval it was in.", ""]
    out += ["## Concurrent appends to one curve bank", "",
            "P processes append N one-run frames each, at the same time, to one parquet bank; repeated R times. "
            "Runs kept: distinct runs readable at the end (expected P·N each time).", ""]
    rows = []
    for code_label, cases in results["appends"].items():
        for a in cases:
            rows.append([code_label, f"{a['processes']} × {a['appends']}", a["repeats"],
                         ", ".join(f"{k}/{a['expected']}" for k in a["kept"]), a["lost"],
                         f"{a['unreadable']} of {a['repeats']}", a["writer_failures"]])
    out += [markdown_table(["code", "processes × appends", "repeats", "runs kept", "runs lost", "bank unreadable",
                            "writers that failed"], rows), ""]
    from reliability_concurrency import section

    out += section(results["concurrency"], ref, results["answer"])
    import reliability_faults

    out += reliability_faults.section(results["faults"], ref, results["answer"])
    out += bad_input_section(results["bad_input"])
    out += ["## Scheduler cost", ""] + scheduler_cost_section() + [""]
    return "\n".join(out)


def bad_input_section(bad: list[dict[str, Any]], note: str = "") -> list[str]:
    """The bad-input table (section 3) as markdown lines."""
    holds = sum(not b["problems"] for b in bad)
    out = ["## Bad input", "", *([note, ""] if note else []),
           f"**{holds} of {len(bad)} cases** exit with status 2 and one line naming the field, file or value, "
           "having written nothing (no output folder, no `mlflow.db`, no MLflow run; the case folder holds only "
           "its input afterwards). The same cases are `tests/test_bad_input.py`; seconds include Python start-up, "
           "four cases at a time.", ""]
    rows = [[b["what"], "`hpo " + " ".join(b["argv"]) + "`", b["returncode"], b["line"],
             "nothing" if not b["written"] else ", ".join(b["written"]), f"{b['seconds']:.1f}",
             "holds" if not b["problems"] else "; ".join(b["problems"])] for b in bad]
    return out + [markdown_table(["input", "command", "exit", "message", "written", "s", "contract"], rows), ""]


def _bad_input_rows(root: Path) -> list[dict[str, Any]]:
    from bad_input_cases import run_all

    bad = run_all(root)
    return [{"name": o.case.name, "what": o.case.what, "argv": o.case.argv,
             "returncode": o.returncode, "line": (o.lines or ["(nothing)"])[0][:160],
             "written": o.written, "seconds": o.seconds, "problems": o.problems()}
            for o in bad.values()]


def refresh_bad_input(md: Path, work: Path) -> None:
    """``--only-bad-input``: rerun the bad-input table (two minutes, no sweeps) and replace that
    section and the scheduler-cost quote of an existing report; sections 1-2 stay as measured."""
    bad = _bad_input_rows(work / "bad-input")
    text = md.read_text()
    head = text.split("## Bad input", 1)[0]
    note = (f"Regenerated alone with `python benchmarks/reliability.py --only-bad-input` on {time.strftime('%Y-%m-%d')}"
            " (the sections above are from the last full run).")
    md.write_text(head + "\n".join(bad_input_section(bad, note) + ["## Scheduler cost", ""]
                                   + scheduler_cost_section() + [""]) + "\n")


def scheduler_cost_section(path: Path = REPO_ROOT / "benchmarks" / "scheduler_cost.md") -> list[str]:
    """The scheduler-cost figures, quoted from the file ``benchmarks/scheduler_cost.py`` writes
    (one measurement, one home: this report does not time the scheduler itself)."""
    if not path.exists():
        return [f"Not measured yet: run `python benchmarks/scheduler_cost.py --md {path.relative_to(REPO_ROOT)}`."]
    lines = path.read_text().splitlines()
    body = lines[1:] if lines and lines[0].startswith("# ") else lines
    return [f"From `{path.relative_to(REPO_ROOT)}` (`python benchmarks/scheduler_cost.py --md ...`):", ""] + body


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="also run sections 1-2 with the code of this git revision")
    parser.add_argument("--md", type=Path, default=REPO_ROOT / "benchmarks" / "reliability.md")
    parser.add_argument("--work", type=Path, help="working folder (default: a temporary one)")
    parser.add_argument("--appends", type=int, default=40, help="appends per process in the bank test")
    parser.add_argument("--only-concurrency", action="store_true",
                        help="rerun only the concurrency / worker-kill section into the existing --md")
    parser.add_argument("--only-faults", action="store_true",
                        help="rerun only the cluster-faults section into the existing --md")
    parser.add_argument("--only-bad-input", action="store_true",
                        help="rerun only the bad-input table (and quote the scheduler cost) into the existing --md")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    work = Path(args.work or tempfile.mkdtemp(prefix="reliability-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.only_bad_input:
        refresh_bad_input(args.md, work)
        print(f"wrote the bad-input section of {args.md} ({time.perf_counter() - began:.0f} s)")
        return 0
    if args.only_faults:
        from reliability_faults import refresh as refresh_faults

        refresh_faults(args.md, work)
        print(f"wrote the cluster-faults section of {args.md} ({time.perf_counter() - began:.0f} s)")
        return 0
    if args.only_concurrency:
        from reliability_concurrency import refresh

        refresh(args.md, work)
        print(f"wrote the concurrency section of {args.md} ({time.perf_counter() - began:.0f} s)")
        return 0
    codes = [Code("this branch", REPO_ROOT)]
    if args.baseline:
        (work / "baseline").mkdir(exist_ok=True)
        codes.append(_baseline(args.baseline, work / "baseline"))

    print("uninterrupted sweep ...", flush=True)
    results: dict[str, Any] = {"uninterrupted": uninterrupted(work / "uninterrupted", codes[0]),
                               "kills": {}, "appends": {}}
    for code in codes:
        results["kills"][code.label] = []
        for i, point in enumerate(KILL_POINTS):
            print(f"{code.label}: kill {point} ...", flush=True)
            folder = work / f"kill-{code.label.split()[0]}-{i}"
            folder.mkdir(parents=True, exist_ok=True)
            results["kills"][code.label].append(kill_and_resume(folder, code, point))
    from reliability_concurrency import answer_of, run_section

    print("concurrent drivers and a killed trial worker ...", flush=True)
    results["answer"] = answer_of(work / "uninterrupted" / "out")
    results["concurrency"] = run_section(work / "concurrency", codes[0], results["uninterrupted"], results["answer"])
    import reliability_faults

    print("cluster faults ...", flush=True)
    results["faults"] = reliability_faults.run_section(work / "faults", codes[0], results["uninterrupted"],
                                                       results["answer"])
    for code in codes:
        print(f"{code.label}: concurrent appends ...", flush=True)
        module = next(m for m in (code.root / "hpo" / "trials" / "curve_bank.py", code.root / "hpo" / "curve_bank.py")
                      if m.exists())  # moved into hpo/trials/ since issue 14
        results["appends"][code.label] = [concurrent_appends(module, code.root, 2, args.appends, 3),
                                          concurrent_appends(module, code.root, 2, 3, 6)]
    print("bad input ...", flush=True)
    results["bad_input"] = _bad_input_rows(work / "bad-input")
    results["minutes"] = (time.perf_counter() - began) / 60
    results["when"] = time.strftime("%Y-%m-%d")
    results["args"] = (f" --baseline {args.baseline}" if args.baseline else "") + (
        f" --appends {args.appends}" if args.appends != 40 else "")
    (work / "reliability.json").write_text(json.dumps(results, indent=1, default=str))
    args.md.write_text(render(results) + "\n")
    print(f"wrote {args.md} (raw results: {work / 'reliability.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
