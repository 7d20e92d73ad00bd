"""The server helper itself: it waits for readiness and never leaves a process behind."""

from __future__ import annotations

import sys

import pytest

from tests.support import ServerProcess, free_port


def test_server_process_waits_until_ready_and_stops(port):
    server = ServerProcess([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                           f"http://127.0.0.1:{port}/", timeout=20, name="http.server")
    assert server.proc.poll() is None
    server.stop()
    assert server.proc.poll() is not None


def test_server_that_dies_early_reports_its_log():
    with pytest.raises(RuntimeError, match="boom"):
        ServerProcess([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"],
                      f"http://127.0.0.1:{free_port()}/", timeout=10, name="dies")
