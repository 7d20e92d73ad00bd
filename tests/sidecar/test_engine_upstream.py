"""The sidecar in front of the bundled engine (`goodput engine serve --model tiny`), as in production.

The engine's timings are not scripted, so the check is against the client's own view: the
official openai client streams through the sidecar while the test times each chunk with the
same StreamTimer; the sidecar's TTFT must be a little earlier than the client's (it sits one
loopback hop closer to the engine) and its TPOT the same within a few milliseconds.
"""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from sidecar.timing import StreamTimer
from tests.support import ServerProcess, free_port, goodput_command

pytestmark = pytest.mark.slow      # starts the engine (torch import, model build): ~10 s


@pytest.fixture(scope="module")
def engine():
    port = free_port()
    server = ServerProcess(goodput_command("engine", "serve", "--model", "tiny", "--port", str(port)),
                           f"http://127.0.0.1:{port}/v1/models", timeout=180, name="engine")
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def live(sidecars, engine):
    return sidecars.start(engine, models=("tiny",))


def engine_running(engine_url: str) -> float:
    text = httpx.get(engine_url + "/metrics", timeout=5).text
    line = next(ln for ln in text.splitlines() if ln.startswith("vllm:num_requests_running{"))
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_openai_client_streams_through_the_sidecar_to_the_engine(live, endpoint):
    c = openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0, timeout=60)
    n = 24
    with httpx.Client(timeout=60) as raw:      # raw bytes, so the client-side timer sees what the sidecar relayed
        body = {"model": "tiny", "max_tokens": n, "stream": True, "ignore_eos": True, "temperature": 0}
        if endpoint == "chat":
            body["messages"] = [{"role": "user", "content": "Tell me a story"}]
        else:
            body["prompt"] = "Once upon a time"
        path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
        raw.get(live.url + "/healthz")          # connection set up before the clock starts
        start = time.perf_counter()
        timer = StreamTimer(start, "chat" if endpoint == "chat" else "completion")
        with raw.stream("POST", live.url + path, json=body) as r:
            for data in r.iter_raw():
                timer.feed(data, time.perf_counter())
    client_view = timer.finish(time.perf_counter())
    span = live.finished_spans(1)[0]
    attrs = span.attributes
    assert attrs["goodput.outcome"] == "good" and attrs["gen_ai.response.model"] == "tiny"
    # The engine's usage (requested by the sidecar, never shown to this client) says n tokens.
    assert not client_view.usage_seen and client_view.output_tokens == n
    assert attrs["gen_ai.usage.output_tokens"] == n
    # The sidecar is one hop closer to the engine: its TTFT is earlier, by well under 10 ms.
    assert 0 < client_view.ttft - attrs["goodput.ttft_seconds"] < 0.010
    assert attrs["goodput.tpot_seconds"] == pytest.approx(client_view.tpot, abs=0.003)
    # The openai client agrees on the content, streaming and not.
    if endpoint == "chat":
        chunks = list(c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=5, stream=True, extra_body={"ignore_eos": True}))
        assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content) >= 1
        full = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                         extra_body={"ignore_eos": True})
    else:
        full = c.completions.create(model="tiny", prompt="Hi", max_tokens=5, extra_body={"ignore_eos": True})
    assert full.usage.completion_tokens == 5
    spans = live.finished_spans(3 if endpoint == "chat" else 2)
    last = spans[-1].attributes
    assert last["gen_ai.request.stream"] is False and last["goodput.ttft_seconds"] == last["goodput.e2e_seconds"]
    assert live.value("goodput_output_tokens_total", model="tiny", slo_class="interactive") == n + 5 + (5 if endpoint == "chat" else 0)


def test_engine_signals_are_scraped(live, engine):
    assert live.call(live.app.scrape_once()) is True
    assert live.value("goodput_engine_up") == 1.0
    assert live.registry.get_sample_value("goodput_engine_kv_cache_usage_ratio", {"model": "tiny"}) is not None
    assert live.registry.get_sample_value("goodput_engine_prefix_cache_queries_total", {"model": "tiny"}) is not None


def test_client_disconnect_frees_the_engine_request(live, engine):
    body = {"model": "tiny", "prompt": "Once", "max_tokens": 4000, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=60) as raw:
        with raw.stream("POST", live.url + "/v1/completions", json=body) as r:
            # Keep reading until the engine's own gauge shows the request running (the engine
            # stops generating for a client that does not read), then hang up mid-stream.
            running = False
            for i, _ in enumerate(r.iter_raw()):
                if i % 10 == 9 and engine_running(engine) == 1.0:
                    running = True
                    break
            assert running
    hung_up = time.monotonic()
    # 4000 tokens would keep the engine busy for many seconds; after the hang-up it must stop at once.
    while engine_running(engine) != 0.0 and time.monotonic() - hung_up < 5:
        time.sleep(0.05)
    assert engine_running(engine) == 0.0
    assert time.monotonic() - hung_up < 2.0
    live.finished_spans(1)
    assert live.value("goodput_requests_total", model="tiny", slo_class="interactive", outcome="cancelled") == 1
