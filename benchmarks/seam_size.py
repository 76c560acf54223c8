"""How large the decision code is, and how many files one rung decision crosses, measured.

Two figures, each counted the same way every time:

* **lines**: ``wc -l`` over ``hpo/decisions/*.py hpo/decisions/keep/*.py predictors/*ranking*
  hpo/calibration/*ranking*`` (the keep-rule seam and the ranking maths it reads);
* **files crossed**: the project files whose Python functions run during the
  ``CollapseScheduler.on_trial_result`` call that decides a sync rung (6 trials of
  ``benchmarks/scheduler_cost.py``'s synthetic sweep, the shipped predictor, the default
  collapse rule, the state written), traced with ``sys.setprofile``. "seam" counts the ``hpo/`` files plus the ``predictors/`` files
  entered directly from an ``hpo/`` frame (the first hop into the predictor library); "all" counts
  every project file, the predictor's internals included. The sweep is played by
  :class:`hpo.trials.simulator.SimulatedSweep` (no Ray runtime). The last rung's call also composes
  the early answer, so it crosses one file more.

Run::

    python benchmarks/seam_size.py [--rungs 0.2 0.3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.scheduler_cost import curves  # noqa: E402
from hpo.data import default_predictor_path  # noqa: E402
from hpo.decisions.scheduler import CollapseScheduler  # noqa: E402
from hpo.decisions.scheduler_contract import SchedulerSettings  # noqa: E402
from hpo.trials.simulator import SimulatedSweep  # noqa: E402
from predictors import Predictor  # noqa: E402

#: Plays Ray's controller (the scheduler calls its stop_trial): the harness, not the decision code.
HARNESS = Path("hpo/trials/simulator.py")
LINE_GLOBS = ("hpo/decisions/*.py", "hpo/decisions/keep/*.py", "predictors/*ranking*", "hpo/calibration/*ranking*")


def seam_lines() -> int:
    return sum(len(p.read_text().splitlines()) for g in LINE_GLOBS for p in sorted(ROOT.glob(g)) if p.is_file())


def _project_file(filename: str) -> Optional[str]:
    try:
        rel = Path(filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    if rel.suffix != ".py" or rel.parts[0] not in ("hpo", "predictors", "trainers") or rel == HARNESS:
        return None
    return str(rel)


def files_crossed(rungs: Sequence[float]) -> list[tuple[set[str], set[str]]]:
    """Per rung, (seam files, all project files) of the call that decides it."""
    predictor = Predictor.load(default_predictor_path())
    runs = curves(6, predictor)  # scheduler_cost's synthetic sweep: τ drawn per trial, so the order matters
    traces: list[tuple[set[str], set[str]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        scheduler = CollapseScheduler(predictor=predictor, settings=SchedulerSettings(rungs=list(rungs)),
                                      state_path=Path(tmp) / "scheduler_state.json")
        plain = scheduler.on_trial_result

        def traced(controller, trial, result):  # noqa: ANN001
            seam: set[str] = set()
            every: set[str] = set()

            def profile(frame, event, arg):  # noqa: ANN001
                if event != "call" or (name := _project_file(frame.f_code.co_filename)) is None:
                    return
                every.add(name)
                caller = _project_file(frame.f_back.f_code.co_filename) if frame.f_back is not None else None
                if name.startswith("hpo/") or (caller or "").startswith("hpo/"):
                    seam.add(name)

            decided = sum(r.decided for r in scheduler.state.rungs)
            sys.setprofile(profile)
            try:
                return plain(controller, trial, result)
            finally:
                sys.setprofile(None)
                if sum(r.decided for r in scheduler.state.rungs) > decided:  # this call decided a rung
                    traces.append((seam, every))

        scheduler.on_trial_result = traced  # type: ignore[method-assign]
        SimulatedSweep(scheduler, runs, n_workers=6).run()
        if len(traces) != len(rungs) or not (Path(tmp) / "scheduler_state.json").exists():
            raise SystemExit(f"error: {len(traces)} of {len(rungs)} rungs decided in one call each, or no state "
                             "written; nothing was measured")
    return traces


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rungs", type=float, nargs="+", default=[0.2, 0.3],
                        help="the sync rungs (t̂); the last one also gives the early answer")
    args = parser.parse_args(argv)
    print(f"decision code: {seam_lines():,} lines ({' '.join(LINE_GLOBS)})")
    for rung, (seam, every) in zip(args.rungs, files_crossed(args.rungs)):
        print(f"the sync rung decision at t̂ {rung} crosses {len(seam)} files (hpo/ and the predictors/ files "
              f"hpo/ calls), {len(every)} with the predictor's internals:")
        for name in sorted(every):
            print(f"  {'seam' if name in seam else '    '}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
