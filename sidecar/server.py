"""Serving the sidecar: aiohttp's low-level HTTP server, signals and drain.

On SIGTERM (or SIGINT) readiness fails at once and new requests get 503 with Retry-After;
in-flight requests have `--drain-timeout` seconds to finish, then the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from sidecar.app import Sidecar

log = logging.getLogger("goodput.sidecar")


class RunningSidecar:
    """A started sidecar listening on a socket; `stop()` drains and closes it."""

    def __init__(self, app: Sidecar):
        self.app = app
        self._server: web.Server | None = None
        self._listener: asyncio.base_events.Server | None = None
        self.port: int | None = None

    async def start(self) -> "RunningSidecar":
        await self.app.start()
        # handler_cancellation: a client that disconnects cancels its handler at once, so the
        # upstream stream is closed without waiting for the next token to fail a write.
        self._server = web.Server(self.app.handle, handler_cancellation=True, access_log=None,
                                  keepalive_timeout=75)
        loop = asyncio.get_running_loop()
        config = self.app.config
        try:
            self._listener = await loop.create_server(self._server, config.host, config.port, backlog=1024,
                                                      reuse_address=True)
        except OSError:
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
             f"(SLO classes: {', '.join(config.slo.classes)}; default {config.slo.default_class})")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    announce(f"goodput sidecar draining: {app.active} request(s) in flight, up to {config.drain_timeout:g} s")
    drained = await running.stop(config.drain_timeout)
    announce("goodput sidecar stopped" + ("" if drained else " (drain timeout: remaining requests were cut)"))
    return 0
