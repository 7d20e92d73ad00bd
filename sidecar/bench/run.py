"""`goodput bench sidecar`: the sidecar's cost against a direct connection and a bare relay.

Two scripted upstreams (paced: a token every 5 ms per stream, like a fast GPU; fast: as fast as
the loop allows), each reached three ways (direct, through the bare asyncio relay, through the
sidecar), at each concurrency. Every component is its own process, so CPU time per process is
read from the OS (psutil) around each run. Runs go direct, relay, sidecar and then in reverse
order, and the two repeats are averaged, so slow drift of the machine hits all three alike.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

from sidecar.bench.report import PATHS, Run, print_table, summarise

UPSTREAMS = {"paced": {"ttft": 0.005, "itl": 0.005}, "fast": {"ttft": 0.0, "itl": 0.0}}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Proc:
    def __init__(self, name: str, args: list[str], ready_url: str):
        self.name = name
        self.proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.ps = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited: {self.proc.stderr.read().decode(errors='replace')[-2000:]}")
            try:
                urllib.request.urlopen(ready_url, timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not answer {ready_url}")
                time.sleep(0.1)

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _start_stack(kind: str) -> dict[str, tuple[str, _Proc | None]]:
    """One upstream, a bare relay and a sidecar in front of it: path -> (base URL, process in the middle)."""
    up_port, relay_port, side_port = _free_port(), _free_port(), _free_port()
    cfg = UPSTREAMS[kind]
    up = _Proc(f"{kind} upstream", ["-m", "sidecar.bench.scripted_upstream", "--port", str(up_port),
                                    "--ttft", str(cfg["ttft"]), "--itl", str(cfg["itl"])],
               f"http://127.0.0.1:{up_port}/health")
    relay = _Proc("bare relay", ["-m", "sidecar.bench.bare_relay", "--port", str(relay_port), "--upstream-port", str(up_port)],
                  f"http://127.0.0.1:{relay_port}/health")
    side = _Proc("sidecar", ["-m", "goodput_cli", "sidecar", "run", "--upstream", f"http://127.0.0.1:{up_port}",
                             "--port", str(side_port), "--models", "scripted"],
                 f"http://127.0.0.1:{side_port}/healthz")
    return {"upstream": (f"http://127.0.0.1:{up_port}", up), "direct": (f"http://127.0.0.1:{up_port}", None),
            "relay": (f"http://127.0.0.1:{relay_port}", relay), "sidecar": (f"http://127.0.0.1:{side_port}", side)}


def _client(url: str, concurrency: int, duration: float, tokens: int) -> tuple[dict, float]:
    """Run the load client process; returns its result and its CPU seconds (from the kernel's rusage)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "sidecar.bench.client", "--url", url, "--concurrency", str(concurrency),
                           "--duration", str(duration), "--tokens", str(tokens)], capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"load client failed: {proc.stderr.decode(errors='replace')[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(proc.stdout), cpu


def _measure(stack, path: str, upstream: str, concurrency: int, duration: float, tokens: int, repeat: int) -> Run:
    url, middle = stack[path]
    up = stack["upstream"][1]
    before_up, before_mid = up.cpu(), middle.cpu() if middle else 0.0
    result, client_cpu = _client(url, concurrency, duration, tokens)
    after_up, after_mid = up.cpu(), middle.cpu() if middle else 0.0
    return Run(upstream=upstream, path=path, concurrency=concurrency, repeat=repeat, tokens=result["tokens"],
               requests=result["requests"], errors=result["errors"], elapsed=result["elapsed"], ttft=result["ttft"],
               cpu_upstream=after_up - before_up, cpu_middle=after_mid - before_mid, cpu_client=client_cpu)


def run_benchmark(levels: tuple[int, ...], duration: float, tokens: int, json_path: Path | None,
                  repeats: int = 2) -> int:
    from rich.progress import Progress

    runs: list[Run] = []
    load_before = os.getloadavg()[0]
    total = len(UPSTREAMS) * len(levels) * len(PATHS) * repeats
    with Progress(transient=True) as progress:
        task = progress.add_task("benchmark", total=total)
        for upstream in UPSTREAMS:
            stack = _start_stack(upstream)
            try:
                for path in PATHS:   # warm-up: imports, pooled connections, first-request costs
                    _client(stack[path][0], 4, 0.5, tokens)
                for concurrency in levels:
                    for repeat in range(repeats):
                        order = PATHS if repeat % 2 == 0 else tuple(reversed(PATHS))
                        for path in order:
                            progress.update(task, description=f"{upstream} x{concurrency} {path}")
                            runs.append(_measure(stack, path, upstream, concurrency, duration, tokens, repeat))
                            progress.advance(task)
            finally:
                for _, proc in stack.values():
                    if proc is not None:
                        proc.stop()
    doc = summarise(runs, duration, tokens, (load_before, os.getloadavg()[0]))
    print_table(doc)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        print(f"wrote {json_path}")
    return 0
