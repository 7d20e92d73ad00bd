"""Faults under open-loop load, tiny engine behind the sidecar.

For each fault: the sidecar's outcomes (good/slo_violated/error/cancelled) add up to the requests
the client sent, in-flight returns to 0, arrivals equal finished requests, and the engine ends with
nothing running and every KV block free. The canary bearer token rides on every request; the last
test checks that nothing the sidecar recorded contains it or the canary prompt.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import httpx
import pytest

from tests.reliability.conftest import CANARY_PROMPT, CANARY_TOKEN, LogCollector
from tests.reliability.stack import Engine, Load
from tests.sidecar.conftest import SidecarThread
from tests.support import ServerProcess, free_port, goodput_command

AUTH = {"Authorization": f"Bearer {CANARY_TOKEN}"}
RECORDED: list[str] = []       # every log line, metrics page and span the fault tests produced


@pytest.fixture(scope="module")
def engine():
    eng = Engine()
    yield eng
    eng.stop()


@pytest.fixture
def logs():
    collector = LogCollector()
    import logging
    root = logging.getLogger()
    root.addHandler(collector)
    yield collector
    root.removeHandler(collector)
    RECORDED.extend(collector.lines())


@pytest.fixture
def stack(engine, logs, request):
    """An in-process sidecar in front of the engine; upstream timeout 10 s unless the test is
    marked with `pytest.mark.parametrize("stack", [seconds], indirect=True)`."""
    runner = SidecarThread()
    live = runner.start(engine.url, models=("tiny",), read_timeout=getattr(request, "param", 10.0))
    yield live
    RECORDED.append(httpx.get(live.url + "/metrics").text)
    RECORDED.extend(json.dumps({"a": dict(s.attributes or {}), "e": [dict(e.attributes or {}) for e in s.events]},
                               default=str) for s in live.spans.get_finished_spans())
    runner.close()


def keep_errors(records) -> list:
    """The client-side error messages (what the sidecar told the client) go into the canary search."""
    RECORDED.extend(str(r.error) for r in records if r.error)
    return records


def outcomes(live) -> dict[str, float]:
    sums = {"good": 0.0, "slo_violated": 0.0, "error": 0.0, "cancelled": 0.0, "shed": 0.0}
    for family in live.registry.collect():
        for s in family.samples:
            if s.name == "goodput_requests_total":
                sums[s.labels["outcome"]] = sums.get(s.labels["outcome"], 0.0) + s.value
    return sums


def settle(live, timeout: float = 10.0) -> tuple[float, float, float]:
    """(finished, arrived, in flight) once the sidecar has nothing in flight, or at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        finished = sum(outcomes(live).values())
        arrived = sum(s.value for f in live.registry.collect() for s in f.samples
                      if s.name == "goodput_requests_arrived_total")
        flight = sum(s.value for f in live.registry.collect() for s in f.samples
                     if s.name == "goodput_requests_in_flight")
        if (flight == 0 and arrived == finished and live.app.active == 0) or time.monotonic() > deadline:
            return finished, arrived, flight


def assert_accounted(live, engine, sent: int, before: float) -> None:
    finished, arrived, flight = settle(live)
    assert flight == 0 and live.app.active == 0
    assert arrived == finished
    assert finished - before == sent, f"sidecar counted {finished - before}, client sent {sent}"
    gauges = engine.wait_idle()
    assert gauges == {"num_requests_running": 0, "num_requests_waiting": 0, "kv_cache_usage_perc": 0}, gauges


@pytest.mark.slow
def test_engine_killed_mid_stream_and_restarted(stack, engine):
    before = sum(outcomes(stack).values())
    load = Load(stack.url, rate=20, count=30, output_tokens=96, headers=AUTH)
    time.sleep(0.8)
    engine.proc.signal(signal.SIGKILL)
    records = keep_errors(load.join())
    got = load.outcomes()
    assert got.get("error", 0) >= 1, got          # streams cut mid-way and refused connections
    engine.start()                                # same port: the sidecar needs no restart
    after_restart = Load(stack.url, rate=10, count=8, output_tokens=16, headers=AUTH, seed=1)
    assert after_restart.join() and after_restart.outcomes().get("error", 0) == 0, after_restart.outcomes()
    assert_accounted(stack, engine, len(records) + 8, before)


@pytest.mark.parametrize("stack", [1.0], indirect=True)
def test_engine_stopped_past_the_upstream_timeout_then_continued(stack, engine):
    before = sum(outcomes(stack).values())
    load = Load(stack.url, rate=20, count=24, output_tokens=96, headers=AUTH, seed=2)
    time.sleep(0.6)
    engine.proc.signal(signal.SIGSTOP)
    try:
        time.sleep(2.5)                           # the upstream timeout is 1 s
    finally:
        engine.proc.signal(signal.SIGCONT)
    records = keep_errors(load.join())
    assert load.outcomes().get("error", 0) >= 1, load.outcomes()
    assert any("upstream_timeout" in (r.error or "") or "timed out" in (r.error or "") or "nothing for too long" in (r.error or "")
               for r in records), [r.error for r in records]
    assert_accounted(stack, engine, len(records), before)


def _open_stream(port: int, max_tokens: int) -> socket.socket:
    body = json.dumps({"model": "tiny", "prompt": CANARY_PROMPT, "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True}).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (CANARY_TOKEN.encode(), len(body), body))
    return sock


def test_a_client_that_stops_reading_does_not_hold_others_and_is_cleaned_up(stack, engine):
    before = sum(outcomes(stack).values())
    stuck = _open_stream(stack.running.port, 1500)
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    time.sleep(0.5)
    others = Load(stack.url, rate=10, count=6, output_tokens=16, headers=AUTH, seed=3)
    assert others.join(30) and others.outcomes() == {"good": 6} or others.outcomes().get("error", 0) == 0, others.outcomes()
    stuck.close()
    assert_accounted(stack, engine, 7, before)
    assert outcomes(stack)["cancelled"] >= 1


def test_a_hundred_clients_disconnecting_mid_stream_at_once(stack, engine):
    before = outcomes(stack)
    socks = [_open_stream(stack.running.port, 200) for _ in range(100)]
    deadline = time.monotonic() + 20
    for s in socks:                               # wait for each stream's first bytes
        s.settimeout(max(0.1, deadline - time.monotonic()))
        assert s.recv(1), "a stream sent nothing"
    for s in socks:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")   # RST, at once
    for s in socks:
        s.close()
    assert_accounted(stack, engine, 100, sum(before.values()))
    after = outcomes(stack)
    assert after["cancelled"] - before["cancelled"] == 100, {k: after[k] - before[k] for k in after}


@pytest.mark.slow
def test_sidecar_sigterm_with_streams_open_drains_them(engine, logs):
    port = free_port()
    proc = ServerProcess(goodput_command("sidecar", "run", "--upstream", engine.url, "--port", str(port),
                                         "--drain-timeout", "60", "--models", "tiny"),
                         f"http://127.0.0.1:{port}/healthz", timeout=60, name="sidecar")
    try:
        socks = [_open_stream(port, 24) for _ in range(64)]
        for s in socks:
            s.settimeout(20)
            assert s.recv(1)
        proc.signal(signal.SIGTERM)
        time.sleep(0.3)
        refused = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"model": "tiny", "prompt": "x"}, timeout=5)
        assert refused.status_code == 503 and refused.headers.get("retry-after") == "1"
        done, tails = 0, []
        for s in socks:
            data = b""
            while b"data: [DONE]" not in data:
                piece = s.recv(65536)
                if not piece:
                    break
                data += piece
            done += b"data: [DONE]" in data and b'"error"' not in data
            tails.append(data[-300:])
            s.close()
        assert done == 64, f"{done} of 64 streams finished during the drain: {tails[:2]}"
        assert proc.wait(30) == 0
    finally:
        proc.stop()
        RECORDED.append(proc.log())
    gauges = engine.wait_idle()
    assert not any(gauges.values()), gauges


def test_zz_canaries_never_recorded():
    """After every fault above: neither canary is in any log line, metric or span."""
    text = "\n".join(RECORDED)
    assert RECORDED and CANARY_TOKEN not in text and CANARY_PROMPT not in text

