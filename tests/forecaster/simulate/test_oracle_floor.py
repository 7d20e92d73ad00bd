"""The oracle is the cost floor: never more replica-minutes than a fixed fleet meeting the same target.

Run on a slice of every bundled real trace that the simulator reads (the whole traces take
minutes; a 15-minute slice keeps the bursts that made the old oracle overpay).
"""

from __future__ import annotations

import numpy as np
import pytest

from forecaster.simulate.loop import LoopConfig
from forecaster.simulate.policies import Limits
from forecaster.simulate.profiles import H100_70B
from forecaster.simulate.runner import simulate_trace
from forecaster.simulate.traces import RequestTrace, read_azure_csv, servegen_requests
from tests.support import TRACES


def _slice(trace: RequestTrace, start_s: float, seconds: float) -> RequestTrace:
    keep = (trace.arrival_s >= start_s) & (trace.arrival_s < start_s + seconds)
    return RequestTrace(trace.name + "-slice", trace.arrival_s[keep] - start_s, trace.prompt_tokens[keep],
                        trace.output_tokens[keep])


def _traces():
    azure = TRACES / "azure2023_code.csv"
    servegen = TRACES / "servegen_language_m-large"
    if not azure.is_file() or not servegen.is_dir():
        pytest.skip("needs ../shared/traces")
    lengths = read_azure_csv(azure)
    yield "azure x2", _slice(read_azure_csv(azure, rate_scale=2.0), 600, 900)
    yield "servegen x0.02", servegen_requests(servegen, lengths, 34200, 900, 0.02, 0)


def test_oracle_costs_no_more_than_the_static_fleet_on_every_bundled_trace():
    loop = LoopConfig(cold_start_s=60.0, metric_delay_s=15.0, drain_limit_s=600.0)
    limits = Limits(1, 40)
    for name, trace in _traces():
        runs, _ = simulate_trace(trace, H100_70B, ["static", "oracle"], loop, limits, tick_s=0.2, target=0.99)
        by = {r.result.policy: r.result for r in runs}
        assert len(trace) > 500, name
        # Both reach the target (or the oracle is the fixed fleet itself), and the oracle is the floor.
        assert by["static"].attainment >= 0.99, (name, by["static"])
        assert by["oracle"].attainment >= 0.99, (name, by["oracle"])
        assert by["oracle"].replica_minutes <= by["static"].replica_minutes + 1e-9, (name, by["oracle"], by["static"])
        assert np.isfinite(by["oracle"].ttft_p99_s)
