"""Per-request stream timing, shared by the proxy and the load generator.

`StreamTimer` eats the raw bytes of an OpenAI-compatible response as they pass and records when
the first content-carrying chunk went by (TTFT), every gap between content chunks (ITL), and the
end (E2E). TPOT is then (E2E - TTFT) / (output_tokens - 1), the way `vllm bench serve` computes
it, with output_tokens from the usage chunk when the upstream sent one, else counted from the
stream (one per choice per content chunk).

What is not a token: `:` comment / keep-alive lines, a chunk with only `delta.role`, an empty
`content` or `text`, the usage chunk, `data: [DONE]`. Events may arrive split across reads or
several per read; an event counts when its terminating blank line arrives, because that is when
a client's SSE parser can act on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_loads = json.loads


@dataclass
class RequestTiming:
    """What one request looked like from the streaming boundary. Times in seconds."""

    ttft: float | None               # None: no content ever arrived (streaming)
    e2e: float
    itl: list[float]                 # one gap per content chunk after the first (a k-token chunk counts once)
    tpot: float | None               # (e2e - ttft) / (output_tokens - 1); None when output_tokens <= 1
    output_tokens: int               # usage.completion_tokens if seen, else counted content chunks
    input_tokens: int | None         # usage.prompt_tokens if seen
    finish_reasons: list[str]
    error: str | None                # an error the upstream reported in the body or stream
    usage_seen: bool
    model: str | None                # the response's model field
    error_type: str | None = None    # the error's type/code, or "incomplete_stream"
    first_token_at: float | None = None   # perf_counter value of the first content chunk
    output_text: str | None = None   # only when the timer was asked to collect text
    cached_tokens: int | None = None     # usage.prompt_tokens_details.cached_tokens if seen
    engine_queue: float | None = None    # the upstream's own per-request split, where it reports one
    engine_prefill: float | None = None  # (`timings.queue_ms` / `prompt_ms`: bundled engine, llama.cpp)
    # What `on_first` returned at the first content chunk (the sidecar's decode-concurrency area,
    # sidecar/metrics.py DecodeConcurrency); None when it was not asked for or no chunk came.
    decode_mark: float | None = None


# The fields every chunk carries; a usage chunk with anything else (llama.cpp moves its `timings`
# there once usage is asked for) keeps that for the client when the proxy strips the usage.
_ENVELOPE = frozenset(("id", "object", "created", "model", "system_fingerprint", "service_tier", "choices", "usage"))


def _without_usage(obj: dict) -> bytes:
    """The event to forward in place of a usage-only chunk the client did not ask for."""
    if _ENVELOPE.issuperset(obj):
        return b""
    rest = {k: v for k, v in obj.items() if k != "usage"}
    return b"data: " + json.dumps(rest, separators=(",", ":"), ensure_ascii=False).encode()


class StreamTimer:
    """Feed it the response bytes as they pass; `finish()` once at the end.

    `strip_usage=True` is for the proxy when it asked the upstream for usage on the client's
    behalf: `relay()` then returns the bytes to forward with that usage removed (and
    holds back an incomplete trailing event until it is complete, so it can be judged whole).
    """

    __slots__ = ("start", "_chat", "_buf", "_first", "_last", "_itl", "_chunks", "_usage", "_finish",
                 "_error", "_error_type", "_model", "_done", "_body", "_strip", "_texts", "_seen_data",
                 "_timings", "_on_first", "_mark")

    def __init__(self, start: float, kind: str, *, strip_usage: bool = False, collect_text: bool = False,
                 on_first=None):
        if kind not in ("chat", "completion"):
            raise ValueError(f"StreamTimer kind must be 'chat' or 'completion', got {kind!r}")
        self.start = start
        self._chat = kind == "chat"
        self._buf = b""
        self._first: float | None = None
        self._last = 0.0
        self._itl: list[float] = []
        self._chunks = 0
        self._usage: dict | None = None
        self._finish: list[str] = []
        self._error: str | None = None
        self._error_type: str | None = None
        self._model: str | None = None
        self._done = False
        self._body = False
        self._strip = strip_usage
        self._texts: list[str] | None = [] if collect_text else None
        self._seen_data = False
        self._timings: dict | None = None
        # Called once, with the time, at the first streamed content chunk; what it returns is kept
        # as the timing's `decode_mark`.
        self._on_first = on_first
        self._mark: float | None = None

    # ---- streaming -------------------------------------------------------------------------
    def feed(self, data: bytes, now: float) -> None:
        """Consume raw SSE bytes received (or relayed) at `now`."""
        self.relay(data, now)

    def _token(self, now: float, count: int = 1) -> None:
        """A content chunk (`count` choices with text) left at `now`: the first sets TTFT, later
        ones add one ITL gap each, however many tokens they carry."""
        if self._first is None:
            self._first = now
            if self._on_first is not None:
                self._mark = self._on_first(now)
        else:
            self._itl.append(now - self._last)
        self._last = now
        self._chunks += count

    @property
    def plain_next(self) -> bool:
        """Whether the next ordinary token may be taken by the C fast path (sidecar/_fastrelay.c),
        which does what `relay`'s fast path does: past the first token, nothing partial held,
        the model known, no text captured."""
        return self._first is not None and not self._buf and self._model is not None and self._texts is None

    @property
    def gaps(self) -> list[float]:
        """The inter-token gaps so far: the list itself, which the C fast path appends to."""
        return self._itl

    def relay(self, data: bytes, now: float) -> bytes:
        """Like feed(); returns the bytes to pass on (`data` itself unless stripping usage)."""
        # Fast path: no leftover, exactly one `data:` line and its blank line, an ordinary token.
        if not self._buf and data[-2:] == b"\n\n" and data[:5] == b"data:" and data.find(b"\n") == len(data) - 2 \
                and self._fast_token(data):
            self._token(now)
            self._seen_data = True
            return data
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:
            # Normalise CRLF / CR line ends for parsing; forwarded bytes stay raw unless stripping.
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self._buf = buf
            return b"" if self._strip else data
        self._buf = buf[cut + 2:]
        head = buf[:cut]
        if b"\n\n" not in head:
            replaced = self._event(head, now)
            if not self._strip:
                return data
            if replaced is None:
                return buf[:cut + 2]
            return replaced + b"\n\n" if replaced else b""
        kept = []
        for event in head.split(b"\n\n"):
            replaced = self._event(event, now)
            if replaced is None:
                kept.append(event)
            elif replaced:
                kept.append(replaced)
        if not self._strip:
            return data
        return b"".join(e + b"\n\n" for e in kept)

    def _event(self, event: bytes, now: float) -> bytes | None:
        """Account one complete SSE event. None: forward it as is; else what to forward instead
        (b"" drops it): only the usage the proxy asked for on the client's behalf is removed."""
        if event[:5] == b"data:" and b"\n" not in event:
            payload = event[5:]
        else:
            parts = [line[5:] for line in event.split(b"\n") if line[:5] == b"data:"]
            if not parts:
                return None    # comments, keep-alives, event:/id: lines alone
            payload = b"\n".join(parts)
        payload = payload.strip()
        if payload == b"[DONE]":
            self._done = True
            return None
        self._seen_data = True
        if self._fast_token(payload):
            self._token(now)
            return None
        try:
            obj = _loads(payload)
        except ValueError:
            return None
        if type(obj) is not dict:
            return None
        return self._chunk(obj, now)

    def _fast_token(self, p: bytes) -> bool:
        """True if `p` is certainly one ordinary content chunk, decided without parsing JSON.

        JSON escapes every quote inside strings, so a byte pattern like `"finish_reason":null`
        can only be the key itself, never generated text. Both compact separators (vLLM) and
        `": "` (json.dumps: SGLang, the bundled engine) are recognised. Anything unusual (several
        choices, a finish reason, usage, an error, the first chunk, text capture) goes to the
        full parse instead.
        """
        if self._model is None or self._texts is not None:
            return False
        i = p.find(b'"finish_reason":')
        if i < 0:
            return False
        i += 17 if p[i + 16:i + 17] == b" " else 16     # compact (pydantic) or spaced (json.dumps)
        if p[i:i + 4] != b"null" or p.find(b'"finish_reason"', i) >= 0:
            return False
        if b'"error"' in p:
            return False
        i = p.find(b'"usage":')
        if i >= 0:
            i += 9 if p[i + 8:i + 9] == b" " else 8
            if p[i:i + 4] != b"null":
                return False
        i = p.find(b'"content":')
        if i >= 0:
            i += 11 if p[i + 10:i + 11] == b" " else 10
        else:
            i = p.find(b'"text":')
            if i < 0:
                return False
            i += 8 if p[i + 7:i + 8] == b" " else 7
        # An opening quote followed by anything but the closing one: non-empty text.
        return p[i:i + 1] == b'"' and p[i + 1:i + 2] != b'"'

    def _chunk(self, obj: dict, now: float) -> bytes | None:
        if self._model is None:
            model = obj.get("model")
            if isinstance(model, str):
                self._model = model
        err = obj.get("error")
        if err is not None or obj.get("object") == "error":
            self._set_error(err if isinstance(err, dict) else obj)
            return None
        usage = obj.get("usage")
        if usage:
            self._usage = usage
        timings = obj.get("timings")     # llama.cpp sends it on the last chunk, usage or not
        if type(timings) is dict:
            self._timings = timings
        choices = obj.get("choices")
        if not choices:
            return _without_usage(obj) if usage and self._strip else None
        tokens = 0
        texts = self._texts
        for choice in choices:
            text = choice.get("text")
            if not text:
                delta = choice.get("delta")
                if delta:
                    text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                    if not text and delta.get("tool_calls"):
                        text = " "   # a tool-call fragment is generated output too
            if text:
                tokens += 1
                if texts is not None and isinstance(text, str):
                    texts.append(text)
            reason = choice.get("finish_reason")
            if reason:
                self._finish.append(reason)
        if tokens:
            self._token(now, tokens)
        return None

    def _set_error(self, err: dict) -> None:
        if self._error is None:
            self._error = str(err.get("message") or err.get("detail") or "upstream error")[:500]
            kind = err.get("type") or err.get("code")
            self._error_type = str(kind) if kind else "upstream_error"

    # ---- whole bodies ----------------------------------------------------------------------
    def feed_json_body(self, body: bytes, now: float) -> None:
        """A non-streaming response (or an error body): TTFT = E2E there."""
        self._body = True
        try:
            obj = _loads(body)
        except ValueError:
            return
        if not isinstance(obj, dict):
            return
        if isinstance(obj.get("model"), str):
            self._model = obj["model"]
        err = obj.get("error")
        if err is not None or obj.get("object") == "error":
            self._set_error(err if isinstance(err, dict) else obj)
            return
        if obj.get("usage"):
            self._usage = obj["usage"]
        if type(obj.get("timings")) is dict:
            self._timings = obj["timings"]
        for choice in obj.get("choices") or ():
            message = choice.get("message") or {}
            text = choice.get("text") or message.get("content")
            if text:
                self._chunks += 1
                if self._texts is not None and isinstance(text, str):
                    self._texts.append(text)
            if choice.get("finish_reason"):
                self._finish.append(choice["finish_reason"])
        self._first = now

    # ---- the end -----------------------------------------------------------------------------
    @property
    def done_seen(self) -> bool:
        return self._done

    @property
    def first_token_at(self) -> float | None:
        """When the first content chunk went by (None until then); the admission guard reads it."""
        return self._first

    def finish(self, now: float) -> RequestTiming:
        e2e = now - self.start
        error, error_type = self._error, self._error_type
        if self._body:
            ttft = e2e if error is None and self._first is not None else None
        else:
            ttft = self._first - self.start if self._first is not None else None
            if error is None and not self._done and self._seen_data:
                error, error_type = "stream ended before data: [DONE]", "incomplete_stream"
        usage = self._usage or {}
        completion = usage.get("completion_tokens")
        output_tokens = completion if isinstance(completion, int) else self._chunks
        prompt = usage.get("prompt_tokens")
        tpot = (e2e - ttft) / (output_tokens - 1) if ttft is not None and output_tokens > 1 else None
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if type(details) is dict else None
        timings = self._timings or {}
        return RequestTiming(
            ttft=ttft, e2e=e2e, itl=self._itl, tpot=tpot, output_tokens=output_tokens,
            input_tokens=prompt if isinstance(prompt, int) else None, finish_reasons=self._finish,
            error=error, usage_seen=isinstance(completion, int), model=self._model, error_type=error_type,
            first_token_at=self._first, output_text="".join(self._texts) if self._texts is not None else None,
            cached_tokens=cached if type(cached) is int else None, engine_queue=_ms(timings.get("queue_ms")),
            engine_prefill=_ms(timings.get("prompt_ms")), decode_mark=self._mark)


def _ms(value) -> float | None:
    return value / 1e3 if type(value) in (int, float) and value >= 0 else None
