"""The sidecar's own HTTP/1.1 server (sidecar.fastserver): the parser alone, then the server in
front of the scripted upstream, driven with exact bytes over a raw socket."""

from __future__ import annotations

import json
import socket
import time

import pytest

from sidecar import fastserver
from sidecar.http1 import ChunkedBody, HttpError, LengthBody, parse_head
from tests.reliability.rawhttp import exchange, parse_responses, request

BODY = json.dumps({"model": "scripted", "prompt": "x", "max_tokens": 3, "script": {"ttft": 0, "itl": 0}}).encode()
STREAM = json.dumps({"model": "scripted", "prompt": "x", "max_tokens": 3, "stream": True,
                     "script": {"ttft": 0, "itl": 0}}).encode()


# ---- parser ------------------------------------------------------------------------------------
def test_head_is_parsed_with_framing_and_keep_alive():
    head, end = parse_head(b"POST /v1/completions?x=%41 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n"
                           b"X-Two: 1\r\nx-two: 2\r\nConnection: keep-alive\r\n\r\nrest")
    assert (head.method, head.raw_path, head.path, head.version) == ("POST", "/v1/completions?x=%41", "/v1/completions", (1, 1))
    assert head.content_length == 12 and not head.chunked and head.keep_alive
    assert head.headers.getall("X-TWO") == ["1", "2"]      # repeated fields kept, names case-insensitive
    assert end == len(b"POST /v1/completions?x=%41 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n"
                      b"X-Two: 1\r\nx-two: 2\r\nConnection: keep-alive\r\n\r\n")


def test_incomplete_head_waits_and_http10_does_not_keep_alive():
    assert parse_head(b"POST /v1/completions HTTP/1.1\r\nHost: a\r\n") == (None, 0)
    head, _ = parse_head(b"GET / HTTP/1.0\r\n\r\n")
    assert head.version == (1, 0) and not head.keep_alive
    head, _ = parse_head(b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n")
    assert head.expect_continue and not head.keep_alive


@pytest.mark.parametrize("data, status", [
    (b"\x16\x03\x01\x02\x00", 400),                                    # TLS, refused before any CRLF
    (b"POST / HTTP/1.1\nHost: a\n", 400),                              # bare LF
    (b"POST / HTTP/1.1\r\nHost: a\r\nX-Big: " + b"a" * 70_000, 431),
    (b"POST / HTTP/1.1\r\n" + b"X: 1\r\n" * 200 + b"\r\n", 431),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
    (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),   # no chunked coding in 1.0
    (b"POST nowhere HTTP/1.1\r\n\r\n", 400),
])
def test_bad_heads_are_refused_with_the_right_status(data, status):
    with pytest.raises(HttpError) as info:
        parse_head(data)
    assert info.value.status == status


def test_chunked_body_decodes_across_any_split_and_drops_trailers():
    data = b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\nNEXT"
    for cut in range(len(data)):
        body, out = ChunkedBody(), []
        pos = body.feed(data[:cut], 0, out)
        rest = data[pos:cut] + data[cut:]
        pos = body.feed(rest, 0, out)
        assert body.done and b"".join(out) == b"abcde" and rest[pos:] == b"NEXT", cut


def test_length_body_stops_at_its_length():
    body, out = LengthBody(3), []
    assert body.feed(b"abcdef", 1, out) == 4 and body.done and out == [b"bcd"]


# ---- the server ----------------------------------------------------------------------------------
@pytest.fixture
def fast(sidecars, upstream):
    return sidecars.start(upstream, models=("scripted",), http_server="fast", max_body_bytes=4096)


def port_of(live) -> int:
    return live.running.port


def test_pipelined_requests_are_answered_in_order_on_one_connection(fast):
    data = (request("POST", "/v1/completions", [], BODY) + request("GET", "/healthz")
            + request("POST", "/v1/completions", [], STREAM) + request("GET", "/metrics"))
    responses, _ = exchange(port_of(fast), [data], half_close=False, expect=4)
    assert [r.status for r in responses] == [200, 200, 200, 200]
    assert json.loads(responses[0].body)["object"] == "text_completion"
    assert json.loads(responses[1].body) == {"status": "alive"}
    assert responses[2].body.rstrip().endswith(b"data: [DONE]")
    assert b"goodput_requests_total" in responses[3].body
    fast.finished_spans(2)     # accounted in the handler's finally, just after the answer left
    assert fast.value("goodput_requests_total", model="scripted", slo_class="interactive", outcome="good") == 2


def test_chunked_request_body_is_relayed_and_measured(fast):
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(BODY[i:i + 7]), BODY[i:i + 7]) for i in range(0, len(BODY), 7))
    data = request("POST", "/v1/completions", [("Transfer-Encoding", "chunked")], chunks + b"0\r\n\r\n")
    responses, _ = exchange(port_of(fast), [data[:60], data[60:]], gap=0.02, half_close=False, expect=1)
    assert [r.status for r in responses] == [200]
    fast.finished_spans(1)
    assert fast.value("goodput_output_tokens_total", model="scripted", slo_class="interactive") == 3


def test_too_large_body_is_413_and_the_next_request_is_still_served(fast):
    big = b'{"prompt": "' + b"a" * 5000 + b'"}'
    data = request("POST", "/v1/completions", [], big) + request("POST", "/v1/completions", [], BODY)
    responses, _ = exchange(port_of(fast), [data], half_close=False, expect=2)
    assert [r.status for r in responses] == [413, 200]
    assert json.loads(responses[0].body)["error"]["type"] == "request_too_large"


def test_expect_continue_over_the_limit_is_413_without_a_100_and_closes(fast):
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port_of(fast)), timeout=5) as sock:
        sock.sendall(head)
        raw = b""
        while chunk := sock.recv(65536):      # the server closes: the body it refused never comes
            raw += chunk
    assert raw.startswith(b"HTTP/1.1 413") and b"100 Continue" not in raw and b"Connection: close" in raw


def test_http10_non_streaming_answer_has_a_length_and_closes(fast):
    data = b"POST /v1/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
    with socket.create_connection(("127.0.0.1", port_of(fast)), timeout=5) as sock:
        sock.sendall(data)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"Content-Length: %d" % len(body) in head
    assert b"Connection: close" in head and json.loads(body)["object"] == "text_completion"


def test_every_answer_carries_one_date_header(fast):
    from email.utils import parsedate_to_datetime

    data = request("GET", "/healthz") + request("POST", "/v1/completions", [], STREAM)
    responses, _ = exchange(port_of(fast), [data], half_close=False, expect=2)
    for r in responses:
        dates = [v for k, v in r.headers if k.lower() == "date"]
        assert len(dates) == 1
        when = parsedate_to_datetime(dates[0])
        assert abs(when.timestamp() - time.time()) < 5


def test_malformed_head_is_400_counted_and_closed(fast):
    responses, raw = exchange(port_of(fast), [b"POST /v1/completions HTTP/1.1\r\nHost : x\r\n\r\n"], expect=1)
    assert [r.status for r in responses] == [400] and responses[0].header("Connection") == "close"
    assert fast.value("goodput_malformed_requests_total") == 1


def test_a_head_that_never_ends_is_answered_408_and_closed(fast, monkeypatch):
    monkeypatch.setattr(fastserver, "HEAD_TIMEOUT", 0.5)
    began = time.monotonic()
    responses, _ = exchange(port_of(fast), [b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"], half_close=False,
                            timeout=5, expect=1)
    assert [r.status for r in responses] == [408]
    assert time.monotonic() - began < 3     # the watchdog checks once a second


def test_a_client_that_does_not_read_pauses_the_upstream(sidecars, upstream):
    """Backpressure: a stream far larger than the socket buffers, a client that reads nothing for a
    while. The sidecar must not buffer it all; once the client reads, everything arrives in order."""
    live = sidecars.start(upstream, models=("scripted",), http_server="fast")
    payload = json.dumps({"model": "scripted", "prompt": "x", "max_tokens": 60000, "stream": True,
                          "script": {"ttft": 0, "itl": 0}}).encode()
    with socket.create_connection(("127.0.0.1", port_of(live)), timeout=20) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.sendall(request("POST", "/v1/completions", [], payload))
        time.sleep(1.0)
        queued = sum(c.transport.get_write_buffer_size() for c in live.running._server.connections)
        # 60,000 events of about 130 bytes are 7.8 MB, more than the kernel's socket buffers take
        # (at most 4 MB sent and 64 KiB received here); paused at 256 KiB queued (relay._HIGH_WATER).
        assert queued < 1024 * 1024, queued
        raw = b""
        while chunk := sock.recv(1 << 20):
            raw += chunk
            if raw.endswith(b"0\r\n\r\n"):
                break
    responses, _ = parse_responses(raw)
    assert responses[0].status == 200 and responses[0].body.rstrip().endswith(b"data: [DONE]")
