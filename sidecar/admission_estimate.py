"""What the goodput guard (sidecar/admission.py) learns about its replica, online.

`ServiceEstimate`: the decode step time against batch and the prefill cost per prompt token, fitted
from what this sidecar measured on finished and first-token-seen requests. `RateWindow`: an
arrival (or prompt-token) rate over the last seconds. Both take timestamps from the caller, so a
test drives them with numbers and checks exact decisions.
"""

from __future__ import annotations

import math
from collections import deque

PREFILL_DECAY = 0.97        # per-sample forgetting of the prefill fit: about the last 30 requests
STEP_DECAY = 0.99           # ... of the step line: about the last 100. Step time against batch is a
#                             property of the hardware and barely moves, and under overload the batch
#                             sits near one value, where a short memory loses the slope.
RATE_WINDOW = 10.0          # seconds of arrivals behind a rate
RECENT_ARRIVALS = 8         # arrivals behind the quick rate (`RateWindow.rising_rate`)
RHO_CAP = 0.9               # prefill share of engine time the TPOT prediction saturates at


class _Line:
    """Exponentially weighted least squares for y = a + b x with b >= 0."""

    def __init__(self, decay: float):
        self.decay = decay
        self.w = self.x = self.y = self.xx = self.xy = 0.0

    def add(self, x: float, y: float) -> None:
        d = self.decay
        self.w = self.w * d + 1
        self.x, self.y = self.x * d + x, self.y * d + y
        self.xx, self.xy = self.xx * d + x * x, self.xy * d + x * y

    def fit(self) -> tuple[float, float]:
        if self.w == 0:
            return 0.0, 0.0
        den = self.w * self.xx - self.x * self.x
        slope = (self.w * self.xy - self.x * self.y) / den if den > 1e-9 * max(1.0, self.w * self.xx) else 0.0
        if slope < 0:
            # More batch never makes a step faster; a negative slope is noise.
            slope = 0.0
        return max(0.0, (self.y - slope * self.x) / self.w), slope


class ServiceEstimate:
    """The replica's decode step time (against batch) and prefill rate, learned online.

    Prefill model: an engine with chunked prefill runs steps of c0 + c_p x (prompt tokens) +
    c_d x (decoding requests). Prefilling X queued tokens at C tokens a step takes X / C steps,
    while the batch grows from B to B + (requests ahead) as each of them finishes its prompt, so
    the wait is X x (a + b x B_mean) with a = c0 / C + c_p and b = c_d / C: two coefficients,
    fitted by least squares through the origin, that need neither C nor the engine's kind. An
    engine that prefills one prompt at a time without decoding in between fits b = 0.

    Decode model: a step at decode batch B takes s(B) = s0 + s1 x B (the step line), and every
    prompt token prefilled meanwhile adds about `a` seconds to the decode (a mixed step is longer
    by c_p a token; a prefill-only step stalls decode). The line is fitted on what is left of a
    finished stream's decode once the prefills that ran during it are taken out, so that it is the
    bare step and the prefill interference can be predicted from the arrival rate on its own:
    over a decode of D seconds at prompt-token rate r, D = n s(B) + a r D, so
    TPOT = s(B) / (1 - rho) with rho = a r, the share of engine time spent prefilling."""

    def __init__(self):
        self._step = _Line(STEP_DECAY)   # bare step time against the mean decode batch of a finished stream
        self._s11 = self._s12 = self._s22 = self._s1y = self._s2y = 0.0   # normal equations, decayed
        self.samples = 0                 # first tokens learned from (the TTFT side)
        self.decode_samples = 0          # finished streams learned from (the TPOT side)

    def step_line(self) -> tuple[float, float]:
        """(s0, s1): the fitted bare step time s0 + s1 x batch."""
        return self._step.fit()

    def step_time(self, batch: float) -> float:
        a, b = self._step.fit()
        return a + b * batch

    def _prefill(self) -> tuple[float, float]:
        """(a, b): seconds per queued prompt token, and its growth per request in the batch."""
        det = self._s11 * self._s22 - self._s12 * self._s12
        if det > 1e-9 * max(1e-12, self._s11 * self._s22):
            a = (self._s22 * self._s1y - self._s12 * self._s2y) / det
            b = (self._s11 * self._s2y - self._s12 * self._s1y) / det
            if a >= 0 and b >= 0:
                return a, b
        # Collinear, or a negative coefficient (noise): the batch term adds nothing; fit a alone.
        return (self._s1y / self._s11 if self._s11 > 0 else 0.0), 0.0

    @property
    def prefill_rate(self) -> float | None:
        """Prompt tokens per second with nothing decoding, None before the first sample."""
        a, _ = self._prefill()
        return 1.0 / a if a > 0 else None

    @property
    def seconds_per_prompt_token(self) -> float:
        """What one prefilled prompt token costs the decode (0 before the first sample)."""
        return self._prefill()[0]

    def predict(self, tokens_ahead: float, batch_mean: float, batch: int) -> float:
        a, b = self._prefill()
        return tokens_ahead * (a + b * batch_mean) + self.step_time(batch)

    def prefill_share(self, prompt_tokens_per_second: float) -> float:
        """rho: the share of engine time prefills take at this prompt-token arrival rate (capped)."""
        return min(RHO_CAP, self.seconds_per_prompt_token * prompt_tokens_per_second)

    def predict_tpot(self, batch: int, rho: float) -> float:
        """Mean time per output token decoding at `batch` while prefills take `rho` of the engine."""
        return self.step_time(batch) / (1.0 - rho)

    def max_batch(self, tpot: float, rho: float) -> float:
        """The largest decode batch whose predicted TPOT stays at or under `tpot` (math.inf when
        the line has no slope and its intercept fits; 0 when not even one request fits)."""
        s0, s1 = self._step.fit()
        budget = tpot * (1.0 - rho) - s0
        if s1 <= 0:
            return math.inf if budget >= 0 else 0
        return max(0, math.floor(budget / s1 + 1e-9))

    def observe_ttft(self, ttft: float, tokens_ahead: float, batch_mean: float, batch: int) -> None:
        """A first token: `ttft` after arriving behind `tokens_ahead` prompt tokens (own included),
        with about `batch_mean` requests decoding on average while it waited."""
        if tokens_ahead > 0:
            wait = max(0.0, ttft - self.step_time(batch))
            x1, x2, d = tokens_ahead, tokens_ahead * batch_mean, PREFILL_DECAY
            self._s11, self._s12, self._s22 = self._s11 * d + x1 * x1, self._s12 * d + x1 * x2, self._s22 * d + x2 * x2
            self._s1y, self._s2y = self._s1y * d + x1 * wait, self._s2y * d + x2 * wait
            self.samples += 1

    def observe_decode(self, tpot: float, batch: float, prefill_tokens_per_gap: float = 0.0) -> None:
        """A finished stream's mean time per token while `batch` requests decoded on average and
        `prefill_tokens_per_gap` prompt tokens of other requests were prefilled per token gap."""
        bare = tpot - self.seconds_per_prompt_token * prefill_tokens_per_gap
        # An over-estimated prefill cost must not turn a step negative: keep a tenth of what was measured.
        self._step.add(batch, max(0.1 * tpot, bare))
        self.decode_samples += 1


class RateWindow:
    """Per-second rate of what was added over the last `window` seconds (fewer right after start)."""

    def __init__(self, window: float = RATE_WINDOW):
        self.window = window
        self._events: deque[tuple[float, float]] = deque()
        self._sum = 0.0
        self._first: float | None = None

    def add(self, now: float, value: float = 1.0) -> None:
        if self._first is None:
            self._first = now
        self._events.append((now, value))
        self._sum += value

    def rate(self, now: float) -> float:
        if self._first is None:
            return 0.0
        while self._events and self._events[0][0] < now - self.window:
            self._sum -= self._events.popleft()[1]
        # At least a second: two requests a millisecond apart are not a rate of 2,000 a second.
        span = max(1.0, min(self.window, now - self._first))
        return max(0.0, self._sum) / span

    def rising_rate(self, now: float, recent: int = RECENT_ARRIVALS) -> float:
        """The larger of `rate` and the rate of the last `recent` events, counted one each: the
        recent - 1 gaps between them over the time since the recent-th last. A step up shows
        within a few arrivals rather than a window later; a step down only as the window forgets."""
        slow = self.rate(now)
        events = self._events
        if len(events) < recent:
            return slow
        return max(slow, (recent - 1) / max(now - events[-recent][0], 1e-3))
