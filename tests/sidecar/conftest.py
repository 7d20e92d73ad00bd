"""Fixtures for the sidecar tests: a scripted upstream process and an in-process sidecar.

The sidecar runs on its own event loop in a background thread with a fresh CollectorRegistry and
an InMemorySpanExporter, so tests drive it with real HTTP clients (the official `openai` one
included) and then read exactly what it recorded.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import urllib.request
from dataclasses import dataclass

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from sidecar.app import Sidecar, make_app
from sidecar.config import ProxyConfig
from sidecar.server import RunningSidecar
from tests.support import ServerProcess, free_port


def upstream_command(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sidecar.bench.scripted_upstream", "--port", str(port), *extra]


@pytest.fixture(scope="module")
def upstream():
    """A scripted upstream (first token after 50 ms, then one every 20 ms unless a request says otherwise)."""
    port = free_port()
    server = ServerProcess(upstream_command(port, "--ttft", "0.05", "--itl", "0.02"),
                           f"http://127.0.0.1:{port}/health", timeout=30, name="scripted-upstream")
    yield f"http://127.0.0.1:{port}"
    server.stop()


def upstream_stats(url: str) -> dict:
    with urllib.request.urlopen(url + "/stats", timeout=5) as resp:
        return json.loads(resp.read())


@dataclass
class LiveSidecar:
    url: str
    app: Sidecar
    registry: CollectorRegistry
    spans: InMemorySpanExporter
    loop: asyncio.AbstractEventLoop
    running: RunningSidecar

    def value(self, name: str, **labels) -> float:
        """A sample's value, 0.0 when the series does not exist (yet)."""
        return self.registry.get_sample_value(name, labels) or 0.0

    def finished_spans(self, count: int, timeout: float = 5.0):
        """Wait until `count` spans have ended (the span ends in the handler's finally)."""
        import time
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.spans.get_finished_spans()
            if len(spans) >= count:
                return list(spans)
            time.sleep(0.01)
        raise AssertionError(f"expected {count} spans, got {len(self.spans.get_finished_spans())}")

    def call(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


class SidecarThread:
    """Runs sidecars on one background event loop; stops every one it started."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.started: list[LiveSidecar] = []

    def start(self, upstream: str, meter_provider=None, tracer_provider=None, **overrides) -> LiveSidecar:
        """`tracer_provider`: by default one recording every span into `LiveSidecar.spans`."""
        overrides.setdefault("engine_metrics_interval", 0)
        config = ProxyConfig(upstream=upstream, port=0, **overrides)
        registry = CollectorRegistry()
        exporter = InMemorySpanExporter()
        provider = tracer_provider
        if provider is None:
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        app = make_app(config, registry, provider, meter_provider)
        running = asyncio.run_coroutine_threadsafe(RunningSidecar(app).start(), self.loop).result(10)
        live = LiveSidecar(f"http://127.0.0.1:{running.port}", app, registry, exporter, self.loop, running)
        self.started.append(live)
        return live

    def close(self):
        for live in self.started:
            try:
                asyncio.run_coroutine_threadsafe(live.running.stop(0.5), self.loop).result(10)
            except Exception:
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def sidecars():
    runner = SidecarThread()
    yield runner
    runner.close()


@pytest.fixture
def sidecar(sidecars, upstream) -> LiveSidecar:
    return sidecars.start(upstream, models=("scripted",))
