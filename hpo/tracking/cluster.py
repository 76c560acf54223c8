"""Connections to a team's Ray head (its Jobs API) and MLflow server, checked within seconds.

``hpo submit/status/answer/logs/stop`` (``hpo.service.jobs``) and ``hpo monitor --job`` read a
sweep through these: Ray's and MLflow's own clients would wait or retry for minutes on an
unreachable service, so every connection is probed first and a failure is one line naming
``--address`` or ``--tracking-uri``.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Optional

from hpo.common.errors import InputError
from hpo.tracking.uri import check_tracking_uri

#: Where a Ray head's dashboard (the Jobs API) listens by default.
DEFAULT_ADDRESS = "http://127.0.0.1:8265"
#: Seconds the Ray head and the MLflow server get to answer the first request.
PROBE_TIMEOUT_S = 5.0


class ClusterError(InputError):
    """The Ray head cannot be used (unreachable, no Jobs API, no token), or names no such job."""


def dashboard_url(address: Optional[str]) -> str:
    """The HTTP address of the head's Jobs API: ``--address``, else ``RAY_ADDRESS``, else the
    local default; ``HOST:PORT`` means ``http://HOST:PORT``."""
    address = (address or os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS).strip()
    if address.startswith("ray://") or address == "auto":
        raise ClusterError(f"--address: {address}: give the Ray dashboard's HTTP address (http://HEAD:8265), "
                           "which serves the Jobs API")
    if "://" not in address:
        address = f"http://{address}"
    return address.rstrip("/")


def probe(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise :class:`ClusterError` unless a Ray dashboard answers at ``url`` within ``timeout_s``."""
    try:
        with urllib.request.urlopen(f"{url}/api/version", timeout=timeout_s) as answer:  # noqa: S310 - http(s)
            body = answer.read()
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            return  # a token-protected head: the client below sends the token or names it
        raise ClusterError(f"--address: {url}: not a Ray dashboard (HTTP {exc.code} on /api/version); "
                           "give the head's dashboard address, http://HEAD:8265") from None
    except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        why = (f"no answer within {timeout_s:g} s" if isinstance(reason, (socket.timeout, TimeoutError))
               else str(getattr(reason, "strerror", None) or reason))
        raise ClusterError(f"--address: Ray head unreachable at {url} ({why}); start it with "
                           "`ray start --head` or set RAY_ADDRESS") from None
    try:
        json.loads(body)["ray_version"]
    except (ValueError, KeyError, TypeError):
        raise ClusterError(f"--address: {url}: not a Ray dashboard (no ray_version on /api/version)") from None


@dataclass(frozen=True)
class Cluster:
    """A connected Ray head: its ``JobSubmissionClient`` and the dashboard ``url`` it talks to."""

    client: Any
    url: str


def connect(address: Optional[str]) -> Cluster:
    """The head at ``address`` (checked within seconds)."""
    url = dashboard_url(address)
    probe(url)
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    try:
        return Cluster(JobSubmissionClient(url), url)
    except AuthenticationError:
        raise ClusterError(f"--address: the Ray head at {url} requires its token: set RAY_AUTH_MODE=token and "
                           "RAY_AUTH_TOKEN (or copy the head's ~/.ray/auth_token)") from None
    except ConnectionError as exc:
        raise ClusterError(f"--address: Ray head unreachable at {url} ({exc})") from None


def tracking_client(uri: Optional[str], fallback: Optional[str] = None) -> Any:
    """An ``MlflowClient`` for ``--tracking-uri``, else ``MLFLOW_TRACKING_URI``, else
    ``fallback`` (the URI a job was submitted with); a server is checked within seconds."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or fallback
    if not uri:
        raise InputError("--tracking-uri: give the MLflow tracking URI (or set MLFLOW_TRACKING_URI)")
    return _mlflow_client(uri)


@functools.lru_cache(maxsize=8)
def _mlflow_client(uri: str) -> Any:
    """One checked client per URI and process: ``hpo answer`` polls and ``hpo status`` lists
    many jobs of one server without probing it again each time."""
    check_tracking_uri(uri, "--tracking-uri", timeout_s=PROBE_TIMEOUT_S)
    # A server that dies later must not stall a client for MLflow's default minutes of retries.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    # MLflow prints two "View run/experiment at" lines for every run it ends on an http server:
    # `hpo stop` ends one per trial, and they would bury its one-line result.
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    from mlflow.tracking import MlflowClient

    from hpo.tracking.uri import use_credentials

    return MlflowClient(tracking_uri=use_credentials(uri))


def job_info(cluster: Cluster, job_id: str) -> Any:
    """The Ray job ``job_id`` on ``cluster``; :class:`ClusterError` names a job that does not exist."""
    try:
        return cluster.client.get_job_info(job_id)
    except RuntimeError as exc:
        if "404" in str(exc) or "does not exist" in str(exc):
            raise ClusterError(f"JOB: no job {job_id!r} on the Ray cluster at {cluster.url}") from None
        raise
