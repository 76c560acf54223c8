"""SIGTERM to the driver mid-sweep, then ``hpo resume``: prints the rows of the SIGTERM section of
``benchmarks/reliability.md``.

The tiny sweep of ``benchmarks/reliability_runs`` (the test suite's: 4 LRs at fixed τ, sync rungs
0.2 / 0.4, halving), run uninterrupted, then twice more stopped mid-sweep (after the first rung's
decision, the survivors training towards the second) by one SIGTERM, and by two SIGTERMs 1 s
apart, sent to the driver's pid alone (what ``kill PID``, ``timeout``, systemd, Slurm and
Kubernetes send first). The stopped folder is copied and the copy resumed; compared with the
uninterrupted run as the kill -9 section is (trials, rung survivors, MLflow runs, compute).

Usage: ``python benchmarks/reliability_signals.py [--work DIR]`` (about 4 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "tests"))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from hpo.common.tables import markdown_table  # noqa: E402
from reliability_runs import Code, _compare, kill_and_resume, uninterrupted  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="reliability-signals-"))
    code = Code("this branch", REPO_ROOT)
    began = time.perf_counter()
    (work / "uninterrupted").mkdir(parents=True, exist_ok=True)
    ref = uninterrupted(work / "uninterrupted", code)
    rows = []
    for count in (1, 2):
        folder = work / f"sigterm-{count}"
        folder.mkdir(parents=True, exist_ok=True)
        got = kill_and_resume(folder, code, "mid-sweep", sigterms=count)
        compared = _compare(ref, got)
        rows.append({"signal": f"{count} SIGTERM{'s, 1 s apart' if count > 1 else ''} to the driver's pid, mid-sweep",
                     "driver exit": str(got["stop_rc"]),
                     "state at stop": f"{got['killed']['decided']} rung(s) decided, t̂ ≤ {got['killed']['t_max']:.2f}",
                     "resume exit": str(got["resume_rc"]), **compared, "resume s": f"{got['resume_wall_s']:.0f}"})
    print(f"Uninterrupted: compute {100 * ref['compute']:.1f}%, {ref['wall_s']:.0f} s; "
          f"all in {time.perf_counter() - began:.0f} s, {time.strftime('%Y-%m-%d')}")
    print(markdown_table(list(rows[0]), [list(r.values()) for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
