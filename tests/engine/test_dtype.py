"""--dtype: the auto rule, the info gauges, and bfloat16 against transformers in bfloat16."""

from __future__ import annotations

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from engine.dtype import MIN_SPEEDUP, bf16_wins, choose_dtype, cpu_bf16_flags, layer_shapes
from engine.parity import greedy_parity, hf_greedy
from tests.engine.test_model import prompts


def timings(**ratios):
    """shape -> {float32, bfloat16} seconds with float32 / bfloat16 = the given ratio."""
    return {name: {"float32": r * 1e-3, "bfloat16": 1e-3} for name, r in ratios.items()}


def test_bf16_must_win_every_shape_by_the_margin():
    assert bf16_wins(timings(decode_batch_1=1.3, decode_batch_32=2.9, prefill_chunk_256=2.9))
    # This machine's picture (AMD EPYC, avx512_bf16, torch 2.13): faster in batches, slower at
    # batch 1, so float32: auto must never be slower than float32.
    assert not bf16_wins(timings(decode_batch_1=0.66, decode_batch_32=2.9, prefill_chunk_256=2.9))
    # Faster, but within the noise margin: float32.
    assert not bf16_wins(timings(decode_batch_1=MIN_SPEEDUP - 0.01, decode_batch_32=3.0))
    assert not bf16_wins({})


def test_cpu_flags_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\n\nprocessor\t: 1\n")
    assert cpu_bf16_flags(info) == ["amx_bf16", "avx512_bf16"]
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n")
    assert cpu_bf16_flags(info) == []
    assert cpu_bf16_flags(tmp_path / "missing") is None


def test_explicit_dtype_is_taken_as_is_and_bad_values_are_named():
    c = choose_dtype("bfloat16", "cpu")
    assert (c.dtype, c.requested, c.reason) == ("bfloat16", "bfloat16", "requested")
    with pytest.raises(ValueError, match="--dtype must be auto, float32, bfloat16 or float16"):
        choose_dtype("fp8", "cpu")


def test_auto_without_bf16_instructions_never_measures(tiny_state):
    def measure(_cfg):
        raise AssertionError("no bf16 instructions: nothing to measure")

    c = choose_dtype("auto", "cpu", tiny_state[0], measure=measure, flags=[])
    assert (c.dtype, c.reason) == ("float32", "cpu_no_bf16_isa")


def test_auto_follows_the_measurement(tiny_state):
    cfg = tiny_state[0]
    fast = choose_dtype("auto", "cpu", cfg, measure=lambda _c: timings(decode_batch_1=1.5, decode_batch_32=2.0,
                                                                            prefill_chunk_256=2.0), flags=["amx_bf16"])
    assert (fast.dtype, fast.reason) == ("bfloat16", "cpu_bf16_faster") and "amx_bf16" in fast.detail
    slow = choose_dtype("auto", "cpu", cfg, measure=lambda _c: timings(decode_batch_1=0.7, decode_batch_32=2.0,
                                                                            prefill_chunk_256=2.0), flags=["avx512_bf16"])
    assert (slow.dtype, slow.reason) == ("float32", "cpu_bf16_slower") and "decode_batch_1 0.70x" in slow.detail


def test_a_quiet_measurement_is_kept_and_reused_a_busy_one_is_not(tiny_state, tmp_path, monkeypatch):
    import engine.dtype as dtype_mod

    cfg = tiny_state[0]
    calls = []
    answers = iter([timings(decode_batch_1=1.2, decode_batch_32=2.0), timings(decode_batch_1=0.9, decode_batch_32=2.0),
                    timings(decode_batch_1=0.9, decode_batch_32=2.0)])
    monkeypatch.setattr(dtype_mod, "time_projections", lambda c: calls.append(c) or next(answers))
    monkeypatch.setenv("GOODPUT_CACHE", str(tmp_path))
    monkeypatch.delenv("GOODPUT_DTYPE_REMEASURE", raising=False)
    monkeypatch.setattr(dtype_mod.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    first = choose_dtype("auto", "cpu", cfg, flags=["avx512_bf16"])
    again = choose_dtype("auto", "cpu", cfg, flags=["avx512_bf16"])
    # The second start reuses the first's answer instead of a fresh reading that would flip it.
    assert (first.dtype, again.dtype, len(calls)) == ("bfloat16", "bfloat16", 1)
    assert "kept in" in again.detail and again.timings == first.timings
    # Asked to measure again: it does, and keeps the new answer; a busy machine's answer is not kept.
    monkeypatch.setenv("GOODPUT_DTYPE_REMEASURE", "1")
    monkeypatch.setattr(dtype_mod.os, "getloadavg", lambda: (64.0, 1.0, 1.0))
    assert choose_dtype("auto", "cpu", cfg, flags=["avx512_bf16"]).dtype == "float32"
    monkeypatch.delenv("GOODPUT_DTYPE_REMEASURE")
    assert choose_dtype("auto", "cpu", cfg, flags=["avx512_bf16"]).dtype == "bfloat16"   # the kept one
    # A damaged file is measured over, not a crash.
    (tmp_path / "dtype-auto.json").write_text("{not json")
    assert choose_dtype("auto", "cpu", cfg, flags=["avx512_bf16"]).dtype == "float32" and len(calls) == 3


def test_auto_on_this_machine_measures_the_models_projections(tiny_state):
    # The real probe, whatever this CPU is: its choice must be the one its own timings imply.
    cfg = tiny_state[0]
    c = choose_dtype("auto", "cpu", cfg)
    assert c.requested == "auto"
    if c.reason == "cpu_no_bf16_isa":
        assert c.dtype == "float32" and not c.timings
    else:
        assert set(c.timings) == {"decode_batch_1", "decode_batch_32", "prefill_chunk_256"}
        assert all(t["float32"] > 0 and t["bfloat16"] > 0 for t in c.timings.values())
        assert c.dtype == ("bfloat16" if bf16_wins(c.timings) else "float32")
    # Fused Q/K/V and gate/up, as the engine stores them: 4 projections per layer.
    assert layer_shapes(cfg) == [(4 * 16 + 2 * 2 * 16, 64), (64, 64), (2 * 192, 64), (64, 192)]


def test_engine_with_auto_builds_in_the_chosen_dtype(make_engine):
    engine = make_engine(num_blocks=8, dtype="auto")
    want = getattr(torch, engine.dtype)
    assert engine.dtype_choice.requested == "auto" and engine.dtype in ("float32", "bfloat16")
    assert engine.runner.kv_caches[0][0].dtype == want and engine.runner.model.embed.dtype == want


def test_info_gauges_name_cache_and_dtype(make_engine):
    from engine.config_info import export_config_info

    engine = make_engine(num_blocks=8, dtype="bfloat16", enable_prefix_caching=False)
    registry = CollectorRegistry()
    export_config_info(registry, "tiny", engine)
    text = generate_latest(registry).decode()
    assert ('vllm:cache_config_info{block_size="16",cache_dtype="bfloat16",enable_prefix_caching="False",'
            'num_gpu_blocks="8"} 1.0') in text
    assert (f'goodput:engine_dtype_info{{device="{engine.cfg.device}",dtype="bfloat16",model_name="tiny",'
            'reason="requested",requested="bfloat16"} 1.0') in text


def test_float32_stays_exact_against_transformers_in_a_batch(make_engine, hf_tiny, tiny_tokenizer):
    res = greedy_parity(make_engine(num_blocks=128), hf_tiny, prompts(tiny_tokenizer)[:4], 12, batched=True)
    assert res.identical_share == 1.0 and res.first_divergence is None and res.argmax_agreement == 1.0
    assert res.max_abs_logit_diff < 1e-3


def test_bfloat16_against_transformers_in_bfloat16(make_engine, hf_tiny_bf16, tiny_tokenizer):
    # Kept tiny: bfloat16 on a CPU without fast bf16 kernels is slow. Prompts of 1-48 tokens.
    ps, n = prompts(tiny_tokenizer)[:4], 12
    engine = make_engine(num_blocks=128, dtype="bfloat16")
    ref = [hf_greedy(hf_tiny_bf16, p, n) for p in ps]
    alone = greedy_parity(engine, hf_tiny_bf16, ps, n, batched=False, reference=ref)
    batched = greedy_parity(engine, hf_tiny_bf16, ps, n, batched=True, reference=ref)
    print(alone.summary())
    print(batched.summary())
    assert alone.total_tokens == batched.total_tokens == 4 * n
    # Same rounding order as transformers' bfloat16 path (RMSNorm, rotary, SDPA): whole-prompt
    # logits agree to bfloat16 precision and pick the same top token almost everywhere.
    assert alone.max_abs_logit_diff < 0.25 and alone.argmax_agreement >= 0.95
    # One prompt at a time is what transformers does; most greedy tokens must agree. (Batched,
    # rows round differently in a 4-row step than alone: reported, not required to be equal.)
    assert alone.identical_share >= 0.75, alone.summary()
    assert engine.kv.pool.num_free_blocks == 128
