"""One request on the sidecar's own HTTP/1.1 server, as the handlers see it.

It answers to the parts of aiohttp's `web.BaseRequest` that `sidecar.app` reads (method, path,
raw_path, headers, version, content_length, transport, remote), so one handler serves both
servers; `sidecar.relay` writes responses through the methods here when the request is one of
these. Responses go straight to the socket: the status line and headers, then the body framed
by Content-Length, chunked coding (HTTP/1.1) or the connection's end (HTTP/1.0).
"""

from __future__ import annotations

import asyncio
import time
from email.utils import formatdate
from http import HTTPStatus

from sidecar.http1 import HttpError, RequestHead, origin_form

# Returned by a handler that wrote its whole response itself.
SENT = object()
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_FRAMING = frozenset(("content-length", "transfer-encoding", "connection", "keep-alive"))
_date = [0, ""]   # (second, its IMF-fixdate): formatted once a second, not once a response


def http_date() -> str:
    """The Date header's value now (RFC 9110 6.6.1: an origin server with a clock sends one)."""
    now = int(time.time())
    if _date[0] != now:
        _date[0], _date[1] = now, formatdate(now, usegmt=True)
    return _date[1]


class FastRequest:
    __slots__ = ("method", "path", "raw_path", "version", "headers", "content_length", "transport", "remote",
                 "keep_alive", "expect_continue", "continue_sent", "started", "chunked", "bodyless", "finished",
                 "body_done", "body_size", "too_large", "body_error", "_parts", "_waiter", "_conn", "_limit")

    def __init__(self, conn, head: RequestHead, transport: asyncio.Transport, remote: str | None, limit: int):
        self.method, self.path, self.version, self.headers = head.method, head.path, head.version, head.headers
        self.raw_path = origin_form(head.raw_path)
        self.content_length = head.content_length
        self.transport, self.remote = transport, remote
        self.keep_alive = head.keep_alive
        self.expect_continue = head.expect_continue
        self.continue_sent = self.started = self.chunked = self.bodyless = self.finished = False
        self.body_done = not head.chunked and not head.content_length
        self.body_size = 0
        self.too_large = head.content_length is not None and head.content_length > limit
        self.body_error: HttpError | None = None
        self._parts: list[bytes] = []
        self._waiter: asyncio.Future | None = None
        self._conn = conn
        self._limit = limit

    # ---- the body, fed by the connection ---------------------------------------------------
    def add_body(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            self.body_size += len(piece)
        if self.body_size > self._limit:
            self.too_large = True
            self._parts.clear()     # refused anyway: keep nothing (the rest is read and dropped)
            waiter, self._waiter = self._waiter, None
            if waiter is not None and not waiter.done():
                waiter.set_result(None)     # answer 413 now, not after the whole body arrived
        elif not self.too_large:
            self._parts.extend(pieces)

    def end_body(self, error: HttpError | None = None) -> None:
        self.body_done = True
        self.body_error = error
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read_body(self, limit: int) -> bytes:
        """The whole body; HttpError 413 past `limit`, 400 when its framing is broken."""
        if self.too_large or (self.content_length or 0) > limit:
            raise HttpError(413, "request body too large")
        if not self.body_done:
            if self.expect_continue and not self.body_size:
                # The client waits (curl: 1 s) for this before sending its body.
                self.continue_sent = True
                self.transport.write(_CONTINUE)
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        if self.body_error is not None:
            raise self.body_error
        if self.too_large or self.body_size > limit:
            raise HttpError(413, "request body too large")
        return self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)

    # ---- the response ------------------------------------------------------------------------
    def start_response(self, status: int, reason: str | None, headers, length: int | None = None) -> bytes:
        """The status line and headers (for the caller to send, with the first body bytes if it
        likes); decides the framing of the body that follows."""
        self.started = True
        self.bodyless = self.method == "HEAD" or status in (204, 304) or status < 200
        if self._conn.closing or (self.expect_continue and not self.continue_sent and not self.body_done):
            # Stopping, or refusing a body the client holds back for a 100 Continue that will not come.
            self.keep_alive = False
        if not reason:
            try:
                reason = HTTPStatus(status).phrase
            except ValueError:
                reason = "Unknown"
        lines = [f"HTTP/1.{self.version[1]} {status} {reason}"]     # an HTTP/1.0 client gets 1.0, as aiohttp does
        dated = False
        for k, v in headers.items():
            low = k.lower()
            if low not in _FRAMING:
                lines.append(f"{k}: {v}")
                dated = dated or low == "date"
        if not dated:
            lines.append(f"Date: {http_date()}")
        if length is not None:
            if status not in (204, 304) and status >= 200:
                lines.append(f"Content-Length: {length}")
        elif not self.bodyless:
            if self.version >= (1, 1):
                self.chunked = True
                lines.append("Transfer-Encoding: chunked")
            else:
                self.keep_alive = False      # an HTTP/1.0 body ends with the connection
        if not self.keep_alive:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")

    def write(self, data: bytes) -> None:
        """One piece of a streamed body (framed here)."""
        if data and not self.bodyless and not self.transport.is_closing():
            self.transport.write(b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data)

    def end_response(self, terminated: bool = False) -> None:
        """End a streamed body; `terminated`: the caller already sent the terminal chunk with its
        last bytes."""
        if self.chunked and not terminated and not self.transport.is_closing():
            self.transport.write(b"0\r\n\r\n")
        self.finished = True

    def send(self, status: int, reason: str | None, headers, body: bytes) -> None:
        """A whole response at once."""
        head = self.start_response(status, reason, headers, len(body))
        if not self.transport.is_closing():
            self.transport.write(head if self.bodyless or not body else head + body)
        self.finished = True

    def abort(self) -> None:
        """Cut the connection (a body that cannot be completed)."""
        self.keep_alive = False
        self.transport.abort()

    async def drain(self) -> None:
        """Wait while the client reads slower than the upstream writes."""
        await self._conn.drain()
