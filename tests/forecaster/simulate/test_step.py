"""A step in demand reaches the expected replica count after exactly the delays it must wait."""

from __future__ import annotations

import numpy as np

from forecaster.simulate.fleet import RequestFleet
from forecaster.simulate.loop import LoopConfig, run
from forecaster.simulate.policies import Limits, Policy
from forecaster.simulate.profiles import H100_70B
from forecaster.simulate.traces import RequestTrace


class ArrivalRate(Policy):
    """Arrivals in the last second (what rate(requests_total[1s]) would give), AverageValue 5."""

    name = "arrival-rate"
    target = 5.0

    def __init__(self, limits):
        super().__init__(limits)
        self._last = None

    def compute(self, view, history):
        rate = None if self._last is None else view.arrivals_total - self._last
        self._last = view.arrivals_total
        return rate


def test_demand_step_reaches_four_replicas_at_exactly_315_s():
    # Demand: 1 req/s (at k + 0.5 s) until 100 s, then 20 req/s from 100.5 s. Tiny requests, so
    # one replica keeps up and the only dynamics are the control loop's.
    # By hand:
    # - the fleet counts a request at the first tick start at or after its arrival; the view at
    #   t = 102 holds every arrival in (100.9, 101.9]: 20. The policy publishes 20 at t = 102
    #   (the view at 101 saw only 100.5 ... 100.9: 9, i.e. ceil(9/5) = 2 wanted).
    # - the HPA reads the value published 30 s before each sync; syncs are every 15 s from 0.
    #   Sync 120 reads t = 90 (1 req/s -> ceil(1/5) = 1: no change). Sync 135 reads t = 105: 20.
    # - AverageValue 5: ratio 20 / (5 x 1) = 4 > 1.1 -> ceil(20 / 5) = 4; the default scale-up
    #   limit from 1 is max(2 x 1, 1 + 4) = 5 >= 4, so spec goes 1 -> 4 at t = 135.
    # - the 3 new replicas start cold for 180 s: ready at 135 + 180 = 315 s, not a tick earlier.
    arrivals = np.concatenate([np.arange(0, 100) + 0.5, 100.5 + np.arange(0, 20 * 300) / 20])
    n = len(arrivals)
    trace = RequestTrace("step", arrivals, np.full(n, 50), np.full(n, 2))
    loop = LoopConfig(cold_start_s=180.0, metric_delay_s=30.0)
    fleet = RequestFleet(H100_70B, trace, initial_replicas=1, cold_start_s=180.0, tick_s=0.1)
    timeline = run(fleet, ArrivalRate(Limits(1, 10)), loop, trace_end_s=float(arrivals[-1]))
    s = timeline.arrays()
    spec_up = s["t"][np.argmax(s["spec"] == 4)]
    ready_up = s["t"][np.argmax(s["ready"] == 4)]
    assert spec_up == 135.0
    assert ready_up == 315.0
    assert s["ready"][s["t"] < 315.0].max() == 1
    # Demand stays at 20 req/s = 4 x target: the HPA holds 4 (ratio 20/(5*4) = 1.0).
    assert set(s["spec"][(s["t"] >= 135.0) & (s["t"] < 400.0)]) == {4}
    assert timeline.scale_events >= 1
