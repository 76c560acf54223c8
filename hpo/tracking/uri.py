"""MLflow tracking URIs: credentials kept out of every file and message, and checked up front.

Stdlib only (importing MLflow takes seconds), so ``hpo sweep`` and ``hpo calibrate`` can refuse
a bad URI before anything is imported, started or written.

* :func:`strip_credentials` is the one place a URI loses its user part
  (``scheme://user:password@host`` → ``scheme://host``); it is applied to every URI that is
  printed or saved (``sweep.yaml``, MLflow artifacts, error messages, a predictor's provenance).
* :func:`use_credentials` moves the user part of an ``http(s)`` URI into MLflow's own
  ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` variables of this process, so
  the client still authenticates while only the stripped URI is kept anywhere.
* :func:`check_tracking_uri` refuses an unknown scheme, an in-memory SQLite store, a file
  store (MLflow 3 refuses them when first used), a SQLite database in a missing directory, and an HTTP server that does not answer within a few seconds, each with one line
  naming the field; and a server that answers ``/health`` but refuses the API (403: the
  Host-header check of recent MLflow servers, or a user without access), naming the server and the fix.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

from hpo.common.errors import InputError

#: Schemes MLflow 3 understands without plugins (its tracking-store registry).
BUILTIN_SCHEMES = frozenset({"", "file", "sqlite", "http", "https", "postgresql", "mysql", "mssql",
                             "databricks", "databricks-uc", "uc"})
#: Seconds an HTTP tracking server gets to answer the up-front check.
HTTP_TIMEOUT_S = 5.0
#: The body of MLflow's 403 for a Host header it does not accept (mlflow.server.security_utils).
INVALID_HOST = "Invalid Host header"

# scheme://user[:password]@ — the user part of any URI inside a text.
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^/\s@?#]*@")


class TrackingUriError(InputError):
    """The tracking URI cannot be used; the message names the field and the (stripped) URI."""


#: ``mlflow ui``'s own address when started without ``--host``/``--port``.
LOCAL_UI = "http://127.0.0.1:5000"


def experiment_page(ui: str, experiment_id: object) -> str:
    """The MLflow UI's page of an experiment, on its runs table: MLflow 3's UI opens an
    experiment on its GenAI pages (traces, latency) unless the URL asks for model training
    (``workflowType=machine_learning``; its sidebar switch remembers the choice per browser)."""
    return f"{ui.rstrip('/')}/#/experiments/{experiment_id}?workflowType=machine_learning"


def strip_credentials(text: str) -> str:
    """``text`` with the user part of every URI in it removed:
    ``http://user:secret@host:5000/x`` → ``http://host:5000/x``. Works on a bare URI and on
    any message that contains URIs."""
    return _USERINFO.sub(r"\1", text) if text else text


def use_credentials(uri: str) -> str:
    """For an ``http(s)`` URI with a user part: put user and password into
    ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` of this process (MLflow's
    basic-auth settings) and return the stripped URI. Other URIs come back unchanged (a
    database URI needs its password in the URI; it is stripped wherever it is shown)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme.lower() not in ("http", "https") or "@" not in parts.netloc:
        return uri
    if parts.username:
        os.environ["MLFLOW_TRACKING_USERNAME"] = urllib.parse.unquote(parts.username)
    if parts.password:
        os.environ["MLFLOW_TRACKING_PASSWORD"] = urllib.parse.unquote(parts.password)
    return strip_credentials(uri)


def _scheme(uri: str) -> str:
    if "://" not in uri and not uri.startswith("sqlite:"):
        return ""  # a plain path: MLflow's file store
    return uri.split(":", 1)[0].lower()


def _plugin_schemes() -> set[str]:
    """Schemes registered by installed MLflow tracking-store plugins (entry points; no import)."""
    from importlib.metadata import entry_points

    return {ep.name for ep in entry_points(group="mlflow.tracking_store")}


def sqlite_path(uri: str) -> Optional[Path]:
    """The database file of a ``sqlite:`` URI (None for an in-memory database)."""
    rest = uri[len("sqlite:"):]
    if rest.startswith("///"):
        path = rest[3:]
    elif rest.startswith("//"):
        path = rest[2:]
    else:
        path = rest
    path = path.split("?", 1)[0]
    if path in ("", ":memory:"):
        return None
    return Path(path if path.startswith("/") else Path.cwd() / path)


def check_tracking_uri(uri: str, field: str = "mlflow.tracking_uri", *, must_exist: bool = False,
                       timeout_s: float = HTTP_TIMEOUT_S) -> None:
    """Raise :class:`TrackingUriError` (one line naming ``field``) if ``uri`` cannot work.

    Nothing is created: a SQLite database or file store must lie in an existing directory
    (MLflow would create missing directories silently), and with ``must_exist`` (reading
    curves) the database itself must exist. An ``http(s)`` server must answer an HTTP request
    within ``timeout_s`` (MLflow's own client retries for minutes without a word).
    """
    shown = strip_credentials(uri)
    scheme = _scheme(uri)
    base = scheme.split("+", 1)[0]  # postgresql+psycopg2 → postgresql
    if base not in BUILTIN_SCHEMES and scheme not in _plugin_schemes():
        raise TrackingUriError(
            f"{field}: {shown}: unknown tracking URI scheme {scheme + '://'!r}; use sqlite:///PATH.db, "
            "file:///DIR, a directory, http(s)://HOST:PORT or a database URI")
    if scheme == "sqlite":
        path = sqlite_path(uri)
        if path is None:
            # MLflow would keep nothing past the command, and write ./mlruns and a file named
            # ':memory:' into the working directory.
            raise TrackingUriError(f"{field}: {shown}: an in-memory MLflow store keeps nothing; "
                                   "give a database file, sqlite:////ABSOLUTE/PATH.db")
        _check_local(path, field, shown, what="database", must_exist=must_exist)
        if must_exist:
            check_mlflow_database(path, field, shown)
        elif path.is_file() and path.stat().st_size > 0:
            check_sqlite_file(path, field, shown)
    elif scheme in ("", "file"):
        if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() not in ("1", "true", "yes"):
            # MLflow 3 refuses its file store (maintenance mode) when first used: after Ray started.
            raise TrackingUriError(
                f"{field}: {shown}: MLflow 3 no longer serves file stores (a directory or file://); use a "
                "database, sqlite:////ABSOLUTE/PATH.db (`mlflow migrate-filestore` moves an existing store), "
                "or set MLFLOW_ALLOW_FILE_STORE=true")
        local = Path(urllib.parse.urlsplit(uri).path if scheme == "file" else uri)
        _check_local(local, field, shown, what="store", must_exist=must_exist, directory=True)
    elif scheme in ("http", "https"):
        _check_http(uri, field, shown, timeout_s)
    elif base in ("postgresql", "mysql", "mssql"):
        check_database_driver(uri, field, shown)


#: What to install for a database tracking store whose Python driver (module) is missing.
DRIVER_INSTALL = {"psycopg": 'pip install "collapse-hpo[postgres]"',
                  "psycopg2": 'pip install psycopg2-binary (or pip install "collapse-hpo[postgres]" and a '
                              'postgresql+psycopg:// URI)',
                  "pymysql": 'pip install "collapse-hpo[mysql]"',
                  "MySQLdb": 'pip install "collapse-hpo[mysql]" and use a mysql+pymysql:// URI (or pip install '
                             'mysqlclient)'}


def check_database_driver(uri: str, field: str, shown: str) -> None:
    """Refuse a database URI whose SQLAlchemy driver is not installed, saying what to install
    (MLflow would fail with ``ModuleNotFoundError`` once the sweep had started). Imports the
    driver, not the database: the server itself is reached only when MLflow opens it."""
    try:
        from sqlalchemy.engine.url import make_url

        make_url(uri).get_dialect().import_dbapi()
    except ModuleNotFoundError as exc:
        how = DRIVER_INSTALL.get(exc.name or "", f"pip install {exc.name}")
        raise TrackingUriError(f"{field}: {shown}: the database driver {exc.name!r} is not installed; {how}") from None
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy's own refusal of the URI (unknown driver, bad syntax)
        raise TrackingUriError(f"{field}: {shown}: not a usable database URI ({' '.join(str(exc).split())})") from None


def read_table_names(path: Path) -> list[str]:
    """The tables of the SQLite database at ``path``, read without writing to it.

    A writer killed inside a transaction (a driver stopped with SIGKILL, the case ``hpo resume``
    exists for) leaves a hot journal beside the database; a read-only connection cannot roll it
    back and fails with "attempt to write a readonly database", although the next read-write open
    (MLflow's) recovers the store. Then the database and its journal are copied to a scratch
    folder and opened there, so the check sees the recovered store and the user's files are
    left exactly as they were. Raises :class:`sqlite3.DatabaseError` for anything else.
    """
    import shutil
    import sqlite3
    import tempfile

    query = "SELECT name FROM sqlite_master WHERE type = 'table'"
    try:
        with contextlib.closing(sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)) as db:
            return [row[0] for row in db.execute(query)]
    except sqlite3.OperationalError as exc:
        journal = path.with_name(path.name + "-journal")
        if "readonly" not in str(exc) or not journal.is_file():
            raise
    with tempfile.TemporaryDirectory(prefix="hpo-sqlite-check-") as scratch:
        copy = Path(scratch) / path.name
        shutil.copyfile(path, copy)
        shutil.copyfile(journal, copy.with_name(copy.name + "-journal"))
        with contextlib.closing(sqlite3.connect(copy)) as db:
            return [row[0] for row in db.execute(query)]


#: Tables every MLflow SQLite store has (MLflow creates ~70 in any database it opens).
MLFLOW_TABLES = frozenset({"alembic_version", "experiments", "runs", "metrics", "params", "tags"})


def check_mlflow_database(path: Path, field: str, shown: str) -> None:
    """Refuse a SQLite file that is not an MLflow store (read-only look: MLflow itself would
    add its ~70 tables to any database it is pointed at)."""
    import sqlite3

    try:
        tables = set(read_table_names(path))
    except sqlite3.DatabaseError as exc:
        raise TrackingUriError(f"{field}: {shown}: {path} is not an SQLite database ({exc})") from None
    missing = MLFLOW_TABLES - tables
    if missing:
        raise TrackingUriError(f"{field}: {shown}: {path} is not an MLflow store (no table "
                               f"{', '.join(sorted(missing))}); nothing was changed in it")


def check_sqlite_file(path: Path, field: str, shown: str) -> None:
    """Refuse an existing file that SQLite cannot open as a database (a corrupt or foreign
    file): MLflow would fail on it with a long traceback once Ray had started."""
    import sqlite3

    try:
        read_table_names(path)
    except sqlite3.DatabaseError as exc:  # OperationalError too: unreadable, locked by a broken journal
        raise TrackingUriError(f"{field}: {shown}: {path} is not a usable SQLite database ({exc}); "
                               "move it away, or give another store") from None


def is_relative_sqlite(uri: str) -> bool:
    """A ``sqlite:`` URI whose database path is relative (to the working directory of
    whichever process opens it)."""
    if _scheme(uri) != "sqlite":
        return False
    rest = uri[len("sqlite:"):]
    path = rest[3:] if rest.startswith("///") else rest[2:] if rest.startswith("//") else rest
    return not path.split("?", 1)[0].startswith("/")


def _check_local(path: Path, field: str, shown: str, *, what: str, must_exist: bool,
                 directory: bool = False) -> None:
    path = path.absolute()
    if must_exist and not path.exists():
        raise TrackingUriError(f"{field}: {shown}: no MLflow {what} at {path}")
    if path.exists() and directory != path.is_dir():
        kind = "not a directory" if directory else "a directory, not a database file"
        raise TrackingUriError(f"{field}: {shown}: {path} is {kind}")
    if not path.parent.is_dir():
        raise TrackingUriError(f"{field}: {shown}: directory {path.parent} does not exist "
                               "(create it first; it is not created for you)")
    if what == "database" and not must_exist:  # a store the command will write
        if path.exists() and not os.access(path, os.R_OK | os.W_OK):
            raise TrackingUriError(f"{field}: {shown}: the database {path} is read-only (not writable); "
                                   "give a writable one")
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise TrackingUriError(f"{field}: {shown}: directory {path.parent} is not writable (SQLite writes its "
                                   "journal beside the database); give a database in a writable folder")


def _check_http(uri: str, field: str, shown: str, timeout_s: float) -> None:
    parts = urllib.parse.urlsplit(strip_credentials(uri))
    if not parts.hostname:
        raise TrackingUriError(f"{field}: {shown}: no host in the URI")
    base = parts.path.rstrip("/")
    # Any HTTP answer (even 401/404) means a server is there; MLflow reports what it thinks.
    probe = urllib.parse.urlunsplit((parts.scheme, parts.netloc, base + "/health", "", ""))
    try:
        with urllib.request.urlopen(probe, timeout=timeout_s):  # noqa: S310 - http(s) only, checked above
            pass
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, (socket.timeout, TimeoutError)):
            why = f"no answer within {timeout_s:g} s"
        else:
            why = strip_credentials(str(getattr(reason, "strerror", None) or reason))
        raise TrackingUriError(f"{field}: {shown}: MLflow tracking server unreachable ({why})") from None
    _check_api_access(uri, parts, field, shown, timeout_s)


def _check_api_access(uri: str, parts: urllib.parse.SplitResult, field: str, shown: str, timeout_s: float) -> None:
    """One read of the tracking API, as the client will make it. ``/health`` is exempt from the
    Host-header check a recent MLflow server (3.x) applies to everything else, so a server that answers
    ``/health`` may still refuse every API call from another machine (HTTP 403)."""
    api = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/")
                                   + "/api/2.0/mlflow/experiments/search", "max_results=1", ""))
    request = urllib.request.Request(api, headers=_basic_auth(uri))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):  # noqa: S310 - http(s) only, checked above
            return
    except urllib.error.HTTPError as exc:
        if exc.code != 403:
            return  # 401 (no password given), 404 (a proxy path), ...: MLflow's client says what it thinks
        body = exc.read(500).decode("utf-8", "replace")
    except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError, OSError):
        return  # it answered /health a moment ago; a slow API is not refused up front
    if INVALID_HOST in body:
        raise TrackingUriError(host_rejected_message(field, shown))
    raise TrackingUriError(f"{field}: {shown}: the MLflow tracking server refuses this user (HTTP 403"
                           f"{': ' + body.strip().splitlines()[0][:200] if body.strip() else ''}); give a user "
                           "with access in the URI (http://USER:PASSWORD@HOST:PORT) or in "
                           "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD")


def _basic_auth(uri: str) -> dict[str, str]:
    """The Authorization header MLflow's client would send (user part of the URI, else
    MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD); none without a user."""
    parts = urllib.parse.urlsplit(uri)
    user = urllib.parse.unquote(parts.username) if parts.username else os.environ.get("MLFLOW_TRACKING_USERNAME")
    password = (urllib.parse.unquote(parts.password) if parts.password
                else os.environ.get("MLFLOW_TRACKING_PASSWORD", ""))
    if not user:
        return {}
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def host_rejected_message(field: str, uri: str) -> str:
    """The one line for an MLflow server that answers 403 "Invalid Host header": it accepts
    only the Host headers it was told to (by default localhost and private addresses), and
    this machine addresses it by another name. Names the server and the fix."""
    shown = strip_credentials(uri)
    host = urllib.parse.urlsplit(shown).netloc or shown
    return (f"{field}: {shown}: the MLflow tracking server refuses requests addressed to {host!r} "
            f"(HTTP 403 {INVALID_HOST!r}: by default an MLflow server accepts only localhost and private "
            f"addresses): restart it with `mlflow server ... --allowed-hosts {host}` (add every name and address "
            "clients use, e.g. 'mlflow.example.org:5000,localhost:*'; or set MLFLOW_SERVER_ALLOWED_HOSTS)")
