"""The engine scraper on real exposition text: vLLM (current and older names), SGLang, the bundled engine.

bundled_engine.txt was captured from `goodput engine serve --model tiny` after three requests;
the vLLM and SGLang files follow those servers' exposition (HELP/TYPE lines, model_name and
engine / tp_rank labels, histograms and info series the scraper must skip).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.engine_metrics import EngineCollector, normalise
from sidecar.metrics import ModelLabels

FIXTURES = Path(__file__).parent / "fixtures"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def snap(name: str, models=(), single=None):
    return normalise((FIXTURES / name).read_text(), ModelLabels(tuple(models)), single)


def test_vllm_current_names_with_two_dp_ranks():
    s = snap("vllm_v1_new.txt", models=(LLAMA,))
    assert s.flavour == "vllm"
    # Counts and counters add over the two engine ranks; the KV ratio is their mean (equal caches).
    assert s.values == {
        "requests_running": {LLAMA: 21.0},
        "requests_waiting": {LLAMA: 4.0},
        "kv_cache_usage_ratio": {LLAMA: pytest.approx(0.5)},
        "prefix_cache_queries": {LLAMA: 200000.0},
        "prefix_cache_hits": {LLAMA: 75000.0},
        "preemptions": {LLAMA: 7.0},
    }


def test_vllm_older_names_map_to_the_same_signals():
    s = snap("vllm_v1_old_names.txt", models=("Qwen/Qwen2.5-7B-Instruct",))
    q = "Qwen/Qwen2.5-7B-Instruct"
    assert s.values["kv_cache_usage_ratio"] == {q: pytest.approx(0.153)}
    assert s.values["prefix_cache_queries"] == {q: 52184.0}
    assert s.values["prefix_cache_hits"] == {q: 20016.0}
    assert s.values["requests_running"] == {q: 7.0} and s.values["preemptions"] == {q: 0.0}


def test_sglang_names():
    s = snap("sglang.txt", models=(LLAMA,))
    assert s.flavour == "sglang"
    assert s.values == {"requests_running": {LLAMA: 162.0}, "requests_waiting": {LLAMA: 2826.0},
                        "kv_cache_usage_ratio": {LLAMA: pytest.approx(0.28)}}


def test_bundled_engine_capture():
    s = snap("bundled_engine.txt", models=("tiny",))
    # Values as captured: idle engine, 39 prompt tokens looked up in the prefix cache, no hits.
    assert s.values == {"requests_running": {"tiny": 0.0}, "requests_waiting": {"tiny": 0.0},
                        "kv_cache_usage_ratio": {"tiny": 0.0}, "preemptions": {"tiny": 0.0},
                        "prefix_cache_queries": {"tiny": 39.0}, "prefix_cache_hits": {"tiny": 0.0}}


def test_models_outside_the_allow_list_become_other():
    s = snap("vllm_v1_new.txt", models=("some-other-model",))
    assert s.values["requests_waiting"] == {"other": 4.0}


def test_unlabelled_series_belong_to_the_single_configured_model():
    text = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 3.0\n"
    assert normalise(text, ModelLabels(("m",)), "m").values == {"requests_waiting": {"m": 3.0}}
    assert normalise(text, ModelLabels(()), None).values == {"requests_waiting": {"other": 3.0}}


def test_auto_model_labels_are_bounded():
    labels = ModelLabels((), max_auto=2)
    assert [labels.label(m) for m in ("a", "b", "c", "a", None)] == ["a", "b", "other", "a", "other"]


def test_collector_exports_contract_names_and_up():
    registry = CollectorRegistry()
    collector = EngineCollector()
    registry.register(collector)
    assert registry.get_sample_value("goodput_engine_up") == 0.0      # nothing scraped yet
    collector.update(snap("vllm_v1_new.txt", models=(LLAMA,)))
    text = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["goodput_engine_preemptions"].type == "counter"
    assert families["goodput_engine_kv_cache_usage_ratio"].type == "gauge"
    assert registry.get_sample_value("goodput_engine_up") == 1.0
    assert registry.get_sample_value("goodput_engine_requests_waiting", {"model": LLAMA}) == 4.0
    assert registry.get_sample_value("goodput_engine_prefix_cache_hits_total", {"model": LLAMA}) == 75000.0
    assert registry.get_sample_value("goodput_engine_prefix_cache_queries_total", {"model": LLAMA}) == 200000.0
    collector.update(None)    # a failed scrape
    assert registry.get_sample_value("goodput_engine_up") == 0.0
    # Counters keep their last value (no false reset for rate()).
    assert registry.get_sample_value("goodput_engine_preemptions_total", {"model": LLAMA}) == 7.0


def test_scrape_of_a_live_upstream_and_of_a_dead_one(sidecars, tmp_path, start_server, port):
    """The sidecar's scraper against a scripted upstream that serves the vLLM fixture."""
    from tests.sidecar.conftest import upstream_command
    start_server(upstream_command(port, "--metrics-file", str(FIXTURES / "vllm_v1_new.txt")),
                 f"http://127.0.0.1:{port}/health", name="metrics-upstream")
    live = sidecars.start(f"http://127.0.0.1:{port}", models=(LLAMA,))
    assert live.call(live.app.scrape_once()) is True
    assert live.value("goodput_engine_up") == 1.0
    assert live.value("goodput_engine_requests_running", model=LLAMA) == 21.0
    dead = sidecars.start("http://127.0.0.1:9", models=(LLAMA,))     # port 9: nothing listens
    assert dead.call(dead.app.scrape_once()) is False
    assert dead.value("goodput_engine_up") == 0.0


def test_llamacpp_capture():
    # Captured from llama-server --metrics (-np 1, --threads-http 8) serving SmolLM2 while one
    # request decoded in its single slot and two more waited for it; llama.cpp has no model label.
    s = snap("llamacpp.txt", single="smollm2")
    assert s.flavour == "llamacpp"
    # Prefix-cache lookups are the prompt tokens it processed (40) plus those it reused (38).
    assert s.values == {"requests_running": {"smollm2": 1.0}, "requests_waiting": {"smollm2": 2.0},
                        "prefix_cache_hits": {"smollm2": 38.0}, "prefix_cache_queries": {"smollm2": 78.0}}
