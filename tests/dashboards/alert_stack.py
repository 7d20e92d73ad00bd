"""Helpers for the Alertmanager test: the chart's example route, an exporter whose SLO counters
grow at chosen rates, and a webhook receiver.

Kept apart from the test so the test reads as the story it checks.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

from tests.support import REPO_ROOT, GetServer

EXAMPLE_DOC = REPO_ROOT / "helm" / "goodput" / "docs" / "alertmanager.md"


def example_config() -> dict:
    """The Alertmanager configuration in the chart's docs (its one ```yaml block)."""
    blocks = re.findall(r"```yaml\n(.*?)```", EXAMPLE_DOC.read_text(), flags=re.S)
    assert len(blocks) == 1, f"{EXAMPLE_DOC}: expected one yaml block, found {len(blocks)}"
    return yaml.safe_load(blocks[0])


def fast_config(receiver_url: str) -> dict:
    """The example with only its receivers pointed at `receiver_url/<receiver name>` and its waits
    shortened to a second; route tree, matchers, grouping and inhibit rules untouched."""
    config = example_config()
    for receiver in config["receivers"]:
        name = receiver["name"]
        receiver.clear()
        receiver.update({"name": name, "webhook_configs": [{"url": f"{receiver_url}/{name}", "send_resolved": False}]})
    config["route"].update({"group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"})
    for route in config["route"].get("routes", []):
        route.pop("repeat_interval", None)
    return config


class GrowingCounters:
    """A sidecar stand-in: `goodput_requests_total` grows at fixed rates per (class, outcome) from
    the moment it starts, and every class has objective 0.99. Exact rates, so the burn rate of
    each class is known exactly: violated / (violated + ok) / (1 - 0.99)."""

    def __init__(self, rates: dict[tuple[str, str], float], objective: float = 0.99):
        started = time.monotonic()
        classes = sorted({cls for cls, _ in rates})

        def text() -> bytes:
            t = time.monotonic() - started
            lines = ["# TYPE goodput_requests_total counter"]
            lines += [f'goodput_requests_total{{model="tiny",slo_class="{cls}",outcome="{outcome}"}} {rate * t:.6f}'
                      for (cls, outcome), rate in sorted(rates.items())]
            lines.append("# TYPE goodput_slo_objective_ratio gauge")
            lines += [f'goodput_slo_objective_ratio{{slo_class="{cls}"}} {objective}' for cls in classes]
            return ("\n".join(lines) + "\n").encode()

        self._server = GetServer(lambda path: text())
        self.address = self._server.address

    def close(self) -> None:
        self._server.close()


class WebhookReceiver:
    """Collects Alertmanager's webhook notifications (JSON, version 4) by path."""

    def __init__(self):
        self.received: list[tuple[str, dict]] = []
        lock = threading.Lock()
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    received.append((self.path.strip("/"), json.loads(body)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def notifications(self, receiver: str) -> list[dict]:
        return [body for path, body in list(self.received) if path == receiver]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
