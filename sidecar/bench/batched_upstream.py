"""A scripted engine with continuous batching: one decode step serves every running stream, and a
step takes `step_base + step_per_seq * batch` seconds (plus `prompt_tokens / prefill_rate` for the
prompts it admits). So overload shows the way it does on a real engine that admits everything:
the batch grows, every stream slows (TPOT grows) and nothing waits.

OpenAI-compatible chat/completions (streaming with usage, and not), GET /health, GET /v1/models,
and GET /metrics with vLLM's names (num_requests_running/waiting, generation_tokens_total,
prompt_tokens_total, iteration_tokens_total, request_success_total, label model_name), so the
sidecar treats it as vLLM. Prompt tokens are counted as words of the messages (no tokenizer).

    python -m sidecar.bench.batched_upstream --port 8000 --step-base 0.04 --step-per-seq 0.005
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid

from aiohttp import web

MODEL = "batched"


class Engine:
    def __init__(self, step_base: float, step_per_seq: float, prefill_rate: float, max_batch: int):
        self.step_base, self.step_per_seq = step_base, step_per_seq
        self.prefill_rate, self.max_batch = prefill_rate, max_batch
        self.waiting: list = []      # (queue, prompt_tokens, max_tokens)
        self.running: list = []      # [queue, tokens_left]
        self.counters = {"generation": 0, "prompt": 0, "iterations": 0, "iteration_tokens": 0, "success": 0}
        self._wake = asyncio.Event()

    def submit(self, prompt_tokens: int, max_tokens: int) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        self.waiting.append((q, prompt_tokens, max_tokens))
        self._wake.set()
        return q

    async def loop(self) -> None:
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
            admitted, prompt = [], 0
            while self.waiting and len(self.running) + len(admitted) < self.max_batch:
                q, p, n = self.waiting.pop(0)
                admitted.append([q, n])
                prompt += p
            batch = self.running + admitted
            step = self.step_base + self.step_per_seq * len(batch) + prompt / self.prefill_rate
            await asyncio.sleep(step)
            self.counters["iterations"] += 1
            self.counters["iteration_tokens"] += len(batch) + prompt
            self.counters["prompt"] += prompt
            still = []
            for entry in batch:
                q, left = entry
                q.put_nowait("token")
                self.counters["generation"] += 1
                entry[1] = left - 1
                if entry[1] > 0:
                    still.append(entry)
                else:
                    q.put_nowait(None)
                    self.counters["success"] += 1
            self.running = still

    def metrics(self) -> str:
        c, label = self.counters, f'{{model_name="{MODEL}"}}'
        return "\n".join([
            "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{label} {len(self.running)}",
            "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{label} {len(self.waiting)}",
            "# TYPE vllm:generation_tokens_total counter", f"vllm:generation_tokens_total{label} {c['generation']}",
            "# TYPE vllm:prompt_tokens_total counter", f"vllm:prompt_tokens_total{label} {c['prompt']}",
            "# TYPE vllm:request_success_total counter", f"vllm:request_success_total{label} {c['success']}",
            "# TYPE vllm:iteration_tokens_total histogram",
            f'vllm:iteration_tokens_total_bucket{{model_name="{MODEL}",le="+Inf"}} {c["iterations"]}',
            f"vllm:iteration_tokens_total_count{label} {c['iterations']}",
            f"vllm:iteration_tokens_total_sum{label} {c['iteration_tokens']}", ""])


def _prompt_tokens(doc: dict) -> int:
    if isinstance(doc.get("messages"), list):
        text = " ".join(str(m.get("content", "")) for m in doc["messages"] if isinstance(m, dict))
    else:
        text = str(doc.get("prompt", ""))
    return max(1, len(text.split()))


def make_app(engine: Engine) -> web.Application:
    async def generate(request: web.Request) -> web.StreamResponse:
        try:
            doc = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response({"error": {"message": "bad JSON", "type": "invalid_request_error"}}, status=400)
        chat = request.path.endswith("/chat/completions")
        n = int(doc.get("max_tokens") or 16)
        prompt = _prompt_tokens(doc)
        q = engine.submit(prompt, n)
        rid = f"cmpl-{uuid.uuid4().hex[:12]}"
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        if not doc.get("stream"):
            while await q.get() is not None:
                pass
            text = " tok" * n
            choice = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
            return web.json_response({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                      "model": MODEL, "choices": [{**choice, "finish_reason": "length"}], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"

        async def send(payload: dict) -> None:
            await resp.write(f"data: {json.dumps({'id': rid, 'object': obj, 'model': MODEL, **payload})}\n\n".encode())

        while await q.get() is not None:
            delta = {"index": 0, "delta": {"content": " tok"}} if chat else {"index": 0, "text": " tok"}
            await send({"choices": [{**delta, "finish_reason": None}]})
        await send({"choices": [{"index": 0, **({"delta": {}} if chat else {"text": ""}), "finish_reason": "length"}]})
        options = doc.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            await send({"choices": [], "usage": usage})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def metrics(_request):
        return web.Response(text=engine.metrics(), content_type="text/plain")

    async def models(_request):
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "goodput"}]})

    async def health(_request):
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_post("/v1/completions", generate)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)

    async def start_loop(app_):
        app_["loop_task"] = asyncio.get_running_loop().create_task(engine.loop())

    async def stop_loop(app_):
        app_["loop_task"].cancel()

    app.on_startup.append(start_loop)
    app.on_cleanup.append(stop_loop)
    return app


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--step-base", type=float, default=0.04, help="seconds of a decode step, before its batch")
    p.add_argument("--step-per-seq", type=float, default=0.005, help="seconds each running sequence adds to a step")
    p.add_argument("--prefill-rate", type=float, default=20000.0, help="prompt tokens (words) per second")
    p.add_argument("--max-batch", type=int, default=256)
    args = p.parse_args(argv)
    for name in ("step_base", "prefill_rate"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if args.step_per_seq < 0 or args.max_batch < 1:
        p.error("--step-per-seq must be >= 0 and --max-batch >= 1")
    engine = Engine(args.step_base, args.step_per_seq, args.prefill_rate, args.max_batch)
    web.run_app(make_app(engine), host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
