"""`goodput bench soak`: the sidecar under steady open-loop load for N minutes, watched for leaks.

The tiny engine and the forecaster (scraping the sidecar) run as processes; `goodput load` sends
Poisson traffic from its own process. The sidecar runs in this process on its own event loop, so
its asyncio tasks can be counted; this process holds nothing else but the sampler, so its RSS,
open file descriptors and threads are the sidecar's. At the end, with the load stopped, the
sidecar's own counters are compared with the client's records, and each figure is checked
against a bound (exit 1 if one fails).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from goodput_cli.errors import UsageError


def register(registry) -> None:
    p = registry.command("bench soak", "sidecar + tiny engine + forecaster under steady load: leaks and counts", run)
    p.add_argument("--minutes", type=float, default=30.0, help="how long the load runs (default 30)")
    p.add_argument("--rate", type=float, default=4.0, help="requests/s, Poisson (default 4)")
    p.add_argument("--output-tokens", type=int, default=32, help="tokens per streamed answer (default 32)")
    p.add_argument("--sample-every", type=float, default=None, help="seconds between samples (default: 10, or less for short runs)")
    p.add_argument("--json", type=Path, help="write samples and verdicts as JSON to this file")


@dataclass
class Sample:
    t: float                  # seconds since the load started
    rss_mib: float
    open_fds: int
    threads: int
    asyncio_tasks: int
    in_flight: int


@dataclass
class Check:
    name: str
    value: float
    bound: str
    ok: bool


@dataclass
class SoakResult:
    minutes: float
    rate: float
    samples: list[Sample] = field(default_factory=list)
    client: dict[str, int] = field(default_factory=dict)
    sidecar: dict[str, float] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def slope_per_minute(samples: list[Sample]) -> float:
    """Least-squares slope of RSS (MiB per minute) over the samples after the first fifth
    (start-up allocations: imports, first connections, histogram series)."""
    rest = samples[len(samples) // 5:]
    if len(rest) < 2:
        return 0.0
    ts = [s.t / 60 for s in rest]
    ys = [s.rss_mib for s in rest]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - mt) ** 2 for t in ts)
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var if var else 0.0


def judge(result: SoakResult, baseline: Sample, end: Sample) -> list[Check]:
    """Pass/fail bounds. RSS: under 1 MiB/min after warm-up (a leak of one small object per
    request at 4 req/s is ~1 MiB/min), or under 16 MiB of growth in a run too short for a slope;
    fds, threads, tasks: back to the warmed-up level once the load stops (idle keep-alive
    connections to the engine may stay, up to 32); counts: exactly the client's."""
    slope = slope_per_minute(result.samples)
    growth = end.rss_mib - baseline.rss_mib
    sent = sum(result.client.values())
    side = result.sidecar
    short = result.minutes < 5
    return [
        Check("RSS slope, MiB/min", round(slope, 3), "< 1" + (" (short run: growth < 16 MiB instead)" if short else ""),
              growth < 16 if short else slope < 1),
        Check("RSS growth, MiB", round(growth, 1), "< 64", growth < 64),
        Check("open fds after the load", end.open_fds, f"<= {baseline.open_fds} + 32", end.open_fds <= baseline.open_fds + 32),
        Check("threads after the load", end.threads, f"<= {baseline.threads} + 2", end.threads <= baseline.threads + 2),
        Check("asyncio tasks after the load", end.asyncio_tasks, f"<= {baseline.asyncio_tasks} + 2",
              end.asyncio_tasks <= baseline.asyncio_tasks + 2),
        Check("in flight after the load", end.in_flight, "== 0", end.in_flight == 0),
        Check("sidecar counted / client sent", side.get("finished", 0), f"== {sent}", side.get("finished", 0) == sent),
        Check("sidecar arrivals / finished", side.get("arrived", 0), f"== {side.get('finished', 0):g}",
              side.get("arrived", 0) == side.get("finished", 0)),
        Check("client errors", result.client.get("error", 0), "== 0", result.client.get("error", 0) == 0),
        Check("forecaster desired replicas", side.get("desired_replicas", float("nan")), ">= 1, finite",
              side.get("desired_replicas", 0) >= 1),
    ]


def _sidecar_counts(registry) -> dict[str, float]:
    out = {"finished": 0.0, "arrived": 0.0, "in_flight": 0.0}
    names = {"goodput_requests_total": "finished", "goodput_requests_arrived_total": "arrived",
             "goodput_requests_in_flight": "in_flight"}
    for family in registry.collect():
        for s in family.samples:
            if s.name in names:
                out[names[s.name]] += s.value
            if s.name == "goodput_requests_total":
                out["outcome_" + s.labels["outcome"]] = out.get("outcome_" + s.labels["outcome"], 0.0) + s.value
    return out


def _sample(proc, loop, registry, t: float) -> Sample:
    async def count_tasks() -> int:
        return len(asyncio.all_tasks())
    tasks = asyncio.run_coroutine_threadsafe(count_tasks(), loop).result(5)
    return Sample(round(t, 1), round(proc.memory_info().rss / 2**20, 2), proc.num_fds(), proc.num_threads(),
                  tasks - 1, int(_sidecar_counts(registry)["in_flight"]))   # - 1: count_tasks itself


def _forecaster_desired(port: int) -> float:
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("goodput_desired_replicas "):
                return float(line.split()[1])
    return float("nan")


def free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(args: argparse.Namespace) -> int:
    import psutil
    from opentelemetry.sdk.trace import TracerProvider
    from prometheus_client import CollectorRegistry

    from goodput_cli.procs import ServerProcess, goodput_command
    from sidecar.app import make_app
    from sidecar.config import ProxyConfig
    from sidecar.server import RunningSidecar

    if args.minutes <= 0 or args.rate <= 0:
        raise UsageError(f"--minutes and --rate must be > 0, got {args.minutes:g} and {args.rate:g}")
    seconds = args.minutes * 60
    every = args.sample_every or min(10.0, max(1.0, seconds / 12))
    work = Path(tempfile.mkdtemp(prefix="goodput-soak-"))
    procs: list[ServerProcess] = []
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="sidecar-loop", daemon=True)
    thread.start()
    result = SoakResult(args.minutes, args.rate)
    running = None
    try:
        engine_port, forecaster_port = free_port(), free_port()
        print(f"soak: starting the tiny engine on :{engine_port} ...", flush=True)
        procs.append(ServerProcess(goodput_command("engine", "serve", "--model", "tiny", "--port", str(engine_port),
                                                   "--max-num-seqs", "128"),
                                   f"http://127.0.0.1:{engine_port}/health", timeout=180, name="engine"))
        registry = CollectorRegistry()
        config = ProxyConfig(upstream=f"http://127.0.0.1:{engine_port}", port=0, models=("tiny",),
                             engine_metrics_interval=2.0)
        running = asyncio.run_coroutine_threadsafe(RunningSidecar(make_app(config, registry, TracerProvider())).start(),
                                                   loop).result(30)
        sidecar = f"127.0.0.1:{running.port}"
        procs.append(ServerProcess(goodput_command("forecaster", "run", "--targets", sidecar, "--step", "2",
                                                   "--horizon", "20", "--capacity", "10", "--api-port", "0",
                                                   "--metrics-port", str(forecaster_port), "--host", "127.0.0.1",
                                                   "--models", "level"),
                                   f"http://127.0.0.1:{forecaster_port}/metrics", timeout=120, name="forecaster"))
        proc = psutil.Process()
        count = max(1, round(args.rate * seconds))
        records = work / "records.jsonl"
        print(f"soak: {count} requests at {args.rate:g}/s for {args.minutes:g} min through http://{sidecar} "
              f"({config.http_server} HTTP server); a sample every {every:g} s", flush=True)
        time.sleep(1.0)
        baseline = _sample(proc, loop, registry, 0.0)
        load = ServerProcess(goodput_command("load", "--url", f"http://{sidecar}", "--model", "tiny", "--rate",
                                             str(args.rate), "--num-requests", str(count), "--input-tokens", "32",
                                             "--output-tokens", str(args.output_tokens), "--records", str(records),
                                             "--quiet", "--slo-ttft", "10", "--slo-tpot", "1"),
                             None, name="load")
        procs.append(load)
        t0 = time.monotonic()
        while load.proc.poll() is None:
            time.sleep(every)
            s = _sample(proc, loop, registry, time.monotonic() - t0)
            result.samples.append(s)
            print(f"  t={s.t:6.0f}s rss={s.rss_mib:7.1f} MiB fds={s.open_fds:4d} threads={s.threads:3d} "
                  f"tasks={s.asyncio_tasks:4d} in_flight={s.in_flight:3d}", flush=True)
            if time.monotonic() - t0 > seconds + 300:
                raise UsageError("the load ran 5 minutes past --minutes; the engine cannot keep up with --rate")
        if load.proc.returncode != 0:
            raise UsageError(f"goodput load failed (exit {load.proc.returncode}):\n{load.log()[-2000:]}")
        time.sleep(3.0)      # the forecaster's next steps; keep-alive connections settle
        end = _sample(proc, loop, registry, time.monotonic() - t0)
        result.samples.append(end)
        for line in records.read_text().splitlines():
            outcome = json.loads(line)["outcome"]
            result.client[outcome] = result.client.get(outcome, 0) + 1
        result.sidecar = _sidecar_counts(registry)
        result.sidecar["desired_replicas"] = _forecaster_desired(forecaster_port)
        result.checks = judge(result, baseline, end)
    finally:
        if running is not None:
            asyncio.run_coroutine_threadsafe(running.stop(1.0), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        for p in reversed(procs):
            p.stop()
    print(f"\nclient: {result.client}; sidecar outcomes: "
          f"{ {k[8:]: v for k, v in result.sidecar.items() if k.startswith('outcome_') and v} }")
    width = max(len(c.name) for c in result.checks)
    for c in result.checks:
        print(f"  {'PASS' if c.ok else 'FAIL'}  {c.name:<{width}}  {c.value:>10g}  {c.bound}")
    print("soak: " + ("PASS" if result.ok else "FAIL"))
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=2, sort_keys=True))
    return 0 if result.ok else 1
