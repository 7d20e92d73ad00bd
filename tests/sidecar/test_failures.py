"""Every way a request can end badly is answered right, counted once, and ends its span once."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.sidecar.conftest import upstream_stats
from tests.support import free_port


@pytest.fixture(params=["fast", "aiohttp"])
def sidecar(request, sidecars, upstream):
    """Every test here runs on both HTTP servers (`--http-server`): they share the handlers."""
    return sidecars.start(upstream, models=("scripted",), http_server=request.param)


CHAT = "/v1/chat/completions"


def chat_body(**script) -> dict:
    return {"model": "scripted", "messages": [{"role": "user", "content": "x"}], "max_tokens": 6, "stream": True,
            "script": script}


def outcome(live, outcome, count=1, timeout=5.0):
    """Wait for `count` spans, then return that outcome's counter (default model/class)."""
    live.finished_spans(count, timeout)
    return live.value("goodput_requests_total", model="scripted", slo_class="interactive", outcome=outcome)


def test_upstream_error_status_is_relayed_and_counted(sidecar):
    r = httpx.post(sidecar.url + CHAT, json=chat_body(status=500), timeout=10)
    assert r.status_code == 500 and r.json()["error"]["message"] == "scripted failure"
    assert outcome(sidecar, "error") == 1
    assert sidecar.spans.get_finished_spans()[0].attributes["error.type"] == "http_500"


def test_upstream_dying_mid_stream_gives_the_client_an_error_event_and_done(sidecar):
    r = httpx.post(sidecar.url + CHAT, json=chat_body(ttft=0, itl=0.01, fail_after=3), timeout=10)
    events = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
    contents = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:4]]
    # role chunk, three tokens, then the sidecar's error event and a clean end of stream.
    assert contents == ["", "t0 ", "t1 ", "t2 "]
    assert json.loads(events[4])["error"]["type"] == "upstream_disconnected"
    assert events[5:] == ["[DONE]"]
    assert outcome(sidecar, "error") == 1
    span = sidecar.spans.get_finished_spans()[0]
    assert span.attributes["error.type"] == "upstream_disconnected"
    assert span.attributes["gen_ai.usage.output_tokens"] == 3        # counted: no usage ever came


@pytest.mark.parametrize("shape, kind", [("nested", "internal_error"), ("flat", "internal_error")])
def test_mid_stream_error_event_is_relayed_and_counted(sidecar, shape, kind):
    r = httpx.post(sidecar.url + CHAT, json=chat_body(ttft=0, itl=0.005, error_after=2, error_shape=shape), timeout=10)
    assert "scripted mid-stream error" in r.text and r.text.endswith("data: [DONE]\n\n")
    assert outcome(sidecar, "error") == 1
    assert sidecar.spans.get_finished_spans()[0].attributes["error.type"] == kind


def test_refused_upstream_is_502_in_openai_shape(sidecars):
    live = sidecars.start(f"http://127.0.0.1:{free_port()}", models=("scripted",))
    r = httpx.post(live.url + CHAT, json=chat_body(), timeout=10)
    assert r.status_code == 502
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert r.json()["error"]["type"] == "upstream_unreachable"
    assert outcome(live, "error") == 1
    assert_counted_once(live)
    assert httpx.get(live.url + "/readyz", timeout=10).status_code == 503


def assert_counted_once(live, count=1):
    """The arrival counts once whether or not the request reached the engine (it is counted after
    the request is written upstream, or at the end where it never was), and nothing stays in flight."""
    assert live.value("goodput_requests_arrived_total", model="scripted", slo_class="interactive") == count
    assert live.value("goodput_requests_in_flight", model="scripted") == 0


def test_upstream_timeout_is_504(sidecars, upstream):
    live = sidecars.start(upstream, models=("scripted",), read_timeout=0.3)
    r = httpx.post(live.url + CHAT, json=chat_body(hold=1.0), timeout=10)
    assert r.status_code == 504 and r.json()["error"]["type"] == "upstream_timeout"
    assert outcome(live, "error") == 1
    assert_counted_once(live)


def test_stalled_stream_ends_with_timeout_event(sidecars, upstream):
    live = sidecars.start(upstream, models=("scripted",), read_timeout=0.3)
    r = httpx.post(live.url + CHAT, json=chat_body(ttft=0, itl=1.0), timeout=10)
    assert r.status_code == 200 and '"upstream_timeout"' in r.text and r.text.endswith("data: [DONE]\n\n")
    assert outcome(live, "error") == 1


def test_oversized_body_is_413_and_counted(sidecars, upstream):
    live = sidecars.start(upstream, models=("scripted",), max_body_bytes=200)
    before = upstream_stats(upstream)["requests"]
    body = chat_body()
    body["messages"][0]["content"] = "x" * 500
    r = httpx.post(live.url + CHAT, json=body, timeout=10)
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    # The body was never read, so the model is unknown: the request counts under `other`.
    live.finished_spans(1)
    assert live.value("goodput_requests_total", model="other", slo_class="interactive", outcome="error") == 1
    assert upstream_stats(upstream)["requests"] == before


def test_client_disconnect_cancels_and_closes_the_upstream_stream_at_once(sidecar, upstream):
    deadline = time.monotonic() + 5
    while upstream_stats(upstream)["active"] and time.monotonic() < deadline:
        time.sleep(0.05)     # streams cut by earlier tests finish noticing first
    before = upstream_stats(upstream)
    # 40 tokens 50 ms apart: the upstream would stream for 2 s if nobody hung up.
    payload = json.dumps(chat_body(ttft=0, itl=0.05) | {"max_tokens": 40}).encode()
    port = int(sidecar.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
    got = b""
    while got.count(b'"content":"t') < 2:
        got += sock.recv(65536)
    sock.close()
    hung_up = time.monotonic()
    live = sidecar
    assert outcome(live, "cancelled") == 1
    while upstream_stats(upstream)["disconnects"] == before["disconnects"] and time.monotonic() - hung_up < 1.0:
        time.sleep(0.01)
    # The upstream noticed within one token interval (its next write failed): the stream was closed,
    # not left to run 1.9 s more.
    assert upstream_stats(upstream)["disconnects"] == before["disconnects"] + 1
    assert time.monotonic() - hung_up < 0.8
    assert live.value("goodput_requests_in_flight", model="scripted") == 0
    span = live.spans.get_finished_spans()[0]
    assert span.attributes["goodput.outcome"] == "cancelled" and "error.type" not in span.attributes


@pytest.fixture
def garbling_upstream():
    """A raw upstream that streams one good chunk, then a chunk whose size line is not hex."""
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(body) < length:
                    body += conn.recv(65536)
                event = (b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"scripted",'
                         b'"choices":[{"index":0,"delta":{"content":"t0 "},"finish_reason":null}]}\n\n')
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                             + f"{len(event):x}\r\n".encode() + event + b"\r\n")
                time.sleep(0.05)
                conn.sendall(b"zz;\r\nnot a chunk\r\n")
                time.sleep(0.2)

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{port}"
    server.close()


@pytest.mark.parametrize("http_server", ["fast", "aiohttp"])
def test_a_garbled_chunked_stream_from_the_upstream_ends_in_an_error_event_not_a_hang(sidecars, garbling_upstream,
                                                                                       http_server):
    live = sidecars.start(garbling_upstream, models=("scripted",), http_server=http_server)
    for attempt in range(2):   # and the sidecar goes on serving after it
        r = httpx.post(live.url + CHAT, json=chat_body(), timeout=10)
        events = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
        assert json.loads(events[0])["choices"][0]["delta"]["content"] == "t0 "
        assert json.loads(events[1])["error"]["type"] == "upstream_disconnected" and events[-1] == "[DONE]", r.text
    assert outcome(live, "error", count=2) == 2
