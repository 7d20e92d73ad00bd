"""The OpenAI-compatible HTTP server around the engine loop (FastAPI on uvicorn).

Every bad input is a 400 in OpenAI's error shape; a client that goes away has its request
aborted (its blocks freed) at once, streaming or not.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine import openapi, protocol
from engine.core import RequestRejected
from engine.engine_loop import EngineError, EngineLoop


def make_app(loop: EngineLoop, served_names: list[str], registry: CollectorRegistry, info: dict) -> FastAPI:
    app = FastAPI(title="goodput bundled engine")
    engine = loop.engine
    tokenizer = engine.tokenizer
    # The longest context a request can have: the model's, or the whole KV cache if smaller.
    max_total = min(engine.max_model_len, engine.num_blocks * engine.cfg.block_size)

    def err(status: int, message: str, type: str = "BadRequestError", param: str | None = None) -> JSONResponse:
        return JSONResponse(protocol.error_body(message, type, param, status), status_code=status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request, exc: StarletteHTTPException):
        kind = {404: "NotFoundError", 405: "MethodNotAllowed"}.get(exc.status_code, "BadRequestError")
        return err(exc.status_code, str(exc.detail), kind)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request, exc: RequestValidationError):
        return err(400, str(exc))

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        created = int(time.time())
        data = [{"id": name, "object": "model", "created": created, "owned_by": "goodput", "root": info["root"],
                 "max_model_len": engine.max_model_len, "tokenizer_path": str(tokenizer.path)} for name in served_names]
        return {"object": "list", "data": data}

    async def handle(request: Request, chat: bool):
        try:
            body = json.loads(await request.body())
        except ValueError as exc:      # JSONDecodeError, UnicodeDecodeError, an integer past 4,300 digits
            return err(400, f"the request body is not valid JSON: {exc}")
        except RecursionError:
            return err(400, "the request body nests JSON deeper than this server parses (about 1,000 levels)")
        try:
            parsed = protocol.parse(body, chat, served_names, tokenizer, max_total)
            if parsed.salt is None and request.headers.get("x-tenant"):
                parsed.salt = "tenant:" + request.headers["x-tenant"]
            engine.check_request(len(parsed.prompt_ids), parsed.params)
        except protocol.BadRequest as exc:
            return err(exc.status, exc.message, exc.type, exc.param)
        except RequestRejected as exc:
            return err(400, str(exc), param="max_tokens" if "max_tokens" in str(exc) else "prompt")
        req_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        queue: asyncio.Queue = asyncio.Queue()
        loop.submit(req_id, parsed.prompt_ids, parsed.params, parsed.salt, queue)
        if parsed.stream:
            return StreamingResponse(_stream(loop, req_id, parsed, queue), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Request-Id": req_id})
        return await _complete(loop, request, req_id, parsed, queue, err)

    @app.post("/v1/completions", openapi_extra=openapi.operation(openapi.COMPLETION))
    async def completions(request: Request):
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions", openapi_extra=openapi.operation(openapi.CHAT))
    async def chat_completions(request: Request):
        return await handle(request, chat=True)

    return app


def _with_timings(obj: dict, out) -> dict:
    t = protocol.timings(out.times, out.num_prompt_tokens, out.num_output_tokens, out.num_cached_tokens)
    if t is not None:
        obj["timings"] = t
    return obj


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _stream(loop: EngineLoop, req_id: str, p: protocol.ParsedRequest, queue: asyncio.Queue):
    created, finished = int(time.time()), False
    try:
        if p.chat:
            yield _sse(protocol.chunk(req_id, p.model, True, created, role=True))
        while True:
            out = await queue.get()
            if isinstance(out, EngineError):
                finished = True
                yield _sse(protocol.error_body(out.message, "InternalServerError", None, 500))
                break
            if out.text:
                yield _sse(protocol.chunk(req_id, p.model, p.chat, created, text=out.text))
            if out.finished:
                finished = True
                yield _sse(protocol.chunk(req_id, p.model, p.chat, created, finish_reason=out.finish_reason))
                if p.include_usage:
                    u = protocol.usage(out.num_prompt_tokens, out.num_output_tokens, out.num_cached_tokens)
                    last = protocol.usage_chunk(req_id, p.model, p.chat, created, u)
                    yield _sse(_with_timings(last, out))
                break
        yield "data: [DONE]\n\n"
    finally:
        # Reached on a client disconnect too (the response task is cancelled mid-await).
        if not finished:
            loop.abort(req_id)


async def _complete(loop: EngineLoop, request: Request, req_id: str, p: protocol.ParsedRequest,
                    queue: asyncio.Queue, err):
    parts: list[str] = []
    try:
        while True:
            try:
                out = await asyncio.wait_for(queue.get(), timeout=0.5)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    loop.abort(req_id)
                    return Response(status_code=499)
                continue
            if isinstance(out, EngineError):
                return err(500, out.message, "InternalServerError")
            parts.append(out.text)
            if out.finished:
                u = protocol.usage(out.num_prompt_tokens, out.num_output_tokens, out.num_cached_tokens)
                return _with_timings(protocol.full_response(req_id, p.model, p.chat, "".join(parts),
                                                            out.finish_reason, u), out)
    except asyncio.CancelledError:
        loop.abort(req_id)
        raise
