"""Goodput guard: answer 429 at once to a request that would miss its TTFT or TPOT objective anyway.

Past the knee every admitted request queues, or joins a decode batch too large for its step to
meet the TPOT objective, and all of them miss; refusing the ones that are certain to miss keeps
the queue short and the batch small enough that the admitted ones still meet theirs, and lets the
client retry elsewhere or later (`Retry-After`). The prediction uses only what this sidecar knows
at the instant a request arrives:

- the requests it has in flight to its engine, each either waiting for its first token or
  decoding (read from each request's own `StreamTimer`, so it is exact at every instant, not the
  engine's scraped gauges, which lag by a scrape interval);
- an online `ServiceEstimate` of this replica (sidecar/admission_estimate.py): the bare decode
  step time against batch, and the prefill cost per prompt token (from measured TTFT against the
  prompt tokens that were queued ahead at arrival);
- the prompt tokens admitted over the last RATE_WINDOW seconds, and each class's arrival rate.

TTFT. Predicted TTFT = (prompt tokens still waiting ahead + own prompt tokens) x (seconds per
prompt token, which grows with the decode batch those requests join; see ServiceEstimate) + one
step at the current decode batch. Prompt length is characters / 4 at first, corrected by the
engine's `usage.prompt_tokens` as answers come back. A class sheds above `ttft * (1 -
admission_margin)`: under sustained overload the queue settles where arrivals start being refused,
so admitted requests land near the threshold and the margin (default 20 %) is what keeps them
under the objective despite the prediction's error. Where the predictor has recently under-shot
by more than that (the 90th percentile of measured - predicted over the last 100 admitted
requests; a loaded or noisy engine), that learned headroom replaces the margin, up to 60 % of the
objective. A lower-priority class also sheds once the predicted wait exceeds PRIORITY_HEADROOM of
the tightest TTFT threshold among the classes above it, because the engine serves in arrival
order: a low request admitted into a long queue delays every high request behind it.

TPOT. The request will decode in the batch it joins: every request in flight now (those waiting
for a first token are ahead of it and decode beside it) and itself. Predicted TPOT = step(batch) /
(1 - rho), rho being the share of engine time the prefills of requests arriving meanwhile take
(admitted prompt tokens/s x seconds per prompt token). Two refusals, both reason `tpot`:
- its own: predicted TPOT above `tpot * (1 - admission_margin)`;
- everyone else's: admitting one more slows every request decoding. The batch may not pass the
  largest one whose step meets the tightest TPOT threshold among its own class and the guarded
  classes in flight, and a class may use of that batch only what the classes above it leave: the
  larger of what they have in flight and what their arrival rate will bring in (Little's law:
  rate x mean time in flight, up to the Poisson count's quantile at the tightest objective above:
  z standard deviations more, z = 2.33 for 99 %; the rate rises within a few of their arrivals,
  `RateWindow.rising_rate`). So low classes absorb the shedding first and a high-priority
  arrival finds room.

Held, not refused, when the batch is full but TTFT has room (class setting `admission_hold`,
default true). A guard that only refuses is a loss system: a class that alone offers the knee finds
the batch at its cap for Erlang's B(cap, load) of its arrivals, and each of those is refused
although a stream ends every (mean time in flight / requests in flight) seconds. So a request the
batch has no room for waits in the sidecar (no socket to the engine) while its predicted TTFT,
the wait included, stays under its threshold: held if the slots it needs (its excess, after the
requests of its class or above already held) are expected within that budget, else refused at once.
At every finish the held requests are judged again, highest priority and longest held first; one
that still does not fit keeps those of its priority and below waiting behind it. At its deadline a
request still without a slot is refused (reason tpot). The guard learns from what the engine did:
the time held is taken out of the TTFT and the time in flight it learns from.

Nothing is shed on TTFT until MIN_SAMPLES first tokens have been measured, nor on TPOT until
MIN_SAMPLES streams have finished: a guess is not a reason to refuse.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import deque
from statistics import NormalDist
from dataclasses import dataclass

from sidecar.admission_estimate import RateWindow, ServiceEstimate
from sidecar.config import SloConfig
from sidecar.slo import SloClass
from sidecar.timing import RequestTiming, StreamTimer

__all__ = ["Admission", "Checked", "ServiceEstimate", "Ticket", "prompt_chars"]

# `goodput sidecar run --log-level debug`: one line per refusal and per finished admitted stream
# (what was predicted at its arrival beside what it met), to see why a guard sheds what it sheds.
log = logging.getLogger("goodput.sidecar.admission")

CHARS_PER_TOKEN = 4.0       # a first guess for English BPE text; learned from usage afterwards
MIN_SAMPLES = 16            # measured streamed requests before the guard may shed
PRIORITY_HEADROOM = 0.5     # lower classes keep the queue under this share of a higher class's TTFT
ERROR_WINDOW = 100          # admitted requests whose prediction error sets the learned headroom
ERROR_QUANTILE = 0.9        # ... at this quantile of (measured - predicted): 9 in 10 admitted in time
MAX_LEARNED_HEADROOM = 0.6  # share of a class's ttft the learned headroom may take at most
_IN_FLIGHT_DECAY = 0.9      # EWMA of the time admitted requests spend in flight
DONE_KEPT = 2048            # finished decode spans kept for the batch of the ones still decoding


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
    predicted_tpot: float | None = None   # None: nothing predicted (guard off, or still learning)
    tpot_threshold: float | None = None   # its class's predicted TPOT above this is shed
    join_batch: int = 0                   # the decode batch it would join: in flight now + itself
    batch_limit: float | None = None      # for a `tpot` shed: the batch its class may fill
    reason: str | None = None             # why it was shed: "ttft" | "tpot"
    detail: str = ""                      # the 429's message
    slo: SloClass | None = None
    held: bool = False                    # waiting in the sidecar for a decode slot (`Admission.review`)
    deadline: float = 0.0                 # ... until then at the latest: its TTFT has no room for more
    was_held: bool = False                # it waited for a slot (admitted, shed or gone since)
    held_seconds: float = 0.0             # ... for how long
    waiter: object = None                 # the proxy's wake-up for a held request (an asyncio future)

    @property
    def shed(self) -> bool:
        return not self.admitted


ADMIT_UNTRACKED = Ticket(admitted=True)
SHED_REASONS = ("ttft", "tpot")


@dataclass(frozen=True)
class Checked:
    """|predicted - measured| of a finished admitted request, where both exist."""

    ttft_error: float | None = None
    tpot_error: float | None = None


NOT_CHECKED = Checked()


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
        self._held: list[Ticket] = []     # waiting for a decode slot: highest priority, then longest held, first
        self._classes = tuple(slo.classes.values())
        self._misses: deque[float] = deque(maxlen=ERROR_WINDOW)   # measured - predicted, admitted requests
        self.learned_headroom = 0.0
        self._thresholds = _thresholds(self._classes)
        self._tpot_thresholds = {c.name: c.tpot * (1 - c.admission_margin) for c in self._classes}
        self._above = {c.name: tuple(a.name for a in self._classes if a.priority > c.priority) for c in self._classes}
        by_name = {c.name: c for c in self._classes}
        self._reserve_z = {above: NormalDist().inv_cdf(min(0.999, max(0.5, max(by_name[n].objective for n in above))))
                           for above in self._above.values() if above}
        self._arrivals = {c.name: RateWindow() for c in self._classes}   # every arrival: demand, shed or not
        self._prompt_rate = RateWindow()                                  # admitted prompt tokens: prefill load
        # (first token, end, prompt tokens) of finished requests a decode in flight may overlap. Capped:
        # one stream stuck for minutes must not make every finish scan everything since it began.
        self._done: deque[tuple[float, float, float]] = deque(maxlen=DONE_KEPT)
        self.in_flight_seconds: float | None = None                      # mean time an admitted request is in flight

    def arrive(self, slo: SloClass, doc: dict, stream: bool, timer: StreamTimer, now: float) -> Ticket:
        """Judge an arriving request: admitted, shed, or `held` for a decode slot (then `review`
        decides it, at the latest by its `deadline`)."""
        if not self.enabled:
            return ADMIT_UNTRACKED
        self._arrivals[slo.name].add(now)
        chars, ids = prompt_chars(doc)
        own = max(1.0, chars / self._chars_per_token + ids)
        ticket = Ticket(True, prompt_tokens=own, chars=chars, arrived=now, timer=timer, stream=stream,
                        tpot_threshold=self._tpot_thresholds[slo.name], slo=slo)
        return self._judge(ticket, now)

    def _judge(self, ticket: Ticket, now: float) -> Ticket:
        """Predict TTFT and TPOT for `ticket` sent now, and admit, shed or hold it. A held ticket
        has waited `now - arrived` already: that counts against its TTFT."""
        slo, waited = ticket.slo, now - ticket.arrived
        if ticket.was_held:
            ticket.held_seconds = waited
        waiting, n_waiting, batch = self._queue(now)
        ahead = waiting + ticket.prompt_tokens
        batch_mean = batch + n_waiting / 2
        ready = self.estimate.samples >= self.min_samples
        predicted = self.estimate.predict(ahead, batch_mean, batch) if ready else None
        join = n_waiting + batch + 1
        rho, predicted_tpot = 0.0, None
        if self.estimate.decode_samples >= self.min_samples:
            rho = self.estimate.prefill_share(self._prompt_rate.rate(now))
            predicted_tpot = self.estimate.predict_tpot(join, rho)
        threshold = self._thresholds[slo.name]
        ticket.predicted_ttft = None if predicted is None else waited + predicted
        ticket.threshold, ticket.tokens_ahead, ticket.batch, ticket.batch_mean = threshold, ahead, batch, batch_mean
        ticket.predicted_tpot, ticket.join_batch = predicted_tpot, join
        judge_tpot = slo.admission and predicted_tpot is not None
        if ticket.held and judge_tpot and (blocked := self._tpot_block(ticket, rho, now)) is not None:
            if now < ticket.deadline:
                return ticket   # still held: a later `review` decides
            excess, why = blocked
            return self._refuse(ticket, "tpot", excess * self._seconds_per_finish(join - 1),
                                f"{why}; held {waited:.2f} s for a decode slot, none came in time")
        if slo.admission and ticket.predicted_ttft is not None and ticket.predicted_ttft > threshold:
            # The excess wait drains at about real time once arrivals stop: retry after it. A held
            # request ran out of time waiting for the batch: its reason is the batch (tpot).
            return self._refuse(ticket, "tpot" if ticket.held else "ttft", ticket.predicted_ttft - threshold,
                                f"this request's predicted time to first token ({ticket.predicted_ttft:.2f} s"
                                + (f", {waited:.2f} s of it held for a decode slot" if ticket.held else "")
                                + f") exceeds what SLO class {slo.name!r} allows ({threshold:.2f} s)")
        if not ticket.held and judge_tpot and (blocked := self._tpot_block(ticket, rho, now)) is not None:
            # Held for a slot instead, while its TTFT has room for the wait: a stream ends about every
            # `seconds per finish`, and it needs `excess` of them, after those of its class or above
            # already held (they go first).
            excess, why = blocked
            per_finish = self._seconds_per_finish(join - 1)
            budget = threshold - (ticket.predicted_ttft if ticket.predicted_ttft is not None else waited)
            if slo.admission_hold and self.in_flight_seconds is not None:
                ahead = sum(1 for t in self._held if t.slo.priority >= slo.priority)
                if (ahead + max(1, math.ceil(excess))) * per_finish <= budget:
                    return self._hold(ticket, now + budget)
            return self._refuse(ticket, "tpot", excess * per_finish, why)
        ticket.admitted, ticket.reason, ticket.detail = True, None, ""
        self._held_remove(ticket)
        self._in_flight[id(ticket)] = ticket
        self._prompt_rate.add(now, ticket.prompt_tokens)
        return ticket

    def _hold(self, ticket: Ticket, deadline: float) -> Ticket:
        ticket.admitted, ticket.reason, ticket.detail = False, None, ""
        ticket.held, ticket.was_held, ticket.deadline = True, True, deadline
        bisect.insort(self._held, ticket, key=_held_order)
        return ticket

    def _held_remove(self, ticket: Ticket) -> None:
        if ticket.held:
            ticket.held = False
            self._held.remove(ticket)

    @property
    def held(self) -> int:
        """Requests waiting in this sidecar for a decode slot."""
        return len(self._held)

    def review(self, now: float) -> list[Ticket]:
        """Judge the held requests again, highest priority and longest held first (a slot freed,
        or a deadline came); returns those now decided, admitted or shed. One that still does not
        fit keeps every request behind it, of its priority or lower, waiting: nobody overtakes."""
        decided: list[Ticket] = []
        blocked = False   # the first still held blocks the rest (all of its priority or lower: the order)
        for ticket in list(self._held):
            if blocked and now < ticket.deadline:
                continue
            self._judge(ticket, now)
            if ticket.held:
                blocked = True
            else:
                decided.append(ticket)
        return decided

    def withdraw(self, ticket: Ticket, now: float) -> None:
        """A held request's client went away: forget it."""
        if ticket.held:
            ticket.held_seconds = now - ticket.arrived
        self._held_remove(ticket)

    def _tpot_block(self, ticket: Ticket, rho: float, now: float) -> tuple[float, str] | None:
        """Why the batch has no room for it on TPOT, as (requests in excess, the 429's reason), or
        None: room. No room when the batch it joins is too large for its own TPOT, or for the
        tightest TPOT in flight once the classes above it have their room."""
        slo, join, est = ticket.slo, ticket.join_batch, self.estimate
        own_limit = est.max_batch(ticket.tpot_threshold, rho)
        if join > own_limit:
            ticket.batch_limit = own_limit
            return join - own_limit, (f"this request's predicted time per output token ({ticket.predicted_tpot:.3f} s, "
                                      f"decoding beside {join - 1} others, prefills taking {100 * rho:.0f} % of the "
                                      f"engine) exceeds what SLO class {slo.name!r} allows "
                                      f"({ticket.tpot_threshold:.3f} s)")
        guarded = [t.slo.name for t in self._in_flight.values() if t.slo is not None and t.slo.admission]
        tight = min([ticket.tpot_threshold] + [self._tpot_thresholds[name] for name in guarded])
        above = self._above[slo.name]
        n_above = sum(1 for t in self._in_flight.values() if t.slo is not None and t.slo.name in above)
        room = est.max_batch(tight, rho) - max(self._reserve(above, now), n_above)
        mine = join - n_above   # in flight at or below its priority, itself included
        if mine <= room:
            ticket.batch_limit = None
            return None
        ticket.batch_limit = max(0.0, room)
        why = (f"the {n_above + max(0, math.floor(room))} that keep time per output token under "
               f"{tight:.3f} s (tightest in flight)" + (", after room for higher-priority classes" if above else ""))
        return mine - room, f"admitting this request would make the decode batch {join}, past {why}"

    def _refuse(self, ticket: Ticket, reason: str, wait: float, why: str) -> Ticket:
        self._held_remove(ticket)
        ticket.admitted = False
        ticket.reason = reason
        ticket.retry_after = max(1, math.ceil(wait))
        ticket.detail = f"the server is at capacity: {why}; retry after {ticket.retry_after} s"
        if log.isEnabledFor(logging.DEBUG):
            log.debug("shed class=%s reason=%s join=%d predicted_tpot=%s tpot_threshold=%.3f "
                      "batch_limit=%s predicted_ttft=%s ttft_threshold=%s", ticket.slo.name if ticket.slo else None,
                      reason, ticket.join_batch, _fmt(ticket.predicted_tpot), ticket.tpot_threshold or 0.0,
                      _fmt(ticket.batch_limit), _fmt(ticket.predicted_ttft), _fmt(ticket.threshold))
        return ticket

    def _reserve(self, above: tuple[str, ...], now: float) -> float:
        """Requests the classes above will have in flight: arrival rate x time in flight (Little),
        up to the Poisson count's quantile at their tightest objective (normal approximation), so
        a higher-priority arrival finds room as often as its objective asks. The rate rises within
        a few of their arrivals (`rising_rate`): a low request admitted while the window still
        averages in a quiet spell holds its place for a whole decode, the high ones arriving
        meanwhile find the batch full."""
        if not above or self.in_flight_seconds is None:
            return 0.0
        expected = sum(self._arrivals[name].rising_rate(now) for name in above) * self.in_flight_seconds
        return expected + self._reserve_z[above] * math.sqrt(expected)

    def _seconds_per_finish(self, in_flight: int) -> float:
        """How often a request in flight finishes (Little's law): the wait per request of excess."""
        return (self.in_flight_seconds or 1.0) / max(1, in_flight)

    def finish(self, ticket: Ticket, timing: RequestTiming) -> Checked:
        """Forget the request, learn from it; returns |predicted - measured| TTFT and TPOT where
        both exist."""
        self._held_remove(ticket)
        if self._in_flight.pop(id(ticket), None) is None:
            return NOT_CHECKED
        start = ticket.timer.start if ticket.timer is not None else ticket.arrived
        end = start + timing.e2e
        if ticket.stream:
            first = start + timing.ttft if timing.ttft is not None else None
        else:
            first = ticket.arrived + (ticket.predicted_ttft or 0.0)
            first = first if first <= end else None
        decode = self._during(first, end) if first is not None and end > first else None
        self._remember(first, end, ticket.prompt_tokens)
        if not ticket.stream or timing.error is not None or timing.ttft is None:
            return NOT_CHECKED   # a non-streamed answer's first token is not observable; errors teach nothing
        # What the engine took: the time held in the sidecar for a slot is not the engine's.
        in_flight = timing.e2e - ticket.held_seconds
        if self.in_flight_seconds is None:
            self.in_flight_seconds = in_flight
        else:
            self.in_flight_seconds = _IN_FLIGHT_DECAY * self.in_flight_seconds + (1 - _IN_FLIGHT_DECAY) * in_flight
        if not ticket.learned:
            self._learn_ttft(ticket, timing.ttft - ticket.held_seconds)
        if timing.input_tokens and ticket.chars:
            # Usage corrects the characters-per-token guess for everything that follows.
            ratio = ticket.chars / timing.input_tokens
            self._chars_per_token = 0.9 * self._chars_per_token + 0.1 * min(16.0, max(0.5, ratio))
        tpot_error = None
        if timing.tpot is not None and decode is not None:
            batch, prefilled = decode
            self.estimate.observe_decode(timing.tpot, batch, prefilled / max(1, timing.output_tokens - 1))
            if ticket.predicted_tpot is not None:
                tpot_error = abs(ticket.predicted_tpot - timing.tpot)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("done class=%s join=%d predicted_tpot=%s measured_tpot=%s mean_batch=%s "
                      "predicted_ttft=%s measured_ttft=%.3f step=%s", ticket.slo.name if ticket.slo else None,
                      ticket.join_batch, _fmt(ticket.predicted_tpot), _fmt(timing.tpot),
                      _fmt(decode[0] if decode else None), _fmt(ticket.predicted_ttft), timing.ttft,
                      "%.4f+%.4f*B" % self.estimate.step_line())
        ttft_error = None
        if ticket.predicted_ttft is not None:
            self._learn_error(timing.ttft - ticket.predicted_ttft)
            ttft_error = abs(ticket.predicted_ttft - timing.ttft)
        return Checked(ttft_error, tpot_error)

    def _during(self, first: float, end: float) -> tuple[float, float]:
        """(mean decode batch, itself included; prompt tokens of other requests whose first token
        came) over the decode window (first, end] of a request that just finished."""
        overlap, prefilled = 0.0, 0.0
        spans = [(f, end, t.prompt_tokens) for t in self._in_flight.values()
                 if (f := self._first_token(t, end)) is not None]
        for f, e, tokens in list(self._done) + spans:
            overlap += max(0.0, min(e, end) - max(f, first))
            if first < f <= end:
                prefilled += tokens
        return 1.0 + overlap / (end - first), prefilled

    def _remember(self, first: float | None, end: float, tokens: float) -> None:
        """Keep a finished request's decode span while a request in flight may still overlap it."""
        if first is not None:
            self._done.append((first, end, tokens))
        horizon = min((t.arrived for t in self._in_flight.values()), default=end)
        while self._done and self._done[0][1] < horizon:
            self._done.popleft()

    def _learn_error(self, miss: float) -> None:
        """Keep the threshold below each objective by what the predictor recently under-shot."""
        self._misses.append(miss)
        if len(self._misses) >= self.min_samples:
            ordered = sorted(self._misses)
            self.learned_headroom = max(0.0, ordered[int(ERROR_QUANTILE * (len(ordered) - 1))])
            self._thresholds = _thresholds(self._classes, self.learned_headroom)

    def _learn_ttft(self, ticket: Ticket, ttft: float) -> None:
        ticket.learned = True
        self.estimate.observe_ttft(ttft, ticket.tokens_ahead, ticket.batch_mean, ticket.batch)

    @staticmethod
    def _first_token(t: Ticket, now: float) -> float | None:
        """When an in-flight request's first token came (None: not yet). No first token is visible
        in a non-streamed answer: assume it came when predicted."""
        if t.stream:
            return t.timer.first_token_at if t.timer is not None else None
        first = t.arrived + (t.predicted_ttft or 0.0)
        return first if first <= now else None

    def _queue(self, now: float) -> tuple[float, int, int]:
        """(prompt tokens of in-flight requests still waiting for their first token, how many of them,
        requests decoding).

        A streamed request's first token is learned from here, as soon as the next request arrives
        after it, rather than when it finishes: under overload the estimate must follow the engine
        within a TTFT, not a whole response later."""
        waiting, n_waiting, decoding = 0.0, 0, 0
        for t in self._in_flight.values():
            first = self._first_token(t, now)
            if t.stream and first is not None and not t.learned:
                self._learn_ttft(t, first - t.timer.start - t.held_seconds)
            if first is None:
                waiting += t.prompt_tokens
                n_waiting += 1
            else:
                decoding += 1
        return waiting, n_waiting, decoding


def _held_order(t: Ticket) -> tuple[int, float]:
    """Held requests are judged highest priority first, then longest held first."""
    return -t.slo.priority, t.arrived


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _thresholds(classes, learned_headroom: float = 0.0) -> dict[str, float]:
    """Predicted TTFT above which each class sheds: its objective less the larger of its margin and
    what the predictor recently under-shot (capped, so a wild predictor cannot shed everything);
    for a lower-priority class also PRIORITY_HEADROOM of the tightest threshold above it. Relative
    to the threshold, not the objective: when a noisy engine widens the learned headroom, the high
    class sheds earlier and the classes below must shed earlier still, or they would outlast it.
    One pass from the highest priority down (recomputed at every finish once headroom is learned)."""
    out: dict[str, float] = {}
    tightest_above = math.inf   # over the classes of strictly higher priority than the current level
    level, level_min = None, math.inf
    for c in sorted(classes, key=lambda c: -c.priority):
        if c.priority != level:
            tightest_above, level, level_min = min(tightest_above, level_min), c.priority, math.inf
        headroom = c.admission_margin * c.ttft
        if c.admission_margin >= 0:
            # A negative margin asks to shed only predicted misses; then the learned headroom is not used.
            headroom = max(headroom, min(learned_headroom, MAX_LEARNED_HEADROOM * c.ttft))
        out[c.name] = min(c.ttft - headroom, PRIORITY_HEADROOM * tightest_above)
        level_min = min(level_min, out[c.name])
    return out


def _threshold(slo: SloClass, classes, learned_headroom: float = 0.0) -> float:
    """One class's threshold (see _thresholds)."""
    return _thresholds(classes, learned_headroom)[slo.name]
