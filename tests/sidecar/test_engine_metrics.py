"""The engine scraper on real exposition text: vLLM (current and older names), SGLang, the bundled engine.

bundled_engine.txt was captured from `goodput engine serve --model tiny` after three requests;
the vLLM and SGLang files (sglang_cached.txt: the newer names for cached tokens and queue time)
follow those servers' exposition (HELP/TYPE lines, model_name and
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
        "prompt_tokens": {LLAMA: 2.18e6},       # read to split cached/computed; this vLLM has no cached counter
        "generation_tokens": {LLAMA: 340211.0 + 301877.0},   # as generated (the forecaster's decode fit)
    }
    # Per-request split: the two ranks' histograms add bucket by bucket.
    queue = s.histograms["queue_time"][LLAMA]
    assert queue.buckets == {0.3: 3100.0, 1.0: 3330.0, float("inf"): 3354.0}
    assert (queue.sum, queue.count) == (pytest.approx(402.5), 3354.0)
    assert s.histograms["prefill_time"][LLAMA].sum == pytest.approx(561.0)
    assert s.histograms["decode_time"][LLAMA].count == 3354.0


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
                        "kv_cache_usage_ratio": {LLAMA: pytest.approx(0.28)}, "prompt_tokens": {LLAMA: 8.128902e6},
                        "generation_tokens": {LLAMA: 7.557572e6}}
    assert s.histograms == {}      # 0.4-era SGLang: no queue histogram, no cached-token counter


def test_sglang_cached_tokens_and_queue_time():
    s = snap("sglang_cached.txt", models=(LLAMA,))
    # Cached tokens add over cache sources (device + host); computed = prompt - cached.
    assert s.values["prompt_tokens_cached"] == {LLAMA: 600000.0}
    assert s.values["prompt_tokens_computed"] == {LLAMA: 300000.0}
    assert s.histograms["queue_time"][LLAMA].buckets == {0.0: 0.0, 0.1: 700.0, 1.0: 950.0, float("inf"): 1000.0}
    assert set(s.histograms) == {"queue_time"}          # SGLang has no per-request prefill/decode histogram
    assert s.prefill_seconds_per_token(LLAMA) is None


def test_bundled_engine_capture():
    s = snap("bundled_engine.txt", models=("tiny",))
    # Values as captured: idle engine after three chats with one system prompt (the third repeats
    # the first): 117 prompt tokens, 48 of them (three 16-token blocks) served from the cache.
    assert s.values == {"requests_running": {"tiny": 0.0}, "requests_waiting": {"tiny": 0.0},
                        "kv_cache_usage_ratio": {"tiny": 0.0}, "preemptions": {"tiny": 0.0},
                        "prefix_cache_queries": {"tiny": 117.0}, "prefix_cache_hits": {"tiny": 48.0},
                        "prompt_tokens": {"tiny": 117.0}, "prompt_tokens_cached": {"tiny": 48.0},
                        "prompt_tokens_computed": {"tiny": 69.0}, "prefill_computed_tokens": {"tiny": 69.0},
                        # 24 tokens generated in 24 iterations: three chats of 8 tokens, one at a time.
                        "generation_tokens": {"tiny": 24.0}, "engine_steps": {"tiny": 24.0}}
    assert {h: s.histograms[h]["tiny"].count for h in s.histograms} == {"queue_time": 3.0, "prefill_time": 3.0,
                                                                         "decode_time": 3.0}
    # Prefill seconds per computed token: the prefill histogram's sum over the KV-computed tokens.
    assert s.prefill_seconds_per_token("tiny") == pytest.approx(s.histograms["prefill_time"]["tiny"].sum / 69.0)


def test_bundled_engine_exports_vllms_current_names_only():
    text = (FIXTURES / "bundled_engine.txt").read_text()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
            "vllm:request_inference_time_seconds", "vllm:request_prefill_kv_computed_tokens",
            "vllm:prompt_tokens_cached", "vllm:iteration_tokens_total"} <= names
    # Names vLLM removed (#29330, #32661) are read from older servers but not exported here.
    assert not {n for n in names if "gpu_" in n or n == "vllm:time_per_output_token_seconds"}


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
    assert families["goodput_engine_queue_time_seconds"].type == "histogram"
    assert registry.get_sample_value("goodput_engine_queue_time_seconds_bucket", {"model": LLAMA, "le": "0.3"}) == 3100.0
    assert registry.get_sample_value("goodput_engine_queue_time_seconds_count", {"model": LLAMA}) == 3354.0
    assert registry.get_sample_value("goodput_engine_prompt_tokens_cached_total", {"model": LLAMA}) is None
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


def test_collector_exports_the_ttft_split_of_the_bundled_engine():
    registry = CollectorRegistry()
    collector = EngineCollector()
    registry.register(collector)
    collector.update(snap("bundled_engine.txt", models=("tiny",)))
    get = registry.get_sample_value
    assert get("goodput_engine_prompt_tokens_cached_total", {"model": "tiny"}) == 48.0
    assert get("goodput_engine_prompt_tokens_computed_total", {"model": "tiny"}) == 69.0
    for part in ("queue", "prefill", "decode"):
        assert get(f"goodput_engine_{part}_time_seconds_count", {"model": "tiny"}) == 3.0
        assert get(f"goodput_engine_{part}_time_seconds_bucket", {"model": "tiny", "le": "+Inf"}) == 3.0
    # vLLM's buckets pass through unchanged (0.3 s is its first request-latency bucket).
    assert get("goodput_engine_queue_time_seconds_bucket", {"model": "tiny", "le": "0.3"}) == 3.0
    assert collector.prefill_seconds_per_token("tiny") > 0


def test_llamacpp_capture():
    # Captured from llama-server --metrics (-np 1, --threads-http 8) serving SmolLM2 while one
    # request decoded in its single slot and two more waited for it; llama.cpp has no model label.
    s = snap("llamacpp.txt", single="smollm2")
    assert s.flavour == "llamacpp"
    # Prefix-cache lookups are the prompt tokens it processed (40) plus those it reused (38).
    assert s.values == {"requests_running": {"smollm2": 1.0}, "requests_waiting": {"smollm2": 2.0},
                        "prefix_cache_hits": {"smollm2": 38.0}, "prefix_cache_queries": {"smollm2": 78.0}}


def _reference_samples(text: str):
    """What prometheus_client's own parser reads from `text`, for the samples normalise() uses."""
    from sidecar.engine_metrics import HISTOGRAM_SOURCES, SOURCES

    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            hist = family.name if family.type == "histogram" and family.name in HISTOGRAM_SOURCES else None
            if hist is not None and s.name.endswith(("_bucket", "_sum", "_count")):
                out.append((s.name, dict(s.labels), s.value, hist))
            elif s.name in SOURCES and not (family.type == "histogram" and family.name in HISTOGRAM_SOURCES):
                out.append((s.name, dict(s.labels), s.value, None))
    return out


TRICKY = """# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a \\"quoted\\" name, with {braces}"} 3.0
vllm:num_requests_waiting {model_name="back\\\\slash\\nline"}   +Inf 1700000000000
vllm:num_requests_running 2
vllm:kv_cache_usage_perc{model_name="m",} NaN
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{le="0.5",model_name="m"} 4.0
vllm:request_queue_time_seconds_bucket{le="+Inf",model_name="m"} 5.0
vllm:request_queue_time_seconds_sum{model_name="m"} 1.25e0
vllm:request_queue_time_seconds_count{model_name="m"} 5
vllm:iteration_tokens_total_count{model_name="m"} 17
"""


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.txt")) + ["tricky"])
def test_the_scrapers_own_parser_reads_what_prometheus_clients_does(name):
    # normalise() parses only the lines it uses, itself (a third of prometheus_client's time on
    # these pages); on every captured page, and on lines with escapes, braces and commas inside
    # label values, spaces, a timestamp, +Inf and NaN, it must read exactly the same samples.
    from sidecar.engine_metrics import _samples

    text = TRICKY if name == "tricky" else (FIXTURES / name).read_text()
    got = [(n, labels, v, h) for n, labels, v, h in _samples(text)]
    want = _reference_samples(text)
    key = lambda s: (s[0], sorted(s[1].items()))  # noqa: E731
    assert len(got) == len(want) and len(got) > 0
    for g, w in zip(sorted(got, key=key), sorted(want, key=key)):
        assert g[:2] == w[:2] and g[3] == w[3]
        assert g[2] == w[2] or (g[2] != g[2] and w[2] != w[2])   # NaN equals NaN here


def test_a_malformed_wanted_line_is_an_error_and_an_unwanted_one_is_skipped():
    from sidecar.engine_metrics import _samples

    with pytest.raises(ValueError, match="malformed labels"):
        list(_samples('vllm:num_requests_waiting{model_name="m" 3\n'))
    with pytest.raises(ValueError, match="no value"):
        list(_samples("vllm:num_requests_waiting\n"))
    with pytest.raises(ValueError):
        list(_samples('vllm:num_requests_waiting{model_name="m"} three\n'))
    # Lines the scraper does not read are not parsed, so they cannot fail it.
    assert list(_samples('# TYPE x gauge\nx{broken 1\n{"no": "name"} 1\nvllm:num_requests_running 2\n')) == [
        ("vllm:num_requests_running", {}, 2.0, None)]
    with pytest.raises(ValueError, match="not Prometheus exposition"):
        list(_samples("<html><body>502 Bad Gateway</body></html>\n"))
