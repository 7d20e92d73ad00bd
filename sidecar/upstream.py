"""A lean HTTP/1.1 client for the measured path, built on asyncio Protocols.

Why not aiohttp's client here: relaying one token through its StreamReader costs a future, a
task wake-up and a timer reschedule per chunk, which made the sidecar cost 3.5x a bare socket
relay per token. Here the upstream connection's `data_received` decodes the chunked body and
hands each piece to a sink synchronously (the proxy's sink times it and writes it to the client
socket), so a token costs one recv, a little parsing and one send, like the bare relay.

Scope: what OpenAI-compatible servers answer with: a status line and headers, then a body
framed by chunked transfer coding, Content-Length, or the connection's end. Connections are
kept alive and pooled per upstream; a pooled connection that the upstream closed while idle is
detected (closed before any response byte) and the request is retried once on a new one.
"""

from __future__ import annotations

import asyncio
import os
import ssl as ssl_module
import time
from typing import Callable
from urllib.parse import urlsplit

_HEAD, _CHUNKED, _LENGTH, _UNTIL_CLOSE, _DONE = range(5)


def _fast_base():
    """The C fast path (sidecar/_fastrelay.c, built at install when a compiler is there) as
    Connection's base, or None: not built, turned off (GOODPUT_NO_FASTRELAY=1), or a platform
    where the clocks it times with are not the ones the Python side reads."""
    if os.environ.get("GOODPUT_NO_FASTRELAY", "") not in ("", "0"):
        return None
    try:
        from sidecar import _fastrelay
    except ImportError:
        return None
    # It stamps tokens and reads with CLOCK_MONOTONIC: time.perf_counter and time.monotonic
    # read that same clock on Linux; elsewhere they may not, and the Python path runs.
    if abs(_fastrelay.monotonic() - time.perf_counter()) > 0.01 or abs(_fastrelay.monotonic() - time.monotonic()) > 0.01:
        return None
    return _fastrelay.FastBase


class _PyBase:
    """What Connection has from the C base when that is not built: the fast path never armed."""
    _fast = None
    _fast_clear = False


_FastBase = _fast_base()
FAST_PATH = _FastBase is not None     # whether streamed tokens take the C path


class UpstreamFailed(Exception):
    """The upstream could not be reached or did not answer in time: (status, error type, message)."""

    def __init__(self, status: int, error_type: str, message: str):
        super().__init__(message)
        self.status, self.error_type, self.message = status, error_type, message


class Head:
    __slots__ = ("status", "reason", "headers", "content_type")

    def __init__(self, status: int, reason: str, headers: list[tuple[str, str]]):
        self.status, self.reason, self.headers = status, reason, headers
        ctype = next((v for k, v in headers if k.lower() == "content-type"), "")
        self.content_type = ctype.split(";", 1)[0].strip().lower()


class Connection(_FastBase or _PyBase, asyncio.Protocol):
    """One upstream connection; serves one request at a time.

    With the C base, `data_received` is C: a read that is exactly one chunk holding one
    ordinary token, while `relay_sse` has armed `_fast`, is timed and written there; any other
    read comes to `_py_data_received`. Without it, `data_received` is `_py_data_received`."""

    def __init__(self, pool: "UpstreamPool"):
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.last_activity = time.monotonic()
        self.timed_out = False
        self._reset()

    def _reset(self) -> None:
        self._state = _HEAD
        self._buf = b""
        self._remaining = 0
        self._crlf = False
        self._keep_alive = True
        self.got_bytes = False
        self.written = False      # the request left (and `send`'s callback ran)
        self.head: Head | None = None
        self._head_waiter: asyncio.Future | None = None
        self._done_waiter: asyncio.Future | None = None
        self._sink: Callable[[bytes], None] | None = None
        self._pending: list[bytes] = []
        self._held = 0
        self.error: str | None = None
        self._fast = None          # the C fast path's arming (a tuple from relay_sse), or None
        self._fast_clear = False   # the chunk decoder holds nothing partial: whole-chunk reads are safe

    # ---- used by the proxy -----------------------------------------------------------------
    async def send(self, head: bytes, body: bytes, sent: Callable[[], None] | None = None) -> Head:
        """Send the request; wait for the response's status line and headers. `sent` is called
        once the request is written, while it travels."""
        loop = asyncio.get_running_loop()
        self._head_waiter = loop.create_future()
        self._done_waiter = loop.create_future()
        self.last_activity = time.monotonic()
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)
        self.written = True
        if sent is not None:
            sent()
        return await self._head_waiter

    def start_body(self, sink: Callable[[bytes], None]) -> asyncio.Future:
        """Hand every body piece to `sink` as it arrives; the future ends with None or an error type."""
        self._sink = sink
        pending, self._pending = self._pending, []
        for i, piece in enumerate(pending):
            self._held = len(pending) - 1 - i     # held pieces still to come after this one
            sink(piece)
        self._held = 0
        return self._done_waiter

    async def read_body(self) -> bytes:
        parts: list[bytes] = []
        error = await self.start_body(parts.append)
        if error is not None:
            raise UpstreamFailed(504 if error == "upstream_timeout" else 502, error,
                                 "the upstream failed while sending its answer")
        return b"".join(parts)

    def pause(self) -> None:
        self.transport.pause_reading()

    def resume(self) -> None:
        if not self.closed:
            self.transport.resume_reading()

    def abort(self, timed_out: bool = False) -> None:
        self.timed_out = self.timed_out or timed_out
        if self.transport is not None and not self.closed:
            self.transport.abort()

    # ---- protocol ----------------------------------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport

    def _py_data_received(self, data: bytes) -> None:
        self.last_activity = time.monotonic()
        self.got_bytes = True
        state = self._state
        if state == _CHUNKED:
            # Fast path: the read is exactly one whole chunk (one token, as engines write them).
            sink = self._sink
            if sink is not None and not self._buf and not self._remaining and not self._crlf:
                eol = data.find(b"\r\n", 0, 10)
                if eol > 0 and data[-2:] == b"\r\n":
                    try:
                        size = int(data[:eol], 16)
                    except ValueError:
                        size = -1
                    if size > 0 and eol + 4 + size == len(data):
                        sink(data[eol + 2:-2])
                        return
            self._chunked(data)
            self._fast_clear = self._state == _CHUNKED and not (self._buf or self._remaining or self._crlf)
        elif state == _HEAD:
            self._parse_head(data)
        elif state == _LENGTH:
            self._length(data)
        elif state == _UNTIL_CLOSE:
            self._deliver(data)
        # _DONE: bytes after a finished response are a protocol error; the connection closes.
        else:
            self._keep_alive = False

    if _FastBase is None:
        data_received = _py_data_received

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._pool.forget(self)
        if self._state == _UNTIL_CLOSE:
            self._finish()
            return
        error = "upstream_timeout" if self.timed_out else "upstream_disconnected"
        if self._head_waiter is not None and not self._head_waiter.done():
            self._head_waiter.set_exception(ConnectionError("closed before the response"))
        if self._state != _DONE:
            self.error = error
            if self._done_waiter is not None and not self._done_waiter.done():
                self._done_waiter.set_result(error)

    # ---- parsing -----------------------------------------------------------------------------
    def _deliver(self, piece: bytes) -> None:
        if self._sink is not None:
            self._sink(piece)
        else:
            self._pending.append(piece)

    def _parse_head(self, data: bytes) -> None:
        buf = self._buf + data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            self._buf = buf
            return
        lines = buf[:end].decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code, _, reason = rest.partition(" ")
        headers = []
        chunked, length, keep_alive = False, None, version == "HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(":")
            value = value.strip()
            headers.append((name, value))
            low = name.lower()
            if low == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
            elif low == "content-length":
                length = int(value)
            elif low == "connection":
                keep_alive = "close" not in value.lower() and (keep_alive or "keep-alive" in value.lower())
        status = int(code)
        if 100 <= status < 200 and status != 101:
            # An interim answer (103 Early Hints, an unasked-for 100): the real head follows.
            self._buf = b""
            if len(buf) > end + 4:
                self._parse_head(buf[end + 4:])
            return
        self._keep_alive = keep_alive
        self._buf = b""
        self.head = Head(status, reason, headers)
        rest_bytes = buf[end + 4:]
        if chunked:
            self._state = _CHUNKED
            self._fast_clear = True
        elif length is not None or status in (204, 304):
            self._state = _LENGTH
            self._remaining = length or 0
        else:
            self._state = _UNTIL_CLOSE
            self._keep_alive = False
        if self._head_waiter is not None and not self._head_waiter.done():
            self._head_waiter.set_result(self.head)
        if self._state == _LENGTH and self._remaining == 0:
            self._finish()
        elif rest_bytes:
            self.data_received(rest_bytes)

    def _length(self, data: bytes) -> None:
        take = min(len(data), self._remaining)
        self._remaining -= take
        if self._remaining == 0:
            self._state = _DONE     # delivered next, then finished: the sink sees the body complete
        self._deliver(data if take == len(data) else data[:take])
        if self._remaining == 0:
            self._finish()

    def _chunked(self, data: bytes) -> None:
        # Everything decoded from one read goes to the sink as one piece: one timing pass and
        # one write to the client per read, however many chunks the upstream packed into it.
        pieces: list[bytes] = []
        try:
            self._dechunk(data, pieces)
        except ValueError:
            # A chunk-size line that is not hex: the framing is lost, and with it the connection.
            # Dropped at once, it ends the answer as a disconnect (an error event for a stream)
            # instead of asyncio's fatal-error path and a traceback per response.
            self._keep_alive = False
            self._buf = b""
            self.abort()
        finally:
            if pieces:
                self._deliver(pieces[0] if len(pieces) == 1 else b"".join(pieces))
            if self._state == _DONE:
                self._finish()

    def _dechunk(self, data: bytes, pieces: list[bytes]) -> None:
        buf = self._buf + data if self._buf else data
        pos, end = 0, len(buf)
        while pos < end:
            if self._remaining:
                take = min(self._remaining, end - pos)
                pieces.append(buf[pos:pos + take])
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._crlf = True
                continue
            if self._crlf:
                if end - pos < 2:
                    break
                pos += 2
                self._crlf = False
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(buf[pos:eol].split(b";", 1)[0], 16)
            if size:
                self._remaining = size
                pos = eol + 2
                continue
            # Last chunk: the trailer section ends at an empty line.
            if buf[eol + 2:eol + 4] == b"\r\n":
                pos = eol + 4
            else:
                trailer_end = buf.find(b"\r\n\r\n", eol)
                if trailer_end < 0:
                    break
                pos = trailer_end + 4
            self._buf = b""
            self._state = _DONE     # _chunked delivers the pieces first, then finishes
            return
        self._buf = buf[pos:]

    def _finish(self) -> None:
        self._state = _DONE
        if self._done_waiter is not None and not self._done_waiter.done():
            self._done_waiter.set_result(None)

    @property
    def body_complete(self) -> bool:
        """True from the piece that holds the body's last bytes on: a sink can end its own
        response with the bytes it forwards, instead of in a write of its own after them."""
        return self._state == _DONE and not self._held

    @property
    def reusable(self) -> bool:
        return self._state == _DONE and self._keep_alive and not self.closed and not self._buf


class UpstreamPool:
    """Keep-alive connections to one upstream, and a watchdog for read timeouts."""

    def __init__(self, base_url: str, connect_timeout: float, read_timeout: float, max_idle: int = 256):
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.host_header = parts.netloc
        self._ssl = ssl_module.create_default_context() if parts.scheme == "https" else None
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self._idle: list[Connection] = []
        self._active: set[Connection] = set()
        self._max_idle = max_idle
        self._watchdog: asyncio.Task | None = None

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: Connection(self), self.host, self.port, ssl=self._ssl,
                                       server_hostname=self.host if self._ssl else None), self.connect_timeout)
        except asyncio.TimeoutError:
            raise UpstreamFailed(504, "upstream_timeout", "connecting to the upstream timed out") from None
        except OSError as exc:
            raise UpstreamFailed(502, "upstream_unreachable",
                                 f"cannot connect to the upstream: {exc.strerror or exc}") from None
        return conn

    async def request(self, method: str, path: str, headers: dict[str, str], body: bytes,
                      sent: Callable[[], None] | None = None) -> Connection:
        """Send a request; returns the connection with `head` set. Release or abort it afterwards.
        `sent` is called once, as soon as the request is written (before its answer comes): the
        caller's bookkeeping runs while the request travels instead of before it leaves."""
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines.append(f"Content-Length: {len(body)}")
        # aiohttp decodes the client's header bytes as UTF-8 with surrogateescape; encoding the same
        # way gives back exactly the bytes the client sent (latin-1 failed on obs-text: a 500).
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")
        for attempt in range(2):
            conn = None
            while self._idle:
                candidate = self._idle.pop()
                if not candidate.closed:
                    conn = candidate
                    conn.reused = True
                    break
            if conn is None:
                conn = await self._connect()
                conn.reused = False
            conn._reset()
            self._active.add(conn)
            try:
                await conn.send(head, body, sent)
                return conn
            except ConnectionError:
                self._active.discard(conn)
                # A kept-alive connection the upstream closed while idle: retry once, fresh.
                if conn.reused and not conn.got_bytes and not conn.timed_out and attempt == 0:
                    if conn.written:
                        sent = None     # called already: once a request
                    continue
                raise UpstreamFailed(504 if conn.timed_out else 502,
                                     "upstream_timeout" if conn.timed_out else "upstream_error",
                                     "the upstream closed the connection before answering") from None
            except asyncio.CancelledError:
                self._active.discard(conn)
                conn.abort()
                raise
        raise AssertionError("unreachable")

    def release(self, conn: Connection) -> None:
        self._active.discard(conn)
        if conn.reusable and len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            conn.abort()

    def discard(self, conn: Connection) -> None:
        """Close a connection whose response will not be read to the end (the engine then stops)."""
        self._active.discard(conn)
        conn.abort()

    def forget(self, conn: Connection) -> None:
        self._active.discard(conn)

    async def _watch(self) -> None:
        """Abort requests that received no byte for `read_timeout` (one timer for all of them,
        instead of rescheduling a timer on every chunk)."""
        period = min(1.0, self.read_timeout / 4)
        while True:
            await asyncio.sleep(period)
            limit = time.monotonic() - self.read_timeout
            for conn in [c for c in self._active if c.last_activity < limit]:
                conn.abort(timed_out=True)

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        for conn in self._idle + list(self._active):
            conn.abort()
        self._idle.clear()
