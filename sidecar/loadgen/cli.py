"""`goodput load` and `goodput sweep`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from goodput_cli.errors import UsageError


def register(registry) -> None:
    p = registry.command("load", "open-loop load against any OpenAI-compatible endpoint", run_load_cmd)
    _common(p)
    p.add_argument("--rate", type=float, help="Poisson (or Gamma, with --cv) arrival rate, req/s")
    p.add_argument("--num-requests", type=int, default=100, help="requests to send at --rate (default 100)")
    p.add_argument("--records", type=Path, help="write one JSON record per request to this JSONL file")
    p.add_argument("--json", type=Path, help="write the summary as JSON to this file")

    s = registry.command("sweep", "offered-load sweep: goodput curve, knee, report folder", run_sweep_cmd)
    _common(s)
    s.add_argument("--rates", required=True, help="comma-separated offered rates, req/s (e.g. 0.5,1,2,4)")
    s.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per rate (default 60)")
    s.add_argument("--out", type=Path, default=Path("sweep-report"), help="report folder (default sweep-report)")
    s.add_argument("--no-warmup", action="store_true",
                   help="skip the two unmeasured warm-up requests sent before the first rate")
    s.add_argument("--compare", metavar="LABEL=URL,...",
                   help="send the same workload to each endpoint in turn at every rate (e.g. "
                        "off=http://127.0.0.1:8080,on=http://127.0.0.1:8081: admission off vs on) instead of --url")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8080", help="endpoint base URL (sidecar or engine)")
    p.add_argument("--model", help="model name (default: the first of the endpoint's /v1/models)")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    p.add_argument("--api-key", help="sent as a Bearer token")
    p.add_argument("--cv", type=float, default=1.0, help="burstiness: CV of inter-arrival gaps (1 = Poisson)")
    p.add_argument("--trace", type=Path, help="replay a trace: Azure CSV, Mooncake JSONL or BurstGPT CSV")
    p.add_argument("--trace-ties", choices=("spread", "as-logged"), default="spread",
                   help="requests sharing one timestamp (Mooncake logs at 3 s): spread evenly to the next "
                        "timestamp (default, as the demo and the simulator replay them) or sent together as logged")
    p.add_argument("--trace-start", type=float, default=0.0, help="trace window start, seconds")
    p.add_argument("--trace-duration", type=float, help="trace window length, seconds")
    p.add_argument("--speedup", type=float, default=1.0, help="replay the trace this many times faster")
    p.add_argument("--limit", type=int, help="at most this many trace requests")
    p.add_argument("--input-tokens", type=int, default=128, help="synthetic prompt length (default 128)")
    p.add_argument("--output-tokens", type=int, default=64, help="synthetic output length (default 64)")
    p.add_argument("--max-model-len", type=int, default=2048, help="scale trace lengths to fit this context")
    p.add_argument("--max-input", type=int, help="cap trace prompt lengths (scaled by one factor)")
    p.add_argument("--max-output", type=int, help="cap trace output lengths")
    p.add_argument("--length-scale", type=float,
                   help="scale trace prompts by this fixed factor (e.g. 0.0625: Mooncake blocks of 32 tokens) and "
                        "truncate those still over --max-input; default: one factor that fits the longest prompt")
    p.add_argument("--long-fraction", type=float, default=0.0,
                   help="synthetic mix: this fraction of requests get --long-input-tokens prompts instead")
    p.add_argument("--long-input-tokens", type=int, default=1024, help="prompt length of the long requests")
    p.add_argument("--tokenizer", type=Path, help="tokenizer.json of the target model: exact prompt lengths")
    p.add_argument("--slo-ttft", type=float, default=2.0, help="TTFT objective, seconds (default 2)")
    p.add_argument("--slo-tpot", type=float, default=0.25, help="TPOT objective, seconds (default 0.25)")
    p.add_argument("--slo-e2e", type=float, help="optional end-to-end objective, seconds")
    p.add_argument("--objective", type=float, default=0.9, help="attainment objective for the knee (default 0.9)")
    p.add_argument("--class-mix", metavar="CLASS=WEIGHT,...",
                   help="send each request with x-slo-class drawn from these weights (e.g. high=1,low=3); "
                        "the summary gives attainment per class")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-ignore-eos", action="store_true", help="let the model stop at EOS")
    p.add_argument("--quiet", action="store_true", help="no live progress display")


def _slo(args):
    from sidecar.slo import SloClass

    if args.slo_ttft <= 0 or args.slo_tpot <= 0 or not 0 < args.objective <= 1:
        raise UsageError("--slo-ttft and --slo-tpot must be > 0 and --objective in (0, 1]")
    return SloClass(name="load", ttft=args.slo_ttft, tpot=args.slo_tpot, e2e=args.slo_e2e, objective=args.objective)


def _model(args) -> str:
    if args.model:
        return args.model
    import httpx

    url = args.url.rstrip("/").removesuffix("/v1") + "/v1/models"
    try:
        data = httpx.get(url, timeout=10).json()["data"]
        return data[0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise UsageError(f"cannot list models at {url} ({exc}); pass --model") from None


def build_workload(args, rate: float | None = None, count: int | None = None, duration: float | None = None):
    """(requests, note, block_tokens) from the trace options or an arrival process."""
    from sidecar.loadgen import traces, workload

    if args.trace:
        try:
            reqs = traces.read_trace(args.trace)
        except traces.TraceError as exc:
            raise UsageError(str(exc)) from None
        if args.trace_ties == "spread":
            reqs = traces.spread_ties(reqs)
        reqs = traces.window(reqs, args.trace_start, args.trace_duration, args.speedup, args.limit)
        if not reqs:
            raise UsageError("the trace window holds no requests; widen --trace-start/--trace-duration")
        try:
            reqs, fit = traces.fit_to_model(reqs, args.max_model_len, args.max_input, args.max_output, args.length_scale)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        note = f"trace {args.trace.name}: {len(reqs)} requests"
        if fit.requests_scaled:
            note += f"; lengths fitted to the model: prompts ×{fit.scale:.3f}, {fit.requests_scaled} requests changed"
        return reqs, note, fit.block_tokens
    rate = rate if rate is not None else args.rate
    if rate is None or rate <= 0:
        raise UsageError("give --rate R (req/s) or --trace FILE")
    if duration is not None:
        count = max(1, round(rate * duration))
    count = count or args.num_requests
    try:
        # Offered at the rate asked, not at the rate the draws happened to realise: a sweep's
        # points sit at their rates, and its knee is read at the load that was offered.
        times = workload.arrivals(rate, count, args.seed, args.cv)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    kind = "Poisson" if args.cv == 1.0 else f"Gamma CV {args.cv}"
    if not 0 <= args.long_fraction <= 1:
        raise UsageError(f"--long-fraction must be in [0, 1], got {args.long_fraction}")
    reqs = workload.synthetic_workload(times, args.input_tokens, args.output_tokens, long_fraction=args.long_fraction,
                                       long_input_tokens=args.long_input_tokens, seed=args.seed)
    reqs = workload.assign_classes(reqs, parse_pairs(args.class_mix, "--class-mix", float), args.seed)
    mix = f", {args.long_fraction:.0%} with {args.long_input_tokens}-token prompts" if args.long_fraction else ""
    return reqs, f"{kind} {rate:g} req/s, {count} requests of {args.input_tokens}+{args.output_tokens} tokens{mix}", 512


def parse_pairs(text: str | None, flag: str, convert) -> dict:
    """`a=1,b=2` -> {"a": convert("1"), ...}, refusing anything else with the flag's name."""
    out: dict = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        try:
            if not sep or not key.strip():
                raise ValueError
            out[key.strip()] = convert(value.strip())
        except ValueError:
            raise UsageError(f"{flag}: expected NAME=VALUE pairs separated by commas, got {item!r}") from None
    if text is not None and not out:
        raise UsageError(f"{flag}: expected at least one NAME=VALUE pair")
    return out


def _url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError(value)
    return value


def prepare(args, block_tokens: int):
    """(LoadConfig, PromptFactory) for a run: the endpoint's model is looked up and the tokenizer
    scanned once, however many loads (sweep points) follow."""
    from sidecar.loadgen.prompts import PromptFactory
    from sidecar.loadgen.runner import LoadConfig

    try:
        prompts = PromptFactory(args.tokenizer, block_tokens=block_tokens, seed=args.seed)
        cfg = LoadConfig(base_url=args.url, model=_model(args), slo=_slo(args), endpoint=args.endpoint,
                         ignore_eos=not args.no_ignore_eos, api_key=args.api_key)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return cfg, prompts


def execute(args, prepared, requests, label: str):
    """Run one load with a live progress line; returns (records, duration)."""
    import asyncio

    from sidecar.loadgen.live import run_with_progress

    cfg, prompts = prepared
    return asyncio.run(run_with_progress(cfg, requests, prompts, label, quiet=args.quiet))


def run_load_cmd(args) -> int:
    from sidecar.loadgen.summary import format_summary, summarise

    requests, note, block = build_workload(args)
    print(note)
    records, duration = execute(args, prepare(args, block), requests, "load")
    summary = summarise(records, duration, requests[-1].arrival if requests else None)
    print(format_summary(summary))
    if args.records:
        with open(args.records, "w") as fh:
            for r in records:
                fh.write(json.dumps(r.to_json()) + "\n")
    if args.json:
        args.json.write_text(json.dumps({"note": note, **summary.to_json()}, indent=2) + "\n")
    return 0


def run_sweep_cmd(args) -> int:
    from sidecar.loadgen.summary import summarise
    from sidecar.loadgen.sweep import SweepPoint, find_knee, write_report

    try:
        rates = sorted(float(x) for x in args.rates.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--rates must be numbers separated by commas, got {args.rates!r}") from None
    if not rates or min(rates) <= 0:
        raise UsageError("--rates needs at least one rate > 0")
    if args.trace:
        # A trace has its own arrival times; a sweep needs arrivals at each offered rate.
        raise UsageError("goodput sweep draws Poisson/Gamma arrivals at each --rates value; to replay a trace "
                         "faster or slower use goodput load --trace FILE --speedup X")
    endpoints = parse_pairs(args.compare, "--compare", _url) if args.compare else {"": args.url}
    prepared = {}
    for label, url in endpoints.items():
        prepared[label] = prepare(_with_url(args, url), 512)
    series: dict[str, list] = {label: [] for label in endpoints}
    if not args.no_warmup:
        # First requests pay one-off costs (allocator growth, kernel selection, connection set-up)
        # that would be charged to the lowest rate; send two, unmeasured, as `vllm bench` does.
        from sidecar.loadgen.workload import PlannedRequest

        warm = [PlannedRequest(0.0, args.input_tokens, args.output_tokens), PlannedRequest(0.0, args.input_tokens, 4)]
        for label in endpoints:
            execute(args, prepared[label], warm, f"warm-up {label}".strip())
    stop = False
    for i, rate in enumerate(rates):
        requests, note, _ = build_workload(args, rate=rate, duration=args.duration)
        print(f"[{i + 1}/{len(rates)}] {note}")
        for j, label in enumerate(endpoints):
            # The same arrivals and lengths (same seed) to every endpoint, one after the other, but
            # fresh prompt text for each run: the engine's prefix cache would otherwise serve a
            # repeated prompt almost free, and every run after the first would look faster.
            prepared[label][1].seed = args.seed + 7919 * (1 + j + len(endpoints) * i)
            records, duration = execute(args, prepared[label], requests, f"{label} {rate:g} req/s".strip())
            series[label].append(SweepPoint(rate, summarise(records, duration, requests[-1].arrival)))
            s = series[label][-1].summary
            print(f"    {label + ': ' if label else ''}goodput {s.goodput:.3f} req/s  attainment {s.attainment * 100:.1f} %  "
                  f"throughput {s.achieved_rate:.3f} req/s  {s.output_tokens_per_s:.1f} tok/s"
                  + (f"  shed {s.shed} (admitted attainment {s.admitted_attainment * 100:.1f} %)" if s.shed else ""))
            stop = stop or bool(s.cancelled)
        if stop:
            break
    slo = {"ttft": args.slo_ttft, "tpot": args.slo_tpot, "e2e": args.slo_e2e}
    points = next(iter(series.values()))
    meta = {"url": args.url if not args.compare else dict(endpoints), "duration_per_rate": args.duration}
    doc = write_report(args.out, points, args.objective, slo, meta, compare=series if args.compare else None)
    for label, pts in series.items():
        knee = find_knee(pts, args.objective)
        print(f"{label + ' ' if label else ''}knee: {knee.rate:g} req/s" if knee
              else f"{label + ' ' if label else ''}knee: none (no rate met the objective)")
    extra = ", goodput-compare.png" if args.compare else ""
    print(f"report: {args.out}/sweep.json, summary.md, goodput.png, latency.png{extra}")
    return 0 if doc else 1


def _with_url(args, url: str):
    copy = argparse.Namespace(**vars(args))
    copy.url = url
    return copy
