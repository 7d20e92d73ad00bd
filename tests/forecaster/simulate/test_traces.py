"""Trace readers: Azure scaling and per-request ServeGen slices drawn from the fitted clients."""

from __future__ import annotations

import numpy as np
import pytest

from forecaster.simulate.traces import read_azure_csv, read_request_trace, servegen_requests
from tests.support import TRACES

AZURE = TRACES / "azure2023_code.csv"
SERVEGEN = TRACES / "servegen_language_m-large"
# ../shared/traces is beside the checkout in CI; a clone elsewhere skips, as the other trace tests do.
pytestmark = pytest.mark.skipif(not AZURE.exists(), reason="needs ../shared/traces")


def test_azure_rate_scale_replays_every_request_k_times():
    base = read_azure_csv(AZURE)
    scaled = read_azure_csv(AZURE, rate_scale=4, seed=0)
    # The traces README: 8,819 requests over 57 min. Integer k = 4 copies each, exactly.
    assert len(base) == 8819 and len(scaled) == 4 * 8819
    assert sorted(scaled.prompt_tokens.tolist()) == sorted(np.repeat(base.prompt_tokens, 4).tolist())
    assert np.all(np.diff(scaled.arrival_s) >= 0)
    assert abs(scaled.duration_s - base.duration_s) <= 1.0  # +-0.5 s jitter at either end


def test_the_mooncake_trace_replays_as_its_readme_describes_it():
    # The traces README: 12,031 requests over 58.9 minutes; lengths as recorded, arrivals from 0.
    trace = read_request_trace(TRACES / "mooncake_conversation.jsonl")
    assert trace.name == "mooncake_conversation" and len(trace) == 12031
    assert trace.arrival_s[0] == 0.0 and 58.8 * 60 < trace.duration_s < 59.0 * 60
    assert np.all(np.diff(trace.arrival_s) >= 0) and trace.prompt_tokens.max() > 100_000
    # It logs at 3 s (about 10 requests a timestamp): replayed spread over each interval, not as clumps.
    assert len(np.unique(trace.arrival_s)) == 12031 and np.diff(trace.arrival_s).max() < 3.1
    doubled = read_request_trace(TRACES / "mooncake_conversation.jsonl", rate_scale=2, seed=1)
    assert len(doubled) == 2 * 12031


def test_servegen_slice_counts_what_the_clients_rates_promise():
    lengths = read_azure_csv(AZURE)
    # Expected arrivals: sum over clients of rate x 600 s for windows 60..65 (hour 10), x 0.1.
    expected = 0.0
    for path in SERVEGEN.glob("chunk-*-trace.csv"):
        for line in path.read_text().splitlines():
            row = line.split(",")
            if 60 <= int(float(row[0]) // 600) < 66 and row[3]:
                expected += float(row[1]) * 600 * 0.1
    a = servegen_requests(SERVEGEN, lengths, start_s=36000, duration_s=3600, rate_scale=0.1, seed=5)
    b = servegen_requests(SERVEGEN, lengths, start_s=36000, duration_s=3600, rate_scale=0.1, seed=5)
    # Same seed, same trace; the count is random (drawn gaps) but ~120k draws land within 2 %.
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert len(a) == pytest.approx(expected, rel=0.02)
    assert a.arrival_s.min() >= 0 and a.arrival_s.max() < 3600
    assert set(np.unique(a.output_tokens)) <= set(np.unique(lengths.output_tokens))
