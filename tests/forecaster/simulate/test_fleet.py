"""The per-request fleet: service timing worked by hand, conservation, cold start, drain."""

from __future__ import annotations

import numpy as np
import pytest

from forecaster.simulate.fleet import RequestFleet
from forecaster.simulate.loop import LoopConfig, run
from forecaster.simulate.policies import Limits, QueueAdapter
from forecaster.simulate.profiles import CPU_SMOLLM2, H100_70B
from forecaster.simulate.traces import RequestTrace


def _trace(arrivals, prompts, outputs) -> RequestTrace:
    return RequestTrace("test", np.asarray(arrivals, float), np.asarray(prompts), np.asarray(outputs))


def _drive(fleet: RequestFleet, until: float) -> None:
    k = 0
    while k * fleet.tick_s < until:
        fleet.step(round(k * fleet.tick_s, 9))
        k += 1


def test_one_request_on_an_idle_h100_replica_is_timed_by_hand():
    # Arrives at 0.05 s, routed at the next tick start (0.1 s). No decodes running, so a step is a
    # pure prompt chunk: 2048 tokens / 20k tok/s = 0.1024 s per 2048 tokens = 20k tok/s; 2000
    # prompt tokens take 0.1 s -> first token at 0.2 s, TTFT 0.15 s. Then 10 more tokens at
    # step(1) = 20 ms + 0.3 ms = 20.3 ms each -> done at 0.2 + 0.203 = 0.403 s.
    fleet = RequestFleet(H100_70B, _trace([0.05], [2000], [11]), initial_replicas=1, cold_start_s=0.0, tick_s=0.1)
    _drive(fleet, 1.0)
    assert fleet.t_first[0] == pytest.approx(0.2, abs=1e-9)
    assert fleet.t_done[0] == pytest.approx(0.403, abs=1e-9)
    assert fleet.good[0]
    view = fleet.view(1.0)
    assert (view.finished_total, view.output_tokens_total, view.waiting, view.running) == (1, 11, 0, 0)


def test_prefill_is_fifo_and_slows_running_decodes():
    # Two 4096-token prompts arrive at 0.0, a tick start, so they are routed at once. The first
    # completes after 4096 tokens (0.2048 s),
    # the second after 8192 tokens. Once the first is decoding, every step that still carries a
    # chunk costs step(1) + 2048/20000 = 0.1227 s, so the second's prefill takes longer than 0.2 s.
    fleet = RequestFleet(H100_70B, _trace([0.0, 0.0], [4096, 4096], [2, 2]), 1, 0.0, tick_s=0.1)
    _drive(fleet, 2.0)
    assert fleet.t_first[0] == pytest.approx(4096 / 20000, abs=1e-9)
    assert fleet.t_first[1] > fleet.t_first[0] + 4096 / 20000
    assert np.all(fleet.t_done > fleet.t_first)


def test_conservation_every_request_is_served_or_dropped():
    # The CPU profile holds 32,768 KV tokens: two requests that need more can never run and are
    # dropped; the other 200 must all finish, and the generated-token counter must equal the sum
    # of their outputs exactly.
    rng = np.random.default_rng(3)
    n = 202
    arrivals = np.sort(rng.uniform(0, 120, n))
    prompts = rng.integers(10, 200, n)
    outputs = rng.integers(1, 20, n)
    prompts[[17, 150]] = 40_000
    fleet = RequestFleet(CPU_SMOLLM2, _trace(arrivals, prompts, outputs), 1, cold_start_s=30.0, tick_s=0.1)
    policy = QueueAdapter(Limits(1, 8))
    timeline = run(fleet, policy, LoopConfig(cold_start_s=30.0, metric_delay_s=0.0), trace_end_s=120.0)
    finished = np.isfinite(fleet.t_done)
    assert fleet.dropped.sum() == 2 and set(np.flatnonzero(fleet.dropped)) == {17, 150}
    assert finished.sum() + fleet.dropped.sum() == n
    assert not (finished & fleet.dropped).any()
    view = fleet.view(timeline.end_s)
    # Tokens advance fractionally inside a tick (fluid steps), so the sum is exact to rounding.
    assert view.output_tokens_total == pytest.approx(outputs[finished].sum(), abs=1e-6)
    assert view.arrivals_total == n and view.in_flight == 0
    assert np.all(fleet.t_first[finished] >= arrivals[finished])


def test_new_replicas_serve_only_after_cold_start_and_removed_ones_drain():
    trace = _trace([0.0], [100], [5])
    fleet = RequestFleet(H100_70B, trace, 1, cold_start_s=10.0, tick_s=0.1)
    fleet.set_replicas(3, now=0.0)
    assert (fleet.view(9.9).ready, fleet.view(9.9).starting) == (1, 2)
    assert (fleet.view(10.0).ready, fleet.view(10.0).starting) == (3, 0)
    # Scaling down removes starting pods first (free), then drains the newest ready ones.
    fleet.set_replicas(4, now=10.0)
    fleet.set_replicas(2, now=10.0)
    view = fleet.view(10.0)
    assert (view.ready, view.starting, view.draining) == (2, 0, 1)
    fleet.step(10.0)  # the drained replica holds nothing: it leaves at its next tick
    assert fleet.view(10.1).draining == 0
