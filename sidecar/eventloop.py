"""The event loop the sidecar (and its benchmark processes) run on: uvloop when it is importable.

uvloop >= 0.23 writes to a socket at once from `transport.write` (earlier versions queued the
write to the end of the loop iteration, which adds latency to every relayed token) and its
loop, timers and transports are C, so each wake-up costs less than asyncio's selector loop.
Without it (not installed, or an unsupported platform) the standard loop is used; nothing else
changes. `GOODPUT_EVENT_LOOP=asyncio` forces the standard loop (for comparisons and debugging).
"""

from __future__ import annotations

import asyncio
import os


def _uvloop():
    if os.environ.get("GOODPUT_EVENT_LOOP", "auto").lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    try:
        major, minor = (int(x) for x in uvloop.__version__.split(".")[:2])
    except ValueError:
        return None
    # Older uvloop buffers writes until the end of the loop iteration: worse than asyncio here.
    return uvloop if (major, minor) >= (0, 23) else None


def loop_name() -> str:
    return "uvloop" if _uvloop() is not None else "asyncio"


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A fresh loop of the chosen kind, for `asyncio.Runner(loop_factory=new_event_loop)`."""
    uv = _uvloop()
    return uv.new_event_loop() if uv is not None else asyncio.new_event_loop()


def run(coro):
    """`asyncio.run(coro)` on the chosen loop."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coro)
