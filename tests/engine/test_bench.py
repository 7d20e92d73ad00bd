"""`goodput bench engine` runs end to end (tiny model, --quick) and its numbers add up."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support import goodput_command


def test_bench_engine_json_is_consistent(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run(goodput_command("bench", "engine", "--model", "tiny", "--quick", "--dtype", "both",
                                       "--json", str(out)), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["dtypes"] == ["float32", "bfloat16"]
    res, bf = doc["runs"]
    # bfloat16 halves the bytes a decode step reads, and its compute floor uses a bfloat16 matmul.
    assert bf["weight_bytes"] * 2 == res["weight_bytes"] == res["model_params"] * 4
    assert bf["machine"]["matmul_dtype"] == "bfloat16" and res["machine"]["matmul_dtype"] == "float32"
    assert bf["floors"]["decode_step_s"] == pytest.approx(bf["weight_bytes"] / (bf["machine"]["memory_read_gb_s"] * 1e9))
    assert bf["floors"]["prefill_s_per_token"] == pytest.approx(2 * bf["model_params"] / (bf["machine"]["matmul_gflop_s"] * 1e9))
    assert "side by side" in r.stdout and "bfloat16 / float32" in r.stdout
    m, f = res["machine"], res["floors"]
    # Floors are derived from rates measured in this same run.
    assert f["decode_step_s"] == pytest.approx(res["weight_bytes"] / (m["memory_read_gb_s"] * 1e9))
    assert f["prefill_s_per_token"] == pytest.approx(2 * res["model_params"] / (m["matmul_gflop_s"] * 1e9))
    assert [d["batch"] for d in res["engine_decode"]] == [1, 8, 32]
    assert [h["batch"] for h in res["transformers_decode"]] == [1, 8]
    for d in res["engine_decode"]:
        assert d["tokens_per_s"] == pytest.approx(d["batch"] / d["step_s"]) and d["steps_measured"] >= 3
        assert res["ratios"][f"decode_b{d['batch']}_over_floor"] == pytest.approx(d["step_s"] / f["decode_step_s"])
    by_batch = {d["batch"]: d for d in res["engine_decode"]}
    for h in res["transformers_decode"]:
        ratio = by_batch[h["batch"]]["tokens_per_s"] / h["tokens_per_s"]
        assert res["ratios"][f"decode_b{h['batch']}_over_transformers"] == pytest.approx(ratio)
        assert (f"decode_b{h['batch']}_2x_transformers" in res["ratios"]["missed"]) == (ratio < 2)
    assert res["engine_prefill"]["tokens"] == 1024
    # Chunking bounds the step: the 1,024-token prefill is 1 step unchunked; with a 128-token budget
    # the 4 decodes take 4 tokens a step, leaving 124 for the prompt: ceil(1024 / 124) = 9 steps.
    stalls = {st["budget"]: st for st in res["prefill_stall"]}
    assert stalls[None]["steps"] == 1 and stalls[128]["steps"] == 9
    # Every missed target comes with a profile of where the time went.
    if any(k.startswith("decode") and "floor" in k for k in res["ratios"]["missed"]):
        assert res["profiles"]["decode_batch_1"] and res["profiles"]["decode_batch_32"]
    assert "engine decode, batch 32" in r.stdout and "transformers generate, batch 8" in r.stdout
