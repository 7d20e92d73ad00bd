"""Fixtures for the reliability tests: a sidecar in front of a recording upstream, with its log,
metrics and spans collected so that tests can assert what it did with every case they sent."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import pytest
from prometheus_client import generate_latest

from tests.reliability.recording_upstream import RecordingUpstream
from tests.sidecar.conftest import LiveSidecar, SidecarThread

CANARY_TOKEN = "sk-canary-7f3e9b21d4c6a8e0"          # sent as a bearer token; must never be recorded
CANARY_PROMPT = "canary prompt 5c1d8e7a-the-owl-flies-at-dawn"   # sent as prompt text


class LogCollector(logging.Handler):
    """Every log record from every logger, formatted with its traceback if it has one."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))

    def emit(self, record):
        self.records.append(record)

    def lines(self) -> list[str]:
        return [self.format(r) for r in self.records]

    def problems(self) -> list[str]:
        """Records at ERROR or above, or carrying a traceback: what the fuzz must never cause."""
        return [self.format(r) for r in self.records if r.levelno >= logging.ERROR or r.exc_info]


@dataclass
class Target:
    """The sidecar under test, its upstream, and everything it wrote."""
    live: LiveSidecar = field(repr=False)
    upstream: RecordingUpstream = field(repr=False)
    logs: LogCollector = field(repr=False)
    error_bodies: list[bytes] = field(default_factory=list, repr=False)   # every >= 400 body the clients saw

    @property
    def port(self) -> int:
        return self.live.running.port

    def counted(self) -> dict[str, float]:
        """Sums over all labels of the request counters, and the in-flight gauge."""
        sums = {"finished": 0.0, "arrived": 0.0, "in_flight": 0.0, "malformed": 0.0}
        names = {"goodput_requests_total": "finished", "goodput_requests_arrived_total": "arrived",
                 "goodput_requests_in_flight": "in_flight", "goodput_malformed_requests_total": "malformed"}
        for family in self.live.registry.collect():
            for sample in family.samples:
                key = names.get(sample.name)
                if key:
                    sums[key] += sample.value
        return sums

    def quiet(self, timeout: float = 5.0) -> dict[str, float]:
        """Wait until no request is being handled and every arrival has finished; the counts."""
        deadline = time.monotonic() + timeout
        while True:
            counts = self.counted()
            if self.live.app.active == 0 and counts["arrived"] == counts["finished"] and counts["in_flight"] == 0:
                return counts
            if time.monotonic() > deadline:
                raise AssertionError(f"the sidecar did not settle in {timeout:g} s: {self.live.app.active} "
                                     f"handler(s) running, {counts}")
            time.sleep(0.005)

    def everything_recorded(self) -> str:
        """Logs, the metrics page, every span's attributes and events, and the error bodies."""
        spans = [json.dumps({"name": s.name, "attributes": dict(s.attributes or {}),
                             "events": [dict(e.attributes or {}) for e in s.events]}, default=str)
                 for s in self.live.spans.get_finished_spans()]
        return "\n".join(self.logs.lines() + [generate_latest(self.live.registry).decode()] + spans
                         + [b.decode("latin-1") for b in self.error_bodies])


@pytest.fixture(scope="module")
def target():
    logs = LogCollector()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(logs)
    root.setLevel(logging.INFO)
    runner = SidecarThread()
    upstream = asyncio.run_coroutine_threadsafe(RecordingUpstream().start(), runner.loop).result(10)
    live = runner.start(upstream.url, max_body_bytes=256 * 1024, models=("m",))
    try:
        yield Target(live, upstream, logs)
    finally:
        asyncio.run_coroutine_threadsafe(upstream.stop(), runner.loop).result(10)
        runner.close()
        root.removeHandler(logs)
        root.setLevel(old_level)
