"""`goodput demo`: the embedded default, everything on this machine.

Starts the bundled engine (SmolLM2 by default), the sidecar in front of it and the forecaster
(scraping the sidecar), calibrates how fast this machine serves, replays a slice of a real trace
time-scaled to that capacity through the sidecar, shows a live view read from the components'
own /metrics, and ends with a report and the metrics URLs.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import time
from pathlib import Path

from goodput_cli.errors import UsageError

BUNDLED_TRACE = Path(__file__).resolve().parent.parent / "sidecar" / "loadgen" / "data" / "azure_code_5min.csv"


def register(registry) -> None:
    p = registry.command("demo", "the embedded default: engine + sidecar + forecaster, replays a real trace", run)
    p.add_argument("--model", default="smollm2", help="engine model: smollm2 (default), tiny, or a path")
    p.add_argument("--trace", type=Path, default=BUNDLED_TRACE, help="trace to replay (default: bundled Azure code slice)")
    p.add_argument("--duration", type=float, default=120.0,
                   help="seconds of replay (default 120); the trace is time-scaled to fill them at the chosen load")
    p.add_argument("--load", type=float, default=0.25,
                   help="mean offered load as a fraction of the calibrated capacity (default 0.25: calibration is a best case, all prompts arriving together; bursts go above)")
    p.add_argument("--max-input", type=int, default=512, help="cap prompt lengths (one scale factor for all, default 512)")
    p.add_argument("--max-output", type=int, default=32, help="cap output lengths (default 32)")
    p.add_argument("--slo-ttft", type=float, default=3.0, help="TTFT objective for the demo, seconds")
    p.add_argument("--slo-tpot", type=float, default=0.5, help="TPOT objective for the demo, seconds")
    p.add_argument("--engine-port", type=int, default=8000)
    p.add_argument("--sidecar-port", type=int, default=8080)
    p.add_argument("--forecaster-port", type=int, default=9300, help="forecaster /metrics port (default 9300)")
    p.add_argument("--forecaster-api-port", type=int, default=8443,
                   help="forecaster External Metrics API (HTTPS, self-signed) port (default 8443)")
    p.add_argument("--out", type=Path, default=Path("demo-report"), help="report folder (default demo-report)")
    p.add_argument("--keep-running", action="store_true", help="leave the servers up after the report until Ctrl-C")


def _slo_file(out: Path, ttft: float, tpot: float) -> Path:
    path = out / "slo.yaml"
    path.write_text("default_class: demo\nclasses:\n"
                    f"  - name: demo\n    ttft: {ttft}\n    tpot: {tpot}\n    objective: 0.9\n")
    return path


def start_stack(args, procs: list) -> None:
    """Engine, sidecar and (when it starts) forecaster, each waited for, appended to `procs`.

    Appending as they start means the caller stops every one that did start, whatever fails next.
    """
    from goodput_cli.procs import ServerProcess, goodput_command

    print(f"starting the engine ({args.model}) on :{args.engine_port} (first run fetches and converts the weights)...")
    procs.append(ServerProcess(goodput_command("engine", "serve", "--model", args.model, "--port", str(args.engine_port)),
                               f"http://127.0.0.1:{args.engine_port}/health", timeout=600, name="engine"))
    print(f"starting the sidecar on :{args.sidecar_port}...")
    procs.append(ServerProcess(goodput_command("sidecar", "run", "--upstream", f"http://127.0.0.1:{args.engine_port}",
                                               "--port", str(args.sidecar_port), "--slo-config", str(_slo_file(args.out, args.slo_ttft, args.slo_tpot)),
                                               "--engine-metrics-interval", "1"),
                               f"http://127.0.0.1:{args.sidecar_port}/healthz", timeout=60, name="sidecar"))


def start_forecaster(args, procs: list, capacity: float) -> bool:
    """The forecaster scraping the sidecar, with the calibrated per-replica capacity; False if it won't start."""
    from goodput_cli.procs import ServerProcess, goodput_command

    if importlib.util.find_spec("forecaster.cli") is None:
        return False
    print(f"starting the forecaster on :{args.forecaster_port} (External Metrics API on https://127.0.0.1:{args.forecaster_api_port})...")
    try:
        procs.append(ServerProcess(goodput_command("forecaster", "run", *forecaster_args(args, capacity)),
                                   f"http://127.0.0.1:{args.forecaster_port}/metrics", timeout=60, name="forecaster"))
        return True
    except (RuntimeError, TimeoutError) as exc:
        # The demo is still whole without the forecast; say why it is missing.
        print(f"forecaster not started, continuing without forecasts: {str(exc).strip().splitlines()[-1]}")
        return False


def forecaster_args(args, capacity: float) -> list[str]:
    # A 5 s step and a 60 s horizon so the forecast moves within a few-minute demo; in production
    # the defaults (15 s, 180 s = a replica's cold start) apply.
    return ["--targets", f"127.0.0.1:{args.sidecar_port}", "--metrics-port", str(args.forecaster_port),
            "--api-port", str(args.forecaster_api_port), "--self-signed", "--step", "5", "--horizon", "60",
            "--capacity", f"{capacity:.4f}", "--max-replicas", "8"]


def calibrate(url: str, model: str, n_in: int, n_out: int, tokenizer) -> float:
    """Completed requests/s of this machine for a typical request at a small concurrency (4)."""
    from sidecar.loadgen.prompts import PromptFactory
    from sidecar.loadgen.runner import LoadConfig, run_load
    from sidecar.loadgen.workload import PlannedRequest
    from sidecar.slo import SloClass

    cfg = LoadConfig(base_url=url, model=model, slo=SloClass("calibrate", ttft=1e9, tpot=1e9))
    prompts = PromptFactory(tokenizer, seed=99)
    asyncio.run(run_load(cfg, [PlannedRequest(0.0, n_in, 4)], prompts))  # warm-up
    reqs = [PlannedRequest(0.0, n_in, n_out) for _ in range(4)]
    records, duration = asyncio.run(run_load(cfg, reqs, prompts))
    done = sum(r.outcome == "good" for r in records)
    if done == 0:
        raise UsageError(f"calibration requests failed: {records[0].error}")
    return done / duration


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from goodput_cli.demo_view import DemoView
    from sidecar.loadgen import traces
    from sidecar.loadgen.prompts import PromptFactory
    from sidecar.loadgen.runner import LiveStats, LoadConfig, run_load
    from sidecar.loadgen.summary import format_summary, summarise
    from sidecar.slo import SloClass

    args.out.mkdir(parents=True, exist_ok=True)
    try:
        reqs = traces.read_trace(args.trace)
    except traces.TraceError as exc:
        raise UsageError(str(exc)) from None
    procs: list = []
    try:
        start_stack(args, procs)
        sidecar_url = f"http://127.0.0.1:{args.sidecar_port}"
        import httpx

        model = httpx.get(f"{sidecar_url}/v1/models", timeout=30).json()["data"][0]["id"]
        tokenizer = tokenizer_file(args.model)
        fitted, fit = traces.fit_to_model(reqs, max_model_len=2048, max_input=args.max_input, max_output=args.max_output)
        n_in = int(np.median([r.input_tokens for r in fitted]))
        n_out = int(np.median([r.output_tokens for r in fitted]))
        print(f"calibrating: 4 concurrent requests of {n_in} prompt + {n_out} output tokens...")
        capacity = calibrate(sidecar_url, model, n_in, n_out, tokenizer)
        has_forecaster = start_forecaster(args, procs, capacity)
        # Take as many of the trace's first requests as the target rate fills the duration with, and
        # compress (or stretch) their real inter-arrival pattern onto the duration.
        count = max(2, min(len(fitted), round(args.load * capacity * args.duration)))
        span = fitted[count - 1].arrival or 1.0
        speedup = span / args.duration
        replay = traces.window(fitted[:count], 0.0, None, speedup)
        print(f"capacity ≈ {capacity:.2f} req/s; replaying the first {count} requests ({span:.0f} s) of "
              f"{args.trace.name} at ×{speedup:.3f} speed: {count / args.duration:.2f} req/s over {args.duration:.0f} s; "
              f"prompts scaled ×{fit.scale:.3f}, outputs capped at {args.max_output}")
        slo = SloClass("demo", ttft=args.slo_ttft, tpot=args.slo_tpot, objective=0.9)
        cfg = LoadConfig(base_url=sidecar_url, model=model, slo=slo)
        stats = LiveStats()
        view = DemoView(sidecar_url, f"http://127.0.0.1:{args.forecaster_port}" if has_forecaster else None, stats, len(replay))

        async def go():
            task = asyncio.ensure_future(run_load(cfg, replay, PromptFactory(tokenizer, seed=1), stats))
            return await view.run_until(task)

        records, duration = asyncio.run(go())
        summary = summarise(records, duration, replay[-1].arrival)
        report = {"model": model, "capacity_req_per_s": capacity, "speedup": speedup, "trace": str(args.trace),
                  "summary": summary.to_json(), "final_metrics": view.last_snapshot}
        (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        with open(args.out / "records.jsonl", "w") as fh:
            for r in records:
                fh.write(json.dumps(r.to_json()) + "\n")
        print("\n" + format_summary(summary))
        print(f"\nreport: {args.out}/report.json, records: {args.out}/records.jsonl")
        print(f"metrics: sidecar {sidecar_url}/metrics  engine http://127.0.0.1:{args.engine_port}/metrics"
              + (f"\n         forecaster http://127.0.0.1:{args.forecaster_port}/metrics  External Metrics API "
               f"https://127.0.0.1:{args.forecaster_api_port}/apis/external.metrics.k8s.io/v1beta1/namespaces/default/goodput_desired_replicas"
               if has_forecaster else ""))
        if args.keep_running:
            print("servers keep running; Ctrl-C to stop")
            while True:
                time.sleep(3600)
        return 0
    finally:
        for p in reversed(procs):
            p.stop()


def tokenizer_file(model: str) -> Path | None:
    """The tokenizer.json of the engine's model, for token-exact prompts (None if there is none).

    The demo starts the engine first, so the weights are already fetched and converted here.
    """
    from engine.weights import resolve_model

    try:
        folder, _ = resolve_model(model, progress=lambda *_: None)
    except (OSError, ValueError):
        return None
    path = folder / "tokenizer.json"
    return path if path.is_file() else None
