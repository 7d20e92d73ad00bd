"""StreamTimer: what counts as a token, when, and what TPOT comes out, on hand-built SSE bytes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.timing import StreamTimer


def chat_chunk(content=None, role=None, finish=None, model="m", usage=None, spaces=False) -> bytes:
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    obj = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model,
           "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    if usage is not None:
        obj["usage"] = usage
    text = json.dumps(obj) if spaces else json.dumps(obj, separators=(",", ":"))
    return b"data: " + text.encode() + b"\n\n"


def usage_chunk(prompt=5, completion=3) -> bytes:
    obj = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
           "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def test_role_only_empty_content_and_comments_are_not_tokens():
    t = StreamTimer(10.0, "chat")
    t.feed(b": keep-alive\n\n", 10.1)
    t.feed(chat_chunk(role="assistant", content=""), 10.2)
    t.feed(chat_chunk(content=""), 10.3)
    t.feed(chat_chunk(content="Hel"), 10.5)
    t.feed(chat_chunk(content="lo"), 10.55)
    t.feed(chat_chunk(content="!", finish="stop"), 10.65)
    t.feed(DONE, 10.7)
    r = t.finish(10.7)
    # First content at 10.5 -> TTFT 0.5 s; the role chunk at 10.2 and the empty one must not count.
    assert r.ttft == pytest.approx(0.5)
    assert r.itl == pytest.approx([0.05, 0.10])
    assert r.output_tokens == 3 and not r.usage_seen
    # TPOT = (E2E - TTFT) / (n - 1) = (0.7 - 0.5) / 2
    assert r.tpot == pytest.approx(0.1)
    assert r.finish_reasons == ["stop"] and r.error is None and r.model == "m"


def test_usage_overrides_counted_chunks_for_tpot():
    # Two chunks that carry 4 tokens each (a speculative-decoding upstream): usage says 8.
    t = StreamTimer(0.0, "chat")
    t.feed(chat_chunk(content="abcd"), 1.0)
    t.feed(chat_chunk(content="efgh", finish="length"), 1.7)
    t.feed(usage_chunk(prompt=11, completion=8) + DONE, 1.8)
    r = t.finish(1.8)
    assert r.usage_seen and r.output_tokens == 8 and r.input_tokens == 11
    assert r.itl == pytest.approx([0.7])            # one gap per chunk, whatever it carries
    assert r.tpot == pytest.approx((1.8 - 1.0) / 7)


def test_events_split_across_reads_count_when_their_blank_line_arrives():
    t = StreamTimer(0.0, "completion")
    raw = b'data: {"model":"m","choices":[{"index":0,"text":"x","finish_reason":null}]}\n\n'
    t.feed(raw[:20], 0.1)
    t.feed(raw[20:-1], 0.2)          # everything but the final newline: not yet an event
    t.feed(raw[-1:], 0.3)
    assert t.finish(0.4).ttft == pytest.approx(0.3)


def test_several_events_in_one_read_and_crlf_line_ends():
    t = StreamTimer(0.0, "completion")
    body = (b'data: {"model":"m","choices":[{"index":0,"text":"a","finish_reason":null}]}\r\n\r\n'
            b'data: {"model":"m","choices":[{"index":0,"text":"b","finish_reason":"stop"}]}\r\n\r\n'
            b'data: [DONE]\r\n\r\n')
    t.feed(body, 0.25)
    r = t.finish(0.3)
    # Both chunks arrive in one read: two tokens, TTFT at that read, one zero gap.
    assert r.output_tokens == 2 and r.ttft == pytest.approx(0.25) and r.itl == [0.0]
    assert r.finish_reasons == ["stop"] and r.error is None


@pytest.mark.parametrize("payload, kind", [
    ({"error": {"message": "KV cache exhausted", "type": "server_error", "code": 500}}, "server_error"),
    ({"object": "error", "message": "old vLLM says no", "type": "BadRequestError", "code": 400}, "BadRequestError"),
])
def test_mid_stream_error_events_in_both_shapes(payload, kind):
    t = StreamTimer(0.0, "chat")
    t.feed(chat_chunk(content="a"), 0.1)
    t.feed(b"data: " + json.dumps(payload).encode() + b"\n\n" + DONE, 0.2)
    r = t.finish(0.2)
    assert r.error == payload.get("message", payload.get("error", {}).get("message"))
    assert r.error_type == kind and r.output_tokens == 1


def test_stream_that_stops_without_done_is_an_error():
    t = StreamTimer(0.0, "chat")
    t.feed(chat_chunk(content="a"), 0.1)
    r = t.finish(0.2)
    assert r.error_type == "incomplete_stream"


def test_strip_usage_removes_only_the_injected_usage_event():
    t = StreamTimer(0.0, "chat", strip_usage=True)
    first = chat_chunk(role="assistant", content="")
    token = chat_chunk(content="hi", finish="stop")
    out = t.relay(first, 0.1) + t.relay(token + usage_chunk()[:30], 0.2) + t.relay(usage_chunk()[30:] + DONE, 0.3)
    # The client sees exactly what it would have seen without include_usage.
    assert out == first + token + DONE
    r = t.finish(0.3)
    assert r.usage_seen and r.output_tokens == 3 and r.input_tokens == 5


def test_strip_usage_keeps_what_else_the_usage_chunk_carries():
    # llama.cpp, once asked for usage, moves its per-request `timings` from the last content chunk
    # into the usage chunk: a client that never asked for usage must still get the timings.
    timings = {"prompt_n": 5, "prompt_ms": 12.5, "predicted_n": 3, "predicted_per_token_ms": 9.25}
    usage = {"completion_tokens": 3, "prompt_tokens": 5, "total_tokens": 8}
    chunk = {"choices": [], "created": 1, "id": "chatcmpl-x", "model": "m", "system_fingerprint": "b1",
             "object": "chat.completion.chunk", "usage": usage, "timings": timings}
    raw = b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
    t = StreamTimer(0.0, "chat", strip_usage=True)
    token = chat_chunk(content="hi", finish="stop")
    out = t.relay(token + raw[:40], 0.1) + t.relay(raw[40:] + DONE, 0.2)
    forwarded = json.loads(out[len(token):-len(DONE)].removeprefix(b"data: "))
    # Everything but the usage the sidecar asked for, in the engine's key order.
    assert forwarded == {k: v for k, v in chunk.items() if k != "usage"}
    assert list(forwarded) == [k for k in chunk if k != "usage"]
    assert out.startswith(token) and out.endswith(DONE)
    r = t.finish(0.2)
    assert r.usage_seen and r.output_tokens == 3 and r.input_tokens == 5


def test_without_strip_relay_returns_the_same_bytes_object():
    t = StreamTimer(0.0, "chat")
    data = chat_chunk(content="x") + usage_chunk()
    assert t.relay(data, 0.1) is data


@pytest.mark.parametrize("kind, body", [
    ("chat", {"model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi there"},
                                           "finish_reason": "stop"}], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}),
    ("completion", {"model": "m", "choices": [{"index": 0, "text": "hi there", "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 4, "completion_tokens": 2}}),
])
def test_non_streaming_ttft_equals_e2e(kind, body):
    t = StreamTimer(1.0, kind)
    t.feed_json_body(json.dumps(body).encode(), 1.9)
    r = t.finish(2.0)
    assert r.ttft == r.e2e == pytest.approx(1.0)
    # TPOT = (E2E - TTFT)/(n-1) = 0: the user got every token at once.
    assert r.output_tokens == 2 and r.tpot == 0.0 and r.input_tokens == 4


def test_non_streaming_error_body():
    t = StreamTimer(0.0, "chat")
    t.feed_json_body(json.dumps({"error": {"message": "bad", "type": "invalid_request_error"}}).encode(), 0.1)
    r = t.finish(0.1)
    assert r.error == "bad" and r.error_type == "invalid_request_error" and r.ttft is None


def test_kind_is_checked():
    with pytest.raises(ValueError, match="chat' or 'completion"):
        StreamTimer(0.0, "embeddings")


def test_spaced_json_takes_the_full_parse_and_agrees():
    # Python's json.dumps puts spaces after colons: the byte fast path declines, the parse decides.
    t = StreamTimer(0.0, "chat")
    for i, ts in enumerate((0.1, 0.2, 0.4)):
        t.feed(chat_chunk(content=f"w{i}", spaces=True), ts)
    t.feed(DONE, 0.5)
    r = t.finish(0.5)
    assert r.output_tokens == 3 and r.itl == pytest.approx([0.1, 0.2])


STREAM = (chat_chunk(role="assistant", content="") + b": ping\n\n"
          + b"".join(chat_chunk(content=f"tok{i} \"quoted\" finish_reason") for i in range(6))
          + chat_chunk(content="end", finish="length") + usage_chunk(prompt=9, completion=7) + DONE)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=12, unique=True))
def test_any_split_of_a_stream_gives_the_same_result(cuts):
    """However the bytes are cut into reads, tokens, usage and the stripped output agree."""
    t = StreamTimer(0.0, "chat", strip_usage=True)
    bounds = [0, *sorted(cuts), len(STREAM)]
    out = b"".join(t.relay(STREAM[a:b], 0.1 * i) for i, (a, b) in enumerate(zip(bounds, bounds[1:])))
    r = t.finish(10.0)
    assert r.output_tokens == 7 and r.input_tokens == 9 and r.finish_reasons == ["length"]
    assert len(r.itl) == 6 and r.error is None
    assert out == STREAM.replace(usage_chunk(prompt=9, completion=7), b"")


def test_cached_tokens_and_the_upstreams_own_split():
    """usage.prompt_tokens_details.cached_tokens (OpenAI, vLLM, the bundled engine) and the
    `timings` object (llama.cpp's shape; the bundled engine adds queue_ms) reach RequestTiming."""
    t = StreamTimer(0.0, "chat")
    t.feed(chat_chunk(role="assistant"), 0.1)
    t.feed(chat_chunk("Hi"), 0.2)
    t.feed(chat_chunk(finish="stop"), 0.3)
    last = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
            "usage": {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41,
                      "prompt_tokens_details": {"cached_tokens": 32}},
            "timings": {"queue_ms": 2.5, "prompt_n": 8, "cache_n": 32, "prompt_ms": 12.0}}
    t.feed(b"data: " + json.dumps(last).encode() + b"\n\n", 0.4)
    t.feed(DONE, 0.4)
    r = t.finish(0.5)
    assert (r.cached_tokens, r.engine_queue, r.engine_prefill) == (32, 0.0025, 0.012)


def test_llama_cpp_timings_on_the_finish_chunk_without_usage():
    t = StreamTimer(0.0, "completion")
    body = {"id": "c", "object": "text_completion", "model": "m",
            "choices": [{"index": 0, "text": "", "finish_reason": "stop"}],
            "timings": {"prompt_n": 12, "prompt_ms": 30.0, "predicted_n": 3, "predicted_ms": 9.0}}
    t.feed(b"data: " + json.dumps(body).encode() + b"\n\n" + DONE, 0.2)
    r = t.finish(0.3)
    # No usage: no cached count; llama.cpp has no queue time; prompt_ms is its prefill.
    assert (r.cached_tokens, r.engine_queue, r.engine_prefill) == (None, None, 0.03)


def test_nonsense_timings_are_ignored():
    t = StreamTimer(0.0, "chat")
    t.feed_json_body(json.dumps({"model": "m", "choices": [{"message": {"content": "x"}, "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                           "prompt_tokens_details": {"cached_tokens": "many"}},
                                 "timings": {"queue_ms": -1, "prompt_ms": "soon"}}).encode(), 0.1)
    r = t.finish(0.1)
    assert (r.cached_tokens, r.engine_queue, r.engine_prefill) == (None, None, None)
