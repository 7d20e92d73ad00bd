"""The decode batch each TPOT was measured at: the sidecar counts the requests decoding (first
content chunk sent, not yet ended) and gives each request the mean of that count over its decode
(goodput_decode_batch_total / goodput_decode_batch_requests_total). The forecaster's service
model fits the decode step against it (tests/forecaster/test_decode_batch.py)."""

from __future__ import annotations

import threading

import openai
import pytest

from sidecar.metrics import DecodeConcurrency


def test_each_request_gets_the_mean_count_decoding_over_its_own_decode():
    d = DecodeConcurrency()
    a = d.began(0.0)                  # A decodes 0-10 s
    b = d.began(4.0)                  # B decodes 4-6 s, beside A
    assert d.ended(6.0, b, 4.0) == pytest.approx(2.0)
    c = d.began(8.0)                  # C decodes 8-12 s
    # A: 4 s alone, 2 s with B, 2 s alone, 2 s with C.
    assert d.ended(10.0, a, 0.0) == pytest.approx((4 * 1 + 2 * 2 + 2 * 1 + 2 * 2) / 10)
    assert d.ended(12.0, c, 8.0) == pytest.approx((2 * 2 + 2 * 1) / 4)
    assert d.decoding == 0
    # A request that ended at its first chunk had no decode time.
    assert d.ended(13.0, d.began(13.0), 13.0) is None
    assert d.decoding == 0


def test_two_overlapping_streams_through_the_sidecar(sidecar_live):
    # A streams 41 tokens 20 ms apart (0.8 s of decode), B 11 (0.2 s), both sent at once with the
    # same first-token time: B decodes beside A throughout (batch 2), A beside B for a quarter
    # of its decode (batch 1.25). Loopback and thread start-up shift B by a few ms.
    c = openai.OpenAI(base_url=sidecar_live.url + "/v1", api_key="sk-test", max_retries=0, timeout=20)

    def one(tokens: int) -> None:
        for _ in c.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=tokens, stream=True,
                                           extra_body={"script": {"ttft": 0.05, "itl": 0.02}}):
            pass

    for attempt in range(3):   # a 2-core machine shared with other tests can starve one stream
        before = (sidecar_live.value("goodput_decode_batch_total", model="scripted"),
                  sidecar_live.value("goodput_decode_batch_requests_total", model="scripted"))
        threads = [threading.Thread(target=one, args=(n,)) for n in (41, 11)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # The counters move in the handler's finally, after the client has read [DONE]; the span
        # ends after them.
        sidecar_live.finished_spans(2 * (attempt + 1))
        total = sidecar_live.value("goodput_decode_batch_total", model="scripted") - before[0]
        count = sidecar_live.value("goodput_decode_batch_requests_total", model="scripted") - before[1]
        assert count == 2
        if total == pytest.approx(2.0 + 1.25, abs=0.12):
            break
    else:
        pytest.fail(f"decode batches summed to {total:.3f}, not 3.25")


@pytest.fixture
def sidecar_live(sidecars, upstream):
    return sidecars.start(upstream, models=("scripted",))
