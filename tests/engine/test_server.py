"""`goodput engine serve --model tiny` over HTTP: the official openai client, errors, disconnects."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.support import ServerProcess, free_port, goodput_command


@pytest.fixture(scope="module")
def server():
    port = free_port()
    # 64 blocks x 16 = 1024 tokens of KV: small enough that a leak would show in the usage gauge.
    # float32 pinned: --dtype auto may pick bfloat16 on some CPUs, where a batched step rounds
    # differently from a lone one and concurrent streams would not equal one-at-a-time ones.
    proc = ServerProcess(goodput_command("engine", "serve", "--model", "tiny", "--port", str(port),
                                         "--num-blocks", "64", "--max-model-len", "2048", "--dtype", "float32"),
                         f"http://127.0.0.1:{port}/health", timeout=120, name="engine-tiny")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()
        print(proc.log()[-3000:])


def metric(base: str, name: str, **labels) -> float:
    text = httpx.get(base + "/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{"):
            lab, value = line[len(name) + 1:].rsplit("} ", 1)
            if all(part in lab.split(",") for part in want.split(",") if part):
                return float(value)
    raise AssertionError(f"{name}{labels} not in /metrics")


def test_openai_client_streams_chat_with_usage(server):
    from openai import OpenAI

    client = OpenAI(base_url=server + "/v1", api_key="none")
    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Tell me about lighthouses."}], max_tokens=12,
        temperature=0, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    # role-only first chunk, content chunks, a finish chunk, then the usage chunk with no choices.
    assert chunks[0].choices[0].delta.role == "assistant" and not chunks[0].choices[0].delta.content
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    text = "".join(c.choices[0].delta.content or "" for c in chunks[1:-2])
    assert text and all(c.choices[0].finish_reason is None for c in chunks[1:-2])
    # The same request without streaming produces the same greedy text.
    full = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Tell me about lighthouses."}],
                                          max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    assert full.choices[0].message.content == text
    assert full.usage.prompt_tokens == chunks[-1].usage.prompt_tokens


def test_completion_stop_string_cuts_text(server):
    body = {"model": "tiny", "prompt": "The lighthouse", "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    full = httpx.post(server + "/v1/completions", json=body).json()
    text = full["choices"][0]["text"]
    assert full["usage"]["completion_tokens"] == 16 and full["choices"][0]["finish_reason"] == "length"
    stop = text[len(text) // 2: len(text) // 2 + 3]
    cut = httpx.post(server + "/v1/completions", json={**body, "stop": [stop]}).json()
    # Greedy decoding repeats the same text up to the first occurrence of the stop string.
    assert cut["choices"][0]["text"] == text[: text.index(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("body,param", [
    (b"{not json", None),
    ({"model": "gpt-4", "prompt": "hi"}, "model"),
    ({"model": "tiny", "prompt": "hi " * 3000}, "max_tokens"),
    ({"model": "tiny", "prompt": "hi", "max_tokens": 4000}, "max_tokens"),
    ({"model": "tiny", "prompt": "hi", "temperature": -1}, None),
    ({"model": "tiny", "prompt": "hi", "top_p": 2}, None),
    ({"model": "tiny", "prompt": "hi", "max_tokens": "ten"}, "max_tokens"),
    ({"model": "tiny", "prompt": 5}, "prompt"),
    ({"model": "tiny", "prompt": "hi", "n": 2}, "n"),
    ({"model": "tiny", "messages": []}, "messages"),
], ids=["bad-json", "unknown-model", "prompt-too-long", "max-tokens-over-cache", "temperature", "top_p",
        "max-tokens-type", "prompt-type", "n", "no-messages"])
def test_bad_input_is_400_in_openai_shape(server, body, param):
    path = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else "/v1/completions"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server + path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == 400 and err["message"]
    assert err["param"] == param


def test_disconnect_aborts_and_frees_blocks(server):
    aborted = metric(server, "vllm:request_success_total", finished_reason="abort") if "abort" in httpx.get(server + "/metrics").text else 0.0
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: {") for line in got)
        assert metric(server, "vllm:num_requests_running", model_name="tiny") == 1
        assert metric(server, "vllm:kv_cache_usage_perc", model_name="tiny") > 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and metric(server, "vllm:num_requests_running", model_name="tiny") != 0:
        time.sleep(0.1)
    # The request was aborted long before 1000 tokens and every block is free again.
    assert metric(server, "vllm:num_requests_running", model_name="tiny") == 0
    assert metric(server, "vllm:kv_cache_usage_perc", model_name="tiny") == 0
    assert metric(server, "vllm:request_success_total", finished_reason="abort") == aborted + 1


def test_tenant_header_salts_the_prefix_cache(server):
    prompt = "The keeper counted the steps as his father taught him, one hundred and twelve. " * 3
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1}

    def cached(tenant):
        r = httpx.post(server + "/v1/completions", json=body, headers={"X-Tenant": tenant}).json()
        return r["usage"]["prompt_tokens_details"]["cached_tokens"], r["usage"]["prompt_tokens"]

    first, n = cached("alpha")
    again, _ = cached("alpha")
    other, _ = cached("beta")
    assert first == 0
    assert again == (n - 1) // 16 * 16       # every full block but the one holding the last token
    assert other == 0                          # another tenant never sees alpha's blocks


def test_models_health_and_metric_names(server):
    assert httpx.get(server + "/health").status_code == 200
    data = httpx.get(server + "/v1/models").json()["data"]
    assert [m["id"] for m in data] == ["tiny"] and data[0]["tokenizer_path"].endswith("tokenizer.json")
    text = httpx.get(server + "/metrics").text
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket"):
        assert f'{name}{{' in text, name
    assert metric(server, "vllm:cache_config_info", block_size="16", cache_dtype="float32", num_gpu_blocks="64") == 1
    assert metric(server, "goodput:engine_dtype_info", model_name="tiny", dtype="float32", requested="float32",
                  reason="requested") == 1


@pytest.mark.slow
def test_openai_client_streams_english_from_smollm2(start_server, port):
    from openai import OpenAI

    start_server(goodput_command("engine", "serve", "--model", "smollm2", "--port", str(port), "--max-model-len", "2048"),
                 f"http://127.0.0.1:{port}/health", timeout=600, name="engine-smollm2")
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
    stream = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
        max_tokens=40, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    # SmolLM2-135M-Instruct knows this one; greedy decoding makes the answer deterministic.
    assert "Paris" in text, text
    words = text.split()
    assert len(words) >= 4 and all(w.isascii() for w in words), text


def test_concurrent_streams_match_one_at_a_time(server):
    import asyncio

    prompts = [f"Request number {i} asks about lighthouses and " + "the sea " * i for i in range(12)]

    async def one(client, prompt):
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        text, usage = "", None
        async with client.stream("POST", server + "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    obj = json.loads(line[6:])
                    if obj["choices"]:
                        text += obj["choices"][0]["text"]
                    usage = obj.get("usage") or usage
        return text, usage["completion_tokens"]

    async def run_all():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(one(client, p) for p in prompts))

    together = asyncio.run(run_all())
    alone = [httpx.post(server + "/v1/completions", json={"model": "tiny", "prompt": p, "max_tokens": 10,
                                                          "temperature": 0, "ignore_eos": True}).json()
             for p in prompts]
    # Batching twelve requests into shared steps changes no token: greedy text is identical.
    assert [t for t, _ in together] == [a["choices"][0]["text"] for a in alone]
    assert all(n == 10 for _, n in together)
    assert metric(server, "vllm:num_requests_running", model_name="tiny") == 0
    assert metric(server, "vllm:kv_cache_usage_perc", model_name="tiny") == 0


def test_per_request_split_metrics_and_timings(server):
    """vLLM's per-request split: queue / prefill / decode histograms, KV computed, cached counter,
    tokens per step; and the same split per request in the response's llama.cpp-shaped timings."""
    def hist_count(name):
        return metric(server, name + "_count", model_name="tiny")

    before = {n: hist_count(n) for n in ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                                         "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds",
                                         "vllm:request_prefill_kv_computed_tokens")}
    cached_before = metric(server, "vllm:prompt_tokens_cached_total", model_name="tiny")
    computed_before = metric(server, "vllm:request_prefill_kv_computed_tokens_sum", model_name="tiny")
    steps_before = hist_count("vllm:iteration_tokens_total")
    prompt = "The harbour pilot read the tide tables aloud before every crossing, twice. " * 3
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "ignore_eos": True, "temperature": 0}
    first = httpx.post(server + "/v1/completions", json=body, headers={"X-Tenant": "split"}).json()
    second = httpx.post(server + "/v1/completions", json=body, headers={"X-Tenant": "split"}).json()
    n = first["usage"]["prompt_tokens"]
    hit = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert hit == (n - 1) // 16 * 16 > 0
    # Each finished request is one observation in each histogram.
    assert {k: hist_count(k) - v for k, v in before.items()} == dict.fromkeys(before, 2.0)
    assert metric(server, "vllm:prompt_tokens_cached_total", model_name="tiny") - cached_before == hit
    # KV computed = prompt tokens not served from the cache: all of the first, the rest of the second.
    assert metric(server, "vllm:request_prefill_kv_computed_tokens_sum", model_name="tiny") - computed_before == 2 * n - hit
    # One prefill step and three decode steps each at least (four tokens): steps were counted.
    assert hist_count("vllm:iteration_tokens_total") - steps_before >= 8
    for r, cached in ((first, 0), (second, hit)):
        t = r["timings"]
        assert (t["prompt_n"], t["cache_n"], t["predicted_n"]) == (n - cached, cached, 4)
        assert t["queue_ms"] >= 0 and t["prompt_ms"] > 0 and t["predicted_ms"] > 0
    text = httpx.get(server + "/metrics").text
    assert "gpu_cache_usage_perc" not in text and "gpu_prefix_cache" not in text
    assert "vllm:time_per_output_token_seconds" not in text
