"""A scripted OpenAI-compatible upstream whose token timings are known exactly.

Used by `goodput bench sidecar` (paced: a token every 5 ms per stream; fast: as fast as the
loop allows) and by the tests. A request may carry a `script` object in its JSON body that
overrides the process defaults:

    ttft            seconds from request to the first content chunk (default --ttft)
    itl             seconds between content chunks (default --itl); 0 = as fast as possible
    tokens_per_chunk  tokens packed into one chunk (default 1); usage counts tokens
    role_chunk      chat: send a role-only chunk first, at once (default true)
    comment         send an SSE comment (keep-alive) before the first token (default false)
    fail_after      close the connection after this many content chunks (mid-stream death)
    error_after     send a mid-stream error event after this many content chunks
    error_shape     "nested" ({"error": {...}}) or "flat" ({"object": "error", ...})
    status          answer with this HTTP status and an OpenAI error body instead
    hold            seconds to wait before sending the response headers at all

Engine-like mode (`--prefill-rate R`, optionally `--itl-per-seq S`), for overload tests: prompts are
prefilled one at a time in arrival order at R tokens/s (prompt tokens = characters / 4, reported as
usage.prompt_tokens), the first token follows its prefill (and `ttft`), and the gap between tokens
is `itl + S x (streams decoding)`, so a queue builds past the knee the way it does in an engine.

The number of content chunks is `max_tokens` / tokens_per_chunk (default max_tokens 16).
Usage is sent when the request asks for it with stream_options.include_usage, and always on
non-streaming answers. Plain HTTP/1.1 over asyncio streams, chunked transfer, keep-alive.

Other paths: GET /health, GET /v1/models, GET /metrics (the file given by --metrics-file, else
404), GET /stats (JSON counters, and the headers of the last request, for tests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from sidecar import eventloop

MODEL = "scripted"


class Upstream:
    def __init__(self, ttft: float, itl: float, metrics_text: str | None, prefill_rate: float = 0.0,
                 itl_per_seq: float = 0.0):
        self.ttft, self.itl, self.metrics_text = ttft, itl, metrics_text
        self.prefill_rate, self.itl_per_seq = prefill_rate, itl_per_seq
        self._prefill = asyncio.Lock()    # FIFO: one prompt at a time, in arrival order
        self.decoding = 0
        self.stats = {"requests": 0, "completed": 0, "disconnects": 0, "active": 0, "tokens": 0}
        self.last_headers: dict[str, str] = {}
        self.last_body: dict = {}

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                keep = await self.route(method, target.split("?", 1)[0], headers, body, writer)
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def route(self, method: str, path: str, headers: dict, body: bytes, writer) -> bool:
        if method == "POST" and path.endswith("/completions"):
            self.last_headers = headers
            return await self.generate(path.endswith("/chat/completions"), json.loads(body or b"{}"), writer)
        if path == "/metrics" and self.metrics_text is not None:
            return _send(writer, 200, self.metrics_text.encode(), "text/plain; version=0.0.4")
        if path == "/health":
            return _send(writer, 200, b"{}", "application/json")
        if path == "/v1/models":
            return _send(writer, 200, json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode())
        if path == "/stats":
            doc = dict(self.stats, last_headers=self.last_headers, last_body=self.last_body)
            return _send(writer, 200, json.dumps(doc).encode())
        return _send(writer, 404, json.dumps({"error": {"message": f"no route {path}", "type": "not_found"}}).encode())

    async def generate(self, chat: bool, req: dict, writer: asyncio.StreamWriter) -> bool:
        self.last_body = req
        script = req.get("script") or {}
        ttft, itl = float(script.get("ttft", self.ttft)), float(script.get("itl", self.itl))
        per_chunk = int(script.get("tokens_per_chunk", 1))
        max_tokens = int(req.get("max_tokens") or 16)
        n_chunks = max(1, max_tokens // per_chunk)
        start = time.perf_counter()
        self.stats["requests"] += 1
        if script.get("hold"):
            await asyncio.sleep(float(script["hold"]))
        if script.get("status"):
            status = int(script["status"])
            return _send(writer, status, json.dumps({"error": {"message": "scripted failure", "type": "server_error",
                                                               "param": None, "code": status}}).encode())
        prompt_tokens = 7
        if self.prefill_rate > 0:
            prompt_tokens = max(1, _prompt_chars(req) // 4)
            async with self._prefill:
                await asyncio.sleep(prompt_tokens / self.prefill_rate)
            # The first token leaves at the scripted ttft or right after the prefill, whichever is later.
            start = max(start, time.perf_counter() - ttft)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n_chunks * per_chunk,
                 "total_tokens": prompt_tokens + n_chunks * per_chunk}
        if not req.get("stream"):
            await _sleep_until(start + ttft + (n_chunks - 1) * itl)
            text = "".join(f"t{i} " for i in range(n_chunks))
            choice = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
            choice["finish_reason"] = "length"
            obj = "chat.completion" if chat else "text_completion"
            doc = {"id": "x", "object": obj, "created": 0, "model": MODEL, "choices": [choice], "usage": usage}
            self.stats["completed"] += 1
            return _send(writer, 200, json.dumps(doc).encode())
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        self.stats["active"] += 1
        try:
            await self._stream(chat, req, script, writer, start, ttft, itl, n_chunks, usage)
        except ConnectionError:
            self.stats["disconnects"] += 1
            return False
        finally:
            self.stats["active"] -= 1
        if script.get("fail_after") is not None:
            return False
        self.stats["completed"] += 1
        return True

    async def _stream(self, chat, req, script, writer, start, ttft, itl, n_chunks, usage) -> None:
        if chat:
            pre = (b'{"id":"x","object":"chat.completion.chunk","created":0,"model":"scripted","choices":[{"index":0,'
                   b'"delta":{"content":"')
            post = b'"},"logprobs":null,"finish_reason":null}]}'
            if script.get("role_chunk", True):
                _chunk(writer, b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"scripted","choices":'
                               b'[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n')
        else:
            pre = b'{"id":"x","object":"text_completion","created":0,"model":"scripted","choices":[{"index":0,"text":"'
            post = b'","logprobs":null,"finish_reason":null}]}'
        if script.get("comment"):
            _chunk(writer, b": keep-alive\n\n")
        fail_after, error_after = script.get("fail_after"), script.get("error_after")
        due = start + ttft
        self.decoding += 1
        try:
            if not await self._tokens(chat, script, writer, itl, n_chunks, pre, post, due, fail_after, error_after):
                return
        finally:
            self.decoding -= 1
        options = req.get("stream_options") or {}
        if options.get("include_usage") and error_after is None:
            obj = "chat.completion.chunk" if chat else "text_completion"
            _chunk(writer, b"data: " + json.dumps({"id": "x", "object": obj, "created": 0, "model": MODEL,
                                                   "choices": [], "usage": usage}).encode() + b"\n\n")
        _chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def _tokens(self, chat, script, writer, itl, n_chunks, pre, post, due, fail_after, error_after) -> bool:
        """The content chunks; False when the script killed the connection midway."""
        for i in range(n_chunks):
            if fail_after is not None and i == fail_after:
                writer.transport.abort()     # the upstream dies: no terminating chunk
                return False
            if error_after is not None and i == error_after:
                if script.get("error_shape") == "flat":
                    err = {"object": "error", "message": "scripted mid-stream error", "type": "internal_error", "code": 500}
                else:
                    err = {"error": {"message": "scripted mid-stream error", "type": "internal_error", "code": 500}}
                _chunk(writer, b"data: " + json.dumps(err).encode() + b"\n\n")
                break
            if i:
                due += itl + self.itl_per_seq * self.decoding
            if due > time.perf_counter():
                await _sleep_until(due)
            elif itl == 0:
                await asyncio.sleep(0)   # as fast as possible, but let other streams run
            body = pre + f"t{i} ".encode() + post
            if i == n_chunks - 1:
                body = body.replace(b'"finish_reason":null', b'"finish_reason":"length"')
            _chunk(writer, b"data: " + body + b"\n\n")
            self.stats["tokens"] += 1
            if writer.transport.get_write_buffer_size() > 65536:
                await writer.drain()
            if writer.transport.is_closing():
                raise ConnectionError("client went away")
        return True


async def _sleep_until(due: float) -> None:
    """Sleep until perf_counter() reaches `due`, never less: uvloop's timers have millisecond
    resolution and fire up to 1 ms early, which would break the promise of exact timings."""
    while (delay := due - time.perf_counter()) > 0:
        await asyncio.sleep(delay)


def _prompt_chars(req: dict) -> int:
    prompt = req.get("prompt")
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(m.get("content") or "") for m in req.get("messages") or () if isinstance(m.get("content"), str))


def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))


def _send(writer, status: int, body: bytes, ctype: str = "application/json") -> bool:
    reason = {200: "OK", 404: "Not Found"}.get(status, "Error")
    writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    return True


async def serve(host: str, port: int, ttft: float, itl: float, metrics_text: str | None, ready=print,
                prefill_rate: float = 0.0, itl_per_seq: float = 0.0) -> None:
    upstream = Upstream(ttft, itl, metrics_text, prefill_rate, itl_per_seq)
    server = await asyncio.start_server(upstream.connection, host, port, backlog=1024)
    ready(f"scripted upstream on http://{host}:{server.sockets[0].getsockname()[1]} (ttft {ttft}s, itl {itl}s)")
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="scripted OpenAI-compatible upstream with known token timings")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ttft", type=float, default=0.005)
    p.add_argument("--itl", type=float, default=0.005)
    p.add_argument("--prefill-rate", type=float, default=0.0,
                   help="engine-like mode: prefill prompts one at a time at this many tokens/s (0 = off)")
    p.add_argument("--itl-per-seq", type=float, default=0.0,
                   help="engine-like mode: each decoding stream adds this many seconds to every token gap")
    p.add_argument("--metrics-file", type=Path, help="served as /metrics (exposition text)")
    args = p.parse_args(argv)
    text = args.metrics_file.read_text() if args.metrics_file else None
    try:
        eventloop.run(serve(args.host, args.port, args.ttft, args.itl, text, ready=lambda s: print(s, flush=True),
                          prefill_rate=args.prefill_rate, itl_per_seq=args.itl_per_seq))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
