"""Log lines a client can trigger, at most one per interval per kind.

Any client can send malformed requests as fast as it likes; a log line (let alone a traceback) per
request would let it flood the log and bury everything else. The first occurrence of a kind is
logged at once; later ones within `interval` seconds are counted and the count is reported on the
next line of that kind.
"""

from __future__ import annotations

import logging
import time


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, interval: float = 10.0, clock=time.monotonic):
        self._log, self._interval, self._clock = logger, interval, clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def log(self, level: int, kind: str, message: str, *args, exc_info=None) -> bool:
        """Log `message % args` unless `kind` was logged less than `interval` ago; True if logged."""
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self._interval:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return False
        self._last[kind] = now
        skipped = self._suppressed.pop(kind, 0)
        if skipped:
            message += f" ({skipped} more like it in the last {self._interval:g} s not logged)"
        self._log.log(level, message, *args, exc_info=exc_info)
        return True
