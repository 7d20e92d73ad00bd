"""The processes of `goodput bench sidecar`: the scripted upstream and the arms in front of it.

Arms: `direct` (the client talks to the upstream), `direct-again` (the same, run again as if it
were an arm: an A/A control, whose "added" latency is the method's own floor on this machine),
`relay` (`bare_relay.py`, bytes only: the floor for a Python relay), `sidecar` (`goodput sidecar
run`, default settings: engine-metrics scrape on, every metric recorded) and `litellm`
(LiteLLM's proxy, the gateway a Python user would otherwise pick; see `litellm_arm.py`). Every
one but the two direct ones is its own process, so the kernel's CPU accounting (psutil, children
included) tells what each costs, and each is pinned to cores (`CorePlan`) where the machine has
more than one.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.request
from dataclasses import dataclass

import psutil

from goodput_cli.procs import ServerProcess

# direct-again: the direct path measured again as an arm (A/A): what "added" reads when nothing is added.
# sidecar-aiohttp: the sidecar on aiohttp's HTTP server (--http-server aiohttp), to compare the servers.
# sidecar-python: the sidecar with its C fast path for streamed tokens off (GOODPUT_NO_FASTRELAY=1),
# to measure what that path saves.
# sidecar-otlp: the sidecar exporting its spans and GenAI metrics over OTLP/HTTP (to `otlp_sink.py`),
# to measure what exporting costs.
ARMS = ("direct", "direct-again", "relay", "sidecar", "sidecar-python", "sidecar-aiohttp", "sidecar-otlp", "litellm")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class CorePlan:
    """Which cores the load side (upstream and client) and the arm under test run on."""

    load: tuple[int, ...]
    arm: tuple[int, ...]

    @staticmethod
    def for_machine() -> "CorePlan":
        cores = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()
        if len(cores) >= 2:
            # Two cores (this machine): upstream and client share one, the arm has the other to itself.
            # With more, the arm still gets one core: a sidecar is one event loop.
            half = max(1, len(cores) - 1) if len(cores) <= 3 else len(cores) // 2
            return CorePlan(load=cores[:half], arm=cores[half:half + 1])
        return CorePlan(load=(), arm=())

    def describe(self) -> str:
        if not self.arm:
            return "not pinned (one core available): upstream, client and arm share it"
        return (f"upstream and load client pinned to core(s) {','.join(map(str, self.load))}, "
                f"the arm under test to core {','.join(map(str, self.arm))}")


def pin(pid: int, cores: tuple[int, ...]) -> None:
    if cores:
        try:
            psutil.Process(pid).cpu_affinity(list(cores))
        except (psutil.Error, OSError, AttributeError):
            pass    # unsupported here: the run is still valid, just noisier


class Proc:
    """A child process that answers `ready_url` once started (goodput_cli.procs.ServerProcess: its
    output in a log file, stopped with its whole process group); CPU read from the kernel.

    Never a pipe for its output: one that nobody drained once blocked the scripted upstream's
    event loop, when the tracebacks it logged after LiteLLM was killed filled it."""

    def __init__(self, name: str, argv: list[str], ready_url: str, cores: tuple[int, ...] = (),
                 env: dict | None = None, timeout: float = 30.0):
        self.name, self.argv, self.ready_url = name, argv, ready_url
        self.cores, self.env, self.timeout = cores, env, timeout
        self._start()

    def _start(self) -> None:
        """Raises RuntimeError (it exited) or TimeoutError (it never answered), the process stopped."""
        self.server = ServerProcess(self.argv, None, env=self.env, name=self.name)
        self.ps = psutil.Process(self.proc.pid)
        pin(self.proc.pid, self.cores)
        self.server.wait_ready_url(self.ready_url, self.timeout)
        for child in self._children():   # workers a server forked (LiteLLM may)
            pin(child.pid, self.cores)

    @property
    def proc(self):
        """The running process (subprocess.Popen); a new one after each restart."""
        return self.server.proc

    def cpu(self) -> float:
        """User + system CPU seconds of the process and its live children."""
        total = 0.0
        for p in [self.ps, *self._children()]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def _children(self):
        try:
            return self.ps.children(recursive=True)
        except psutil.Error:
            return []

    def restart(self) -> None:
        """Stop and start again, on the same port: whatever the process still held is dropped."""
        self.stop()
        self._start()

    def stop(self) -> None:
        self.server.stop(grace=10.0)


@dataclass
class Stack:
    """One upstream and the arms in front of it: arm -> base URL, and the process that is the arm."""

    upstream: Proc
    urls: dict[str, str]
    procs: dict[str, Proc | None]
    missing: dict[str, str]          # arm -> why it is not measured
    sink: Proc | None = None         # the OTLP receiver of the sidecar-otlp arm
    exported: dict | None = None     # what it had counted when the arms had stopped (stop())

    def sink_stats(self) -> dict | None:
        """What the OTLP receiver has counted (spans, posts, bytes); None without one."""
        if self.sink is None:
            return None
        try:
            with urllib.request.urlopen(self.sink.ready_url.replace("/health", "/stats"), timeout=2) as resp:
                return json.loads(resp.read())
        except (OSError, ValueError):
            return None

    def settle(self, arm: str, saturated: bool, timeout: float = 120.0) -> None:
        """Before the next run: an arm that fell behind still holds a backlog it keeps sending
        to the shared upstream (LiteLLM's saturated proxy did for minutes, so every run after it,
        direct included, timed out connecting), so it is restarted; then wait until the upstream
        has no request in flight. An upstream that still has some after `timeout` is restarted
        too, on its port (it once stopped answering for minutes after LiteLLM's restart, blocked
        writing to a full stderr pipe; see Proc). An arm that does not come back raises
        RuntimeError or TimeoutError; the caller measures the others without it."""
        proc = self.procs.get(arm)
        if saturated and proc is not None:
            proc.restart()
        if self._upstream_empty(timeout):
            return
        print(f"goodput bench sidecar: the upstream still had requests in flight {timeout:g} s after a run "
              f"on {arm}; restarting it", file=sys.stderr, flush=True)
        self.upstream.restart()

    def _upstream_empty(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.urls["direct"] + "/stats", timeout=2) as resp:
                    if json.loads(resp.read()).get("active", 0) <= 0:
                        return True
            except (OSError, ValueError):
                pass
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the arms, then the OTLP receiver (its count read first: a stopped sidecar has
        flushed the spans its SDK still held), then the upstream."""
        for proc in self.procs.values():
            if proc is not None:
                proc.stop()
        if self.sink is not None:
            self.exported = self.sink_stats()
            self.sink.stop()
        if self.upstream is not None:
            self.upstream.stop()


def start_stack(ttft: float, itl: float, plan: CorePlan, arms: tuple[str, ...], metrics_file: str | None,
                api_key: str) -> Stack:
    py = sys.executable
    up_port = free_port()
    up_args = [py, "-m", "sidecar.bench.scripted_upstream", "--port", str(up_port), "--ttft", str(ttft), "--itl", str(itl)]
    if metrics_file:
        up_args += ["--metrics-file", metrics_file]
    upstream = Proc("scripted upstream", up_args, f"http://127.0.0.1:{up_port}/health", plan.load)
    up_url = f"http://127.0.0.1:{up_port}"
    stack = Stack(upstream, {"direct": up_url}, {"direct": None}, {})
    if "direct-again" in arms:
        stack.urls["direct-again"], stack.procs["direct-again"] = up_url, None
    try:
        if "relay" in arms:
            port = free_port()
            stack.procs["relay"] = Proc("bare relay", [py, "-m", "sidecar.bench.bare_relay", "--port", str(port),
                                                       "--upstream-port", str(up_port)],
                                        f"http://127.0.0.1:{port}/health", plan.arm)
            stack.urls["relay"] = f"http://127.0.0.1:{port}"
        otlp = None
        if "sidecar-otlp" in arms:
            port = free_port()
            stack.sink = Proc("OTLP sink", [py, "-m", "sidecar.bench.otlp_sink", "--port", str(port)],
                              f"http://127.0.0.1:{port}/health", plan.load)
            # The SDK's defaults otherwise: spans batched every 5 s (512 at most a post), metrics every 60 s.
            otlp = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}
        for arm, server, env in (("sidecar", "fast", None), ("sidecar-python", "fast", {"GOODPUT_NO_FASTRELAY": "1"}),
                                 ("sidecar-aiohttp", "aiohttp", None), ("sidecar-otlp", "fast", otlp)):
            if arm in arms:
                port = free_port()
                stack.procs[arm] = Proc(arm, [py, "-m", "goodput_cli", "sidecar", "run", "--upstream", up_url,
                                              "--port", str(port), "--models", "scripted", "--http-server", server],
                                        f"http://127.0.0.1:{port}/healthz", plan.arm, env=env)
                stack.urls[arm] = f"http://127.0.0.1:{port}"
        if "litellm" in arms:
            from sidecar.bench import litellm_arm
            try:
                proc, url = litellm_arm.start(up_url, plan.arm, api_key)
                stack.procs["litellm"], stack.urls["litellm"] = proc, url
            except litellm_arm.Unavailable as exc:
                stack.missing["litellm"] = str(exc)
    except BaseException:
        stack.stop()
        raise
    return stack
