"""The sidecar's Prometheus metrics, exactly as DESIGN.md's contract names them.

One `SidecarMetrics` per registry owns every series; the proxy calls `started()` and
`finished()` once per measured request. Label values come from bounded sets only: models
through `ModelLabels`, SLO classes from the config, outcomes and objectives from fixed lists.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from sidecar.admission import SHED_REASONS
from sidecar.config import SloConfig
from sidecar.slo import OBJECTIVES, OUTCOMES, SloClass, Verdict
from sidecar.timing import RequestTiming


class _Series(NamedTuple):
    """One (model, class)'s labelled series (SidecarMetrics._children)."""

    requests: dict        # outcome -> counter
    ttft: object
    tpot: object
    e2e: object
    input_tokens: object
    output_tokens: object
    flight: object        # goodput_requests_in_flight{model}
    arrived: object       # goodput_requests_arrived_total{model, slo_class}
    decode_batch: object  # goodput_decode_batch_total{model}
    decode_batch_requests: object

# TTFT spans 10 ms (a warm short prompt) to a minute (a long prompt behind a queue).
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
                7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0)
# ITL and TPOT must resolve below 10 ms: fast GPUs stream a token every 5-10 ms, and vLLM's own
# ITL buckets starting at 10 ms put all of them into one bucket.
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)
# Tokens per request: the shape of the mix (how long the long prompts are), which the forecaster's
# service model needs beyond the counters' means. Powers of two, 1 to 128k.
TOKEN_COUNT_BUCKETS = tuple(float(2 ** k) for k in range(18))
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
               90.0, 120.0, 180.0, 300.0, 600.0)


class ModelLabels:
    """Maps model names to bounded label values.

    With an allow-list (`--models a,b`) anything else is `other`. Without one, the first
    `max_auto` distinct names seen are kept and later ones become `other`, so a client that
    invents model names cannot grow the series without bound.
    """

    OTHER = "other"

    def __init__(self, allowed: tuple[str, ...] = (), max_auto: int = 8):
        self._fixed = bool(allowed)
        self._known: set[str] = set(allowed)
        self._max_auto = max_auto

    def label(self, model: str | None) -> str:
        if not model:
            return self.OTHER
        if model in self._known:
            return model
        if not self._fixed and len(self._known) < self._max_auto and len(model) <= 128:
            self._known.add(model)
            return model
        return self.OTHER

    @property
    def known(self) -> tuple[str, ...]:
        return tuple(sorted(self._known))


class GapHistogram:
    """A histogram recorded a request at a time: all of a stream's gaps in one call.

    prometheus_client's Histogram takes a lock per observation; a 64-token stream has 63 gaps,
    and observing them one by one cost more CPU than relaying the tokens. This collector keeps
    plain per-label bucket counts (only the event loop writes them) and exports them in the
    standard histogram exposition.
    """

    def __init__(self, name: str, documentation: str, label: str, buckets: tuple[float, ...],
                 registry: CollectorRegistry):
        self._name, self._doc, self._label = name, documentation, label
        self._bounds = tuple(float(b) for b in buckets)
        self._series: dict[str, list] = {}      # label value -> [counts per bucket and +Inf, sum]
        registry.register(self)

    def observe_many(self, label: str, values: list[float]) -> None:
        entry = self._series.get(label)
        if entry is None:
            entry = self._series[label] = [[0] * (len(self._bounds) + 1), 0.0]
        counts, bounds = entry[0], self._bounds
        for value in values:
            counts[bisect_left(bounds, value)] += 1     # le: a value equal to a bound falls in it
        entry[1] += sum(values)

    def describe(self):
        return [HistogramMetricFamily(self._name, self._doc, labels=[self._label])]

    def collect(self):
        family = HistogramMetricFamily(self._name, self._doc, labels=[self._label])
        for label, (counts, total) in sorted(self._series.items()):
            cumulative, buckets = 0, []
            for bound, count in zip(self._bounds + (float("inf"),), counts):
                cumulative += count
                buckets.append((floatToGoString(bound), cumulative))
            family.add_metric([label], buckets, total)
        yield family


# The windows arrivals are counted in for their burstiness (label value, seconds); the forecaster's
# service model reads the index of dispersion at a prompt's service time between them
# (forecaster/prompt_queue.py ARRIVAL_WINDOWS_S, which a test holds equal to these).
ARRIVAL_WINDOWS = (("0.1", 0.1), ("1", 1.0), ("10", 10.0))


class DecodeConcurrency:
    """How many requests are decoding at this sidecar (first content chunk sent, not yet ended),
    and the area under that count over time. A request's mean decode batch is the area gained
    between its first chunk and its end over that time: the batch its TPOT was measured at,
    itself included. The forecaster's service model fits the decode step against it (an engine's
    running gauge, sampled at a step's ends, is a noisy stand-in for the batch a step's requests
    lived through, and that noise flattened the fitted slope to half the engine's)."""

    __slots__ = ("decoding", "area", "at")

    def __init__(self):
        self.decoding, self.area, self.at = 0, 0.0, None

    def _advance(self, now: float) -> None:
        if self.at is None or now > self.at:
            if self.at is not None:
                self.area += self.decoding * (now - self.at)
            self.at = now

    def began(self, now: float) -> float:
        """A request's first content chunk went by at `now`; returns its mark (the area then)."""
        self._advance(now)
        self.decoding += 1
        return self.area

    def ended(self, now: float, mark: float, first: float) -> float | None:
        """The request that began at `first` with `mark` ended at `now`: its mean decode batch
        (None for no decode time)."""
        self._advance(now)
        self.decoding = max(0, self.decoding - 1)
        span = now - first
        return (self.area - mark) / span if span > 0 else None


class SidecarMetrics:
    def __init__(self, registry: CollectorRegistry, slo_config: SloConfig):
        mc = ("model", "slo_class")
        self.requests = Counter("goodput_requests", "Measured requests by final outcome (decided once, when the request ends).",
                                ("model", "slo_class", "outcome"), registry=registry)
        # Counted when a request arrives: goodput_requests_total counts it when it ends, which lags
        # by its duration and hides demand exactly when the engine is overloaded.
        self.arrived = Counter("goodput_requests_arrived", "Measured requests, counted when each arrives (before it is served or refused).",
                               mc, registry=registry)
        # How clumped arrivals come: with goodput_requests_arrived_total, the index of dispersion of
        # the requests per window (the forecaster's service model queues clumps as they come).
        self.arrived_squared = Counter(
            "goodput_requests_arrived_squared",
            "Sum over consecutive windows of window_seconds of the square of the requests that arrived in "
            "the window (the window in progress counted as far as it has gone); with "
            "goodput_requests_arrived_total, how clumped arrivals come.", ("model", "window_seconds"),
            registry=registry)
        # model -> per window: [its counter, width, the current window's index, arrivals in it]
        self._windows: dict[str, list[list]] = {}
        self.clock = time.monotonic
        self.violations = Counter("goodput_slo_violations", "Objectives missed by requests whose outcome is slo_violated.",
                                  ("model", "slo_class", "objective"), registry=registry)
        self.ttft = Histogram("goodput_ttft_seconds", "Time from receipt of the request to the first content chunk sent to the client.",
                              mc, buckets=TTFT_BUCKETS, registry=registry)
        self.tpot = Histogram("goodput_tpot_seconds", "Per-request mean decode time per output token: (E2E - TTFT) / (output_tokens - 1).",
                              mc, buckets=TOKEN_BUCKETS, registry=registry)
        self.itl = GapHistogram("goodput_itl_seconds", "Every gap between streamed content chunks; a chunk carrying k tokens "
                                "contributes its gap once.", "model", TOKEN_BUCKETS, registry)
        self.e2e = Histogram("goodput_e2e_seconds", "Time from receipt of the request to the end of the response.",
                             mc, buckets=E2E_BUCKETS, registry=registry)
        self.input_tokens = Counter("goodput_input_tokens", "Prompt tokens, from the upstream's usage.", mc, registry=registry)
        self.output_tokens = Counter("goodput_output_tokens", "Generated tokens, from usage when sent, else counted from the stream.",
                                     mc, registry=registry)
        self.request_input_tokens = GapHistogram(
            "goodput_request_input_tokens", "Prompt tokens per request (usage), the mix the forecaster plans for.",
            "model", TOKEN_COUNT_BUCKETS, registry)
        self.request_output_tokens = GapHistogram(
            "goodput_request_output_tokens", "Generated tokens per request.", "model", TOKEN_COUNT_BUCKETS, registry)
        # The decode batch each TPOT was measured at (DecodeConcurrency): the sum of the requests'
        # mean batches and how many there were; their ratio over a step is the mean batch of the
        # TPOTs in goodput_tpot_seconds.
        self.decode_batch = Counter("goodput_decode_batch", "Sum over streamed requests with a TPOT of the mean number of "
                                    "requests decoding at this sidecar during their decode, themselves included.",
                                    ("model",), registry=registry)
        self.decode_batch_requests = Counter("goodput_decode_batch_requests", "Streamed requests counted in "
                                             "goodput_decode_batch_total.", ("model",), registry=registry)
        self.decoding = DecodeConcurrency()
        self.in_flight = Gauge("goodput_requests_in_flight", "Measured requests being served now.", ("model",), registry=registry)
        self.slo_target = Gauge("goodput_slo_target_seconds", "The configured objective per SLO class.", ("slo_class", "objective"),
                                registry=registry)
        self.slo_ratio = Gauge("goodput_slo_objective_ratio", "The share of requests each SLO class should serve good.", ("slo_class",),
                               registry=registry)
        self._cache: dict[tuple[str, str], tuple] = {}
        # Requests refused at the HTTP layer (unparseable framing): they never reach the proxy, have
        # no model or class, and so are not in goodput_requests_total.
        self.malformed = Counter("goodput_malformed_requests", "Requests refused with 400 because they are not valid "
                                 "HTTP/1.1 (bad framing, conflicting lengths, oversize headers).", registry=registry)
        # The admission guard (sidecar/admission.py): what it predicted for every request it judged,
        # and how far off it was for the admitted ones it could check (streamed, first token seen).
        self.admission_predicted = Histogram("goodput_admission_predicted_ttft_seconds",
                                             "TTFT the admission guard predicted when the request arrived (admitted or shed).",
                                             mc, buckets=TTFT_BUCKETS, registry=registry)
        self.admission_error = Histogram("goodput_admission_ttft_error_seconds",
                                         "|predicted - measured| TTFT of admitted streamed requests: is the guard accurate?",
                                         mc, buckets=TTFT_BUCKETS, registry=registry)
        self.admission_predicted_tpot = Histogram("goodput_admission_predicted_tpot_seconds",
                                                  "TPOT the admission guard predicted when the request arrived, at the decode "
                                                  "batch it would join (admitted or shed).",
                                                  mc, buckets=TOKEN_BUCKETS, registry=registry)
        self.admission_tpot_error = Histogram("goodput_admission_tpot_error_seconds",
                                              "|predicted - measured| TPOT of admitted streamed requests: is the guard accurate?",
                                              mc, buckets=TOKEN_BUCKETS, registry=registry)
        # Why each shed request was refused: reason = ttft | tpot (the objective it was predicted to miss).
        self.admission_shed = Counter("goodput_admission_shed", "Requests the admission guard refused with 429, by the "
                                      "objective they were predicted to miss.", ("model", "slo_class", "reason"),
                                      registry=registry)
        # How long a request the decode batch had no room for waited in the sidecar for a slot
        # (sidecar/admission.py `Admission.review`): admitted after it, or shed when its TTFT had no room left.
        self.admission_held = Histogram("goodput_admission_held_seconds",
                                        "Time a request waited in the sidecar for a decode slot before it was admitted "
                                        "or shed (part of its TTFT).", mc, buckets=TTFT_BUCKETS, registry=registry)
        self.draining = Gauge("goodput_draining", "1 while the sidecar drains after SIGTERM.", registry=registry)
        # Classes whose requests may be held for a decode slot: their held histogram exists (at 0)
        # from a model's first request on, so a panel reads "none held" rather than "no data".
        self._hold_classes = {s.name for s in slo_config.classes.values() if s.admission and s.admission_hold}
        for slo in slo_config.classes.values():
            self.slo_ratio.labels(slo.name).set(slo.objective)
            for objective, seconds in slo.targets().items():
                self.slo_target.labels(slo.name, objective).set(seconds)

    def arrived_now(self, model: str, slo_name: str) -> None:
        """Count a judged request's arrival, before it is held, served or refused: demand counts
        when it arrives (the forecaster reads it)."""
        self._children(model, slo_name).arrived.inc()
        # Σ n² grows by (n + 1)² − n² = 2n + 1 as the n+1-th request of a window arrives.
        now = self.clock()
        state = self._windows.get(model)
        if state is None:
            state = self._windows[model] = [[self.arrived_squared.labels(model, label), width, -1, 0]
                                            for label, width in ARRIVAL_WINDOWS]
        for window in state:
            child, width, last, n = window
            index = int(now // width)
            n = n if last == index else 0
            child.inc(2 * n + 1)
            window[2], window[3] = index, n + 1

    def started(self, model: str, slo_name: str) -> None:
        self._children(model, slo_name).flight.inc()

    def admission(self, model: str, slo_name: str, ticket, checked) -> None:
        """Record one request's admission predictions (sidecar/admission.py `Ticket`), why it was
        shed, and once it finished, the predictions' errors (`Checked`)."""
        if ticket.predicted_ttft is not None:
            self.admission_predicted.labels(model, slo_name).observe(ticket.predicted_ttft)
        if ticket.predicted_tpot is not None:
            self.admission_predicted_tpot.labels(model, slo_name).observe(ticket.predicted_tpot)
        if ticket.reason is not None:
            self.admission_shed.labels(model, slo_name, ticket.reason).inc()
        if ticket.was_held:
            self.admission_held.labels(model, slo_name).observe(ticket.held_seconds)
        if checked.ttft_error is not None:
            self.admission_error.labels(model, slo_name).observe(checked.ttft_error)
        if checked.tpot_error is not None:
            self.admission_tpot_error.labels(model, slo_name).observe(checked.tpot_error)

    def _children(self, model: str, slo_name: str) -> "_Series":
        """The labelled series of one (model, class), looked up once: `.labels()` costs a lock
        and a dict lookup per call, paid per request otherwise."""
        key = (model, slo_name)
        found = self._cache.get(key)
        if found is None:
            if slo_name in self._hold_classes:
                self.admission_held.labels(model, slo_name)
            found = self._cache[key] = _Series(
                {o: self.requests.labels(model, slo_name, o) for o in OUTCOMES},
                self.ttft.labels(model, slo_name), self.tpot.labels(model, slo_name), self.e2e.labels(model, slo_name),
                self.input_tokens.labels(model, slo_name), self.output_tokens.labels(model, slo_name),
                self.in_flight.labels(model), self.arrived.labels(model, slo_name),
                self.decode_batch.labels(model), self.decode_batch_requests.labels(model))
        return found

    def finished(self, model: str, slo: SloClass, timing: RequestTiming, verdict: Verdict,
                 in_flight: bool = True, arrival_counted: bool = True) -> None:
        """Record one ended request (called exactly once, from the proxy's finally). `in_flight`
        is False for a request refused before it was counted as started (e.g. 413 or a shed one);
        `arrival_counted` False for one refused before its arrival was counted (`arrived_now`)."""
        series = self._children(model, slo.name)
        requests, ttft, tpot, e2e, input_tokens, output_tokens, flight = series[:7]
        if in_flight:
            flight.dec()
        if timing.decode_mark is not None:
            # It began decoding (its first chunk went by): it leaves the count however it ended.
            first = timing.first_token_at
            end = first + timing.e2e - timing.ttft if timing.ttft is not None else first
            batch = self.decoding.ended(end, timing.decode_mark, first)
            if batch is not None and timing.tpot is not None:
                series.decode_batch.inc(batch)
                series.decode_batch_requests.inc()
        if not arrival_counted:
            # Refused before it was judged (e.g. 413): it still arrived, so demand counts it once.
            self.arrived_now(model, slo.name)
        requests[verdict.outcome].inc()
        if verdict.outcome == "shed":
            return   # answered at once without reaching the engine: no latency or tokens to record
        for objective in verdict.violated:
            self.violations.labels(model, slo.name, objective).inc()
        if timing.ttft is not None:
            ttft.observe(timing.ttft)
        if timing.tpot is not None:
            tpot.observe(timing.tpot)
        e2e.observe(timing.e2e)
        if timing.itl:
            self.itl.observe_many(model, timing.itl)
        if timing.input_tokens:
            input_tokens.inc(timing.input_tokens)
            self.request_input_tokens.observe_many(model, [timing.input_tokens])
        if timing.output_tokens:
            output_tokens.inc(timing.output_tokens)
            self.request_output_tokens.observe_many(model, [timing.output_tokens])


def zero_series(metrics: SidecarMetrics, models: tuple[str, ...], slo_config: SloConfig) -> None:
    """Create the request counters at 0 for known models, so rate() has a start point."""
    for model in models:
        metrics.in_flight.labels(model)
        metrics.decode_batch.labels(model)
        metrics.decode_batch_requests.labels(model)
        for slo in slo_config.classes.values():
            metrics.arrived.labels(model, slo.name)
            for outcome in OUTCOMES:
                metrics.requests.labels(model, slo.name, outcome)
            for objective in slo.targets():
                if objective in OBJECTIVES:
                    metrics.violations.labels(model, slo.name, objective)
            if slo.admission:
                for reason in SHED_REASONS:
                    metrics.admission_shed.labels(model, slo.name, reason)
