"""The measured path's own HTTP/1.1 client: response framing, pooling, stale connections, timeouts."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.upstream import Connection, UpstreamFailed, UpstreamPool


class _Pool:
    def forget(self, conn):
        pass


class _Transport:
    def __init__(self):
        self.aborted = False

    def abort(self):
        self.aborted = True


def feed(response: bytes, cuts: list[int]) -> tuple[Connection, list[bytes]]:
    """Feed `response` to a Connection in pieces cut at `cuts`; returns it and the body pieces."""
    conn = Connection(_Pool())
    conn.connection_made(_Transport())
    pieces: list[bytes] = []
    conn._sink = pieces.append
    bounds = [0, *sorted(set(cuts)), len(response)]
    for a, b in zip(bounds, bounds[1:]):
        if b > a:
            conn.data_received(response[a:b])
    return conn, pieces


BODY = b"data: {\"a\": 1}\n\n" * 3 + b"data: [DONE]\n\n"
CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
           + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (BODY[:16], BODY[16:40], BODY[40:]))
           + b"0\r\n\r\n")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(CHUNKED) - 1), max_size=10))
def test_chunked_body_survives_any_split(cuts):
    conn, pieces = feed(CHUNKED, cuts)
    # The body is the concatenation of the chunks' data, however the reads fell.
    assert b"".join(pieces) == BODY
    assert conn.head.status == 200 and conn.head.content_type == "text/event-stream"
    assert conn.reusable


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(CHUNKED) - 1), max_size=10))
def test_the_piece_with_the_last_bytes_knows_the_body_is_complete(cuts):
    # What lets the relay send its own terminal chunk in the same write as the last bytes.
    conn = Connection(_Pool())
    conn.connection_made(_Transport())
    seen: list[tuple[bytes, bool]] = []
    conn._sink = lambda piece: seen.append((piece, conn.body_complete))
    bounds = [0, *sorted(set(cuts)), len(CHUNKED)]
    reads = [CHUNKED[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]
    for data in reads:
        conn.data_received(data)
    assert b"".join(p for p, _ in seen) == BODY
    assert not any(done for _, done in seen[:-1])
    # Complete at the last piece exactly when the read that held the last data bytes also held
    # the whole terminal chunk.
    last_data_end = len(CHUNKED) - len(b"\r\n0\r\n\r\n")
    last_read_start = len(CHUNKED) - len(reads[-1])
    assert seen[-1][1] == (last_read_start < last_data_end)
    assert conn.body_complete


def test_pieces_held_before_the_sink_came_are_complete_only_at_the_last():
    # Reads that arrive before the proxy hands over its sink are held, then replayed: only the
    # last of them may end the client's body, or the terminal chunk would go out before the rest.
    conn = Connection(_Pool())
    conn.connection_made(_Transport())
    head_end = CHUNKED.index(b"\r\n\r\n") + 4
    conn.data_received(CHUNKED[:head_end + 30])
    conn.data_received(CHUNKED[head_end + 30:])
    seen: list[tuple[bytes, bool]] = []
    conn.start_body(lambda piece: seen.append((piece, conn.body_complete)))
    assert b"".join(p for p, _ in seen) == BODY
    assert [done for _, done in seen] == [False, True]
    assert conn.body_complete


def test_content_length_piece_with_the_last_bytes_knows_the_body_is_complete():
    body = b'{"choices": [{"text": "hi"}]}'
    response = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    conn = Connection(_Pool())
    conn.connection_made(_Transport())
    seen: list[bool] = []
    conn._sink = lambda piece: seen.append(conn.body_complete)
    conn.data_received(response[:-5])
    conn.data_received(response[-5:])
    assert seen == [False, True] and conn.reusable


def test_chunk_extensions_and_trailers():
    response = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"5;name=value\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n")
    conn, pieces = feed(response, [])
    assert b"".join(pieces) == b"hello" and conn.reusable


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=60), max_size=6))
def test_content_length_body_survives_any_split(cuts):
    body = b'{"choices": [{"text": "hi"}]}'
    response = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    conn, pieces = feed(response, [c for c in cuts if c < len(response)])
    assert b"".join(pieces) == body and conn.reusable


def test_body_until_close_ends_cleanly_and_is_not_reused():
    conn, pieces = feed(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{\"a\"", [])
    conn.data_received(b": 1}")
    conn.connection_lost(None)
    assert b"".join(pieces) == b'{"a": 1}'
    assert conn.error is None and not conn.reusable


def test_connection_close_header_prevents_reuse():
    conn, _ = feed(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", [])
    assert not conn.reusable


def test_cut_stream_reports_upstream_disconnected():
    conn, pieces = feed(CHUNKED[:120], [])
    conn.connection_lost(ConnectionResetError())
    assert conn.error == "upstream_disconnected" and b"".join(pieces) == BODY[:len(b"".join(pieces))]


class _Server:
    """A tiny keep-alive HTTP server that counts connections and can drop idle ones."""

    def __init__(self, hold: float = 0.0, drop_second: bool = False):
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []
        self.hold = hold
        # Close a connection as its second request arrives, unanswered (an idle timeout racing
        # the request on a kept-alive connection).
        self.drop_second = drop_second

    async def handle(self, reader, writer):
        self.connections += 1
        self.writers.append(writer)
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next((ln.split(b":")[1] for ln in head.split(b"\r\n")
                                   if ln.lower().startswith(b"content-length")), b"0"))
                await reader.readexactly(length)
                if self.drop_second and served == 1:
                    writer.close()
                    return
                if self.hold:
                    await asyncio.sleep(self.hold)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


async def _with_server(server: _Server, body):
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        return await body(port)
    finally:
        listener.close()


def _requests_in_turn(server: _Server, count: int, before=None) -> tuple[list[bytes], list[int]]:
    """`count` requests one after another through one pool, `await before(i)` ahead of request i;
    the answers, and the requests whose "it left" callback ran, in the order it ran."""
    sent: list[int] = []

    async def body(port):
        pool = UpstreamPool(f"http://127.0.0.1:{port}", 2.0, 5.0)
        answers = []
        for i in range(count):
            if before is not None:
                await before(i)
            conn = await pool.request("POST", "/v1/completions", {}, b"{}", sent=lambda i=i: sent.append(i))
            answers.append(await conn.read_body())
            pool.release(conn)
        await pool.close()
        return answers

    return asyncio.run(_with_server(server, body)), sent


def test_pool_reuses_and_retries_a_connection_closed_while_idle():
    server = _Server()

    async def drop_idle(i):
        if i == 2:
            for w in server.writers:      # the upstream drops its idle keep-alive connections
                w.close()
            await asyncio.sleep(0.05)

    answers, sent = _requests_in_turn(server, 3, drop_idle)
    assert answers == [b"ok"] * 3
    assert sent == [0, 1, 2]      # the caller's "it left" callback: once a request, reconnect or not
    # One connection served the first two requests; the third needed a new one after the drop.
    assert server.connections == 2


def test_a_kept_alive_connection_dropped_on_the_request_is_retried_and_counted_once():
    """The upstream closes a kept-alive connection as the next request reaches it, unanswered:
    the pool retries on a new connection, and the caller's callback still runs once for the request."""
    server = _Server(drop_second=True)
    answers, sent = _requests_in_turn(server, 2)
    assert answers == [b"ok", b"ok"]
    assert server.connections == 2      # the second request went out twice: dropped, then retried
    assert sent == [0, 1]


def test_no_answer_within_the_read_timeout_is_504():
    server = _Server(hold=2.0)

    async def body(port):
        pool = UpstreamPool(f"http://127.0.0.1:{port}", 2.0, 0.3)
        try:
            with pytest.raises(UpstreamFailed) as info:
                await pool.request("POST", "/v1/completions", {}, b"{}")
        finally:
            await pool.close()
        return info.value

    failure = asyncio.run(_with_server(server, body))
    assert (failure.status, failure.error_type) == (504, "upstream_timeout")


def test_interim_1xx_heads_are_skipped():
    conn, pieces = feed(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", [30])
    assert conn.head.status == 200 and b"".join(pieces) == b"ok"


def test_without_the_c_path_the_protocol_is_the_python_one():
    # Runs whether or not sidecar/_fastrelay.c is built (tests/sidecar/test_fastrelay.py skips without it).
    # What a machine without a compiler runs (and GOODPUT_NO_FASTRELAY=1 asks for).
    import os
    import subprocess
    import sys
    code = ("from sidecar import upstream as u\n"
            "assert not u.FAST_PATH and u.Connection.data_received is u.Connection._py_data_received\n"
            "assert u._PyBase in u.Connection.__mro__\n")
    env = dict(os.environ, GOODPUT_NO_FASTRELAY="1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
