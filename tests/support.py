"""Shared test helpers: free loopback ports, paths, and server processes that always stop.

`ServerProcess` (from goodput_cli.procs, which the demo uses too) starts a command, waits until
an HTTP URL answers, keeps its output in a log file (shown when a test fails, see conftest.py),
and stops the process group however the test ends.
"""

from __future__ import annotations

import socket
from pathlib import Path

from goodput_cli.procs import ServerProcess, goodput_command  # noqa: F401  (re-exported for tests)

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED = REPO_ROOT.parent / "shared"
TRACES = SHARED / "traces"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


