"""Goodput guard: answer 429 at once to a request that would miss its TTFT objective anyway.

Past the knee every admitted request queues, and all of them miss; refusing the ones that are
certain to miss keeps the queue short enough that the admitted ones still meet theirs, and lets
the client retry elsewhere or later (`Retry-After`). The prediction uses only what this sidecar
knows at the instant a request arrives:

- the requests it has in flight to its engine, each either waiting for its first token or
  decoding (read from each request's own `StreamTimer`, so it is exact at every instant, not the
  engine's scraped gauges, which lag by a scrape interval);
- an online `ServiceEstimate` of this replica: the decode step time against batch (from the TPOT
  of finished streams) and the prefill rate (from measured TTFT against the prompt tokens that
  were queued ahead at arrival).

Predicted TTFT = (prompt tokens still waiting ahead + own prompt tokens) x (seconds per prompt
token, which grows with the decode batch those requests join; see ServiceEstimate) + one step
at the current decode batch. Prompt length is characters / 4 at first, corrected by
the engine's `usage.prompt_tokens` as answers come back.

Thresholds: a class sheds above `ttft * (1 - admission_margin)`: under sustained overload the
queue settles where arrivals start being refused, so admitted requests land near the threshold
and the margin (default 20 %) is what keeps them under the objective despite the prediction's
error. Where the predictor has recently under-shot by more than that (the 90th percentile of
measured - predicted over the last 100 admitted requests; a loaded or noisy engine), that
learned headroom replaces the margin, up to 60 % of the objective. A lower-priority class also
sheds once the predicted wait exceeds PRIORITY_HEADROOM of the tightest TTFT objective among the
classes above it, because the engine serves in arrival order: a low request admitted into a long
queue delays every high request behind it. So low classes absorb the shedding first.

Nothing is shed until MIN_SAMPLES requests have been measured: a guess is not a reason to refuse.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from sidecar.config import SloConfig
from sidecar.slo import SloClass
from sidecar.timing import RequestTiming, StreamTimer

CHARS_PER_TOKEN = 4.0       # a first guess for English BPE text; learned from usage afterwards
MIN_SAMPLES = 16            # measured streamed requests before the guard may shed
PRIORITY_HEADROOM = 0.5     # lower classes keep the queue under this share of a higher class's TTFT
_DECAY = 0.97               # per-sample forgetting: about the last 30 requests carry the estimate
ERROR_WINDOW = 100          # admitted requests whose prediction error sets the learned headroom
ERROR_QUANTILE = 0.9        # ... at this quantile of (measured - predicted): 9 in 10 admitted in time
MAX_LEARNED_HEADROOM = 0.6  # share of a class's ttft the learned headroom may take at most


@dataclass(eq=False)
class Ticket:
    """One request's admission decision, and what the guard tracks while it is in flight."""

    admitted: bool
    predicted_ttft: float | None = None   # None: nothing predicted (guard off, or still learning)
    threshold: float | None = None        # predicted TTFT above this is shed
    retry_after: int = 0                  # seconds, for a shed request
    prompt_tokens: float = 0.0            # estimated from the body
    chars: int = 0
    tokens_ahead: float = 0.0             # prompt tokens to prefill before this one's first token, own included
    batch: int = 0                        # requests decoding when it arrived
    batch_mean: float = 0.0               # ... and on average while it waits (those ahead join the batch)
    arrived: float = 0.0
    timer: StreamTimer | None = None
    stream: bool = True
    learned: bool = False                 # its TTFT has been fed to the estimate

    @property
    def shed(self) -> bool:
        return not self.admitted


ADMIT_UNTRACKED = Ticket(admitted=True)


class _Line:
    """Exponentially weighted least squares for y = a + b x with b >= 0."""

    def __init__(self):
        self.w = self.x = self.y = self.xx = self.xy = 0.0

    def add(self, x: float, y: float) -> None:
        d = _DECAY
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
    engine that prefills one prompt at a time without decoding in between fits b = 0."""

    def __init__(self):
        self._step = _Line()             # TPOT of a finished stream against the batch it decoded in
        self._s11 = self._s12 = self._s22 = self._s1y = self._s2y = 0.0   # normal equations, decayed
        self.samples = 0

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

    def predict(self, tokens_ahead: float, batch_mean: float, batch: int) -> float:
        a, b = self._prefill()
        return tokens_ahead * (a + b * batch_mean) + self.step_time(batch)

    def observe_ttft(self, ttft: float, tokens_ahead: float, batch_mean: float, batch: int) -> None:
        """A first token: `ttft` after arriving behind `tokens_ahead` prompt tokens (own included),
        with about `batch_mean` requests decoding on average while it waited."""
        if tokens_ahead > 0:
            wait = max(0.0, ttft - self.step_time(batch))
            x1, x2, d = tokens_ahead, tokens_ahead * batch_mean, _DECAY
            self._s11, self._s12, self._s22 = self._s11 * d + x1 * x1, self._s12 * d + x1 * x2, self._s22 * d + x2 * x2
            self._s1y, self._s2y = self._s1y * d + x1 * wait, self._s2y * d + x2 * wait
            self.samples += 1

    def observe_decode(self, tpot: float, batch: float) -> None:
        """A finished stream's mean time per token while about `batch` requests decoded."""
        self._step.add(batch, tpot)


def prompt_chars(doc: dict) -> tuple[int, int]:
    """(characters of prompt text, tokens given as ids) in an OpenAI request body."""
    chars, ids = 0, 0

    def walk(value) -> None:
        nonlocal chars, ids
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            ids += 1
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            # Chat content parts: {"type": "text", "text": ...}; roles and names add a few tokens.
            walk(value.get("content", value.get("text")))

    walk(doc.get("messages", doc.get("prompt")))
    return chars, ids


class Admission:
    """Decides per arriving request; call `arrive` once, then `finish` once if it was admitted."""

    def __init__(self, slo: SloConfig, min_samples: int = MIN_SAMPLES):
        self.enabled = any(c.admission for c in slo.classes.values())
        self.min_samples = min_samples
        self.estimate = ServiceEstimate()
        self._chars_per_token = CHARS_PER_TOKEN
        self._in_flight: dict[int, Ticket] = {}
        self._classes = tuple(slo.classes.values())
        self._misses: deque[float] = deque(maxlen=ERROR_WINDOW)   # measured - predicted, admitted requests
        self.learned_headroom = 0.0
        self._thresholds = {c.name: _threshold(c, self._classes) for c in self._classes}

    def arrive(self, slo: SloClass, doc: dict, stream: bool, timer: StreamTimer, now: float) -> Ticket:
        if not self.enabled:
            return ADMIT_UNTRACKED
        chars, ids = prompt_chars(doc)
        own = max(1.0, chars / self._chars_per_token + ids)
        waiting, n_waiting, batch = self._queue(now)
        ahead = waiting + own
        batch_mean = batch + n_waiting / 2
        ready = self.estimate.samples >= self.min_samples
        predicted = self.estimate.predict(ahead, batch_mean, batch) if ready else None
        threshold = self._thresholds[slo.name]
        if slo.admission and predicted is not None and predicted > threshold:
            # The excess wait drains at about real time once arrivals stop: retry after it.
            return Ticket(False, predicted, threshold, retry_after=max(1, math.ceil(predicted - threshold)))
        ticket = Ticket(True, predicted, threshold, prompt_tokens=own, chars=chars, tokens_ahead=ahead,
                        batch=batch, batch_mean=batch_mean, arrived=now, timer=timer, stream=stream)
        self._in_flight[id(ticket)] = ticket
        return ticket

    def finish(self, ticket: Ticket, timing: RequestTiming) -> float | None:
        """Forget the request, learn from it; returns |predicted - measured| TTFT when both exist."""
        if self._in_flight.pop(id(ticket), None) is None:
            return None
        if not ticket.stream or timing.error is not None or timing.ttft is None:
            return None   # a non-streamed answer's first token is not observable; errors teach nothing
        if not ticket.learned:
            self._learn_ttft(ticket, timing.ttft)
        if timing.input_tokens and ticket.chars:
            # Usage corrects the characters-per-token guess for everything that follows.
            ratio = ticket.chars / timing.input_tokens
            self._chars_per_token = 0.9 * self._chars_per_token + 0.1 * min(16.0, max(0.5, ratio))
        if timing.tpot is not None:
            _, _, batch_now = self._queue(ticket.arrived + timing.e2e)
            self.estimate.observe_decode(timing.tpot, (ticket.batch + batch_now) / 2 + 1)
        if ticket.predicted_ttft is None:
            return None
        self._learn_error(timing.ttft - ticket.predicted_ttft)
        return abs(ticket.predicted_ttft - timing.ttft)

    def _learn_error(self, miss: float) -> None:
        """Keep the threshold below each objective by what the predictor recently under-shot."""
        self._misses.append(miss)
        if len(self._misses) >= self.min_samples:
            ordered = sorted(self._misses)
            self.learned_headroom = max(0.0, ordered[int(ERROR_QUANTILE * (len(ordered) - 1))])
            self._thresholds = {c.name: _threshold(c, self._classes, self.learned_headroom) for c in self._classes}

    def _learn_ttft(self, ticket: Ticket, ttft: float) -> None:
        ticket.learned = True
        self.estimate.observe_ttft(ttft, ticket.tokens_ahead, ticket.batch_mean, ticket.batch)

    def _queue(self, now: float) -> tuple[float, int, int]:
        """(prompt tokens of in-flight requests still waiting for their first token, how many of them,
        requests decoding).

        A streamed request's first token is learned from here, as soon as the next request arrives
        after it, rather than when it finishes: under overload the estimate must follow the engine
        within a TTFT, not a whole response later."""
        waiting, n_waiting, decoding = 0.0, 0, 0
        for t in self._in_flight.values():
            if t.stream:
                first = t.timer.first_token_at
                if first is not None and not t.learned:
                    self._learn_ttft(t, first - t.timer.start)
            else:
                # No first token is visible in a non-streamed answer: assume it came when predicted.
                first = t.arrived + (t.predicted_ttft or 0.0)
                first = first if first <= now else None
            if first is None:
                waiting += t.prompt_tokens
                n_waiting += 1
            else:
                decoding += 1
        return waiting, n_waiting, decoding


def _threshold(slo: SloClass, classes, learned_headroom: float = 0.0) -> float:
    """Predicted TTFT above which `slo` sheds: its objective less the larger of its margin and what
    the predictor recently under-shot (capped, so a wild predictor cannot shed everything); for a
    lower-priority class also half the tightest objective above it."""
    headroom = slo.admission_margin * slo.ttft
    if slo.admission_margin >= 0:
        # A negative margin asks to shed only predicted misses; then the learned headroom is not used.
        headroom = max(headroom, min(learned_headroom, MAX_LEARNED_HEADROOM * slo.ttft))
    own = slo.ttft - headroom
    above = [c.ttft for c in classes if c.priority > slo.priority]
    return min(own, PRIORITY_HEADROOM * min(above)) if above else own
