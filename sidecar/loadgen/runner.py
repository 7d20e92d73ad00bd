"""Open-loop load against any OpenAI-compatible endpoint, timed with the sidecar's own code.

Every request goes out at its scheduled time whether or not earlier ones finished. Timing uses
`sidecar.timing.StreamTimer`, the same implementation the proxy measures with, so a load run
and the sidecar's metrics agree by construction on what TTFT, ITL and TPOT mean.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Callable

import aiohttp

from sidecar.loadgen.prompts import PromptFactory
from sidecar.loadgen.summary import RequestRecord
from sidecar.loadgen.workload import PlannedRequest
from sidecar.slo import SloClass, judge
from sidecar.timing import StreamTimer


@dataclass
class LoadConfig:
    base_url: str                       # e.g. http://127.0.0.1:8080 (the /v1 part is added here)
    model: str
    slo: SloClass
    endpoint: str = "completions"       # completions | chat
    ignore_eos: bool = True             # so outputs have the trace's length, as benchmarks do
    api_key: str | None = None
    request_timeout: float = 600.0
    extra_body: dict = field(default_factory=dict)
    headers: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.endpoint not in ("completions", "chat"):
            raise ValueError(f"endpoint must be 'completions' or 'chat', got {self.endpoint!r}")
        self.base_url = self.base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]


@dataclass
class LiveStats:
    """Counters the progress display reads while the run goes on."""

    sent: int = 0
    finished: int = 0
    good: int = 0
    errors: int = 0
    shed: int = 0
    started_at: float = 0.0

    def goodput(self, now: float) -> float:
        elapsed = now - self.started_at
        return self.good / elapsed if elapsed > 0 else 0.0


def _body(cfg: LoadConfig, prompt: str, req: PlannedRequest) -> dict:
    body = {"model": cfg.model, "max_tokens": req.output_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0.0}
    if cfg.ignore_eos:
        body["ignore_eos"] = True   # vLLM / SGLang / bundled-engine extension; others ignore it
    if cfg.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    body.update(cfg.extra_body)
    return body


async def _one(session: aiohttp.ClientSession, cfg: LoadConfig, req: PlannedRequest, index: int,
               prompt: str, t0: float, stats: LiveStats) -> RequestRecord:
    url = f"{cfg.base_url}/v1/{'chat/completions' if cfg.endpoint == 'chat' else 'completions'}"
    record = RequestRecord(index=index, scheduled=req.arrival, sent=0.0, input_tokens=req.input_tokens,
                           max_tokens=req.output_tokens, hash_ids=list(req.hash_ids), slo_class=req.slo_class)
    headers = cfg.headers if req.slo_class is None else {**cfg.headers, "x-slo-class": req.slo_class}
    delay = t0 + req.arrival - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    start = time.perf_counter()
    record.sent = start - t0
    stats.sent += 1
    timer = StreamTimer(start, "chat" if cfg.endpoint == "chat" else "completion")
    error = None
    cancelled = shed = False
    try:
        async with session.post(url, json=_body(cfg, prompt, req), headers=headers) as resp:
            if resp.status != 200:
                text = await resp.text()
                error = f"HTTP {resp.status}: {_error_message(text)}"
                # 429: refused at once by an admission guard (the sidecar's, or any rate limiter);
                # an open-loop run does not retry, it records what the server did with the arrival.
                shed = resp.status == 429
            else:
                async for chunk in resp.content.iter_any():
                    timer.feed(chunk, time.perf_counter())
    except asyncio.CancelledError:
        cancelled = True
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    timing = timer.finish(time.perf_counter())
    error = error or timing.error
    verdict = judge(timing, cfg.slo, error=error, cancelled=cancelled, shed=shed)
    record.outcome, record.violated = verdict.outcome, list(verdict.violated)
    record.ttft, record.tpot, record.e2e = timing.ttft, timing.tpot, timing.e2e
    record.itl, record.output_tokens = list(timing.itl), timing.output_tokens
    record.usage_input_tokens, record.error = timing.input_tokens, error
    record.cached_tokens = timing.cached_tokens
    stats.finished += 1
    stats.good += record.outcome == "good"
    stats.errors += record.outcome == "error"
    stats.shed += record.outcome == "shed"
    return record


def _error_message(text: str) -> str:
    try:
        err = json.loads(text)
        err = err.get("error", err)
        return str(err.get("message", err))[:200]
    except (ValueError, AttributeError):
        return text[:200]


async def run_load(cfg: LoadConfig, requests: list[PlannedRequest], prompts: PromptFactory,
                   stats: LiveStats | None = None,
                   on_record: Callable[[RequestRecord], None] | None = None) -> tuple[list[RequestRecord], float]:
    """Send `requests` open-loop; returns (records in index order, run duration in seconds).

    Cancelling the task (Ctrl-C) stops sending, marks unfinished requests `cancelled`, and still
    returns everything measured so far.
    """
    stats = stats or LiveStats()
    texts = [prompts.prompt(r, i) for i, r in enumerate(requests)]
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    timeout = aiohttp.ClientTimeout(total=cfg.request_timeout, sock_connect=10)
    # limit=0: open loop means no client-side cap on concurrent requests.
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    records: list[RequestRecord] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
        t0 = time.perf_counter()
        stats.started_at = t0
        tasks = [asyncio.ensure_future(_one(session, cfg, r, i, texts[i], t0, stats)) for i, r in enumerate(requests)]
        try:
            for fut in asyncio.as_completed(tasks):
                rec = await fut
                records.append(rec)
                if on_record:
                    on_record(rec)
        except asyncio.CancelledError:
            for t in tasks:
                t.cancel()
            done = {r.index for r in records}
            for t in tasks:
                try:
                    rec = await t
                except asyncio.CancelledError:
                    continue   # cancelled before it was sent: not part of the run
                if rec.index not in done:
                    records.append(rec)
        duration = time.perf_counter() - t0
    records.sort(key=lambda r: r.index)
    return records, duration
