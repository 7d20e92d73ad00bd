"""The benchmark's load client, run as its own process: open-loop arrivals or closed-loop streams.

Open loop (`--rate R --duration D --seed S`): request i is sent at the i-th arrival of a Poisson
process of rate R (seeded, so every arm sees the same schedule), whether or not earlier ones
have finished, the way wrk2 and Nighthawk load a server. TTFT counts from the *scheduled* send
time, so a client or server that falls behind shows up in the numbers instead of slowing the
arrivals down (no coordinated omission). Closed loop (`--concurrency N --duration D`): N streams
back to back, for the token rate an arm sustains.

The client is lean on purpose: it uses the sidecar's own protocol-level HTTP client
(`sidecar.upstream`), whose `data_received` hands each de-chunked read to `StreamTimer` at once,
so a token is timed when its bytes arrive, not after a task switch.

Prints one JSON document: per request `[index, ttft, gaps..., ]` (seconds), errors, unfinished
requests (still open at the grace deadline), the worst send lag of the schedule, elapsed seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

from sidecar.timing import StreamTimer
from sidecar.upstream import UpstreamFailed, UpstreamPool

_clock = time.perf_counter


def poisson_schedule(rate: float, duration: float, seed: int) -> list[float]:
    """Arrival offsets (seconds from the start) of a Poisson process of `rate` per second."""
    rng = random.Random(seed)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return out
        out.append(t)


_WORDS = ("def", "return", "self", "value", "result", "items", "index", "config", "request", "for", "in",
          "if", "else", "None", "import", "from", "class", "count", "total", "data", "await", "async", "with")


def prompt_text(tokens: int, seed: int) -> str:
    """About `tokens` tokens (4 characters each, English BPE's average) of code-like lines, the
    same for the same seed: the Azure code trace's prompts are code, 2,048 tokens on average."""
    rng = random.Random(seed)
    lines, chars = [], -1        # the length of "\n".join(lines): one newline fewer than lines
    while chars < 4 * tokens:
        line = "    " * rng.randint(0, 3) + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 10)))
        lines.append(line)
        chars += len(line) + 1
    return "\n".join(lines)


def request_bodies(tokens: int, prompt_tokens: int, variants: int = 64) -> list[bytes]:
    """The chat request bodies the client cycles through. With `prompt_tokens` 0, one body whose
    prompt is one word; otherwise a system prompt every request shares (three quarters of the
    tokens, as an application's instructions) and a user message of its own (the rest), in
    `variants` bodies, so the sidecar parses, relays and analyses a prompt of that size."""
    def body(messages: list[dict]) -> bytes:
        return json.dumps({"model": "scripted", "stream": True, "max_tokens": tokens, "messages": messages}).encode()

    if prompt_tokens <= 0:
        return [body([{"role": "user", "content": "benchmark"}])]
    system = prompt_text(prompt_tokens * 3 // 4, seed=0)
    return [body([{"role": "system", "content": system},
                  {"role": "user", "content": prompt_text(prompt_tokens - prompt_tokens * 3 // 4, seed=1 + i)}])
            for i in range(variants)]


class Client:
    def __init__(self, url: str, tokens: int, api_key: str = "", prompt_tokens: int = 0):
        self.pool = UpstreamPool(url, connect_timeout=10.0, read_timeout=60.0, max_idle=1024)
        self.bodies = request_bodies(tokens, prompt_tokens)
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.records: list[list[float]] = []
        self.errors = 0
        self.first_error: str | None = None   # what the first failure was, so a failed run says why
        self.tokens = 0

    async def one(self, index: int, start: float) -> None:
        """One streamed request, timed from `start` (its scheduled time in open loop)."""
        timer = StreamTimer(start, "chat")
        feed = timer.feed
        conn = None
        ok, why = False, None
        try:
            body = self.bodies[index % len(self.bodies)]
            conn = await self.pool.request("POST", "/v1/chat/completions", self.headers, body)
            if conn.head.status != 200:
                answer = await conn.read_body()
                why = f"HTTP {conn.head.status}: {answer[:200].decode(errors='replace')}"
            else:
                error = await conn.start_body(lambda data: feed(data, _clock()))
                ok = error is None
                why = None if ok else f"stream failed: {error}"
        except (UpstreamFailed, ConnectionError, OSError) as exc:
            ok, why = False, f"{type(exc).__name__}: {exc}"
        finally:
            if conn is not None:
                (self.pool.release if ok else self.pool.discard)(conn)
        timing = timer.finish(_clock())
        if not ok or timing.error is not None or timing.ttft is None:
            self.errors += 1
            if self.first_error is None:
                self.first_error = why or timing.error or "no first token"
            return
        self.tokens += len(timing.itl) + 1     # content chunks received (one token each here)
        self.records.append([index, timing.ttft, *timing.itl])


async def open_loop(url: str, rate: float, duration: float, seed: int, tokens: int, grace: float,
                    api_key: str = "", prompt_tokens: int = 0) -> dict:
    client = Client(url, tokens, api_key, prompt_tokens)
    schedule = poisson_schedule(rate, duration, seed)
    tasks: list[asyncio.Task] = []
    worst_lag = 0.0
    loop = asyncio.get_running_loop()
    begin = _clock() + 0.05
    for index, offset in enumerate(schedule):
        due = begin + offset
        # Never early: uvloop's timers have millisecond resolution and may fire up to 1 ms before.
        while (delay := due - _clock()) > 0:
            await asyncio.sleep(delay)
        worst_lag = max(worst_lag, _clock() - due)
        tasks.append(loop.create_task(client.one(index, due)))
    # Requests still open `grace` seconds after the last arrival are counted as unfinished: an arm
    # past its knee would otherwise keep the benchmark waiting on its queue.
    done, pending = await asyncio.wait(tasks, timeout=grace) if tasks else (set(), set())
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    elapsed = _clock() - begin
    await client.pool.close()
    return {"mode": "open", "rate": rate, "scheduled": len(schedule), "requests": client.records,
            "errors": client.errors, "first_error": client.first_error, "unfinished": len(pending), "tokens": client.tokens,
            "worst_send_lag_s": worst_lag, "elapsed": elapsed}


async def closed_loop(url: str, concurrency: int, duration: float, tokens: int, api_key: str = "",
                      prompt_tokens: int = 0) -> dict:
    client = Client(url, tokens, api_key, prompt_tokens)
    begin = _clock()
    deadline = begin + duration
    counter = iter(range(1 << 30))

    async def worker() -> None:
        while _clock() < deadline:
            await client.one(next(counter), _clock())

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = _clock() - begin
    await client.pool.close()
    return {"mode": "closed", "concurrency": concurrency, "requests": client.records, "errors": client.errors,
            "first_error": client.first_error, "unfinished": 0, "tokens": client.tokens, "worst_send_lag_s": 0.0, "elapsed": elapsed}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="open- or closed-loop streaming load client for goodput bench sidecar")
    p.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8080")
    p.add_argument("--rate", type=float, default=0.0, help="open loop: Poisson arrivals per second")
    p.add_argument("--seed", type=int, default=0, help="open loop: schedule seed (same seed, same schedule)")
    p.add_argument("--grace", type=float, default=15.0, help="open loop: seconds to wait after the last arrival")
    p.add_argument("--concurrency", type=int, default=0, help="closed loop: streams back to back")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--api-key", default="", help="sent as a bearer token (LiteLLM's proxy wants one)")
    p.add_argument("--prompt-tokens", type=int, default=0,
                   help="prompt size in tokens (about 4 characters each; 0 = a one-word prompt)")
    args = p.parse_args(argv)
    if args.prompt_tokens < 0:
        sys.exit(f"--prompt-tokens must be >= 0, got {args.prompt_tokens}")
    from sidecar.eventloop import new_event_loop
    url = args.url.rstrip("/")
    if args.rate > 0:
        coro = open_loop(url, args.rate, args.duration, args.seed, args.tokens, args.grace, args.api_key,
                         args.prompt_tokens)
    elif args.concurrency > 0:
        coro = closed_loop(url, args.concurrency, args.duration, args.tokens, args.api_key, args.prompt_tokens)
    else:
        sys.exit("give --rate (open loop) or --concurrency (closed loop)")
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        result = runner.run(coro)
    json.dump(result, sys.stdout, separators=(",", ":"))


if __name__ == "__main__":
    main()
