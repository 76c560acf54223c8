"""SIGTERM stops a sweep the way Ctrl-C does.

``kill``, ``timeout``, systemd, Slurm and Kubernetes send SIGTERM first (then SIGKILL after a
grace period). ``ray.init`` installs its own SIGTERM handler in the driver (``sys.exit``), which
tears Ray down under Ray Tune's feet: the process aborts (exit -6, a C++ stack dump), the
parent MLflow run and the running trials end FAILED, and no report or resume hint is printed.

:func:`stop_like_ctrl_c` replaces it (call it after ``ray.init``): the first SIGTERM asks Ray
Tune to end the run as its own SIGINT handler does (save the experiment state, stop the
trials), so the sweep ends as an interrupted one: the partial report, the runs KILLED, the
``hpo resume`` line, exit status 130. A SIGTERM before ``tune.run`` has installed its handler
is held and handed to it by :class:`DeferredStop` at the loop's first step. A second SIGTERM
ends the driver at once with the resume line: what is on disk then is what a SIGKILL leaves
(state files are written atomically), which ``hpo resume`` continues.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any, Callable, Optional

from ray.tune import Callback  # imported by the driver only, after Ray

_requested = threading.Event()


def stop_requested() -> bool:
    """Whether a SIGTERM asked this driver to stop."""
    return _requested.is_set()


def _tune_handler() -> Optional[Callable[..., Any]]:
    """Ray Tune's stop handler while ``tune.run`` is running (it stays on SIGUSR1 even after a
    first Ctrl-C restores SIGINT's), else None."""
    handler = signal.getsignal(signal.SIGUSR1)
    return handler if callable(handler) and getattr(handler, "__name__", "") == "signal_interrupt_tune_run" else None


def stop_like_ctrl_c(resume_hint: str) -> None:
    """Install the driver's SIGTERM handler (main thread only; elsewhere Python forbids it).
    ``resume_hint``: the line printed if a second SIGTERM ends the driver at once."""
    if threading.current_thread() is not threading.main_thread():
        return
    _requested.clear()

    def on_sigterm(signum: int, frame: Any) -> None:
        if _requested.is_set():  # the second one: no more waiting
            print(f"error: stopped by a second SIGTERM; {resume_hint}", file=sys.stderr, flush=True)
            os._exit(128 + signal.SIGTERM)  # Ray's processes share the driver's fate
        _requested.set()
        print("SIGTERM received: stopping the sweep as Ctrl-C does (a second SIGTERM ends it at once)",
              file=sys.stderr, flush=True)
        handler = _tune_handler()
        if handler is not None:
            handler(signal.SIGUSR1, frame)

    signal.signal(signal.SIGTERM, on_sigterm)


class DeferredStop(Callback):
    """A Ray Tune callback that hands a SIGTERM received before ``tune.run`` installed its
    handler to that handler at the loop's first step."""

    def __init__(self) -> None:
        self.handed = False

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if _requested.is_set() and not self.handed:
            handler = _tune_handler()
            if handler is not None:
                self.handed = True
                handler(signal.SIGUSR1, None)
