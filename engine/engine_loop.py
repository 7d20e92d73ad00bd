"""The engine loop: one thread owns the engine core and runs steps while there is work.

The asyncio side never touches the engine: it posts commands (add, abort) into a thread-safe
queue and gets each step's outputs back through loop.call_soon_threadsafe, one call per step,
into per-request asyncio queues. So a long model step never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass

from engine.core import LLMEngine, RequestOutput
from engine.metrics import EngineMetrics
from engine.request import SamplingParams

log = logging.getLogger("goodput.engine")


@dataclass
class EngineError:
    """Sent to a request's queue when a step failed; the server turns it into an error."""
    message: str


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    arrival: float
    first_token: float | None = None
    last_token: float | None = None


class EngineLoop:
    def __init__(self, engine: LLMEngine, metrics: EngineMetrics | None = None):
        self.engine = engine
        self.metrics = metrics
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self.num_steps = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._cmds.put(("stop",))
        self._thread.join(timeout=10)

    def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams, salt: str | None,
               out_queue: asyncio.Queue) -> None:
        """Call engine.check_request first (from any thread): add never fails on length."""
        stream = _Stream(asyncio.get_running_loop(), out_queue, time.monotonic())
        self._cmds.put(("add", request_id, prompt_ids, params, salt, stream))

    def abort(self, request_id: str) -> None:
        self._cmds.put(("abort", request_id))

    def _drain(self, block: bool) -> bool:
        """Apply pending commands; True if there were any."""
        got = False
        while True:
            try:
                cmd = self._cmds.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                return got
            block, got = False, True
            if cmd[0] == "add":
                _, rid, prompt_ids, params, salt, stream = cmd
                try:
                    self.engine.add_request(rid, prompt_ids, params, salt, arrival_time=stream.arrival)
                    self._streams[rid] = stream
                except ValueError as exc:
                    stream.loop.call_soon_threadsafe(stream.queue.put_nowait, EngineError(str(exc)))
            elif cmd[0] == "abort":
                rid = cmd[1]
                if self._streams.pop(rid, None) is not None:
                    self.engine.abort(rid)
                    if self.metrics:
                        self.metrics.success.labels(self.metrics.model_name, "abort").inc()

    def _run(self) -> None:
        while not self._stop.is_set():
            changed = self._drain(block=not self.engine.has_work())
            if not self.engine.has_work():
                if changed and self.metrics:  # e.g. the last request was aborted: gauges to zero
                    self.metrics.update_engine(self.engine)
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # a failed step fails its requests, not the server
                log.exception("engine step failed")
                self._fail_all(f"engine step failed: {exc}")
                continue
            self.num_steps += 1
            self._deliver(outputs)
            if self.metrics:
                self.metrics.step_done(self.engine.num_step_tokens)
                self.metrics.update_engine(self.engine)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        now = time.monotonic()
        batches: dict[asyncio.AbstractEventLoop, list] = {}
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if self.metrics:
                m = self.metrics.model_name
                if stream.first_token is None:
                    self.metrics.ttft.labels(m).observe(now - stream.arrival)
                    self.metrics.first_token(out.num_cached_tokens)
                else:
                    self.metrics.itl.labels(m).observe(now - stream.last_token)
            if stream.first_token is None:
                stream.first_token = now
            stream.last_token = now
            if out.finished:
                del self._streams[out.request_id]
                if self.metrics:
                    self.metrics.request_finished(out.finish_reason, now - stream.arrival,
                                                  out.num_prompt_tokens, out.num_output_tokens,
                                                  out.times, out.num_cached_tokens)
            batches.setdefault(stream.loop, []).append((stream.queue, out))
        for loop, items in batches.items():
            loop.call_soon_threadsafe(_put_all, items)

    def _fail_all(self, message: str) -> None:
        for rid, stream in list(self._streams.items()):
            self.engine.abort(rid)
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, EngineError(message))
        self._streams.clear()


def _put_all(items) -> None:
    for q, out in items:
        q.put_nowait(out)
