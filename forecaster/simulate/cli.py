"""`goodput simulate`: autoscaling policies replayed on a trace."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from goodput_cli.errors import UsageError

# The simulated fleet's routers (forecaster/simulate/fleet.py ROUTERS, which a test holds equal);
# the fleet module imports numpy, which `goodput --help` should not wait for.
ROUTERS = ("least-outstanding", "random")

DEFAULT_POLICIES = "utilization,queue-adapter,queue-keda,saturation,goodput,oracle"


def register(registry) -> None:
    p = registry.command("simulate", "autoscaling policies replayed on a trace", run_command)
    p.add_argument("--trace", required=True,
                   help="a per-request trace (Azure LLM CSV, Mooncake JSONL, BurstGPT CSV) or a ServeGen client folder")
    p.add_argument("--policy", default=DEFAULT_POLICIES,
                   help=f"comma-separated policies (default: {DEFAULT_POLICIES})")
    p.add_argument("--cold-start", type=float, default=180.0, help="seconds from ordering a replica to it serving (default 180)")
    p.add_argument("--profile", default="h100-70b", help="built-in profile (h100-70b, cpu-smollm2) or a profile JSON file")
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--max-replicas", type=int, default=100)
    p.add_argument("--scale-down-window", type=int, default=300,
                   help="HPA behavior.scaleDown.stabilizationWindowSeconds for every HPA-driven policy (default 300, Kubernetes' default)")
    p.add_argument("--metric-delay", type=float, default=30.0, help="age in seconds of the metric the HPA reads (default 30)")
    p.add_argument("--rate-scale", type=float, default=1.0,
                   help="multiply the trace's arrival rate (a per-request trace: each request replayed k times; ServeGen: every client's rate)")
    p.add_argument("--start", type=float, default=0.0, help="ServeGen: start of the slice, seconds")
    p.add_argument("--duration", type=float, default=None, help="ServeGen: length of the slice, seconds (default 6 h)")
    p.add_argument("--tick", type=float, default=None, help="fleet time step, seconds (default 0.1)")
    p.add_argument("--capacity-rps", type=float, default=None,
                   help="per-replica capacity the forecaster is given (default: learned online by its service model)")
    p.add_argument("--warmup", type=float, default=0.0,
                   help="score only from this many seconds in (requests arriving and replicas existing after it); default 0")
    p.add_argument("--target", type=float, default=0.99, help="attainment the oracle and static searches must reach, as a share of the requests an idle replica serves within the SLO (default 0.99)")
    p.add_argument("--lengths", default=None,
                   help="ServeGen: a per-request trace (Azure CSV, Mooncake JSONL, ...) whose prompt/output lengths are drawn for the requests")
    p.add_argument("--goodput-set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a forecaster PolicyConfig field for the goodput policy (repeatable), e.g. target_queue=5")
    p.add_argument("--router", default=ROUTERS[0], choices=ROUTERS,
                   help="how the fleet spreads requests: to the replica with the fewest in flight (a load-aware "
                        "gateway; default) or at random (a Kubernetes Service)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="folder for plots (PNG), results.md and results.json")
    p.add_argument("--json", default=None, help="write results JSON to this file")


def _parse_policies(text: str) -> list[str]:
    from forecaster.simulate.policies import POLICY_NAMES

    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in POLICY_NAMES]
    if bad or not names:
        raise UsageError(f"unknown policy {', '.join(bad) or '(none)'}; choose from {', '.join(POLICY_NAMES)}")
    return names


def _parse_overrides(items: list[str]) -> dict:
    import json

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--goodput-set takes FIELD=VALUE (a forecaster PolicyConfig field), got {item!r}")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def run_command(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from forecaster.simulate import report
    from forecaster.simulate.loop import LoopConfig
    from forecaster.simulate.policies import Limits
    from forecaster.simulate.profiles import load_profile
    from forecaster.simulate.runner import simulate_trace
    from forecaster.simulate.traces import read_request_trace, servegen_requests

    names = _parse_policies(args.policy)
    overrides = _parse_overrides(args.goodput_set)
    trace_path = Path(args.trace)
    if not trace_path.exists():
        raise UsageError(f"trace {trace_path} does not exist; pass a per-request trace (Azure CSV, Mooncake JSONL, "
                         "BurstGPT CSV) or a ServeGen client folder")
    try:
        profile = load_profile(args.profile)
        loop = LoopConfig(cold_start_s=args.cold_start, metric_delay_s=args.metric_delay)
        if not 1 <= args.min_replicas <= args.max_replicas:
            raise ValueError(f"need 1 <= --min-replicas <= --max-replicas, got {args.min_replicas}..{args.max_replicas}")
        limits = Limits(args.min_replicas, args.max_replicas, args.scale_down_window)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc

    started = time.monotonic()
    with Progress(TextColumn("{task.description:<22}"), BarColumn(), TextColumn("{task.percentage:>5.1f}%"),
                  TimeElapsedColumn(), transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(name: str, t: float, total: float) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(name, total=total)
            bar.update(tasks[name], completed=t)

        try:
            if trace_path.is_dir():
                if not args.lengths:
                    raise UsageError("a ServeGen folder has no request lengths: pass --lengths TRACE (an Azure CSV, ...) "
                                     "to draw them from")
                lengths = read_request_trace(Path(args.lengths))
                trace = servegen_requests(trace_path, lengths, args.start, args.duration or 6 * 3600.0,
                                          args.rate_scale, args.seed)
            else:
                trace = read_request_trace(trace_path, args.rate_scale, args.seed)
            runs, facts = simulate_trace(trace, profile, names, loop, limits, tick_s=args.tick or 0.1,
                                         target=args.target, capacity_rps=args.capacity_rps,
                                         goodput_overrides=overrides, warmup_s=args.warmup,
                                         progress=lambda n, t: progress(n, t, trace.duration_s), router=args.router)
            title = f"{trace.name}, {profile.name}, cold start {args.cold_start:g} s" + \
                (", requests routed at random" if args.router == "random" else "")
        except (ValueError, TypeError) as exc:
            raise UsageError(str(exc)) from exc

    results = [r.result.to_dict() for r in runs]
    setup = {"trace": str(trace_path), "profile": profile.to_dict(), "policies": names,
             "cold_start_s": args.cold_start, "metric_delay_s": args.metric_delay, "rate_scale": args.rate_scale,
             "min_replicas": args.min_replicas, "max_replicas": args.max_replicas,
             "scale_down_window_s": args.scale_down_window, "goodput_overrides": overrides, "seed": args.seed,
             "wall_s": round(time.monotonic() - started, 1), **facts}
    print(title)
    capacity = facts.get("capacity_rps")
    learned = facts.get("learned")
    print(f"SLO: TTFT <= {profile.slo.ttft_s:g} s and TPOT <= {profile.slo.tpot_s:g} s; "
          + (f"forecaster capacity {capacity:.2f} req/s per replica; " if capacity else "")
          + f"wall {setup['wall_s']} s")
    print(f"requests an idle replica serves within the SLO: {100 * facts['servable_alone']:.2f} %; the oracle and "
          f"static searches aim at {args.target:g} of those ({100 * facts['oracle_target']:.2f} % of all)")
    if learned:
        curve = f" + {1000 * profile.decode_log_s:g}·ln(b)" if profile.decode_log_s else ""
        print(f"forecaster learned online: capacity {learned['capacity_rps']:.2f} req/s per replica "
              f"({learned['capacity_source']}); prefill {learned['prefill_tokens_per_s']:.0f} tok/s "
              f"(profile {profile.prefill_tokens_per_s:g}), step {1000 * learned['decode_base_s']:.1f} ms + "
              f"{1000 * learned['decode_per_seq_s']:.2f} ms/seq + {1000 * learned.get('decode_log_s', 0.0):.2f} ms·ln(b) "
              f"(profile {1000 * profile.decode_base_s:g} + {1000 * profile.decode_per_seq_s:g}{curve}), "
              f"mix {learned['prompt_mean']:.0f}/{learned['output_mean']:.0f} tokens in/out, "
              f"arrivals' index of dispersion {learned.get('arrival_dispersion', 1.0):.2f} (1 = Poisson), "
              f"wait scale {learned.get('wait_scale', 1.0):.3f} (1 = the replicas' own queues)")
    print(report.text_table(results))
    for r in results:
        if r["policy"] in ("oracle", "static") and r["attainment"] < facts["oracle_target"] - 1e-12:
            print(f"note: no {r['policy']} plan within --max-replicas {args.max_replicas} reaches the target "
                  f"({100 * facts['oracle_target']:.2f} %); its row is the best it found"
                  + (", so 'cost vs oracle' compares with a plan that misses it" if r["policy"] == "oracle" else ""))
    if args.json:
        report.write_json(Path(args.json), setup, results)
    if args.out:
        out = Path(args.out)
        report.write_json(out / "results.json", setup, results)
        (out / "results.md").write_text(f"{title}\n\n{report.markdown_table(results)}\n")
        report.plot(out / "timeline.png", title, {r.result.policy: r.series for r in runs})
        print(f"wrote {out}/results.json, results.md, timeline.png")
    return 0
