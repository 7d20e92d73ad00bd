"""The wait scale: how much less prompts wait than in one replica's own M/G/1 queue.

Behind a router that sends each request to the least loaded replica, the replicas' prompt
queues pool and a prompt rarely waits behind a long one; at random they do not, and the scale
stays about 1. Each calm step (no burst in the burst floor's memory) gives one ratio, the
engines' mean queue time over the model's mean wait at that step's rate per replica
(OnlineServiceModel._add_wait). The scale is the mean of those ratios, weighted by requests and
forgotten at the learner's half-life, at the upper end of its 90 % band (the standard error over
the steps' effective count), at most 1, and 1 until EVIDENCE requests have been timed. Never
above 1: bursts are the burst floor's to price.

A ratio of summed waits instead is ruled by the few loaded steps (a warm-up's), where a
heavy-tailed queue's realised mean falls short of its expectation: it read 0.53 with the
replicas routed at random (Mooncake).
"""

from __future__ import annotations

import math

EVIDENCE = 200.0        # requests whose queue time the scale needs before it moves from 1
MIN_SCALE = 0.02
_Z90 = 1.645


class WaitScale:
    def __init__(self):
        self._w = self._s1 = self._s2 = 0.0   # forgotten sums of w, w·ratio, w·ratio²
        self._w2 = 0.0                         # of w² (forgotten twice as fast)

    def decay(self, f: float) -> None:
        self._w *= f
        self._s1 *= f
        self._s2 *= f
        self._w2 *= f * f

    def add(self, observed: float, predicted: float, w: float) -> None:
        """One step: its observed and predicted mean wait (seconds), weighted by `w` requests."""
        if not (predicted > 0 and w > 0):
            return
        r = observed / predicted
        self._w += w
        self._s1 += w * r
        self._s2 += w * r * r
        self._w2 += w * w

    def value(self) -> float:
        if self._w < EVIDENCE:
            return 1.0
        mean = self._s1 / self._w
        sd = math.sqrt(max(0.0, self._s2 / self._w - mean * mean))
        n_eff = self._w * self._w / self._w2 if self._w2 > 0 else 1.0
        return min(1.0, max(MIN_SCALE, mean + _Z90 * sd / math.sqrt(n_eff)))


__all__ = ["EVIDENCE", "MIN_SCALE", "WaitScale"]
