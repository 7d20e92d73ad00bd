"""Profiles: built-in numbers and profiles fitted from a `goodput bench engine --json` result."""

from __future__ import annotations

import json

import pytest

from forecaster.simulate.profiles import CPU_SMOLLM2, H100_70B, load_profile


def test_bench_result_becomes_a_linear_step_model(tmp_path):
    # DESIGN.md's CPU figures as a bench result: 75 ms at batch 1, 327 ms at batch 32. Two points
    # fit exactly: slope (0.327 - 0.075) / 31 = 8.129 ms per sequence, intercept 66.87 ms.
    bench = {"model": "smollm2", "engine_decode": [{"batch": 1, "step_s": 0.075}, {"batch": 32, "step_s": 0.327}],
             "engine_prefill": {"tokens": 1024, "seconds": 4.0, "tokens_per_s": 256.0}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    profile = load_profile(str(path))
    assert profile.decode_per_seq_s == pytest.approx(0.252 / 31)
    assert profile.decode_base_s == pytest.approx(0.075 - 0.252 / 31)
    assert profile.step_s(32) == pytest.approx(0.327)
    assert profile.prefill_tokens_per_s == 256.0
    assert profile.kv_capacity_tokens == CPU_SMOLLM2.kv_capacity_tokens


def test_builtin_profiles_match_their_stated_sources():
    # CPU: 75 ms at batch 1 and 327 ms at batch 32 (DESIGN.md), to the fitted rounding.
    assert CPU_SMOLLM2.step_s(1) == pytest.approx(0.075, abs=1e-4)
    assert CPU_SMOLLM2.step_s(32) == pytest.approx(0.327, abs=1e-3)
    # H100 70B: 39 ms a step at batch 64 (cautious side of ~19-40 ms published), 2 s / 200 ms SLO.
    assert H100_70B.step_s(64) == pytest.approx(0.0392)
    assert (H100_70B.slo.ttft_s, H100_70B.slo.tpot_s) == (2.0, 0.2)


def test_unknown_profile_says_what_exists():
    with pytest.raises(ValueError, match="cpu-smollm2, h100-70b"):
        load_profile("a100-7b")


def test_bench_result_is_read_as_the_forecasters_prior_reads_it(tmp_path):
    """One reader for a bench result: the simulator's profile and the forecaster's prior
    (forecaster.service_prior.model_from_bench) get the same step, concave from three batch sizes
    on (the AMD EPYC host's SmolLM2 float32 steps), and the same error for a bad file."""
    from forecaster.service_prior import model_from_bench

    bench = {"model": "smollm2", "engine_decode": [{"batch": b, "step_s": s} for b, s in
                                                   ((1, 0.0431), (8, 0.1010), (32, 0.1722))],
             "engine_prefill": {"tokens_per_s": 590.0}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    profile = load_profile(str(path))
    prior = model_from_bench(bench)
    assert profile.decode_log_s > 0
    for b in (1, 4, 16, 32, 64):
        assert profile.step_s(b) == pytest.approx(prior.step_s(b))
    assert profile.step_s(32) == pytest.approx(0.1722, rel=0.05)
    bad = tmp_path / "one-point.json"
    bad.write_text(json.dumps({**bench, "engine_decode": bench["engine_decode"][:1]}))
    with pytest.raises(ValueError, match="two or more batch sizes"):
        load_profile(str(bad))
