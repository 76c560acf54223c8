"""Bad input: every case of the table exits 2 with one line naming the field, file or value,
before anything is written (no output folder, no mlflow.db, no MLflow run, no Ray start).

Each case is the real CLI in a subprocess (``bad_input_cases``); they run four at a time, so
the table costs seconds, not minutes.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from bad_input_cases import CASES, Outcome, run_all


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    return run_all(tmp_path_factory.mktemp("bad-input"))


@pytest.mark.parametrize("name", [case.name for case in CASES])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(outcomes: dict[str, Outcome], name: str) -> None:
    outcome = outcomes[name]
    assert outcome.problems() == [], f"{outcome.case.what}: {outcome.stderr[-2000:]}"


def test_unreachable_server_is_named_within_seconds(outcomes: dict[str, Outcome]) -> None:
    # http://127.0.0.1:9 used to hang for over 200 s in MLflow's retries; now the whole
    # command (Python start-up included, four cases at a time) answers in seconds.
    assert outcomes["tracking_unreachable"].seconds < 30


def test_silent_server_times_out_in_about_five_seconds() -> None:
    # A server that accepts the connection but never answers: the check gives up after its
    # timeout with a message saying so (MLflow's client would wait for minutes).
    from hpo.tracking.uri import TrackingUriError, check_tracking_uri

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    accepted: list[socket.socket] = []
    thread = threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True)
    thread.start()
    began = time.perf_counter()
    try:
        with pytest.raises(TrackingUriError, match="unreachable.*no answer within 1 s"):
            check_tracking_uri(f"http://127.0.0.1:{server.getsockname()[1]}", timeout_s=1.0)
    finally:
        for conn in accepted:
            conn.close()
        server.close()
    assert time.perf_counter() - began < 5


def test_strip_credentials_removes_the_user_part_everywhere() -> None:
    from hpo.tracking.uri import strip_credentials

    assert strip_credentials("http://alice:pw@host:5000/x?y=1") == "http://host:5000/x?y=1"
    assert strip_credentials("postgresql+psycopg2://u:p@db/mlflow") == "postgresql+psycopg2://db/mlflow"
    assert strip_credentials("error at https://u@h/api and http://h2/") == "error at https://h/api and http://h2/"
    assert strip_credentials("sqlite:////abs/m.db") == "sqlite:////abs/m.db"
    assert strip_credentials("/plain/path@x") == "/plain/path@x"


def test_packaged_sweep_names_resolve(tmp_path: Path) -> None:
    # `hpo sweep quickstart` names the packaged config; an existing file of that name wins.
    import os

    from hpo.service.cli import sweep_config_path
    from hpo.data import packaged_sweeps

    assert "quickstart" in packaged_sweeps()
    assert sweep_config_path("quickstart").name == "quickstart.yaml"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        (tmp_path / "quickstart").write_text("name: mine\n")
        assert sweep_config_path("quickstart") == Path("quickstart")
    finally:
        os.chdir(cwd)
