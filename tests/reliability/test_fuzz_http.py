"""A raw-socket HTTP fuzzer for the sidecar, in front of an upstream that records what it gets.

For every case: no 5xx from the proxy (the recording upstream never answers 5xx, so any 5xx is
the proxy's own), no ERROR line or traceback in any log, every well-formed request answered,
forwarded once and, when measured, counted exactly once (arrivals = finished = spans, in-flight
back to 0); malformed framing refused with 400 in OpenAI's shape and nothing forwarded.

`make test` runs GOODPUT_FUZZ_EXAMPLES (default 150) cases in a few seconds; the long run is
`GOODPUT_FUZZ_EXAMPLES=5000 python -m pytest tests/reliability/test_fuzz_http.py`.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

from hypothesis import HealthCheck, given, settings

from tests.reliability.conftest import CANARY_PROMPT, CANARY_TOKEN
from tests.reliability.rawhttp import exchange, request
from tests.reliability.strategies import MUST_REFUSE, Case, cases

EXAMPLES = int(os.environ.get("GOODPUT_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 150,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
STATS = {"cases": 0, "requests": 0, "measured": 0, "refused": 0}


def run_case(target, case: Case) -> None:
    before = target.quiet()
    received_before = len(target.upstream.received)
    spans_before = len(target.live.spans.get_finished_spans())
    responses, raw = exchange(target.port, case.pieces, gap=case.gap, half_close=False, timeout=5,
                              expect=case.requests or 1, heads=list(case.heads))
    after = target.quiet()
    for resp in responses:
        if resp.status >= 400:
            target.error_bodies.append(resp.body)
        assert resp.status < 500, f"proxy answered {resp.status}: {resp.body[:300]!r} for {case.data[:300]!r}"
    forwarded = target.upstream.received[received_before:]
    assert not target.upstream.protocol_errors, target.upstream.protocol_errors
    assert not any(r.target.startswith("/smuggled") for r in forwarded), "a smuggled request reached the upstream"
    problems = target.logs.problems()
    assert not problems, problems[:3]
    assert after["in_flight"] == 0 and after["arrived"] == after["finished"], after
    finished = after["finished"] - before["finished"]
    spans = len(target.live.spans.get_finished_spans()) - spans_before
    assert spans == finished, f"{spans} spans for {finished} counted requests"
    STATS["cases"] += 1
    if case.must_refuse:
        # Refused before the proxy saw a request: one 400 in OpenAI's shape, nothing else (431,
        # Request Header Fields Too Large, for a head past the limit on the sidecar's own server).
        assert len(responses) == 1, (responses, case.data[:200])
        assert responses[0].status == 400 or (responses[0].status == 431 and len(case.data) > 65536), \
            (responses[0].status, case.data[:200])
        assert json.loads(responses[0].body)["error"]["type"] == "invalid_request_error"
        assert not forwarded
        # Counted exactly once: as malformed when the headers were already bad, or as a measured
        # request ending in error when its body turned bad after the proxy had started it.
        assert (after["malformed"] - before["malformed"]) + finished == 1, (after, before, case.pieces[:2])
        STATS["refused"] += 1
        return
    # Well-formed: each answered in order, each forwarded unless the sidecar itself refused it
    # (400 nested too deep, 413 too large: counted, not forwarded), each measured one counted once.
    assert len(responses) == case.requests, (len(responses), case.requests, raw[:300], case.data[:300])
    own = sum(1 for r in responses if r.status == 413 or (r.status == 400 and b"sidecar" in r.body))
    assert len(forwarded) == case.requests - own, (len(forwarded), case.requests, own)
    assert finished == case.measured, f"counted {finished}, sent {case.measured} measured requests"
    assert after["malformed"] == before["malformed"]
    STATS["requests"] += case.requests
    STATS["measured"] += case.measured


@FUZZ
@given(case=cases)
def test_fuzzed_requests_are_answered_counted_once_and_never_5xx(target, case):
    run_case(target, case)


def test_every_must_refuse_case_is_a_400_and_never_forwarded(target):
    for data in MUST_REFUSE:
        run_case(target, Case([data], 0, 0, must_refuse=True))
        # The headers first, the rest 50 ms later: the proxy has started the request when the
        # bad part arrives (this once left the handler waiting for a body that never came).
        head = data.find(b"\r\n\r\n") + 4
        if 4 <= head < len(data):
            run_case(target, Case([data[:head], data[head:]], 0, 0, must_refuse=True, gap=0.05))
    for path in ("/v1/completions", "/v1/models"):      # measured and passthrough paths
        bad = b"POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" % path.encode()
        run_case(target, Case([bad, b"2\r\n{}\r\nzz\r\n"], 0, 0, must_refuse=True, gap=0.05))


def test_deeply_nested_json_is_a_400_counted_once(target):
    """The first probe's finding: 100,000 nested arrays made the sidecar answer 500 and skip
    its accounting. Now a 400 in OpenAI's shape, counted once as an error, nothing forwarded."""
    before = target.quiet()
    data = request("POST", "/v1/chat/completions", [("Content-Type", "application/json")],
                   b"[" * 100_000 + b"]" * 100_000)
    responses, _ = exchange(target.port, [data], half_close=False, expect=1)
    after = target.quiet()
    assert [r.status for r in responses] == [400]
    assert json.loads(responses[0].body)["error"]["type"] == "invalid_request_error"
    assert after["finished"] - before["finished"] == 1
    assert target.live.value("goodput_requests_total", model="other", slo_class="interactive", outcome="error") >= 1
    assert not target.logs.problems()


def test_malformed_requests_log_at_most_one_line_per_kind(target):
    """200 bad chunk sizes in a row: one short log line (no traceback), not 200 tracebacks."""
    start = len(target.logs.records)
    bad = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
    for _ in range(200):
        responses, _ = exchange(target.port, [bad], half_close=False, expect=1)
        assert [r.status for r in responses] == [400]
    lines = [r for r in target.logs.records[start:] if r.name.startswith(("goodput", "aiohttp"))]
    assert len(lines) <= 1 and not any(r.exc_info for r in lines), [r.getMessage() for r in lines]


def test_a_slow_partial_request_does_not_block_others(target):
    """Slowloris: ten connections trickle a header a byte every 50 ms; a normal request on an
    eleventh is served at once."""
    stop = threading.Event()

    def trickle():
        with socket.create_connection(("127.0.0.1", target.port)) as sock:
            for byte in b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000:
                if stop.is_set():
                    return
                sock.sendall(bytes([byte]))
                time.sleep(0.05)

    threads = [threading.Thread(target=trickle, daemon=True) for _ in range(10)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    began = time.monotonic()
    responses, _ = exchange(target.port, [request("POST", "/v1/completions", [], b'{"model": "m", "prompt": "x"}')],
                            half_close=False, expect=1)
    took = time.monotonic() - began
    stop.set()
    for t in threads:
        t.join(2)
    assert [r.status for r in responses] == [200]
    assert took < 1.0, f"a normal request took {took:.2f} s behind slow ones"


def test_half_closed_connection_is_counted_once(target):
    """A client that sends a request and shuts its write side (nc -N) is either answered or, if
    the server takes the close as a hang-up, counted once as cancelled; never lost."""
    before = target.quiet()
    for _ in range(20):
        exchange(target.port, [request("POST", "/v1/completions", [], b'{"model": "m", "prompt": "x", "stream": true}')],
                 half_close=True, timeout=3)
    after = target.quiet()
    assert after["finished"] - before["finished"] == 20
    assert after["in_flight"] == 0


def test_zz_canaries_never_recorded_and_totals(target):
    """Runs last in this module: across every case above, the canary bearer token and prompt
    appear in no log line, metric, span or error body. Prints the run's totals."""
    text = target.everything_recorded()
    assert CANARY_TOKEN not in text
    assert CANARY_PROMPT not in text
    print(f"\nfuzz totals: {STATS}, log lines {len(target.logs.records)}, "
          f"error bodies {len(target.error_bodies)}, spans {len(target.live.spans.get_finished_spans())}")
