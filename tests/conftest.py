"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
import tempfile

import pytest

from tests.support import ServerProcess, free_port


@pytest.fixture(scope="session", autouse=True)
def _session_tmpdir(tmp_path_factory):
    """Every temporary file the tests and the processes they start make (server logs, certificates,
    scratch directories) goes under pytest's own base directory, which pytest prunes to its last
    three runs, instead of piling up in /tmp run after run."""
    path = str(tmp_path_factory.mktemp("tmp"))
    before = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = path, path
    yield
    if before[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before[0]
    tempfile.tempdir = before[1]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


@pytest.fixture
def start_server(request):
    """Factory: start_server(cmd, ready_url, ...) -> ServerProcess.

    Every process started through it is stopped when the test ends, and its log is printed
    (captured into the report) when the test failed.
    """
    started: list[ServerProcess] = []

    def start(cmd, ready_url, **kwargs) -> ServerProcess:
        server = ServerProcess(cmd, ready_url, **kwargs)
        started.append(server)
        return server

    yield start
    failed = any(getattr(request.node, f"rep_{when}", None) is not None and getattr(request.node, f"rep_{when}").failed
                 for when in ("setup", "call"))
    for server in started:
        server.stop()
        if failed:
            print(f"\n----- log of {server.name}: {' '.join(server.cmd)} -----\n{server.log()[-8000:]}")
