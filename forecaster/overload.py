"""Evidence that the fleet is short now: what keeps a published count from falling.

A decision rests on the service model and the demand forecast, and either can be wrong for a
while. In the demo, one replica offered 5 req/s served 1 % of its requests within the SLO, while
the model, refitting on the burst's first large batches, read 2.4-4.6 req/s a replica and the
forecast of the rate at the horizon, made from 2-s steps of about 10 arrivals, swung between 6.5
and 1.5 req/s: the published count went 4 -> 2 -> 3 -> 2 in the middle of the burst. The fleet shows it is short in two ways no model stands
between, and while either holds the policy does not lower the count it published
(forecaster/policy.py):

- **The backlog grows**: the requests in flight at the sidecars rose by more than chance
  explains, over the last step or over the horizon (a replica's cold start: a backlog that grew
  over the time a replica ordered then took to arrive was not met; at 2-s steps one step's rise
  of a 2x burst is within the noise about half the time, and a backlog still draining is larger
  than before the burst). Requests that arrive and end as a balanced flow change the count
  in flight by arrivals − endings, about zero, with a variance of about their sum (the
  difference of two Poisson counts); a rise past `z` of those standard deviations says arrivals
  outrun the fleet. It shows at once, while the requests ending are still the good ones that
  began before.
- **The SLO is missed**: the requests that ended in the last step with requests ending missed
  more often than the objective allows, beyond what chance explains. The misses of a step are a
  binomial count, and the step breaches when so many would be rarer than 1 − `confidence` at the
  share the objective allows, 1 − ratio × (the share an idle replica serves in time: prompts too
  long for the TTFT objective miss on any fleet and are no sign of a short one). It shows late (a
  request is judged when it ends) and lasts while a backlog drains.

Both tests are one-sided at the forecast's interval level (0.95), and a trip holds the count one
step more. On a balanced flow (Poisson arrivals, requests ending at random) the backlog test,
its windows sharing their level, trips on 5.3-5.9 % of steps (four simulated flows of 20,000
steps; 8.3-11.0 % with each window at the full level: tests/forecaster/test_policy.py). The
SLO test's rate on a fleet meeting its objective is the binomial tail's, at most 5 %.
"""

from __future__ import annotations

import math

import numpy as np

from scipy.special import bdtrc, ndtri


def breaching(good: float, ended: float, ratio: float, feasible: float, confidence: float) -> bool:
    """Whether `ended - good` misses of `ended` requests exceed what `ratio` of the `feasible`
    share allows, at one-sided `confidence`."""
    n = int(round(ended))
    bad = n - int(round(min(good, ended)))
    if n <= 0 or bad <= 0:
        return False
    allowed = 1.0 - ratio * min(1.0, max(0.0, feasible))
    if allowed <= 0.0:
        return True
    # P(X >= bad) for X ~ Binomial(n, allowed); bdtrc(k, n, p) is P(X > k).
    return float(bdtrc(bad - 1, n, allowed)) < 1.0 - confidence


def backlog_growing(in_flight_change: float, arrived: float, ended: float, confidence: float) -> bool:
    """Whether the requests in flight rose by more than a balanced flow's noise: a rise of
    `in_flight_change` while `arrived` came and `ended` left, at one-sided `confidence`."""
    if not (math.isfinite(in_flight_change) and in_flight_change > 0):
        return False
    spread = math.sqrt(max(0.0, arrived) + max(0.0, ended))
    return in_flight_change > float(ndtri(confidence)) * max(spread, 1.0)


class ShortNow:
    """The count last published, and the last step with requests ending. Per step `observe`; per
    decision `reasons` (why the count last published must hold, empty if nothing says so), read
    from the policy's own fixed-step series of requests in flight and arrivals/s, then
    `published` with the count decided. `window`: the most steps the backlog's rise is measured
    over (the policy's horizon, a replica's cold start)."""

    def __init__(self, confidence: float, window: int):
        self.confidence = confidence
        self.window = max(1, window)
        self.last: int | None = None      # the count last published
        self._ended: tuple[float, float] | None = None   # (good, ended) of the last step with any ending

    def observe(self, good: float | None, ended: float | None, in_flight: float) -> None:
        if good is not None and ended:
            self._ended = (good, ended)
        elif not in_flight > 0:
            self._ended = None     # nothing ended and nothing left: no breach (else the last step's holds)

    def reasons(self, in_flight: np.ndarray, arrivals: np.ndarray, step_s: float, ratio: float,
                feasible: float) -> tuple[str, ...]:
        grew = self._backlog_grew(in_flight, arrivals, step_s)
        missed = self._ended is not None and breaching(*self._ended, ratio, feasible, self.confidence)
        return ("backlog",) * grew + ("breach",) * missed

    def _backlog_grew(self, in_flight: np.ndarray, arrivals: np.ndarray, step_s: float) -> bool:
        """The rise in flight over the last step at `confidence`; over the last 2, 4, 8, ... steps
        up to the window, each at the level that keeps the chance of any of them tripping on a
        balanced flow at 1 − confidence."""
        n = min(len(in_flight) - 1, len(arrivals), self.window)
        if n < 1:
            return False
        spans = [1]
        while spans[-1] * 2 < n:
            spans.append(spans[-1] * 2)
        if n > 1:
            spans.append(n)
        wide = 1.0 - (1.0 - self.confidence) / max(1, len(spans) - 1)
        for span in spans:
            change = float(in_flight[-1] - in_flight[-1 - span])
            came = float(np.sum(arrivals[-span:])) * step_s
            if backlog_growing(change, came, came - change, self.confidence if span == 1 else wide):
                return True
        return False

    def published(self, count: int) -> None:
        self.last = int(count)


__all__ = ["ShortNow", "backlog_growing", "breaching"]
