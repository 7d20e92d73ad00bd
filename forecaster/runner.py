"""The forecaster's loop: every step, read the fleet, decide, publish.

One owner each: the source reads, the policy decides, ForecastState holds what the servers show.
A step whose input is bad keeps the last published decision, logs why and counts the reason in
goodput_forecaster_source_errors_total: the source failed (`unreachable`), answered nothing
usable (`no_sample`), a sample held NaN, infinite or negative values (`non_finite`, `negative`),
or the decision itself came out non-finite or below one replica (`bad_decision`). The next good
sample continues the history, whose gap the series code bridges. Holding never scales down, so
an outage of the signals cannot take replicas away.
"""

from __future__ import annotations

import logging
import math
import threading
import time

from forecaster.policy import Decision, FleetSample, ForecastPolicy
from forecaster.scoring import ForecastScorer
from forecaster.server import ForecastState

log = logging.getLogger("goodput.forecaster")
# Counters and gauges that must be finite and >= 0 (kv_cache_usage may be NaN: no replica reports it).
_CHECKED = ("arrivals_total", "input_tokens_total", "output_tokens_total", "in_flight", "queue_waiting", "running",
            "preemptions_total", "good_total")


def sample_problem(sample: FleetSample) -> str | None:
    """Why a sample cannot be used (a reason label), or None."""
    for name in _CHECKED:
        value = getattr(sample, name)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return "non_finite"
        if value < 0:
            return "negative"
    if not isinstance(sample.ready_replicas, int) or sample.ready_replicas < 0:
        return "negative"
    return None


def decision_problem(decision: Decision) -> str | None:
    values = (decision.queue_depth_mean, decision.queue_depth_upper, decision.arrival_rate_mean,
              decision.arrival_rate_upper, decision.capacity_rps, decision.desired_replicas)
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        return "bad_decision"
    if decision.desired_replicas < 1:
        return "bad_decision"
    return None


class Runner:
    def __init__(self, source, policy: ForecastPolicy, state: ForecastState, step_seconds: float,
                 clock=time.time, recorder=None):
        self.source, self.policy, self.state = source, policy, state
        self.recorder = recorder   # replay.Recorder: every sample used, for `goodput forecaster replay`
        self.step_seconds = step_seconds
        self.clock = clock
        self.num_steps = 0
        self.num_source_errors = 0
        self.scorer = ForecastScorer()

    def warm_up(self, seconds: float) -> int:
        """Feeds the policy the source's recent history, if it has one; returns samples read."""
        history = getattr(self.source, "history", None)
        if history is None or seconds <= 0:
            return 0
        try:
            samples = history(seconds, now=self.clock())
        except Exception as exc:  # noqa: BLE001 - a cold start is still a start
            log.warning("warm-up from history failed, starting cold: %s", exc)
            return 0
        for s in samples:
            self.policy.observe(s)
            self._record(s.t, s, warm=True)
        log.info("warmed up from %d samples of history", len(samples))
        return len(samples)

    def step(self) -> Decision | None:
        now = self.clock()
        try:
            sample = self.source.poll(now)
        except Exception as exc:  # noqa: BLE001 - the loop must outlive a bad scrape
            self.num_source_errors += 1
            return self._hold("unreachable", f"reading the fleet failed: {exc}")
        if sample is None:
            return self._hold("no_sample", "no source answered with a usable sample")
        problem = sample_problem(sample)
        if problem is not None:
            return self._hold(problem, f"the fleet sample has {problem.replace('_', '-')} values: {sample}")
        self.policy.observe(sample)
        learned = getattr(self.source, "cold_start_seconds", None)
        cold_start = learned() if learned is not None else None
        if learned is not None:
            self.policy.learned_cold_start(cold_start)
        try:
            starting = self.source.starting_replicas()
            self._record(now, sample, starting, cold_start)   # never raises
            decision = self.policy.decide(now, starting)
        except Exception as exc:  # noqa: BLE001 - a bad decision must not end the loop either
            return self._hold("bad_decision", f"deciding failed: {type(exc).__name__}: {exc}")
        problem = decision_problem(decision)
        if problem is not None:
            return self._hold(problem, f"the decision is unusable: {decision}")
        self._score(now, sample, decision)
        self.state.publish(decision, sample.ready_replicas, self.scorer.scores)
        self.num_steps += 1
        status = self.policy.selector.status
        log.info("desired=%d (%s) ready=%d rate=%.2f/%.2f queue@h=%.1f/%.1f capacity=%.2f (%s) model=%s "
                 "demand=%s%s",
                 decision.desired_replicas, "+".join(decision.reasons), sample.ready_replicas,
                 decision.arrival_rate_mean, decision.arrival_rate_upper, decision.queue_depth_mean,
                 decision.queue_depth_upper, decision.capacity_rps, decision.capacity_source, decision.model_name,
                 decision.demand_estimate,
                 f" ({status.last_error})" if status.source != "fit" and status.last_error else "")
        return decision

    def _record(self, t: float, sample: FleetSample, starting: int = 0, cold_start: float | None = None,
                warm: bool = False) -> None:
        """A recording that cannot be written (disk full) stops, said once; the forecaster goes on."""
        if self.recorder is None:
            return
        try:
            self.recorder.write(t, sample, starting, cold_start, warm)
        except Exception as exc:  # noqa: BLE001 - a recording must never cost a decision
            log.warning("recording to %s stopped: %s", self.recorder.path, exc)
            self.recorder = None

    def _score(self, now: float, sample, decision: Decision) -> None:
        """Scores forecasts now due against this step, then records this step's."""
        obs = self.policy.last_observation
        actuals = {"queue_depth": sample.queue_waiting,
                   "arrival_rate": self.policy.history.rates["arrivals"].last}
        if obs is not None and obs.ttft_count:
            actuals["ttft"] = obs.ttft_sum / obs.ttft_count
        if obs is not None and obs.tpot_count:
            actuals["tpot"] = obs.tpot_sum / obs.tpot_count
        self.scorer.observe(now, {k: v for k, v in actuals.items() if v is not None})
        forecasts = {"queue_depth": (decision.queue_depth_mean, decision.queue_depth_upper),
                     "arrival_rate": (decision.arrival_rate_mean, decision.arrival_rate_upper)}
        # Latency of the default (first) class: all classes share one replica's physics.
        for quantity, values in (("ttft", decision.ttft_s), ("tpot", decision.tpot_s)):
            if values:
                forecasts[quantity] = next(iter(values.values()))
        self.scorer.record(now, self.state.horizon_seconds, forecasts)

    def _hold(self, reason: str, message: str) -> None:
        """Keep the last published decision (never scale down on bad input); say why."""
        self.state.note_source_error(reason)
        held = self.state.get()
        log.warning("%s; keeping desired=%s (%s)", message,
                    held.decision.desired_replicas if held else "unpublished", reason)
        return None

    def run(self, stop: threading.Event) -> None:
        next_at = self.clock()
        while not stop.is_set():
            self.step()
            next_at += self.step_seconds
            # Keep to the step grid; after a slow step, start the next one at once rather than drift.
            stop.wait(max(0.0, next_at - self.clock()))
            if self.clock() - next_at > self.step_seconds:
                next_at = self.clock()
