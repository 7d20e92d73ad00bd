"""Helpers for the fault tests: the tiny engine as a process that can be killed and restarted on
the same port, an open-loop load run in a background thread, and the engine's own gauges."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx

from sidecar.config import ProxyConfig
from sidecar.loadgen.prompts import PromptFactory
from sidecar.loadgen.runner import LoadConfig, run_load
from sidecar.loadgen.workload import poisson_arrivals, synthetic_workload
from tests.support import ServerProcess, free_port, goodput_command


class Engine:
    """`goodput engine serve --model tiny` with a small KV cache (a leaked block shows in usage)."""

    def __init__(self, num_blocks: int = 2048):
        self.port = free_port()
        self.num_blocks = num_blocks
        self.proc: ServerProcess | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = ServerProcess(goodput_command("engine", "serve", "--model", "tiny", "--port", str(self.port),
                                                  "--num-blocks", str(self.num_blocks), "--max-model-len", "2048",
                                                  "--max-num-seqs", "128"),
                                  self.url + "/health", timeout=120, name="engine-tiny")

    def gauges(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", timeout=5).text
        out = {}
        for line in text.splitlines():
            for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
                if line.startswith(name + "{"):
                    out[name.split(":")[1]] = float(line.rsplit(" ", 1)[1])
        return out

    def wait_idle(self, timeout: float = 15.0) -> dict[str, float]:
        """Wait until nothing runs or waits and every KV block is free; the last gauges read."""
        deadline = time.monotonic() + timeout
        while True:
            gauges = self.gauges()
            if not any(gauges.values()) or time.monotonic() > deadline:
                return gauges
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


class Load:
    """`count` streaming requests at `rate`/s (Poisson, open loop) through `base_url`, in a thread."""

    def __init__(self, base_url: str, rate: float, count: int, output_tokens: int = 64, seed: int = 0,
                 headers: dict | None = None, prompt: str | None = None):
        slo = ProxyConfig(upstream="http://unused").slo.classes["interactive"]
        self.cfg = LoadConfig(base_url=base_url, model="tiny", slo=slo, request_timeout=60,
                              headers=headers or {})
        self.requests = synthetic_workload(poisson_arrivals(rate, count, seed=seed), 24, output_tokens)
        self.prompts = _FixedPrompt(prompt) if prompt else PromptFactory(seed=seed)
        self.records = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.records, _ = asyncio.run(run_load(self.cfg, self.requests, self.prompts))

    def join(self, timeout: float = 90.0) -> list:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the load did not finish"
        return self.records

    def outcomes(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.records:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
        return counts


class _FixedPrompt:
    def __init__(self, text: str):
        self.text = text

    def prompt(self, request, index: int) -> str:
        return f"{self.text} {index}"
