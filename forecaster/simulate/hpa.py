"""The Kubernetes HorizontalPodAutoscaler (autoscaling/v2) controller, reproduced for one External metric.

Follows kube-controller-manager's pkg/controller/podautoscaler: replica_calculator.go
(GetExternalMetricReplicas for `Value`, GetExternalPerPodMetricReplicas for `AverageValue`) and
horizontal.go (reconcileAutoscaler, stabilizeRecommendationWithBehaviors,
convertDesiredReplicasWithBehaviorRate, calculateScale{Up,Down}Limit..., storeScaleEvent), with
the defaults the API server fills in for `behavior`. Time is the simulation's seconds; "After"
comparisons are strict, as Go's time.After is, so a sample exactly one window old drops out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

POLICY_TYPES = ("Pods", "Percent")
SELECT_POLICIES = ("Max", "Min", "Disabled")


@dataclass(frozen=True)
class ScalingPolicy:
    type: str  # "Pods" or "Percent"
    value: int
    period_seconds: int

    def __post_init__(self) -> None:
        if self.type not in POLICY_TYPES:
            raise ValueError(f"scaling policy type must be one of {POLICY_TYPES}, got {self.type!r}")
        if self.value <= 0 or not 0 < self.period_seconds <= 1800:
            raise ValueError(f"scaling policy needs value > 0 and 0 < periodSeconds <= 1800, got {self}")


@dataclass(frozen=True)
class ScalingRules:
    stabilization_window_seconds: int
    policies: tuple[ScalingPolicy, ...]
    select_policy: str = "Max"

    def __post_init__(self) -> None:
        if self.select_policy not in SELECT_POLICIES:
            raise ValueError(f"selectPolicy must be one of {SELECT_POLICIES}, got {self.select_policy!r}")
        if not 0 <= self.stabilization_window_seconds <= 3600:
            raise ValueError(f"stabilizationWindowSeconds must be in 0..3600, got {self.stabilization_window_seconds}")


# The API server's defaults (k8s.io/kubernetes pkg/apis/autoscaling/v2/defaults.go).
DEFAULT_SCALE_UP = ScalingRules(0, (ScalingPolicy("Percent", 100, 15), ScalingPolicy("Pods", 4, 15)), "Max")
DEFAULT_SCALE_DOWN = ScalingRules(300, (ScalingPolicy("Percent", 100, 15),), "Max")


@dataclass(frozen=True)
class HpaSpec:
    target_type: str  # "Value" or "AverageValue" (External metric target)
    target: float
    min_replicas: int = 1
    max_replicas: int = 100
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN
    tolerance: float = 0.1  # --horizontal-pod-autoscaler-tolerance
    sync_period_s: float = 15.0  # --horizontal-pod-autoscaler-sync-period

    def __post_init__(self) -> None:
        if self.target_type not in ("Value", "AverageValue"):
            raise ValueError(f"External metric target type must be Value or AverageValue, got {self.target_type!r}")
        if self.target <= 0:
            raise ValueError(f"metric target must be positive, got {self.target}")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 1 <= min_replicas <= max_replicas, got {self.min_replicas}..{self.max_replicas}")


def milli(value: float) -> int:
    """A metric value as the controller sees it: resource.Quantity.MilliValue() rounds up."""
    return math.ceil(round(value * 1000.0, 6))


def external_value_replicas(usage: float, target: float, spec_replicas: int, ready_pods: int, tolerance: float) -> int:
    """GetExternalMetricReplicas: ratio = usage / target against the whole metric, times ready pods."""
    usage_m, target_m = milli(usage), milli(target)
    if spec_replicas == 0:
        return math.ceil(usage_m / target_m)
    ratio = usage_m / target_m
    if abs(1.0 - ratio) <= tolerance:
        return spec_replicas
    return math.ceil(ratio * ready_pods)


def external_average_value_replicas(usage: float, target_per_pod: float, status_replicas: int, tolerance: float) -> int:
    """GetExternalPerPodMetricReplicas: the tolerance compares usage with target x current pods."""
    usage_m, target_m = milli(usage), milli(target_per_pod)
    ratio = usage_m / (target_m * status_replicas) if status_replicas else math.inf
    if abs(1.0 - ratio) > tolerance:
        return math.ceil(usage_m / target_m)
    return status_replicas


@dataclass
class _Stamped:
    t: float
    value: int


@dataclass
class HpaController:
    """One HPA object: call reconcile() every sync period with what the controller would read."""

    spec: HpaSpec
    recommendations: list[_Stamped] = field(default_factory=list)
    scale_up_events: list[_Stamped] = field(default_factory=list)
    scale_down_events: list[_Stamped] = field(default_factory=list)
    _window_started: bool = False

    def metric_replicas(self, usage: float, spec_replicas: int, status_replicas: int, ready_pods: int) -> int:
        s = self.spec
        if s.target_type == "Value":
            return external_value_replicas(usage, s.target, spec_replicas, ready_pods, s.tolerance)
        return external_average_value_replicas(usage, s.target, status_replicas, s.tolerance)

    def reconcile(self, now: float, spec_replicas: int, usage: float, ready_pods: int, status_replicas: int | None = None) -> int:
        """The replica count the HPA writes to the scale subresource at `now` (reconcileAutoscaler)."""
        s = self.spec
        status = spec_replicas if status_replicas is None else status_replicas
        # recordInitialRecommendation: a new HPA starts its recommendations with the current count,
        # so one low first reading does not scale it down inside the first window.
        if not self._window_started:
            self._window_started = True
            self.recommendations.append(_Stamped(now, spec_replicas))
        if spec_replicas > s.max_replicas:
            desired = s.max_replicas
        elif spec_replicas < s.min_replicas:
            desired = s.min_replicas
        else:
            proposed = self.metric_replicas(usage, spec_replicas, status, ready_pods)
            stabilized = self._stabilize(now, spec_replicas, proposed)
            desired = self._rate_limit(now, spec_replicas, stabilized)
        if desired != spec_replicas:
            self._store_scale_event(now, spec_replicas, desired)
        return desired

    def _stabilize(self, now: float, current: int, desired: int) -> int:
        up_cutoff = now - self.spec.scale_up.stabilization_window_seconds
        down_cutoff = now - self.spec.scale_down.stabilization_window_seconds
        up_rec, down_rec = desired, desired
        old_index = None
        for i, rec in enumerate(self.recommendations):
            if rec.t > up_cutoff:
                up_rec = min(rec.value, up_rec)
            if rec.t > down_cutoff:
                down_rec = max(rec.value, down_rec)
            if rec.t < up_cutoff and rec.t < down_cutoff:
                old_index = i
        recommendation = max(current, up_rec)
        recommendation = min(recommendation, down_rec)
        # Record the unstabilised recommendation, reusing a slot older than both windows.
        if old_index is not None:
            self.recommendations[old_index] = _Stamped(now, desired)
        else:
            self.recommendations.append(_Stamped(now, desired))
        return recommendation

    def _change_in_period(self, now: float, period_s: int, events: list[_Stamped]) -> int:
        cutoff = now - period_s
        return sum(e.value for e in events if e.t > cutoff)

    def _limit(self, now: float, current: int, rules: ScalingRules, up: bool) -> int:
        if rules.select_policy == "Disabled":
            return current
        # Max picks the biggest change: the highest limit going up, the lowest going down.
        pick_highest = (rules.select_policy == "Max") == up
        result = None
        for policy in rules.policies:
            added = self._change_in_period(now, policy.period_seconds, self.scale_up_events)
            deleted = self._change_in_period(now, policy.period_seconds, self.scale_down_events)
            start = current - added + deleted
            if up:
                proposed = start + policy.value if policy.type == "Pods" else math.ceil(start * (1 + policy.value / 100))
            else:
                proposed = start - policy.value if policy.type == "Pods" else int(start * (1 - policy.value / 100))
            if result is None:
                result = proposed
            else:
                result = max(result, proposed) if pick_highest else min(result, proposed)
        return current if result is None else result

    def _rate_limit(self, now: float, current: int, desired: int) -> int:
        s = self.spec
        if desired > current:
            limit = max(self._limit(now, current, s.scale_up, up=True), current)
            return min(desired, min(s.max_replicas, limit))
        if desired < current:
            limit = min(self._limit(now, current, s.scale_down, up=False), current)
            return max(desired, max(s.min_replicas, limit))
        return desired

    def _store_scale_event(self, now: float, prev: int, new: int) -> None:
        if new > prev:
            rules, events, change = self.spec.scale_up, self.scale_up_events, new - prev
        else:
            rules, events, change = self.spec.scale_down, self.scale_down_events, prev - new
        longest = max((p.period_seconds for p in rules.policies), default=0)
        # markScaleEventsOutdated + reuse of an outdated slot: keeps the list bounded.
        for i, e in enumerate(events):
            if e.t <= now - longest:
                events[i] = _Stamped(now, change)
                return
        events.append(_Stamped(now, change))
