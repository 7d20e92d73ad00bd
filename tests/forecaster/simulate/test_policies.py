"""Policy metrics on hand-built fleet views, and scoring from a warm-up point."""

from __future__ import annotations

from collections import deque

import numpy as np

from forecaster.simulate.fleet import FleetView, RequestFleet
from forecaster.simulate.loop import LoopConfig, run
from forecaster.simulate.policies import Limits, QueueAdapter, QueueKeda, Saturation, Utilization
from forecaster.simulate.profiles import H100_70B
from forecaster.simulate.runner import score
from forecaster.simulate.traces import RequestTrace


def view(t, ready, waiting, kv, starting=0, busy=0.0, serving=0.0) -> FleetView:
    ids = tuple(range(len(waiting)))
    return FleetView(t=t, ready=ready, starting=starting, draining=0, waiting=float(sum(waiting)), running=0.0,
                     kv_usage=float(np.mean(kv)), per_replica_ids=ids, per_replica_waiting=tuple(waiting),
                     per_replica_kv=tuple(kv), busy_s_total=busy, serving_s_total=serving, arrivals_total=0.0,
                     input_tokens_total=0.0, output_tokens_total=0.0, good_total=0.0, finished_total=0.0,
                     dropped_total=0.0)


def test_saturation_scales_up_by_one_and_keeps_its_target_until_reached():
    policy = Saturation(Limits(1, 10), interval_s=30.0)
    # Replica 0 queue 6 (>= 5: saturated), replica 1 queue 3: spare queue over the non-saturated
    # one is 5 - 3 = 2 < 3 -> scale up to ready + 1 = 3.
    h = deque([view(0.0, 2, [6, 3], [0.2, 0.2])])
    policy.observe(h[-1], h)
    assert policy.published == [(0.0, 3.0)]
    # 30 s later the deployment is still at 2 (the HPA has not acted): the target 3 is kept.
    h.append(view(30.0, 2, [0, 0], [0.1, 0.1]))
    policy.observe(h[-1], h)
    assert policy.published[-1] == (30.0, 3.0)


def test_saturation_scale_down_only_when_the_load_fits_on_one_fewer():
    policy = Saturation(Limits(1, 10), interval_s=30.0)
    # Three replicas, queues 1 each, KV 0.2: on two, queue 1.5 and KV 0.3 leave spare 3.5 >= 3
    # and 0.5 >= 0.1 -> ready - 1 = 2.
    h = deque([view(0.0, 3, [1, 1, 1], [0.2, 0.2, 0.2])])
    policy.observe(h[-1], h)
    assert policy.published[-1] == (0.0, 2.0)
    # Queues 1.5 each: on two, 2.25 -> spare 2.75 < 3: unsafe, stays at 3 (inputs are the
    # max over the last minute, so a fresh policy sees only this view).
    policy = Saturation(Limits(1, 10), interval_s=30.0)
    h = deque([view(0.0, 3, [1.5, 1.5, 1.5], [0.2, 0.2, 0.2])])
    policy.observe(h[-1], h)
    assert policy.published[-1] == (0.0, 3.0)


def test_queue_policies_publish_the_waiting_sum_on_their_cadence():
    adapter, keda = QueueAdapter(Limits(1, 10)), QueueKeda(Limits(1, 10))
    h = deque()
    for t in range(0, 61):
        h.append(view(float(t), 2, [t, 0], [0.0, 0.0]))
        adapter.observe(h[-1], h)
        keda.observe(h[-1], h)
    assert len(adapter.published) == 61 and adapter.value_at(42.5) == 42.0
    # KEDA's 30 s polling: values at 0, 30 and 60 only; between polls the last one holds.
    assert [t for t, _ in keda.published] == [0.0, 30.0, 60.0]
    assert keda.value_at(59.0) == 30.0 and keda.value_at(-1.0) is None


def test_utilization_is_busy_share_of_serving_time_over_15_s():
    policy = Utilization(Limits(1, 10))
    h = deque([view(0.0, 2, [0, 0], [0, 0], busy=0.0, serving=0.0)])
    policy.observe(h[-1], h)
    # 15 s later: 2 replicas served 30 replica-seconds and computed for 27 of them -> 90 %.
    h.append(view(15.0, 2, [0, 0], [0, 0], busy=27.0, serving=30.0))
    policy.observe(h[-1], h)
    assert policy.published[-1] == (15.0, 90.0)


def test_warmup_scores_only_requests_and_replicas_after_it():
    arrivals = np.arange(0.0, 120.0, 0.5)
    trace = RequestTrace("w", arrivals, np.full(len(arrivals), 100), np.full(len(arrivals), 3))
    fleet = RequestFleet(H100_70B, trace, 2, 0.0, tick_s=0.1)
    timeline = run(fleet, QueueAdapter(Limits(2, 2)), LoopConfig(cold_start_s=0.0), trace.duration_s)
    result = score("q", fleet, timeline, np.zeros(200), trace.duration_s, warmup_s=60.0).result
    # 2 requests a second from 60 s up to the last arrival at 119.5 s: 120 of them. Replicas are
    # fixed at 2; the per-second samples inside [60, 119.5) are t = 60..119, 60 of them:
    # 120 replica-seconds = 2 replica-minutes.
    assert result.requests == 120 and result.good == 120
    assert result.replica_minutes == 2.0


def test_goodput_policy_runs_the_forecasters_own_code_through_the_hpa():
    from forecaster.policy import ForecastPolicy

    from forecaster.simulate.policies import Goodput

    # 10 minutes at 4 req/s, then 12 req/s: small enough to run in seconds.
    rng = np.random.default_rng(2)
    arrivals = np.sort(np.concatenate([rng.uniform(0, 600, 2400), rng.uniform(600, 900, 3600)]))
    trace = RequestTrace("g", arrivals, rng.integers(200, 2000, len(arrivals)), rng.integers(5, 30, len(arrivals)))
    policy = Goodput(Limits(1, 20), cold_start_s=60.0, capacity_rps=5.0)
    assert isinstance(policy.forecaster, ForecastPolicy)  # the real class, not a copy
    spec = policy.hpa_spec()
    assert (spec.target_type, spec.target) == ("AverageValue", 1.0)
    fleet = RequestFleet(H100_70B, trace, 1, 60.0, tick_s=0.1)
    run(fleet, policy, LoopConfig(cold_start_s=60.0), trace.duration_s)
    # It decided every 15 s and published exactly its decisions as goodput_desired_replicas.
    assert len(policy.decisions) == len(policy.published) >= 55
    assert all(v == d.desired_replicas for (_, v), (_, d) in zip(policy.published, policy.decisions))
    # 12 req/s at 5 req/s per replica needs 3 or more replicas at the end.
    assert policy.published[-1][1] >= 3
