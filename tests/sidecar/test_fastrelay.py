"""The C fast path (sidecar/_fastrelay.c) decides, times and writes exactly as the Python path.

It takes an upstream read only when it is one whole chunk holding one ordinary content event,
once `relay_sse` has armed it; everything else goes to the Python protocol. These tests hold it
to the Python code's own decisions on generated events, to the framing it may take, and, live,
to the same bytes, token counts and gaps through the sidecar both ways.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar import upstream as upstream_mod
from sidecar.timing import StreamTimer
from sidecar.upstream import Connection

fastrelay = pytest.importorskip("sidecar._fastrelay", reason="the C fast path is not built here (no compiler)")

pytestmark = pytest.mark.skipif(not upstream_mod.FAST_PATH, reason="the C fast path is turned off")


def python_takes(event: bytes) -> bool:
    """StreamTimer.relay's own fast-path decision for a timer past its first token."""
    timer = StreamTimer(0.0, "chat")
    timer._model, timer._first = "m", 0.0
    return (event[-2:] == b"\n\n" and event[:5] == b"data:" and event.find(b"\n") == len(event) - 2
            and timer._fast_token(event))


def event(choices=None, usage="absent", error=False, spaced=False, extra_line=False) -> bytes:
    doc = {"id": "c1", "object": "chat.completion.chunk", "model": "m"}
    if choices is not None:
        doc["choices"] = choices
    if usage != "absent":
        doc["usage"] = usage
    if error:
        doc["error"] = {"message": "boom"}
    text = json.dumps(doc, separators=(", ", ": ") if spaced else (",", ":"))
    return b"data: " + text.encode() + (b"\nid: 7" if extra_line else b"") + b"\n\n"


_text = st.sampled_from(["", "hi", " ", 'say "x"', "\\", "\n", "é", '"finish_reason":null', "null"])
_reason = st.sampled_from([None, "stop", "length", "tool_calls"])
_choice = st.one_of(
    st.builds(lambda t, r: {"index": 0, "delta": {"content": t}, "finish_reason": r}, _text, _reason),
    st.builds(lambda t, r: {"index": 0, "text": t, "finish_reason": r}, _text, _reason),
    st.builds(lambda r: {"index": 0, "delta": {"role": "assistant"}, "finish_reason": r}, _reason),
    st.builds(lambda r: {"index": 0, "delta": {"tool_calls": [{"index": 0}]}, "finish_reason": r}, _reason),
)
_events = st.builds(event, st.one_of(st.none(), st.lists(_choice, min_size=0, max_size=2)),
                    st.sampled_from(["absent", None, {"completion_tokens": 3}]), st.booleans(), st.booleans(),
                    st.booleans())


@settings(max_examples=500, deadline=None)
@given(_events)
def test_the_c_path_takes_exactly_the_events_the_python_path_takes(ev):
    assert fastrelay.event_fast(ev) == python_takes(ev)


@settings(max_examples=300, deadline=None)
@given(_events, st.integers(min_value=0, max_value=400), st.binary(min_size=1, max_size=3))
def test_and_so_it_does_on_damaged_events(ev, at, junk):
    # Cut, spliced or truncated bytes: the two decisions still agree.
    ev = ev[:at] + junk + ev[at + len(junk):]
    assert fastrelay.event_fast(ev) == python_takes(ev)


def test_the_decision_itself():
    token = event([{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}])
    assert fastrelay.event_fast(token) and fastrelay.event_fast(token.replace(b",", b", ").replace(b":", b": ", 1))
    assert not fastrelay.event_fast(event([{"index": 0, "delta": {"content": ""}, "finish_reason": None}]))
    assert not fastrelay.event_fast(event([{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]))
    assert not fastrelay.event_fast(event([{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}],
                                          usage={"completion_tokens": 1}))
    assert not fastrelay.event_fast(token[:-1])          # not a whole event
    assert not fastrelay.event_fast(b"data: [DONE]\n\n")


class _Transport:
    def __init__(self, closing=False, buffered=0):
        self.written: list[bytes] = []
        self.closing, self.buffered = closing, buffered
        self.paused = False

    def pause_reading(self):
        self.paused = True

    def write(self, data):
        self.written.append(data)

    def is_closing(self):
        return self.closing

    def get_write_buffer_size(self):
        return self.buffered


class _Pool:
    def forget(self, conn):
        pass


TOKEN = event([{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}])


def chunk(payload: bytes, size: bytes | None = None) -> bytes:
    return (size if size is not None else b"%x" % len(payload)) + b"\r\n" + payload + b"\r\n"


def armed(out: _Transport, pressure=lambda: None, high_water=1 << 18):
    """A Connection mid-body (chunked), armed as relay_sse arms it, and the Python path's pieces."""
    conn = Connection(_Pool())
    conn.connection_made(None)
    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    pieces: list[bytes] = []
    conn._sink = pieces.append
    timer = StreamTimer(0.0, "chat")
    timer._model, timer._first, timer._last = "m", 1.0, 1.0
    conn._fast = (out.write, timer, timer.gaps, out.get_write_buffer_size, high_water, pressure, out.is_closing)
    return conn, pieces, timer


@pytest.mark.parametrize("read, taken", [
    (chunk(TOKEN), True),
    (chunk(TOKEN, b"%X" % len(TOKEN)), True),               # upper-case hex is plain hex
    (chunk(TOKEN, b"0%x" % len(TOKEN)), True),              # so are leading zeros
    (chunk(TOKEN, b"0x%x" % len(TOKEN)), False),            # int(., 16) takes these; the C path does not
    (chunk(TOKEN, b"%x;ext=1" % len(TOKEN)), False),        # a chunk extension
    (chunk(TOKEN, b"+%x" % len(TOKEN)), False),
    (chunk(TOKEN) + chunk(TOKEN), False),                   # two chunks in one read
    (chunk(TOKEN)[:-1], False),                              # a partial one
    (chunk(TOKEN, b"%x" % (len(TOKEN) + 1)), False),         # a size that does not match
])
def test_only_a_read_that_is_one_plain_chunk_takes_the_c_path(read, taken):
    out = _Transport()
    conn, pieces, timer = armed(out)
    conn.data_received(read)
    assert (out.written == [read]) is taken
    assert (timer._chunks == 1 and len(timer.gaps) == 1) is taken
    if not taken:
        assert out.written == [] and timer._chunks == 0


def test_the_c_path_stamps_tokens_on_the_clock_the_python_path_stamps_them_on():
    # The relay's clock is time.perf_counter (sidecar/app.py), the read timeout's time.monotonic.
    out = _Transport()
    conn, pieces, timer = armed(out)
    before, before_mono = time.perf_counter(), time.monotonic()
    conn.data_received(chunk(TOKEN))
    conn.data_received(chunk(TOKEN))
    after, after_mono = time.perf_counter(), time.monotonic()
    # Two tokens: gaps from the timer's last token, each stamped on perf_counter's clock.
    assert timer._chunks == 2 and len(timer.gaps) == 2
    assert before - 1.0 <= timer.gaps[0] <= after - 1.0 and 0 <= timer.gaps[1] <= after - before
    assert before <= timer._last <= after and before_mono <= conn.last_activity <= after_mono
    assert out.written == [chunk(TOKEN)] * 2 and pieces == []


def test_a_closing_client_or_an_unarmed_connection_leaves_the_read_to_python():
    out = _Transport(closing=True)
    conn, pieces, timer = armed(out)
    conn.data_received(chunk(TOKEN))
    assert out.written == [] and pieces == [TOKEN] and timer._chunks == 0
    out = _Transport()
    conn, pieces, timer = armed(out)
    conn._fast = None
    conn.data_received(chunk(TOKEN))
    assert out.written == [] and pieces == [TOKEN]


def test_a_full_client_buffer_hands_back_to_python():
    calls = []
    out = _Transport(buffered=10)
    conn, pieces, timer = armed(out, pressure=lambda: calls.append(1), high_water=5)
    conn.data_received(chunk(TOKEN))
    assert out.written == [chunk(TOKEN)] and calls == [1]


def test_a_partial_chunk_held_by_python_disarms_whole_chunk_reads():
    out = _Transport()
    conn, pieces, timer = armed(out)
    whole = chunk(TOKEN)
    conn.data_received(whole[:10])           # Python holds a partial chunk now
    assert not conn._fast_clear
    conn.data_received(whole[10:] + whole[:10])   # completes it; starts the next
    assert out.written == [] and not conn._fast_clear
    conn.data_received(whole[10:])
    assert conn._fast_clear and b"".join(pieces) == TOKEN * 2   # the body, as Python delivered it
    conn.data_received(whole)                # nothing held: the C path again
    assert out.written == [whole] and b"".join(pieces) == TOKEN * 2


N = 64


def _stream(url: str) -> bytes:
    body = {"model": "scripted", "stream": True, "max_tokens": N, "messages": [{"role": "user", "content": "hi"}],
            "script": {"ttft": 0.01, "itl": 0.002}}
    with httpx.Client(timeout=20) as c:
        return c.post(url + "/v1/chat/completions", json=body).content


@pytest.mark.parametrize("c_path", [True, False])
def test_live_through_the_sidecar_both_ways(sidecars, upstream, monkeypatch, c_path):
    python_reads = []
    original = Connection._py_data_received

    def counted(self, data):
        python_reads.append(len(data))
        return original(self, data)

    monkeypatch.setattr(Connection, "_py_data_received", counted)
    if not c_path:
        monkeypatch.setattr("sidecar.relay.FAST_PATH", False)
    live = sidecars.start(upstream, models=("scripted",))
    answer = _stream(live.url)
    texts = [json.loads(line[6:])["choices"][0]["delta"].get("content")
             for line in answer.decode().split("\n") if line.startswith("data: {")]
    assert texts[1:] == [f"t{i} " for i in range(N)] and answer.endswith(b"data: [DONE]\n\n")
    live.finished_spans(1)    # the request is accounted (its span ends last) after its bytes went out
    assert live.value("goodput_output_tokens_total", model="scripted", slo_class="interactive") == N
    assert live.value("goodput_itl_seconds_count", model="scripted") == N - 1
    # The script's timings: the first token after 10 ms, then one every 2 ms (a loaded 2-core
    # machine stretches both; a token timed from the wrong origin would add hours).
    assert 0.01 <= live.value("goodput_ttft_seconds_sum", model="scripted", slo_class="interactive") < 0.5
    assert 0.001 <= live.value("goodput_itl_seconds_sum", model="scripted") / (N - 1) < 0.05
    assert live.value("goodput_requests_total", model="scripted", slo_class="interactive", outcome="good") == 1
    # The C path takes every token after the first (the head, the role chunk, the first token
    # and the end go to Python); the Python path reads them all.
    if c_path:
        assert len(python_reads) < 10
    else:
        assert len(python_reads) >= N


class _Client:
    """The fast server's request as relay_sse sees it: a chunked client."""
    chunked = True

    def __init__(self):
        self.transport = _Transport()

    def start_response(self, *a):
        return b"HEAD"

    def end_response(self, terminated=False):
        pass


def relayed(monkeypatch, reads, between=None):
    """Reads fed to a Connection that relay_sse relays to a client; `between(k, client, conn)`
    runs before read k. Returns (what the client got, the timer, the upstream transport)."""
    import asyncio

    import sidecar.relay as relay

    monkeypatch.setattr(relay, "FastRequest", _Client)

    async def run():
        conn = Connection(_Pool())
        upstream = _Transport()
        conn.connection_made(upstream)
        conn._done_waiter = asyncio.get_running_loop().create_future()
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        timer = StreamTimer(0.0, "chat")
        client = _Client()
        task = asyncio.get_running_loop().create_task(relay.relay_sse(client, conn, timer, time.perf_counter))
        await asyncio.sleep(0)
        for k, read in enumerate(reads):
            if between is not None:
                between(k, client, conn)
            conn.data_received(read)
        conn._finish()
        await task
        return client.transport.written, timer, upstream

    return asyncio.run(run())


def test_an_event_split_across_chunks_is_joined_by_python_not_taken_in_halves(monkeypatch):
    # A two-line event whose first line ends one chunk: the second chunk alone looks like a plain
    # token, but it is the rest of an event Python holds; armed before, the C path must let it by.
    split = chunk(b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}]}\n')
    written, timer, _ = relayed(monkeypatch, [chunk(TOKEN), chunk(TOKEN), split, chunk(TOKEN), chunk(TOKEN)])
    # Tokens 1 and 2 (the second by C), then the split event: two data lines, one event whose
    # payload is not one JSON document, so it counts nothing; the last token is C's again.
    assert timer._chunks == 3 and len(timer.gaps) == 2 and timer._buf == b""
    assert written[-1] == chunk(TOKEN)


def test_a_client_that_stops_reading_pauses_the_upstream_from_the_c_path_too(monkeypatch):
    seen = []

    def fill_up(k, client, conn):
        seen.append((conn._fast is not None, conn.transport.paused))
        if k == 1:            # after the first token (Python's), the client's buffer fills
            client.transport.buffered = 1 << 20

    written, timer, upstream = relayed(monkeypatch, [chunk(TOKEN), chunk(TOKEN), chunk(TOKEN)], fill_up)
    # Before the second token: armed, reading. The second went by C, which saw the full buffer
    # and handed back at once: the upstream paused, the C path off, before the third read.
    assert seen[1:] == [(True, False), (False, True)]
    assert timer._chunks == 3 and written[1:] == [chunk(TOKEN)] * 2
