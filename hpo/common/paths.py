"""Checks of the paths a command reads and writes, made before any work starts (stdlib only).

Every command that writes a folder or a file (``hpo train --output``, a sweep's ``output_dir``,
``hpo calibrate --output-dir`` and ``--predictor-out``) and every command that reads a user's
file (a curve file) checks it here first, so that a path that cannot work is one line naming
the field and the path, exit status 2, with nothing written and no training done:

* an empty path (``output_dir: ""`` would otherwise mean the working directory or a default);
* a dangling symbolic link (its target would be created somewhere the user did not name);
* an output folder that is a file, or lies under a file; an output file that is a directory;
* a folder the process cannot write (a read-only mount, an immutable or permission-denied folder),
  found with ``os.access`` on the nearest existing ancestor: nothing is created to find out;
* an input that is not a regular file (a FIFO would block the read for ever, a device never ends).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Union

from hpo.common.errors import InputError

PathLike = Union[str, "os.PathLike[str]"]


class PathError(InputError):
    """A path that cannot be used; the message names the field and the path."""


def _given(value: PathLike | None, field: str) -> Path:
    if value is None or not str(value).strip():
        raise PathError(f"{field}: empty path; name a folder or file (or leave the setting out for the default)")
    return Path(os.path.expanduser(str(value)))


def _refuse_dangling(path: Path, field: str) -> None:
    """A symlink on the way whose target does not exist: writing through it would create the target."""
    for part in (path, *path.parents):
        if part.is_symlink() and not part.exists():
            raise PathError(f"{field}: {path}: {part} is a symbolic link to {os.readlink(part)}, which does not "
                            "exist; give the real folder (or create the target first)")


def _nearest_existing(folder: Path, target: Path, field: str) -> Path:
    """The first ancestor of ``folder`` (itself included) that exists; refuse one that is not a
    folder (``target``, the path being checked, is named in the message)."""
    ancestor = folder
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise PathError(f"{field}: cannot create {target}: {ancestor} is a file, not a folder")
    return ancestor


def _check_writable(folder: Path, path: Path, field: str) -> None:
    if not os.access(folder, os.W_OK | os.X_OK):
        what = "cannot write into" if folder == path else f"cannot create {path}:"
        raise PathError(f"{field}: {what} {folder} (not writable: permissions or a read-only file system)")


def check_output_dir(value: PathLike | None, field: str) -> Path:
    """The absolute folder ``value`` names, if it is (or can be created as) a writable folder;
    else :class:`PathError` naming ``field``. Creates nothing."""
    given = _given(value, field)
    path = Path(os.path.abspath(given))
    _refuse_dangling(path, field)
    path = path.resolve()
    if path.exists() and not path.is_dir():
        raise PathError(f"{field}: {path} exists and is not a directory")
    _check_writable(_nearest_existing(path, path, field), path, field)
    return path


def check_output_file(value: PathLike | None, field: str) -> Path:
    """The absolute file path ``value`` names, if a file can be written there (its folder
    exists or can be created, and is writable; the path is not a folder); else
    :class:`PathError` naming ``field``. Creates nothing."""
    given = _given(value, field)
    path = Path(os.path.abspath(given))
    _refuse_dangling(path, field)
    path = path.resolve()
    if path.is_dir():
        raise PathError(f"{field}: {path} is a directory; give a file path (e.g. {path / 'predictor.json'})")
    if path.exists() and not path.is_file():
        raise PathError(f"{field}: {path} exists and is not a regular file")
    folder = _nearest_existing(path.parent, path, field)
    _check_writable(folder, path.parent, field)
    if path.exists() and not os.access(path, os.W_OK):
        raise PathError(f"{field}: cannot replace {path} (not writable)")
    return path


def check_input_file(value: PathLike, field: str = "", what: str = "file") -> Path:
    """``value`` as a Path if it names an existing regular file (symlinks followed); else
    :class:`PathError`: missing, a directory, or a FIFO, socket or device, whose read would
    block or never end."""
    path = Path(value)
    where = f"{field}: {path}" if field else str(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise PathError(f"{where}: no such {what}") from None
    except OSError as exc:
        raise PathError(f"{where}: cannot read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(mode):
        raise PathError(f"{where}: is a directory, not a {what}")
    if not stat.S_ISREG(mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise PathError(f"{where}: is {kind}, not a regular {what}; only regular files are read")
    kernel = _kernel_file(path)
    if kernel is not None:
        # /proc and /sys files pass as regular files (size 0) but are the kernel's views of
        # processes and devices: /proc/self/mem fails with EIO, others never end.
        raise PathError(f"{where}: is a file of the kernel's {kernel} (resolves to {path.resolve()}), not a {what}")
    return path


#: Pseudo-filesystems whose files look regular but are not data.
KERNEL_FILESYSTEMS = ("/proc", "/sys")


def _kernel_file(path: Path) -> str | None:
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop: stat() above would have said so
        return None
    return next((fs for fs in KERNEL_FILESYSTEMS if resolved.is_relative_to(fs)), None)
