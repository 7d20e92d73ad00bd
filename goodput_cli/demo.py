"""`goodput demo`: the embedded default, everything on this machine.

Starts the bundled engine (SmolLM2 by default) and the sidecar in front of it, calibrates what
one replica serves within the SLO (prefill and decode probes turned into requests/s by the
service model, `goodput_cli.demo_plan`), starts the forecaster with that as its prior, and
replays a real trace in three phases (under capacity, a burst past it, back under) through the
sidecar. A live view reads the components' own /metrics; the report folder gets timeline.png,
report.md and report.json (`goodput_cli.demo_report`). Every process it starts is stopped on
any exit.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import signal
import sys
import time
from pathlib import Path

from engine.dtype import REQUESTABLE
from goodput_cli.demo_plan import (CALIBRATION_CLASS, DEFAULT_PHASES, calibrate, parse_phases, plan_phases,
                                   write_calibration_records)
from goodput_cli.errors import UsageError

TINY_PHASES = "under:0.5:8,burst:3:5,recovery:0.4:8"
DASHBOARDS = Path(__file__).resolve().parent.parent / "dashboards" / "generated"
BUNDLED_TRACE = Path(__file__).resolve().parent.parent / "sidecar" / "loadgen" / "data" / "mooncake_conversation_5min.jsonl"


def register(registry) -> None:
    p = registry.command("demo", "the embedded default: engine + sidecar + forecaster, a real trace in three phases", run)
    p.add_argument("--model", default="smollm2", help="engine model: smollm2 (default), tiny, or a path")
    p.add_argument("--dtype", default="float32", choices=REQUESTABLE,
                   help="engine dtype (default float32: runs stay comparable; `auto` times both at start and "
                        "its choice can flip between runs on a CPU where they are close)")
    p.add_argument("--trace", type=Path, default=BUNDLED_TRACE, help="trace to replay (default: the bundled slice of the Mooncake conversation trace)")
    p.add_argument("--phases", default=None,
                   help="name:load:seconds,... with load a multiple of the calibrated capacity (default "
                        + ",".join(f"{s.name}:{s.load:g}:{s.seconds:g}" for s in DEFAULT_PHASES)
                        + f"; with --model tiny {TINY_PHASES})")
    p.add_argument("--max-rate", type=float, default=None,
                   help="cap the busiest phase's offered rate, req/s, scaling every phase alike (for a model faster "
                        "than this client can load)")
    p.add_argument("--max-input", type=int, default=512, help="cap prompt lengths (one scale factor for all, default 512)")
    p.add_argument("--max-output", type=int, default=32, help="cap output lengths (default 32)")
    p.add_argument("--slo-ttft", type=float, default=3.0, help="TTFT objective for the demo, seconds (default 3)")
    p.add_argument("--slo-tpot", type=float, default=0.5, help="TPOT objective for the demo, seconds (default 0.5)")
    p.add_argument("--objective", type=float, default=0.9, help="share of requests that must meet both (default 0.9)")
    p.add_argument("--admission", action="store_true",
                   help="turn the sidecar's goodput guard on: requests predicted to miss are shed (429)")
    p.add_argument("--forecaster-step", type=float, default=2.0,
                   help="forecaster step, s (default 2: its forecasting models need 20 steps of history, "
                        "which phase 1 then gives; production default 15, with history read from Prometheus)")
    p.add_argument("--engine-port", type=int, default=8000)
    p.add_argument("--sidecar-port", type=int, default=8080)
    p.add_argument("--forecaster-port", type=int, default=9300, help="forecaster /metrics port (default 9300)")
    p.add_argument("--forecaster-api-port", type=int, default=8443,
                   help="forecaster External Metrics API (HTTPS, self-signed) port (default 8443)")
    p.add_argument("--out", type=Path, default=Path("demo-report"), help="report folder (default demo-report)")
    p.add_argument("--keep-running", action="store_true", help="leave the servers up after the report until Ctrl-C")


def _slo_file(out: Path, args, phase_classes: list[str]) -> Path:
    """One class per phase (and one for the calibration), all with the demo's objectives: the
    sidecar's counters then split by phase exactly."""
    path = out / "slo.yaml"
    extra = f"    admission: true\n" if args.admission else ""
    body = "default_class: demo\nclasses:\n"
    for name in ["demo", CALIBRATION_CLASS, *phase_classes]:
        body += (f"  - name: {name}\n    ttft: {args.slo_ttft}\n    tpot: {args.slo_tpot}\n"
                 f"    objective: {args.objective}\n" + (extra if name != CALIBRATION_CLASS else ""))
    body += "rules:\n  - header: x-slo-class\n"
    path.write_text(body)
    return path


def start_stack(args, procs: list, phase_classes: list[str]) -> None:
    """Engine and sidecar, each waited for, appended to `procs` as soon as it exists (so the
    caller stops every one that did start, whatever fails next, Ctrl-C included)."""
    from goodput_cli.procs import ServerProcess, goodput_command

    t0 = time.monotonic()
    print(f"starting the engine ({args.model}) on :{args.engine_port} (the first run fetches and converts the weights)...")
    procs.append(ServerProcess(goodput_command("engine", "serve", "--model", args.model, "--port", str(args.engine_port),
                                               "--dtype", args.dtype),
                               None, name="engine", die_with_parent=True, log_dir=args.out))
    procs[-1].wait_ready_url(f"http://127.0.0.1:{args.engine_port}/health", timeout=600)
    print(f"starting the sidecar on :{args.sidecar_port}...")
    procs.append(ServerProcess(goodput_command("sidecar", "run", "--upstream", f"http://127.0.0.1:{args.engine_port}",
                                               "--port", str(args.sidecar_port),
                                               "--slo-config", str(_slo_file(args.out, args, phase_classes)),
                                               "--engine-metrics-interval", "1"),
                               None, name="sidecar", die_with_parent=True, log_dir=args.out))
    procs[-1].wait_ready_url(f"http://127.0.0.1:{args.sidecar_port}/healthz", timeout=60)
    print(f"engine and sidecar up in {time.monotonic() - t0:.0f} s")


def start_forecaster(args, procs: list, prior: Path) -> bool:
    """The forecaster scraping the sidecar, its service model seeded by the calibration; False if
    it won't start (the demo is still whole without forecasts, and says why)."""
    from goodput_cli.procs import ServerProcess, goodput_command

    if importlib.util.find_spec("forecaster.cli") is None:
        return False
    (args.out / "forecaster-steps.jsonl").unlink(missing_ok=True)   # this run's steps only (the recorder appends)
    print(f"starting the forecaster on :{args.forecaster_port} (External Metrics API on https://127.0.0.1:{args.forecaster_api_port})...")
    try:
        procs.append(ServerProcess(goodput_command("forecaster", "run", *forecaster_args(args, prior)), None,
                                   name="forecaster", die_with_parent=True, log_dir=args.out))
        procs[-1].wait_ready_url(f"http://127.0.0.1:{args.forecaster_port}/metrics", timeout=60)
        return True
    except (RuntimeError, TimeoutError) as exc:
        print(f"forecaster not started, continuing without forecasts: {str(exc).strip().splitlines()[-1]}")
        return False


def forecaster_args(args, prior: Path) -> list[str]:
    # A short step and horizon so the forecast moves within a few-minute demo, and a short
    # scale-down window so phase 3 shows it scaling back; in production the defaults (15 s step,
    # 180 s horizon = a replica's cold start, 300 s window) apply. No --capacity: the forecaster
    # plans on its service model, seeded by the calibration and learned from the live traffic.
    # Every step it read is recorded (`goodput forecaster replay` decides again on it).
    return ["--targets", f"127.0.0.1:{args.sidecar_port}", "--metrics-port", str(args.forecaster_port),
            "--api-port", str(args.forecaster_api_port), "--self-signed", "--step", f"{args.forecaster_step:g}",
            "--horizon", "30", "--cold-start", "30", "--scale-down-window", "15", "--prior", str(prior),
            "--max-replicas", "16", "--record", str(args.out / "forecaster-steps.jsonl")]


def _validate(args) -> tuple:
    # The tiny model answers in milliseconds: a short run (under a minute) says as much, and this
    # client cannot offer its capacity, so the rates are capped.
    tiny = args.model == "tiny"
    if args.phases is None:
        args.phases = TINY_PHASES if tiny else ",".join(f"{s.name}:{s.load:g}:{s.seconds:g}" for s in DEFAULT_PHASES)
    if args.max_rate is None and tiny:
        args.max_rate = 20.0
    args.calibration_scale = 0.15 if tiny else 1.0
    try:
        specs = parse_phases(args.phases)
    except ValueError as exc:
        raise UsageError(f"--phases: {exc}") from None
    for name in ("slo_ttft", "slo_tpot", "forecaster_step"):
        if not getattr(args, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0")
    if not 0 < args.objective < 1:
        raise UsageError("--objective must be between 0 and 1")
    if args.max_rate is not None and not args.max_rate > 0:
        raise UsageError("--max-rate must be > 0")
    return specs


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from goodput_cli.demo_report import write_report
    from goodput_cli.demo_view import DemoView
    from sidecar.loadgen import traces
    from sidecar.loadgen.prompts import PromptFactory
    from sidecar.loadgen.runner import LiveStats, LoadConfig, run_load
    from sidecar.slo import SloClass

    specs = _validate(args)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        fitted, fit = replayed_trace(args.trace, args.max_input, args.max_output)
    except traces.TraceError as exc:
        raise UsageError(str(exc)) from None
    phase_classes = [f"phase-{s.name}" for s in specs]
    slo_dict = {"ttft": args.slo_ttft, "tpot": args.slo_tpot, "objective": args.objective}
    procs: list = []
    # SIGTERM ends the demo like Ctrl-C: the finally below stops every component (and if even
    # that is skipped, each component has asked the kernel to end it with this process).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        start_stack(args, procs, phase_classes)
        sidecar_url = f"http://127.0.0.1:{args.sidecar_port}"
        import httpx

        model = httpx.get(f"{sidecar_url}/v1/models", timeout=30).json()["data"][0]["id"]
        tokenizer = tokenizer_file(args.model)
        slo = SloClass("demo", ttft=args.slo_ttft, tpot=args.slo_tpot, objective=args.objective)
        cfg = LoadConfig(base_url=sidecar_url, model=model, slo=slo)
        print("calibrating: prefill and decode probes through the sidecar...")
        try:
            cal = calibrate(cfg, lambda k: PromptFactory(tokenizer, seed=1000 + k), [r.input_tokens for r in fitted],
                            [r.output_tokens for r in fitted], args.slo_ttft, args.slo_tpot, args.objective,
                            step_token_budget=512, max_batch=64, time_scale=args.calibration_scale,
                            max_rate=args.max_rate)
        except RuntimeError as exc:
            raise UsageError(str(exc)) from None
        print(f"calibration {cal.line}")
        prior = args.out / "calibration.json"
        prior.write_text(json.dumps(cal.bench, indent=2) + "\n")
        # Every calibration request, so the fit can be read again (docs/service_model/calibration-spread.md).
        write_calibration_records(args.out / "calibration-records.jsonl", cal.records)
        has_forecaster = start_forecaster(args, procs, prior)
        replay, phases = plan_phases(fitted, cal.capacity, specs, args.max_rate)
        print(f"replaying {len(replay)} requests of {args.trace.name} (prompts scaled x{fit.scale:.3f}, outputs capped at "
              f"{args.max_output}) in {len(phases)} phases: "
              + ", ".join(f"{p.name} {p.end - p.start:.0f} s at {p.rate:.2f} req/s" for p in phases))
        stats = LiveStats()
        view = DemoView(sidecar_url, f"http://127.0.0.1:{args.forecaster_port}" if has_forecaster else None, stats,
                        phases, len(replay), CALIBRATION_CLASS, slo_dict, procs)
        # The sidecar's counters before the replay: the calibration's requests are its own class.
        before = _class_counts(sidecar_url)

        async def go():
            task = asyncio.ensure_future(run_load(cfg, replay, PromptFactory(tokenizer, seed=1), stats,
                                                  on_record=view.records.append))
            return await view.run_until(task)

        records, duration = asyncio.run(go())
        after = _class_counts(sidecar_url)
        sidecar_counts = {c: {o: after.get(c, {}).get(o, 0) - before.get(c, {}).get(o, 0)
                              for o in after.get(c, {})} for c in phase_classes}
        # The measurements first: whatever the report does, nothing measured is lost.
        with open(args.out / "records.jsonl", "w") as fh:
            for r in records:
                fh.write(json.dumps(r.to_json()) + "\n")
        (args.out / "series.jsonl").write_text("".join(json.dumps(x) + "\n" for x in view.series))
        report = write_report(args.out, records=records, phases=phases, series=view.series, run_end=duration,
                              calibration=cal, slo=slo_dict, model=model, trace=str(args.trace),
                              admission=args.admission, extra={"sidecar_counts": sidecar_counts,
                                                               "final_metrics": view.last_snapshot})
        print_summary(report)
        print(f"\nreport: {args.out}/report.md, {args.out}/report.json, {args.out}/timeline.png, records: "
              f"{args.out}/records.jsonl")
        print(f"\nPrometheus should scrape: sidecar {sidecar_url}/metrics (it also re-exports the engine's as "
              f"goodput_engine_*), engine http://127.0.0.1:{args.engine_port}/metrics"
              + (f", forecaster http://127.0.0.1:{args.forecaster_port}/metrics; the HPA's External Metrics API: "
                 f"https://127.0.0.1:{args.forecaster_api_port}/apis/external.metrics.k8s.io/v1beta1/namespaces/default/goodput_desired_replicas"
                 if has_forecaster else ""))
        print(f"Grafana: import {', '.join(str(p) for p in sorted(DASHBOARDS.glob('*.json')))} "
              f"(alerting rules: {DASHBOARDS / 'rules'})")
        if args.keep_running:
            print("servers keep running; Ctrl-C to stop")
            while True:
                time.sleep(3600)
        return 0
    except RuntimeError as exc:
        # A component died or answered nonsense: say which, with its log, and stop the others.
        raise UsageError(f"the demo stopped: {exc}") from None
    finally:
        for p in reversed(procs):
            p.stop()


def replayed_trace(path: Path = BUNDLED_TRACE, max_input: int = 512, max_output: int = 32):
    """(requests, fit): the trace as the demo replays it, fitted to the engine's 2,048-token
    context (its defaults: prompts scaled to at most 512 tokens, outputs capped at 32); its
    lengths are the mix the calibration measures with."""
    from sidecar.loadgen import traces

    return traces.fit_to_model(traces.spread_ties(traces.read_trace(path)), max_model_len=2048, max_input=max_input,
                               max_output=max_output)


def _class_counts(sidecar_url: str) -> dict[str, dict[str, float]]:
    import httpx

    from goodput_cli import promtext
    from goodput_cli.demo_view import outcomes_by_class

    return outcomes_by_class(promtext.parse(httpx.get(f"{sidecar_url}/metrics", timeout=10).text))


def print_summary(report: dict) -> None:
    from goodput_cli.demo_report import _n

    def ms(v):
        return "-" if v is None else f"{v * 1000:.0f}"

    print(f"\n{'phase':<10} {'s':>9} {'offered':>8} {'req':>5} {'good':>5} {'late':>5} {'shed':>5} {'attain':>7} "
          f"{'thru/s':>7} {'good/s':>7} {'TTFT p50':>9} {'TPOT p50':>9} {'desired':>8}")
    for p in report["phases"]:
        att = "-" if p["attainment"] is None else f"{p['attainment'] * 100:.1f}%"
        span = f"{p['start']:.0f}-{p['end']:.0f}"
        print(f"{p['name']:<10} {span:>9} {p['offered_rate']:>8.2f} {p['requests']:>5} {p['good']:>5} "
              f"{p['slo_violated']:>5} {p['shed']:>5} {att:>7} {p['throughput']:>7.2f} {p['goodput']:>7.2f} "
              f"{ms(p['ttft_p50']):>7}ms {ms(p['tpot_p50']):>7}ms "
              f"{_n(p['desired_replicas_max']):>8}")
    lead = report["forecast_lead_seconds"]
    print("\nforecast lead: " + (f"{lead:+.1f} s: the forecaster asked for more replicas at "
                                  f"{report['forecaster_asked_at']:.1f} s, attainment fell at {report['attainment_fell_at']:.1f} s"
                                  if lead is not None else f"not measured ({report['note']})"))


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
