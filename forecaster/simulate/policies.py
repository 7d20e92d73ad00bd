"""Autoscaling policies: each publishes one metric that an HPA reads (or, the oracle, acts directly).

A policy sees the fleet's views (every second) and publishes values on its own cadence; the
simulation loop hands the HPA the value published `metric_delay` seconds before each sync. What
each one reproduces:

- utilization: GPU utilisation (DCGM's "a kernel was running" share) averaged over ready replicas,
  External `Value` target 80. Continuous batching keeps any replica holding a request busy, so
  this reads ~100 % whenever there is work: it shows why utilisation cannot drive LLM scaling.
- queue-adapter: vLLM production-stack's HPA recipe: `vllm:num_requests_waiting` summed through
  prometheus-adapter, `AverageValue` target 1.
- queue-keda: production-stack's KEDA recipe: the same query, threshold 5 (`AverageValue` 5),
  pollingInterval 30 s (the value refreshes every 30 s). cooldownPeriod 300 s only governs
  scaling to zero, which min replicas >= 1 never does, so it has no effect here.
- saturation: llm-d workload-variant-autoscaler's saturation analyzer (defaults kvCacheThreshold
  0.8, queueLengthThreshold 5, kvSpareTrigger 0.1, queueSpareTrigger 3; inputs max_over_time[1m]
  per replica; target ready + 1 / ready - 1; a previous target not yet reached is kept). It
  publishes desired replicas, read with `AverageValue` 1. Its reconcile interval is 30 s here
  (assumed; configurable).
- goodput: this project's forecaster, forecaster.policy.ForecastPolicy, run as-is: it observes a
  FleetSample every step_seconds and publishes goodput_desired_replicas (`AverageValue` 1), read
  by an HPA with the chart's behaviour (no scale-down window of its own: the forecaster holds
  scale-downs itself, with its window taken from --scale-down-window).
- oracle: see oracle.py; no HPA.
- static: not autoscaling at all: the smallest fixed fleet that reaches the attainment target
  (runner.py), the cost of provisioning for the peaks a causal policy cannot follow.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from forecaster.simulate.fleet import FleetView
from forecaster.simulate.hpa import DEFAULT_SCALE_DOWN, HpaSpec, ScalingRules

POLICY_NAMES = ("utilization", "queue-adapter", "queue-keda", "saturation", "goodput", "oracle", "static")


@dataclass(frozen=True)
class Limits:
    """What every HPA-driven policy shares: replica bounds and the scale-down stabilisation window
    (Kubernetes' default 300 s unless set)."""

    min_replicas: int
    max_replicas: int
    scale_down_window_s: int = 300


class Policy:
    """Publishes (t, value) pairs; the HPA reads the one in force at t - delay."""

    name = "policy"
    target_type = "AverageValue"
    target = 1.0
    publish_every_s = 1.0

    def __init__(self, limits: Limits):
        self.limits = limits
        self.published: list[tuple[float, float]] = []
        self._next_publish = 0.0

    def hpa_spec(self) -> HpaSpec | None:
        down = ScalingRules(self.limits.scale_down_window_s, DEFAULT_SCALE_DOWN.policies, DEFAULT_SCALE_DOWN.select_policy)
        return HpaSpec(self.target_type, self.target, self.limits.min_replicas, self.limits.max_replicas,
                       scale_down=down)

    def observe(self, view: FleetView, history: deque) -> None:
        if view.t + 1e-9 < self._next_publish:
            return
        self._next_publish = view.t + self.publish_every_s
        value = self.compute(view, history)
        if value is not None:
            self.published.append((view.t, float(value)))

    def compute(self, view: FleetView, history: deque) -> float | None:
        raise NotImplementedError

    def value_at(self, t: float) -> float | None:
        """The value published at or before t (None: the metric does not exist yet)."""
        lo, hi = 0, len(self.published)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.published[mid][0] <= t + 1e-9:
                lo = mid + 1
            else:
                hi = mid
        return self.published[lo - 1][1] if lo else None

    def close(self) -> None:
        pass


class Utilization(Policy):
    name = "utilization"
    target_type = "Value"
    target = 80.0
    window_s = 15.0

    def compute(self, view, history):
        old = next((v for v in history if v.t >= view.t - self.window_s), None)
        if old is None or view.serving_s_total <= old.serving_s_total:
            return None
        return 100.0 * (view.busy_s_total - old.busy_s_total) / (view.serving_s_total - old.serving_s_total)


class QueueAdapter(Policy):
    name = "queue-adapter"
    target = 1.0

    def compute(self, view, history):
        return view.waiting


class QueueKeda(QueueAdapter):
    name = "queue-keda"
    target = 5.0
    publish_every_s = 30.0


class Saturation(Policy):
    name = "saturation"
    kv_threshold, queue_threshold = 0.8, 5.0
    kv_spare_trigger, queue_spare_trigger = 0.1, 3.0
    lookback_s = 60.0

    def __init__(self, limits: Limits, interval_s: float = 30.0):
        super().__init__(limits)
        self.publish_every_s = interval_s
        self.desired: int | None = None

    def compute(self, view, history):
        kv: dict[int, float] = {}
        queue: dict[int, float] = {}
        for v in history:
            if v.t < view.t - self.lookback_s:
                continue
            for rid, q, k in zip(v.per_replica_ids, v.per_replica_waiting, v.per_replica_kv):
                kv[rid] = max(kv.get(rid, 0.0), k)
                queue[rid] = max(queue.get(rid, 0.0), q)
        live = [rid for rid in view.per_replica_ids]
        current, ready = view.spec_replicas, view.ready
        if self.desired is not None and self.desired != current:
            return self.desired  # a previous target not reached yet is kept
        non_sat = [r for r in live if kv.get(r, 0.0) < self.kv_threshold and queue.get(r, 0.0) < self.queue_threshold]
        target = ready
        if not non_sat:
            target = ready + 1
        else:
            n = len(non_sat)
            spare_kv = sum(self.kv_threshold - kv.get(r, 0.0) for r in non_sat) / n
            spare_q = sum(self.queue_threshold - queue.get(r, 0.0) for r in non_sat) / n
            if spare_kv < self.kv_spare_trigger or spare_q < self.queue_spare_trigger:
                target = ready + 1
            elif n >= 2:
                kv_after = sum(kv.get(r, 0.0) for r in non_sat) / (n - 1)
                q_after = sum(queue.get(r, 0.0) for r in non_sat) / (n - 1)
                if self.kv_threshold - kv_after >= self.kv_spare_trigger and \
                        self.queue_threshold - q_after >= self.queue_spare_trigger:
                    target = ready - 1
        self.desired = max(self.limits.min_replicas, min(self.limits.max_replicas, target))
        return self.desired


class Goodput(Policy):
    """The forecaster's own decision rule (forecaster/policy.py), fed the fleet's metrics."""

    name = "goodput"

    def __init__(self, limits: Limits, cold_start_s: float, capacity_rps: float | None, step_s: float = 15.0,
                 slo=None, target: float = 0.99, **overrides):
        super().__init__(limits)
        from forecaster.policy import ForecastPolicy, PolicyConfig  # the real thing, not a copy

        self.publish_every_s = step_s
        fields = dict(step_seconds=step_s, horizon_seconds=cold_start_s, cold_start_seconds=cold_start_s,
                      capacity_rps=capacity_rps, min_replicas=limits.min_replicas, max_replicas=limits.max_replicas,
                      scale_down_window_seconds=float(limits.scale_down_window_s))
        unknown = sorted(set(overrides) - set(PolicyConfig.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown forecaster setting {', '.join(unknown)}; PolicyConfig has "
                             f"{', '.join(sorted(PolicyConfig.__dataclass_fields__))}")
        config = PolicyConfig(**{**fields, **overrides})
        self.forecaster = ForecastPolicy(config)
        self.decisions: list = []
        # The SLO as the sidecars would announce it (goodput_slo_target_seconds), nothing else.
        if slo is not None:
            from forecaster.service_model import Slo

            self.slos = (Slo(ttft_s=slo.ttft_s, tpot_s=slo.tpot_s, ratio=target, name="default"),)
        else:
            self.slos = None

    def hpa_spec(self) -> HpaSpec | None:
        """As the chart ships it for goodput_desired_replicas: no scale-down window of the HPA's own
        (the forecaster already holds a scale-down for its window), down at the API's default pace.
        One stabilisation, not two in series."""
        down = ScalingRules(0, DEFAULT_SCALE_DOWN.policies, DEFAULT_SCALE_DOWN.select_policy)
        return HpaSpec(self.target_type, self.target, self.limits.min_replicas, self.limits.max_replicas,
                       scale_down=down)

    def compute(self, view, history):
        self.forecaster.observe(view.sample(self.slos))
        decision = self.forecaster.decide(view.t, starting_replicas=view.starting)
        self.decisions.append((view.t, decision))
        return decision.desired_replicas

    def close(self) -> None:
        self.forecaster.close()


def make_policy(name: str, limits: Limits, cold_start_s: float, capacity_rps: float | None,
                saturation_interval_s: float = 30.0, goodput_overrides: dict | None = None,
                slo=None, target: float = 0.99) -> Policy:
    if name == "utilization":
        return Utilization(limits)
    if name == "queue-adapter":
        return QueueAdapter(limits)
    if name == "queue-keda":
        return QueueKeda(limits)
    if name == "saturation":
        return Saturation(limits, saturation_interval_s)
    if name == "goodput":
        return Goodput(limits, cold_start_s, capacity_rps, slo=slo, target=target, **(goodput_overrides or {}))
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
