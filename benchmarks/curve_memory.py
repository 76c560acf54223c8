"""Peak memory of ``hpo calibrate --from-curves`` on a large curve file, against the stated budget.

Writes a CSV of ``--runs`` runs (the 6 example runs of ``configs/curves/example_curves.csv``,
60 points each, copied under new run ids: 17,682 runs is 99 MB), prints the budget's estimates for
it (``hpo/calibration/memory.py``) and runs the calibration under ``/usr/bin/time -v`` for at most
``--seconds`` (the whole calibration of 17,682 runs takes far longer: one held-out refit per run),
printing its peak resident memory.

Usage: ``python benchmarks/curve_memory.py [--runs 17682] [--seconds 420]``
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from hpo.calibration.memory import _shape, fit_memory_mb, memory_budget_mb, read_memory_mb  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=17_682)
    parser.add_argument("--seconds", type=int, default=420)
    args = parser.parse_args()
    example = pd.read_csv(REPO_ROOT / "configs/curves/example_curves.csv")
    per_copy = example["run_id"].nunique()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.csv"
        copies = [example.assign(run_id=example["run_id"] + f"_{k}") for k in range(args.runs // per_copy)]
        pd.concat(copies).to_csv(path, index=False)
        rows, columns = _shape(path)
        size = path.stat().st_size
        print(f"{path.name}: {size / 2**20:.0f} MB, {rows:,} rows x {columns} columns; budget "
              f"{memory_budget_mb():,.0f} MB; estimated read {read_memory_mb(size, rows, columns):,.0f} MB, "
              f"fit {fit_memory_mb(len(copies) * per_copy):,.0f} MB", flush=True)
        run = subprocess.run(["/usr/bin/time", "-v", "timeout", str(args.seconds), sys.executable, "-m",
                              "hpo.service.cli", "calibrate", "--from-curves", str(path), "--output-dir",
                              str(Path(tmp) / "out"), "--predictor-out", str(Path(tmp) / "out" / "p.json")],
                             cwd=REPO_ROOT, capture_output=True, text=True)
        peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr)
        progress = [line for line in run.stdout.splitlines() if line.strip()]
        print(f"exit {run.returncode} after at most {args.seconds} s; peak RSS "
              f"{int(peak.group(1)) / 1024:,.0f} MB" if peak else run.stderr[-2000:])
        print("last progress line:", progress[-1] if progress else "(none)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
