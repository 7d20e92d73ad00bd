"""Trace readers on the real shared traces, and the replay transforms."""

from __future__ import annotations

import json

import pytest

from sidecar.loadgen.traces import TraceError, fit_to_model, read_trace, window
from tests.support import TRACES

AZURE = TRACES / "azure2023_code.csv"
MOONCAKE = TRACES / "mooncake_conversation.jsonl"

needs_traces = pytest.mark.skipif(not AZURE.exists(), reason="../shared/traces not present")


@needs_traces
def test_azure_trace_matches_its_readme():
    reqs = read_trace(AZURE)
    # The traces README: 8,819 requests over 57 min, mean ContextTokens 2,048, max 7,437.
    assert len(reqs) == 8819
    assert reqs[0].arrival == 0.0
    assert 56 * 60 < reqs[-1].arrival < 58 * 60
    assert max(r.input_tokens for r in reqs) == 7437
    assert round(sum(r.input_tokens for r in reqs) / len(reqs)) in range(2040, 2056)


@needs_traces
def test_mooncake_trace_keeps_hash_ids():
    reqs = read_trace(MOONCAKE)
    assert len(reqs) == 12031
    first = json.loads(MOONCAKE.open().readline())
    assert reqs[0].hash_ids == tuple(first["hash_ids"])
    # README: len(hash_ids) == ceil(input_length / 512).
    assert all(len(r.hash_ids) == -(-r.input_tokens // 512) for r in reqs[:500])


def test_burstgpt_reader(tmp_path):
    path = tmp_path / "burst.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,472,18,490,Conversation log\n2,GPT-4,1087,0,1087,Conversation log\n")
    reqs = read_trace(path)
    assert [(r.arrival, r.input_tokens, r.output_tokens) for r in reqs] == [(0.0, 1087, 1), (3.0, 472, 18)]


def test_unreadable_traces_name_the_problem(tmp_path):
    with pytest.raises(TraceError, match="no such trace"):
        read_trace(tmp_path / "missing.csv")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5}\n')
    with pytest.raises(TraceError, match=r"bad.jsonl:1"):
        read_trace(bad)


def test_window_speedup_and_fit():
    from sidecar.loadgen.workload import PlannedRequest

    reqs = [PlannedRequest(float(t), 1024 * (t + 1), 100, (t, t + 1)) for t in range(10)]
    picked = window(reqs, start=2, duration=4, speedup=2)
    # Arrivals 2,3,4,5 re-based to 0 and halved.
    assert [r.arrival for r in picked] == [0.0, 0.5, 1.0, 1.5]
    fitted, report = fit_to_model(reqs, max_model_len=2048, max_output=64)
    # The longest prompt (10,240) must fit in 2047 tokens: one factor 2046/10240 for all.
    assert report.scale == pytest.approx(2046 / 10240)
    assert max(r.input_tokens for r in fitted) <= 2046
    assert all(r.output_tokens <= 64 for r in fitted)
    assert report.requests_scaled == 10
    # 512-token blocks scale with the prompts, so prefix structure survives.
    assert report.block_tokens == int(512 * report.scale)


def test_fixed_scale_keeps_block_size_and_truncates_only_the_longest():
    from sidecar.loadgen.workload import PlannedRequest

    reqs = [PlannedRequest(0.0, 1024, 10, (1, 2)), PlannedRequest(1.0, 20480, 10, tuple(range(40)))]
    fitted, report = fit_to_model(reqs, max_model_len=2048, max_input=512, scale=1 / 16)
    # 512-token blocks become 32-token blocks; 1024 → 64 tokens; 20,480 → 1,280 truncated to 511.
    assert report.block_tokens == 32
    assert [r.input_tokens for r in fitted] == [64, 511]
    with pytest.raises(ValueError, match="scale"):
        fit_to_model(reqs, 2048, scale=2.0)


def test_long_prompt_mix():
    import numpy as np

    from sidecar.loadgen.workload import synthetic_workload

    reqs = synthetic_workload(np.arange(2000.0), 64, 32, long_fraction=0.1, long_input_tokens=1024, seed=3)
    longs = sum(r.input_tokens == 1024 for r in reqs)
    # Binomial(2000, 0.1): mean 200, sd 13.4; four sd either side.
    assert 146 < longs < 254
    assert all(r.input_tokens in (64, 1024) and r.output_tokens == 32 for r in reqs)


def test_tied_timestamps_spread_to_the_next_one():
    from sidecar.loadgen.traces import spread_ties
    from sidecar.loadgen.workload import PlannedRequest

    trace = [PlannedRequest(0.0, 1, 1), PlannedRequest(0.0, 2, 1), PlannedRequest(3.0, 3, 1),
             PlannedRequest(3.0, 4, 1), PlannedRequest(3.0, 5, 1), PlannedRequest(6.0, 6, 1)]
    out = spread_ties(trace)
    assert [r.arrival for r in out] == pytest.approx([0.0, 1.5, 3.0, 4.0, 5.0, 6.0])
    assert [r.input_tokens for r in out] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("ties, arrivals", [("spread", [0.0, 1.5, 3.0, 4.0, 5.0, 6.0]),
                                            ("as-logged", [0.0, 0.0, 3.0, 3.0, 3.0, 6.0])])
def test_load_replays_tied_timestamps_spread_unless_asked_as_logged(tmp_path, ties, arrivals):
    # Mooncake logs at 3 s: `goodput load --trace` spreads a timestamp's requests to the next
    # one by default, as the demo and the simulator replay them; --trace-ties as-logged sends
    # them together.
    import argparse

    from sidecar.loadgen.cli import _common, build_workload

    path = tmp_path / "tied.jsonl"
    path.write_text("".join(json.dumps({"timestamp": ms, "input_length": 100 + i, "output_length": 4,
                                        "hash_ids": [i]}) + "\n"
                            for i, ms in enumerate([0, 0, 3000, 3000, 3000, 6000])))
    p = argparse.ArgumentParser()
    _common(p)
    reqs, _, _ = build_workload(p.parse_args(["--trace", str(path), "--trace-ties", ties]))
    assert [r.arrival for r in reqs] == pytest.approx(arrivals)
    assert [r.input_tokens for r in reqs] == [100, 101, 102, 103, 104, 105]
