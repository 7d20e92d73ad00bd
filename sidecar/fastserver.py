"""The sidecar's own HTTP/1.1 server, built on asyncio Protocols (`--http-server fast`).

Why not aiohttp's server: every request there costs a StreamReader, a payload writer and a few
task wake-ups before the handler runs, and per token its writer adds a drain check; on the
measured path the sidecar already decodes the upstream in `data_received` (sidecar.upstream) and
wants the client side as lean. Here a connection parses the request head itself (sidecar.http1),
starts the handler at once, feeds it the body as it arrives, and responses are written straight
to the transport (sidecar.fastrequest).

Behaviour: keep-alive; pipelined requests answered in order (the next head is parsed only after
the current response ended); chunked and Content-Length bodies; `Expect: 100-continue`; HTTP/1.0
(no chunked coding, the connection closes after the response); head and body limits (431, 413);
malformed requests get a 400 in OpenAI's error shape and the connection closes after a short
linger; clients that stall mid-head or mid-body, or idle past the keep-alive time, are dropped by
one watchdog for all connections; a client that disconnects cancels its handler. Body writes to
slow clients are paced by pause_writing/resume_writing (`drain`); the SSE relay pauses the
upstream on the transport's buffer size itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from http import HTTPStatus

from sidecar.fastrequest import SENT, FastRequest
from sidecar.http1 import ChunkedBody, HttpError, LengthBody, parse_head
from sidecar.ratelog import RateLimitedLog
from sidecar.relay import error_body

log = logging.getLogger("goodput.sidecar")
_limited = RateLimitedLog(log)

KEEPALIVE_TIMEOUT = 75.0     # an idle kept-alive connection is closed after this
HEAD_TIMEOUT = 30.0          # from a head's first byte to its end
BODY_IDLE_TIMEOUT = 60.0     # no body byte for this long: the client is dropped (the handler cancelled)
LINGER = 1.0                 # after refusing a request, read and drop for this long before closing,
                             # so the client reads the 400 instead of a reset
_PIPELINE_LIMIT = 1 << 20    # bytes of later requests buffered while one is handled; then reading pauses
_DISCARD_LIMIT = 64 << 20    # body bytes read and dropped after an early answer (413, 429) before closing


class _Connection(asyncio.Protocol):
    def __init__(self, server: "FastServer"):
        self._server = server
        self._loop = server.loop
        self.transport: asyncio.Transport | None = None
        self._remote: str | None = None
        self._buf = b""
        self._body: LengthBody | ChunkedBody | None = None
        self._request: FastRequest | None = None    # the request being answered
        self._feeding: FastRequest | None = None    # the request whose body is being read
        self._discarded = 0
        self._task: asyncio.Task | None = None
        self._eof = False
        self._refused = False       # answered a malformed request: lingering, then closed
        self._read_paused = False
        self._write_paused: asyncio.Future | None = None
        self.closing = False        # the server stops: close after the response in progress
        self.closed = False
        self.last_activity = time.monotonic()
        self.head_started: float | None = None

    # ---- asyncio callbacks -------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self._remote = peer[0] if isinstance(peer, tuple) else None
        self._server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self.last_activity = time.monotonic()
        self._buf = self._buf + data if self._buf else data
        try:
            self._process()
        except Exception as exc:    # noqa: BLE001 - a bug here must cost one connection, not flood the log
            kind = type(exc).__name__
            _limited.log(logging.ERROR, kind, "unhandled %s while parsing a request", kind, exc_info=exc)
            self.transport.abort()

    def eof_received(self) -> bool:
        self._eof = True
        if self._feeding is not None and not self._feeding.body_done:
            self._body_failed(HttpError(400, "the connection ended inside the request body"))
        elif self._request is None and self._feeding is None:
            self.transport.close()
        return True     # keep the write side open: a half-closed client still gets its answer

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._server.connections.discard(self)
        if self._task is not None and not self._task.done():
            self._task.cancel()     # the client hung up: the handler ends and closes its upstream
        self._wake_writer()

    def pause_writing(self) -> None:
        if self._write_paused is None:
            self._write_paused = self._loop.create_future()

    def resume_writing(self) -> None:
        self._wake_writer()

    def _wake_writer(self) -> None:
        waiter, self._write_paused = self._write_paused, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def drain(self) -> None:
        if self.closed:
            raise ConnectionResetError("the client closed the connection")
        if self._write_paused is not None:
            await self._write_paused

    # ---- parsing -----------------------------------------------------------------------------
    def _process(self) -> None:
        while True:
            if self._body is not None:
                if not self._buf:
                    return
                pieces: list[bytes] = []
                try:
                    pos = self._body.feed(self._buf, 0, pieces)
                except HttpError as exc:
                    self._body_failed(exc)
                    return
                self._buf = self._buf[pos:] if pos < len(self._buf) else b""
                feeding = self._feeding
                if feeding is not None:
                    feeding.add_body(pieces)
                else:
                    self._discarded += sum(map(len, pieces))
                    if self._discarded > _DISCARD_LIMIT:
                        self._close()
                        return
                if not self._body.done:
                    return
                self._body = None
                if feeding is not None:
                    self._feeding = None
                    feeding.end_body()
            if self._request is not None:
                # A handler is running: later requests wait in the buffer (answers go in order).
                if len(self._buf) > _PIPELINE_LIMIT and not self._read_paused:
                    self._read_paused = True
                    self.transport.pause_reading()
                return
            while self._buf.startswith(b"\r\n"):     # RFC 9112 2.2: empty lines before a request
                self._buf = self._buf[2:]
            if not self._buf:
                self.head_started = None
                if self._eof:
                    self._close()
                return
            try:
                head, pos = parse_head(self._buf)
            except HttpError as exc:
                self._refuse(exc)
                return
            if head is None:
                if self.head_started is None:
                    self.head_started = time.monotonic()
                if self._eof:
                    self._close()
                return
            self.head_started = None
            self._buf = self._buf[pos:]
            self._discarded = 0
            request = FastRequest(self, head, self.transport, self._remote, self._server.max_body_bytes)
            if head.chunked:
                self._body = ChunkedBody()
            elif head.content_length:
                self._body = LengthBody(head.content_length)
            if self._body is not None:
                self._feeding = request
            self._request = request
            self._task = self._loop.create_task(self._run(request))

    def _body_failed(self, exc: HttpError) -> None:
        """The body's framing is broken: nothing after it can be read as a request."""
        self._buf = b""
        self._body = None
        self._refused = True
        feeding, self._feeding = self._feeding, None
        if feeding is not None:
            feeding.keep_alive = False
            feeding.end_body(exc)    # the handler answers 400 (counted as its own request)
        if self._request is None:
            self._close()

    def _refuse(self, exc: HttpError) -> None:
        """A head that cannot be a request: 400 (or 431) in OpenAI's shape, counted, then close."""
        self._refused = True
        self._buf = b""
        self._server.on_malformed()
        kind = f"http_{exc.status}"
        _limited.log(logging.INFO, kind, "refused a malformed request from %s with %d: %s",
                     self._remote, exc.status, exc.reason)
        body = error_body(f"malformed HTTP request: {exc.reason}", "invalid_request_error", exc.status)
        reason = HTTPStatus(exc.status).phrase
        self.transport.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                             b"Connection: close\r\n\r\n%s" % (exc.status, reason.encode(), len(body), body))
        self._linger()

    def _linger(self) -> None:
        # Closing with unread bytes would send a reset, which can destroy the answer in flight.
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._loop.call_later(LINGER, self._close)

    def _close(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.close()

    # ---- one request -------------------------------------------------------------------------
    async def _run(self, request: FastRequest) -> None:
        try:
            resp = await self._server.handler(request)
            if resp is not SENT and not request.started:
                if getattr(resp, "keep_alive", None) is False:
                    request.keep_alive = False
                request.send(resp.status, resp.reason, resp.headers, resp.body or b"")
        except asyncio.CancelledError:
            # The client went away (or drain ran out of time): nothing more can be said to it.
            self._task = None
            self.transport.abort()
            return
        except Exception as exc:    # noqa: BLE001 - a bug in a handler must not kill the connection silently
            kind = type(exc).__name__
            _limited.log(logging.ERROR, kind, "unhandled %s in the request handler", kind, exc_info=exc)
            if not request.started:
                request.keep_alive = False
                request.send(500, None, {"Content-Type": "application/json"},
                             error_body("internal error in the sidecar", "internal_error", 500))
            self._task = None
            self._request = None
            self.transport.close() if request.finished else self.transport.abort()
            return
        self._task = None
        self._finish(request)

    def _finish(self, request: FastRequest) -> None:
        self._request = None
        # A half-closed client (EOF) still gets answers to the requests it sent; _process closes
        # the connection once nothing is left to read.
        keep = request.keep_alive and request.finished and not self.closing and not self._refused
        if self._feeding is request:
            # Answered before its body was read (413, 429, 503): read the rest and drop it, unless
            # the client still waits for a 100 Continue that will not come.
            self._feeding = None
            if request.expect_continue and not request.continue_sent:
                keep = False
        if self._refused and request.body_error is not None:
            self._linger()
            return
        if not keep:
            self._close()
            return
        self.last_activity = time.monotonic()
        if self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()
        self._process()

    # ---- watchdog and shutdown -----------------------------------------------------------------
    def check_timeouts(self, now: float) -> None:
        if self.closed or self._refused:
            return
        if self._request is None and self._feeding is None and self._body is None:
            if self.head_started is not None:
                if now - self.head_started > HEAD_TIMEOUT:
                    self._refuse(HttpError(408, "the request head took too long"))
            elif now - self.last_activity > KEEPALIVE_TIMEOUT:
                self._close()
        elif self._body is not None and now - self.last_activity > BODY_IDLE_TIMEOUT:
            self.transport.abort()

    def shut(self) -> None:
        """Stop after the response in progress; an idle connection closes now."""
        self.closing = True
        if self._request is None:
            self._close()

    def abort(self) -> None:
        if not self.closed:
            self.transport.abort()


class FastServer:
    """Protocol factory for `loop.create_server`; `handler(request)` returns a response with
    status, reason, headers and body (aiohttp's web.Response works), or SENT."""

    def __init__(self, handler, on_malformed, max_body_bytes: int):
        self.handler = handler
        self.on_malformed = on_malformed
        self.max_body_bytes = max_body_bytes
        self.loop = asyncio.get_running_loop()
        self.connections: set[_Connection] = set()
        self._watchdog = self.loop.create_task(self._watch())

    def __call__(self) -> _Connection:
        return _Connection(self)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for conn in list(self.connections):
                conn.check_timeouts(now)

    async def shutdown(self, timeout: float) -> None:
        """Close idle connections now and the rest when their response ends; past `timeout`, cut them."""
        for conn in list(self.connections):
            conn.shut()
        deadline = time.monotonic() + timeout
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.abort()
        self._watchdog.cancel()
