"""Shared test helpers: free loopback ports, paths, server processes that always stop, a
threaded GET server for stand-ins (`GetServer`), and the scripts under scripts/ as modules
(`load_script`).

`ServerProcess` (from goodput_cli.procs, which the demo uses too) starts a command, waits until
an HTTP URL answers, keeps its output in a log file (shown when a test fails, see conftest.py),
and stops the process group however the test ends.
"""

from __future__ import annotations

import importlib.util
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from goodput_cli.procs import ServerProcess, goodput_command  # noqa: F401  (re-exported for tests)

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED = REPO_ROOT.parent / "shared"
TRACES = SHARED / "traces"


def load_script(name: str):
    """scripts/<name> loaded as a module (scripts/ is not a package), for tests of its functions."""
    spec = importlib.util.spec_from_file_location(Path(name).stem, REPO_ROOT / "scripts" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class GetServer:
    """A loopback HTTP server on a thread that answers every GET with `respond(path)`: bytes, or
    (status, bytes). The tests' stand-ins for a /metrics page or the Kubernetes API; `close()`
    (or leaving a `with` block) stops it."""

    def __init__(self, respond, content_type: str = "text/plain; version=0.0.4"):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                answer = respond(self.path)
                status, body = answer if isinstance(answer, tuple) else (200, answer)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "GetServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
