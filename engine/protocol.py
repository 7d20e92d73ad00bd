"""OpenAI request parsing and response shapes for /v1/completions and /v1/chat/completions.

Parsing turns a JSON body into a `ParsedRequest` or raises `BadRequest` (-> 400 in OpenAI's error
shape); building responses is plain dict work so the server stays about transport.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.request import SamplingParams


class BadRequest(ValueError):
    def __init__(self, message: str, param: str | None = None, status: int = 400, type: str = "BadRequestError"):
        super().__init__(message)
        self.message, self.param, self.status, self.type = message, param, status, type


def error_body(message: str, type: str = "BadRequestError", param: str | None = None, code: int = 400) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass
class ParsedRequest:
    chat: bool
    model: str
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    salt: str | None


def _get(body: dict, name: str, types, default=None):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise BadRequest(f"'{name}' must be {_tname(types)}, got a boolean", name)
    if not isinstance(value, types):
        raise BadRequest(f"'{name}' must be {_tname(types)}, got {type(value).__name__}", name)
    return value


def _tname(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join({"int": "an integer", "float": "a number", "str": "a string", "bool": "a boolean",
                        "list": "a list", "dict": "an object"}[t.__name__] for t in types)


def parse(body, chat: bool, served_names: list[str], tokenizer, max_model_len: int) -> ParsedRequest:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = _get(body, "model", str, served_names[0])
    if model not in served_names:
        raise BadRequest(f"the model '{model}' does not exist; this server serves {served_names}", "model",
                         type="NotFoundError")
    if _get(body, "n", int, 1) != 1:
        raise BadRequest("only n=1 is supported", "n")
    if chat:
        messages = _get(body, "messages", list)
        if not messages:
            raise BadRequest("'messages' must be a non-empty list", "messages")
        norm = []
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequest("each message needs a 'role' string and 'content'", "messages")
            content = m.get("content")
            if isinstance(content, list):  # content parts: keep the text ones
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
            if not isinstance(content, str):
                raise BadRequest("message 'content' must be a string or a list of text parts", "messages")
            norm.append({**m, "content": content})
        try:
            text = tokenizer.apply_chat_template(norm, add_generation_prompt=True)
        except ValueError as exc:
            raise BadRequest(str(exc), "messages") from None
        prompt_ids = tokenizer.encode(text, add_special=False)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_ids = tokenizer.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            if any(t < 0 or t >= tokenizer.vocab_size for t in prompt):
                raise BadRequest(f"prompt token ids must be in [0, {tokenizer.vocab_size})", "prompt")
            prompt_ids = list(prompt)
        else:
            raise BadRequest("'prompt' must be a string, a list of token ids, or a list holding one of those", "prompt")
    if not prompt_ids:
        raise BadRequest("the prompt is empty", "prompt")
    max_tokens = body.get("max_completion_tokens") if chat and body.get("max_completion_tokens") is not None else body.get("max_tokens")
    if max_tokens is None:
        # OpenAI's completions default is 16; chat runs until the context is full.
        max_tokens = max(1, max_model_len - len(prompt_ids)) if chat else 16
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise BadRequest("'max_tokens' must be an integer", "max_tokens")
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else (stop or [])
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("'stop' must be a non-empty string or a list of them", "stop")
    stream_options = _get(body, "stream_options", dict, {})
    salt = _get(body, "cache_salt", str)
    try:
        params = SamplingParams(
            max_tokens=max_tokens, temperature=float(_get(body, "temperature", (int, float), 1.0)),
            top_p=float(_get(body, "top_p", (int, float), 1.0)), top_k=_get(body, "top_k", int, -1),
            seed=_get(body, "seed", int), stop=stop, stop_token_ids=list(_get(body, "stop_token_ids", list, [])),
            ignore_eos=_get(body, "ignore_eos", bool, False))
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    return ParsedRequest(chat, model, prompt_ids, params, _get(body, "stream", bool, False),
                         bool(stream_options.get("include_usage")), salt)


def usage(prompt: int, completion: int, cached: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def timings(times, prompt: int, completion: int, cached: int) -> dict | None:
    """Per-request timings in llama.cpp's `timings` shape (prompt_n = prompt tokens computed,
    cache_n = served from the prefix cache, *_ms durations), plus `queue_ms`, which llama.cpp
    lacks: vLLM users ask for exactly this split per request (vllm#40076)."""
    if times is None:
        return None
    return {"queue_ms": times.queue * 1e3, "prompt_n": prompt - cached, "cache_n": cached,
            "prompt_ms": times.prefill * 1e3, "predicted_n": completion, "predicted_ms": times.decode * 1e3}


def chunk(req_id: str, model: str, chat: bool, created: int, *, text: str | None = None, role: bool = False,
          finish_reason: str | None = None) -> dict:
    if chat:
        delta = {"role": "assistant"} if role else ({"content": text} if text else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"id": req_id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}
    choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    return {"id": req_id, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


def usage_chunk(req_id: str, model: str, chat: bool, created: int, u: dict) -> dict:
    obj = "chat.completion.chunk" if chat else "text_completion"
    return {"id": req_id, "object": obj, "created": created, "model": model, "choices": [], "usage": u}


def full_response(req_id: str, model: str, chat: bool, text: str, finish_reason: str, u: dict) -> dict:
    created = int(time.time())
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
        return {"id": req_id, "object": "chat.completion", "created": created, "model": model,
                "choices": [choice], "usage": u}
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {"id": req_id, "object": "text_completion", "created": created, "model": model, "choices": [choice], "usage": u}
