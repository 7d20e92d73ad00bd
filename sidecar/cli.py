"""`goodput sidecar run` and `goodput bench sidecar`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from goodput_cli.errors import UsageError


def register(registry) -> None:
    p = registry.command("sidecar run", "run the measuring proxy in front of an upstream", run_cmd)
    p.add_argument("--upstream", required=True, help="the OpenAI-compatible server, e.g. http://127.0.0.1:8000")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 in a pod)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    p.add_argument("--slo-config", type=Path, help="SLO classes and rules, YAML (default: one class 'interactive', "
                                                    "TTFT 1 s, TPOT 0.1 s, objective 0.99)")
    p.add_argument("--models", default="", help="comma-separated model names kept as label values; others become "
                                                "'other' (default: the first 8 names seen)")
    p.add_argument("--engine-metrics-interval", type=float, default=5.0,
                   help="seconds between scrapes of the upstream's /metrics (0 = off; default 5)")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds in-flight requests may take to finish after SIGTERM (default 30)")
    p.add_argument("--max-body-bytes", type=int, default=16 * 1024 * 1024,
                   help="largest request body accepted, bytes (default 16 MiB); larger gets 413")
    p.add_argument("--upstream-timeout", type=float, default=600.0,
                   help="seconds without a byte from the upstream before 504 / a stream error (default 600)")
    p.add_argument("--capture-content", action="store_true",
                   help="record prompt and completion text in spans (off by default; never the Authorization header)")
    p.add_argument("--advice-window", type=int, default=256,
                   help="recent prompts per model and tenant compared for prompt-layout advice (/advice, "
                        "goodput_prompt_*; keyed hashes only, never text; 0 = off; default 256)")
    p.add_argument("--genai-provider", default="openai",
                   help="gen_ai.provider.name on spans and OTel metrics (default openai: the API the sidecar speaks; "
                        "e.g. vllm, llama.cpp)")
    p.add_argument("--otel-legacy-metrics", action="store_true",
                   help="with an OTLP endpoint, also export the GenAI metric names of semantic conventions <= v1.41 "
                        "(gen_ai.client.operation.duration, gen_ai.client.token.usage)")
    p.add_argument("--http-server", choices=("fast", "aiohttp"), default="fast",
                   help="the HTTP server clients talk to: fast (the sidecar's own HTTP/1.1 server on asyncio "
                        "protocols) or aiohttp (aiohttp's server; default fast)")
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))

    b = registry.command("bench sidecar", "what the sidecar adds: open loop, beside a bare relay and LiteLLM's proxy",
                         bench_cmd)
    b.add_argument("--json", type=Path, help="write the results (and every run's per-request data) as JSON to this file")
    b.add_argument("--duration", type=float, default=10.0, help="seconds of arrivals per measured run (default 10)")
    b.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every arm (default 3)")
    b.add_argument("--scenarios", default="paced16,paced64,requests,requests2k,sparse,fast64",
                   help="comma-separated, of paced16, paced64, requests, requests2k (one-token requests with "
                        "2,048-token prompts), sparse, fast64 (default: all)")
    b.add_argument("--arms", default="direct,direct-again,relay,sidecar,litellm",
                   help="comma-separated, of direct, direct-again (the direct path again, as an arm: the method's "
                        "own floor), relay, sidecar, sidecar-python (the sidecar with its C fast path for streamed "
                        "tokens off), sidecar-aiohttp (the sidecar on aiohttp's HTTP "
                        "server), sidecar-otlp (the sidecar exporting spans and metrics over OTLP/HTTP to a local "
                        "receiver), litellm (default: all but sidecar-python, sidecar-aiohttp and sidecar-otlp; direct is required). "
                        "litellm is installed on first use into $GOODPUT_CACHE/litellm-venv")


def build_config(args: argparse.Namespace):
    from sidecar.config import DEFAULT_SLO_CONFIG, ConfigError, ProxyConfig, load_slo_config

    try:
        slo = load_slo_config(args.slo_config) if args.slo_config else DEFAULT_SLO_CONFIG
    except ConfigError as exc:
        raise UsageError(f"invalid --slo-config: {exc}") from None
    models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    try:
        return ProxyConfig(upstream=args.upstream, host=args.host, port=args.port, slo=slo, models=models,
                           engine_metrics_interval=args.engine_metrics_interval, drain_timeout=args.drain_timeout,
                           max_body_bytes=args.max_body_bytes, capture_content=args.capture_content,
                           read_timeout=args.upstream_timeout, advice_window=args.advice_window,
                           genai_provider=args.genai_provider, otel_legacy_metrics=args.otel_legacy_metrics,
                           http_server=args.http_server)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


_SWITCH_INTERVAL_S = 0.0005   # the longest the event loop waits for the GIL an export thread holds


def run_cmd(args: argparse.Namespace) -> int:
    import logging

    from prometheus_client import CollectorRegistry, disable_created_metrics

    from sidecar.app import make_app
    from sidecar.otel_metrics import meter_provider_from_env
    from sidecar.server import serve
    from sidecar.tracing import provider_from_env

    config = build_config(args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    provider = provider_from_env()
    meters = meter_provider_from_env()
    disable_created_metrics()   # the *_created series only add noise to every scrape

    async def main() -> int:
        import gc
        app = make_app(config, CollectorRegistry(), provider, meters)
        # Move everything built at start-up (modules, registry, tracer) out of the collector's
        # reach: later collections then only walk objects made while serving.
        gc.collect()
        gc.freeze()
        # With an OTLP endpoint the SDK encodes and posts spans and metrics from threads of its own.
        # While one holds the GIL the event loop waits up to the switch interval (5 ms by
        # default) for it: at 64 paced streams that took the added TTFT p99 from 2.4 to 5.0 ms,
        # and at 0.5 ms to 3.1 (docs/sidecar/benchmark.md). It acts only while another thread runs
        # Python: without export, the one other Python thread is an executor's.
        sys.setswitchinterval(_SWITCH_INTERVAL_S)
        try:
            return await serve(app, announce=lambda line: print(line, flush=True))
        except OSError as exc:
            raise UsageError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}; "
                             f"choose another --port") from None

    from sidecar import eventloop

    try:
        return eventloop.run(main())   # uvloop when importable (sidecar/eventloop.py)
    finally:
        provider.shutdown()   # flushes spans still queued for OTLP export
        if meters is not None:
            meters.shutdown()  # a last collection: requests since the previous export are sent too


def bench_cmd(args: argparse.Namespace) -> int:
    from sidecar.bench.run import parse_arms, parse_scenarios, run_benchmark

    try:
        scenarios, arms = parse_scenarios(args.scenarios), parse_arms(args.arms)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.duration <= 0 or args.repeats < 1:
        raise UsageError("--duration must be > 0 and --repeats >= 1")
    return run_benchmark(scenarios, arms, args.duration, args.repeats, args.json)
