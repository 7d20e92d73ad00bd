"""The benchmark's load client, run as its own process: closed-loop streams for a fixed time.

Each of `--concurrency` workers sends a streaming chat request, reads it to the end (timed with
`StreamTimer`, the same code the sidecar measures with) and sends the next, until `--duration`
has passed. Prints one JSON line: TTFTs, tokens received, requests, errors, elapsed seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp

from sidecar.timing import StreamTimer


async def _worker(session: aiohttp.ClientSession, url: str, body: bytes, deadline: float, out: dict) -> None:
    headers = {"Content-Type": "application/json"}
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        timer = StreamTimer(start, "chat")
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                if resp.status != 200:
                    await resp.read()
                    out["errors"] += 1
                    continue
                async for data in resp.content.iter_any():
                    timer.feed(data, time.perf_counter())
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            out["errors"] += 1
            continue
        timing = timer.finish(time.perf_counter())
        if timing.error is not None or timing.ttft is None:
            out["errors"] += 1
            continue
        out["ttft"].append(timing.ttft)
        out["tokens"] += len(timing.itl) + 1     # content chunks received (one token each here)
        out["requests"] += 1


async def run(url: str, concurrency: int, duration: float, tokens: int) -> dict:
    body = json.dumps({"model": "scripted", "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": "benchmark"}]}).encode()
    out = {"ttft": [], "tokens": 0, "requests": 0, "errors": 0}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        start = time.perf_counter()
        deadline = start + duration
        await asyncio.gather(*(_worker(session, url, body, deadline, out) for _ in range(concurrency)))
        out["elapsed"] = time.perf_counter() - start
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="closed-loop streaming load client for goodput bench sidecar")
    p.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8080")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args(argv)
    result = asyncio.run(run(args.url.rstrip("/") + "/v1/chat/completions", args.concurrency, args.duration, args.tokens))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
