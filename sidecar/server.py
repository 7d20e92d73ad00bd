"""Serving the sidecar: its own HTTP/1.1 server (sidecar.fastserver) or aiohttp's low-level one
(`--http-server`), signals and drain.

On SIGTERM (or SIGINT) readiness fails at once and new requests get 503 with Retry-After;
in-flight requests have `--drain-timeout` seconds to finish, then the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal

from aiohttp import web
from aiohttp.web_protocol import RequestHandler, _ErrInfo

from sidecar.app import Sidecar
from sidecar.fastserver import FastServer
from sidecar.ratelog import RateLimitedLog
from sidecar.relay import error_response
from sidecar.upstream import FAST_PATH

log = logging.getLogger("goodput.sidecar")
_limited = RateLimitedLog(log)
# Only a reason made of plain words is repeated to the client and the log: aiohttp's messages go
# on to quote the offending bytes, which may carry a prompt or a bearer token.
_PLAIN_REASON = re.compile(r"[A-Za-z0-9 '\-]{1,80}")


class _Connection(RequestHandler):
    """aiohttp's connection handler with its answer to malformed requests replaced.

    aiohttp answers a request it cannot parse (conflicting framing, a bad chunk size, an
    oversize header) with a text/plain 400 and logs a full traceback at ERROR each time, so any
    client could flood the log. Here the answer is a 400 in OpenAI's error shape, counted in
    goodput_malformed_requests_total, with at most one short log line per kind every 10 s.
    """

    def data_received(self, data: bytes) -> None:
        queued = len(self._messages)
        super().data_received(data)
        request = self._current_request
        if (request is not None and len(self._messages) > queued and isinstance(self._messages[-1][0], _ErrInfo)
                and not request.content.is_eof()):
            # The body of the request being handled turned out malformed (a bad chunk size after
            # the headers arrived). aiohttp queues the error behind the running handler, which
            # would wait for the rest of the body forever; hand it to the handler's body instead
            # (read_body turns it into a 400, and the connection closes). No lingering read of
            # the rest: it would raise the same error again, outside any handler.
            request.content.set_exception(self._messages[-1][0].exc)
            self._lingering_time = 0.0

    def handle_error(self, request, status=500, exc=None, message=None):
        if request.writer.output_size > 0:
            raise ConnectionError("the response has started; cannot send an error response")
        kind = type(exc).__name__ if exc is not None else f"http_{status}"
        if status >= 500:
            # Our own handler raised: a bug, so keep the traceback, but at most one per kind every 10 s.
            _limited.log(logging.ERROR, kind, "unhandled %s in the request handler", kind, exc_info=exc)
            resp = error_response(status, "internal error in the sidecar", "internal_error")
        else:
            first = str(getattr(exc, "message", "") or message or "").split("\n", 1)[0].split(":", 1)[0].strip()
            reason = first if _PLAIN_REASON.fullmatch(first) else "malformed request"
            self._manager.on_malformed()
            _limited.log(logging.INFO, kind, "refused a malformed request from %s with %d: %s (%s)",
                         request.remote, status, reason, kind)
            resp = error_response(status, f"malformed HTTP request: {reason}", "invalid_request_error")
        resp.force_close()
        return resp


class _Server(web.Server):
    """web.Server whose connections use `_Connection` (it builds them in __call__)."""

    def __init__(self, handler, on_malformed, **kwargs):
        super().__init__(handler, **kwargs)
        self.on_malformed = on_malformed

    def __call__(self) -> RequestHandler:
        return _Connection(self, loop=self._loop, **self._kwargs)


class RunningSidecar:
    """A started sidecar listening on a socket; `stop()` drains and closes it."""

    def __init__(self, app: Sidecar):
        self.app = app
        self._server: web.Server | FastServer | None = None
        self._listener: asyncio.base_events.Server | None = None
        self.port: int | None = None

    async def start(self) -> "RunningSidecar":
        await self.app.start()
        # handler_cancellation: a client that disconnects cancels its handler at once, so the
        # upstream stream is closed without waiting for the next token to fail a write.
        config = self.app.config
        if config.http_server == "fast":
            self._server = FastServer(self.app.handle, self.app.metrics.malformed.inc, config.max_body_bytes)
        else:
            self._server = _Server(self.app.handle, self.app.metrics.malformed.inc, handler_cancellation=True,
                                   access_log=None, keepalive_timeout=75)
        loop = asyncio.get_running_loop()
        try:
            self._listener = await loop.create_server(self._server, config.host, config.port, backlog=1024,
                                                      reuse_address=True)
        except OSError:
            if isinstance(self._server, FastServer):
                await self._server.shutdown(0)
            await self.app.close()
            raise
        self.port = self._listener.sockets[0].getsockname()[1]
        return self

    async def stop(self, drain_timeout: float) -> bool:
        self.app.begin_drain()
        drained = await self.app.wait_drained(drain_timeout)
        if self._listener is not None:
            self._listener.close()
        if self._server is not None:
            await self._server.shutdown(1.0)
        await self.app.close()
        return drained


async def serve(app: Sidecar, announce=print) -> int:
    running = await RunningSidecar(app).start()
    config = app.config
    announce(f"goodput sidecar listening on http://{config.host}:{running.port} -> {config.upstream} "
             f"(SLO classes: {', '.join(config.slo.classes)}; default {config.slo.default_class}; streamed tokens: "
             f"{'C fast path' if FAST_PATH else 'Python path'})")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    announce(f"goodput sidecar draining: {app.active} request(s) in flight, up to {config.drain_timeout:g} s")
    drained = await running.stop(config.drain_timeout)
    announce("goodput sidecar stopped" + ("" if drained else " (drain timeout: remaining requests were cut)"))
    return 0
