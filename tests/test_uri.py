"""Tracking URIs checked up front (hpo.tracking.uri): stores a sweep cannot write, drivers not installed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from hpo.tracking.uri import TrackingUriError, check_tracking_uri


def _immutable(path: Path) -> bool:
    if os.geteuid() == 0:  # root ignores mode bits
        return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
    path.chmod(0o555 if path.is_dir() else 0o444)
    return True


def _mutable(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    path.chmod(0o755 if path.is_dir() else 0o644)


def test_sqlite_store_in_a_read_only_folder_or_file_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    (tmp_path / "m.db").write_bytes(b"")
    if not (_immutable(folder) and _immutable(tmp_path / "m.db")):
        pytest.skip("cannot make files read-only here")
    try:
        with pytest.raises(TrackingUriError, match="mlflow.tracking_uri: .*directory .*ro is not writable"):
            check_tracking_uri(f"sqlite:///{folder / 'm.db'}")
        with pytest.raises(TrackingUriError, match="m.db is read-only"):
            check_tracking_uri(f"sqlite:///{tmp_path / 'm.db'}")
        # Reading curves from a read-only store is fine (must_exist: --from-mlflow reads only).
        with pytest.raises(TrackingUriError, match="not an MLflow store"):
            check_tracking_uri(f"sqlite:///{tmp_path / 'm.db'}", "--tracking-uri", must_exist=True)
    finally:
        _mutable(folder)
        _mutable(tmp_path / "m.db")
    check_tracking_uri(f"sqlite:///{folder / 'm.db'}")  # writable again: accepted


@pytest.mark.skipif(importlib.util.find_spec("psycopg") is not None, reason="psycopg is installed here")
def test_postgres_uri_without_its_driver_says_what_to_install_without_the_password() -> None:
    with pytest.raises(TrackingUriError) as caught:
        check_tracking_uri("postgresql://alice:pw@127.0.0.1:9/mlflow")
    message = str(caught.value)
    assert 'pip install "collapse-hpo[postgres]"' in message and "'psycopg'" in message
    assert "pw" not in message and "alice" not in message and "\n" not in message


_KILLED_WRITER = """
import os, signal, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.executescript("CREATE TABLE runs(x); CREATE TABLE experiments(x); CREATE TABLE metrics(x); "
                 "CREATE TABLE params(x); CREATE TABLE tags(x); CREATE TABLE alembic_version(x);")
db.execute("PRAGMA cache_size=1")  # spill the open transaction into the database file
db.execute("BEGIN")
db.executemany("INSERT INTO runs VALUES (?)", [("x" * 100,)] * 20000)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_store_left_mid_write_by_a_killed_driver_is_accepted_and_left_untouched(tmp_path: Path) -> None:
    """A driver killed inside an MLflow write leaves a hot journal; resuming that sweep must not
    be refused as "not a usable SQLite database" (the read-only look cannot roll the journal
    back, MLflow's own open does), and the check must not change the files."""
    import sys

    store = tmp_path / "mlflow.db"
    subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(store)], check=False)
    journal = tmp_path / "mlflow.db-journal"
    assert journal.is_file() and journal.stat().st_size > 0, "the killed writer left no hot journal"
    before = (store.read_bytes(), journal.read_bytes())
    check_tracking_uri(f"sqlite:///{store}", "output_dir")
    check_tracking_uri(f"sqlite:///{store}", "--tracking-uri", must_exist=True)
    assert (store.read_bytes(), journal.read_bytes()) == before
    # A file that is no database is still refused.
    journal.unlink()
    store.write_bytes(b"not a database" * 100)
    with pytest.raises(TrackingUriError, match="not a usable SQLite database"):
        check_tracking_uri(f"sqlite:///{store}", "output_dir")
