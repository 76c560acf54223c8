"""One driver per output folder: an exclusive ``flock`` held by ``hpo sweep``, ``hpo resume``
and ``hpo calibrate`` for their lifetime.

Two drivers in one folder corrupt it (one trial trained twice, rung decisions rewritten, a
running sweep's ``sweep.yaml`` overwritten, an ``mlflow.db`` broken by two writers), so the
second one is refused with exit status 2, naming the holder's command, pid and host.

The lock is ``<folder>/.hpo.lock``. ``flock`` locks belong to the open file and the kernel
drops them when the holder dies (``kill -9`` included), so a killed driver never leaves the
folder locked; the file's text (who holds it) is only for the message. ``flock`` is not
reliable across hosts on every network file system: the host is named so that a user sharing
a folder between machines can tell.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> folder = Path(tempfile.mkdtemp()) / "out"
    >>> with hold_folder(folder, "hpo sweep"):
    ...     try:
    ...         with hold_folder(folder, "hpo resume"):
    ...             pass
    ...     except FolderBusyError as exc:
    ...         print("in use by hpo sweep" in str(exc))
    True
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Iterator

from hpo.common.errors import InputError

LOCK_FILE = ".hpo.lock"


class FolderBusyError(InputError):
    """Another live process holds the folder's lock; the message names it."""


def _holder(fd: int) -> dict[str, Any]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return json.loads(os.read(fd, 4096).decode() or "{}")
    except (OSError, ValueError):
        return {}


def _busy(folder: Path, holder: dict[str, Any]) -> FolderBusyError:
    who = holder.get("command") or "another hpo command"
    since = f", since {holder['since']}" if holder.get("since") else ""
    return FolderBusyError(
        f"{folder}: in use by {who} (pid {holder.get('pid', '?')} on host {holder.get('host', '?')}{since}); "
        "one driver per folder: wait for it to end, or stop it first")


@contextlib.contextmanager
def hold_folder(folder: str | Path, command: str) -> Iterator[Path]:
    """Hold ``folder``'s exclusive lock (creating the folder) while the block runs.

    Raises :class:`FolderBusyError` at once (never waits) when a live process holds it. If
    this call created the folder and the block fails leaving nothing but the lock file, the
    folder is removed again: a start that failed writes nothing.
    """
    folder = Path(folder)
    created = not folder.exists()
    path = folder / LOCK_FILE
    while True:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise _busy(folder, holder) from None
        # The file may have been removed (a failed start cleaning up) between our open and
        # our lock: a lock on an unlinked file guards nothing, so lock the file there now.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps({"command": command, "pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).encode())
        yield folder
    except BaseException:
        if created and {p.name for p in folder.iterdir()} == {LOCK_FILE}:
            with contextlib.suppress(OSError):
                path.unlink()
                folder.rmdir()
        raise
    finally:
        os.close(fd)  # releases the lock
