"""Fixtures shared by every test folder."""

from __future__ import annotations

import pytest

from tests.support import ServerProcess, free_port


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
