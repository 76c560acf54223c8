"""The one base class of errors caused by the user's input (stdlib only, imported everywhere).

The CLI prints an :class:`InputError` as one line and exits with status 2; anything else is a
bug or an outside failure and keeps its traceback. Catching the base class lets the CLI stay
free of the heavy modules (pandas, Ray, MLflow) that define particular errors.

An input error raised inside Ray Tune's loop (a trial's results breaking the report contract)
reaches the caller wrapped in Ray's ``TuneError``, whose text is the whole traceback;
:func:`input_error_behind` finds it again, and :func:`exit_2_on_uncaught` makes a script of the
user's own (``tuner.fit()`` with ``CollapseScheduler``) end with that one line and status 2.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

#: Exceptions that wrap another raised in Ray Tune's loop (ray.tune.error.TuneError).
_WRAPPERS = ("TuneError",)


class InputError(ValueError):
    """Bad input (a config, a file, a URI, a directory); the message names what is wrong."""


def input_error_behind(exc: BaseException) -> Optional[InputError]:
    """``exc`` itself when it is an :class:`InputError`; for Ray's wrapper of an error raised in
    Tune's loop, the input error it wraps (its ``__cause__``/``__context__`` chain); else None
    (an unrelated failure raised while handling an input error keeps its traceback)."""
    if isinstance(exc, InputError):
        return exc
    if type(exc).__name__ not in _WRAPPERS:
        return None
    seen: set[int] = set()
    inner: Optional[BaseException] = exc.__cause__ or exc.__context__
    while inner is not None and id(inner) not in seen:
        if isinstance(inner, InputError):
            return inner
        seen.add(id(inner))
        inner = inner.__cause__ or inner.__context__
    return None


def announce(exc: InputError) -> None:
    """Print ``error: <message>`` to stderr once, now: before Ray's ~90-line traceback of the
    wrapper, so the reason is the first thing read."""
    if getattr(exc, "announced", False):
        return
    print(f"error: {exc}", file=sys.stderr, flush=True)
    exc.announced = True  # type: ignore[attr-defined]


def exit_2_on_uncaught() -> None:
    """Chain a ``sys.excepthook`` (once per process) under which an uncaught input error, or
    Ray's wrapper of one, ends the process with its one line (if not said already) and exit
    status 2, as the ``hpo`` CLI does; every other exception goes to the previous hook."""
    previous = sys.excepthook
    if getattr(previous, "collapse_hpo", False):
        return

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        error = input_error_behind(value)
        if error is None:
            previous(kind, value, tb)
            return
        announce(error)
        sys.exit(2)  # from an excepthook: Python exits with this status, atexit handlers (ray.shutdown) run

    hook.collapse_hpo = True  # type: ignore[attr-defined]
    sys.excepthook = hook
