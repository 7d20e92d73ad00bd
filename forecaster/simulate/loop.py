"""The simulation loop: fleet ticks, policy samples every second, HPA syncs every 15 s.

Time is an integer tick count (no float drift): the fleet is viewed once a second, the policy
sees that view, and at each HPA sync the controller reads the value the policy published
`metric_delay_s` earlier (Prometheus scrape + adapter cache + API, lumped), then writes the new
deployment size, which the fleet applies at once (pod creation; the cold start covers the rest).
The run covers the trace, then keeps going (with the policy still in charge) until every request
has finished or `drain_limit_s` has passed.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from forecaster.simulate.hpa import HpaController


@dataclass(frozen=True)
class LoopConfig:
    cold_start_s: float = 180.0
    metric_delay_s: float = 30.0
    hpa_sync_s: float = 15.0
    sample_s: float = 1.0
    drain_limit_s: float = 1800.0
    history_s: float = 120.0  # views kept for policies that look back (utilisation, saturation)

    def __post_init__(self) -> None:
        if self.cold_start_s < 0 or self.metric_delay_s < 0:
            raise ValueError("cold start and metric delay must be >= 0 seconds")
        if self.hpa_sync_s <= 0 or self.sample_s <= 0:
            raise ValueError("HPA sync period and sample period must be > 0 seconds")


@dataclass
class Timeline:
    """Per-second record of one run (lists while running, arrays after)."""

    t: list = field(default_factory=list)
    spec: list = field(default_factory=list)
    ready: list = field(default_factory=list)
    starting: list = field(default_factory=list)
    draining: list = field(default_factory=list)
    waiting: list = field(default_factory=list)
    running: list = field(default_factory=list)
    arrivals: list = field(default_factory=list)
    metric: list = field(default_factory=list)
    scale_events: int = 0
    end_s: float = 0.0

    def add(self, view, metric: float | None, arrivals_before: float) -> None:
        self.t.append(view.t)
        self.spec.append(view.spec_replicas)
        self.ready.append(view.ready)
        self.starting.append(view.starting)
        self.draining.append(view.draining)
        self.waiting.append(view.waiting)
        self.running.append(view.running)
        self.arrivals.append(view.arrivals_total - arrivals_before)
        self.metric.append(np.nan if metric is None else metric)

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(getattr(self, k), dtype=float)
                for k in ("t", "spec", "ready", "starting", "draining", "waiting", "running", "arrivals", "metric")}


def run(fleet, policy, config: LoopConfig, trace_end_s: float, progress=None) -> Timeline:
    """Drive `fleet` with `policy` (an HPA-backed Policy or the Oracle) and record a Timeline."""
    tick = fleet.tick_s
    per_sample = max(1, round(config.sample_s / tick))
    per_sync = max(1, round(config.hpa_sync_s / tick))
    spec = policy.hpa_spec()
    hpa = HpaController(spec) if spec is not None else None
    history: deque = deque(maxlen=int(config.history_s / config.sample_s) + 1)
    timeline = Timeline()
    last_arrivals = 0.0
    end_ticks = math.ceil((trace_end_s + config.drain_limit_s) / tick)
    trace_ticks = math.ceil(trace_end_s / tick)
    k = 0
    while k <= end_ticks:
        now = round(k * tick, 9)  # k * 0.1 is not exact in binary; keep whole seconds whole
        # Control first: a view at t shows what the HPA wrote at t.
        if hpa is None:
            if k % per_sample == 0:
                desired = policy.desired_at(now)
                if desired != fleet.spec_replicas():
                    fleet.set_replicas(desired, now)
                    timeline.scale_events += 1
        elif k % per_sync == 0 and k > 0:
            usage = policy.value_at(now - config.metric_delay_s)
            if usage is not None:
                view = fleet.view(now)
                desired = hpa.reconcile(now, view.spec_replicas, usage, view.ready)
                if desired != view.spec_replicas:
                    fleet.set_replicas(desired, now)
                    timeline.scale_events += 1
        if k % per_sample == 0:
            view = fleet.view(now)
            history.append(view)
            policy.observe(view, history)
            metric = policy.value_at(now) if hpa is not None else float(view.spec_replicas)
            timeline.add(view, metric, last_arrivals)
            last_arrivals = view.arrivals_total
            if progress and k % (per_sample * 60) == 0:
                progress(min(now, trace_end_s))
        fleet.step(now)
        k += 1
        if k > trace_ticks and fleet.idle:
            break
    timeline.end_s = k * tick
    policy.close()
    return timeline

