"""The goodput guard's must-show run, reproducible: `python scripts/admission_sweep.py`.

One bundled engine, three sidecars in front of it (admission off; on; on with two priority
classes), then:

1. `goodput sweep --compare off=...,on=...` at --multiples of the knee, the same seed for both:
   goodput against offered load with and without the guard (side-by-side table, both curves).
2. `goodput load --class-mix high=1,low=1` at 2x the knee through the two-class sidecar (after two
   unrecorded runs at 0.5x and 1x the knee, so that its guard has learned the engine): the
   high-priority class's attainment and who absorbed the shedding.
3. The guard's TTFT and TPOT prediction errors on those runs (p50/p90 of |predicted - measured|),
   read from the sidecars' own goodput_admission_{ttft,tpot}_error_seconds histograms (Prometheus'
   histogram_quantile interpolation), and why they shed (goodput_admission_shed_total{reason}).

Everything lands in --out (default docs/admission): sweep/ (sweep.json, summary.md,
goodput-compare.png), two-classes.json and report.md. Needs a quiet machine: it is a latency
measurement. `--model tiny --knee 16 --input-tokens 512 --duration 5` checks the pipeline in a
couple of minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml

from goodput_cli.procs import ServerProcess, goodput_command

ROOT = Path(__file__).resolve().parent.parent


def sidecar(port: int, upstream: str, classes: list[dict], folder: Path, name: str,
            log_level: str = "warning") -> ServerProcess:
    path = folder / f"slo-{name}.yaml"
    path.write_text(yaml.safe_dump({"classes": classes, "rules": [{"header": "x-slo-class"}]}, sort_keys=False))
    return ServerProcess(goodput_command("sidecar", "run", "--upstream", upstream, "--port", str(port),
                                         "--slo-config", str(path), "--engine-metrics-interval", "0",
                                         "--log-level", log_level),
                         f"http://127.0.0.1:{port}/healthz", timeout=60, name=f"sidecar-{name}")


def run(cmd: list[str]) -> None:
    print("$ goodput " + " ".join(cmd[3:]), flush=True)
    proc = subprocess.run(cmd, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")


def _families(url: str) -> list:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return list(text_string_to_metric_families(resp.read().decode()))


def shed_reasons(url: str) -> dict[str, dict[str, int]]:
    """slo_class -> {reason: requests shed} over the sidecar's whole life (its warm-up included)."""
    out: dict[str, dict[str, int]] = {}
    for family in _families(url):
        if family.name == "goodput_admission_shed":
            for s in family.samples:
                if s.name.endswith("_total"):
                    out.setdefault(s.labels["slo_class"], {})[s.labels["reason"]] = int(s.value)
    return out


def error_quantiles(url: str, objective: str = "ttft") -> dict[str, dict]:
    """slo_class -> {count, p50, p90} of goodput_admission_{objective}_error_seconds, from /metrics."""
    buckets: dict[str, list[tuple[float, float]]] = {}
    for family in _families(url):
        if family.name != f"goodput_admission_{objective}_error_seconds":
            continue
        for s in family.samples:
            if s.name.endswith("_bucket"):
                buckets.setdefault(s.labels["slo_class"], []).append((float(s.labels["le"]), s.value))
    out = {}
    for cls, pairs in buckets.items():
        pairs.sort()
        total = pairs[-1][1]
        if total:
            out[cls] = {"count": int(total), "p50": _quantile(0.5, pairs), "p90": _quantile(0.9, pairs)}
    return out


def _quantile(q: float, pairs: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile: linear inside the bucket holding the rank."""
    rank = q * pairs[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in pairs:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below) if count > below else upper
        lower, below = upper, count
    return lower


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--knee", type=float, default=3.0, help="req/s at the knee without admission (README sweep: 3)")
    p.add_argument("--multiples", default="0.5,1,1.5,2,3", help="offered loads, as multiples of --knee")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals per rate")
    p.add_argument("--input-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--slo-ttft", type=float, default=3.0)
    p.add_argument("--slo-tpot", type=float, default=0.3)
    p.add_argument("--margin", type=float, default=0.2, help="admission_margin of the guarded classes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", help="the engine's --dtype (pinned like the demo's: the knee depends on it)")
    p.add_argument("--port", type=int, default=18600)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "admission")
    p.add_argument("--only-classes", action="store_true",
                   help="skip the off/on sweep: only the two-class runs (its report goes to classes.md)")
    p.add_argument("--class-mixes", default="high=1,low=1",
                   help="';'-separated --class-mix weights for the two-class runs at 2x the knee, run in this order")
    p.add_argument("--repeats", type=int, default=1, help="two-class runs per mix (seeds seed, seed+10, ...)")
    p.add_argument("--decision-log", action="store_true",
                   help="run the two-class sidecar at --log-level debug and keep its log (every refusal and "
                        "finished stream, predicted beside measured) as OUT/two-classes-decisions.log")
    p.add_argument("--hold-arms", action="store_true",
                   help="two-class runs through two sidecars side by side, one holding a request the batch has "
                        "no room for (admission_hold: true, the default) and one refusing it at once (false); "
                        "the arms alternate within each repeat")
    p.add_argument("--scripted", metavar="ARGS", default=None,
                   help="instead of the bundled engine, the scripted upstream with these arguments (e.g. the "
                        "decode-bound one: '--ttft 0.005 --itl 0.01 --itl-per-seq 0.002 --prefill-rate 50000'); "
                        "its model is 'scripted', and --input-tokens counts words")
    args = p.parse_args(argv)
    args.load_before = os.getloadavg()[0]
    print(f"load average {args.load_before:.2f} (a latency measurement: run it alone)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    rates = ",".join(f"{args.knee * float(m):g}" for m in args.multiples.split(","))
    base = {"ttft": args.slo_ttft, "tpot": args.slo_tpot}
    guard = {"admission": True, "admission_margin": args.margin}
    engine_url = f"http://127.0.0.1:{args.port}"
    arms = ("hold", "refuse") if args.hold_arms else ("two",)
    ports = {name: args.port + i for i, name in enumerate(("off", "on", *arms), 1)}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    if args.scripted is not None:
        engine = ServerProcess([sys.executable, "-m", "sidecar.bench.scripted_upstream", "--port", str(args.port),
                                *shlex.split(args.scripted)], engine_url + "/health", timeout=60, name="scripted")
        args.model = "scripted"
    else:
        # The engine first: it fetches and converts the weights, whose folder holds the tokenizer.
        engine = ServerProcess(goodput_command("engine", "serve", "--model", args.model, "--port", str(args.port),
                                               "--dtype", args.dtype),
                               engine_url + "/health", timeout=600, name="engine")
    servers = [engine]
    try:
        tok = None
        if args.scripted is None:
            from goodput_cli.demo import tokenizer_file

            tok = tokenizer_file(args.model)
        common = ["--input-tokens", str(args.input_tokens), "--output-tokens", str(args.output_tokens),
                  "--slo-ttft", str(args.slo_ttft), "--slo-tpot", str(args.slo_tpot), "--seed", str(args.seed),
                  "--quiet", *(["--tokenizer", str(tok)] if tok else []),
                  *(["--model", "scripted"] if args.scripted is not None else [])]
        if not args.only_classes:
            servers.append(sidecar(ports["off"], engine_url, [{"name": "interactive", **base}], args.out, "off"))
            servers.append(sidecar(ports["on"], engine_url, [{"name": "interactive", **base, **guard}], args.out, "on"))
        for arm in arms:
            hold = {} if arm == "two" else {"admission_hold": arm == "hold"}
            servers.append(sidecar(ports[arm], engine_url,
                                   [{"name": "high", **base, **guard, **hold, "priority": 1},
                                    {"name": "low", **base, **guard, **hold, "priority": 0}], args.out, arm,
                                   log_level="debug" if args.decision_log else "warning"))
        if not args.only_classes:
            run(goodput_command("sweep", "--compare", f"off={urls['off']},on={urls['on']}", "--rates", rates,
                                "--duration", str(args.duration), "--out", str(args.out / "sweep"), *common))
        # A deployed guard has long learned its engine; this fresh sidecar learns first (unrecorded)
        # at half the knee and at the knee, as the "on" one did on the sweep's rates below 2x: the
        # TPOT term's step line needs to have seen the batches the knee makes, not only small ones.
        # (Their own seeds, so their prompts are not in the prefix cache when the measured run sends them.)
        mixes = [m.strip() for m in args.class_mixes.split(";") if m.strip()]
        for arm in arms:
            for i, (rate, n) in enumerate(((args.knee / 2, 24), (args.knee, max(20, round(args.knee * args.duration / 2)))), 1):
                run(goodput_command("load", "--url", urls[arm], "--rate", f"{rate:g}", "--num-requests", str(n),
                                    "--class-mix", mixes[0], *common, "--seed", str(args.seed + i)))
        count = max(20, round(2 * args.knee * args.duration * 2))
        runs = []   # (mix, repeat, arm, path, load average before)
        for r in range(args.repeats):
            # Mixes (and arms) alternate their order between repeats, so none always runs on the warmest guard.
            for mix in (mixes if r % 2 == 0 else mixes[::-1]):
                for arm in (arms if r % 2 == 0 else arms[::-1]):
                    single = len(mixes) == 1 and args.repeats == 1 and arm == "two"
                    path = args.out / ("two-classes.json" if single else
                                       f"two-classes-{'' if arm == 'two' else arm + '-'}"
                                       f"{mix.replace('=', '').replace(',', '-')}-r{r}.json")
                    runs.append((mix, r, arm, path, os.getloadavg()[0]))
                    seed = ["--seed", str(args.seed + 10 * r)] if r else []
                    run(goodput_command("load", "--url", urls[arm], "--rate", f"{2 * args.knee:g}", "--num-requests",
                                        str(count), "--class-mix", mix, "--json", str(path), *common, *seed))
        two = runs[0][3]
        sidecars = arms if args.only_classes else ("on", *arms)
        errors = {objective: {name: error_quantiles(urls[name], objective) for name in sidecars}
                  for objective in ("ttft", "tpot")}
        reasons = {name: shed_reasons(urls[name]) for name in sidecars}
    finally:
        for server in reversed(servers):
            server.stop()
        if args.decision_log and len(servers) > 1:
            for arm, server in zip(arms, servers[-len(arms):]):
                name = "two-classes-decisions.log" if arm == "two" else f"two-classes-decisions-{arm}.log"
                (args.out / name).write_text(server.log())
    args.load_after = os.getloadavg()[0]
    if args.only_classes:
        report = write_classes_report(args, runs, errors, reasons)
        print(report)
        return 0
    report = write_report(args, json.loads((args.out / "sweep" / "sweep.json").read_text()),
                          json.loads(two.read_text()), errors, reasons)
    print(report)
    return 0


def _command_line() -> str:
    """This run's command as a report's first line, quoted so that it pastes back into a shell
    (a --class-mixes value holds a ';')."""
    return f"`python scripts/admission_sweep.py {shlex.join(sys.argv[1:])}`".rstrip() + "\n"


def write_classes_report(args, runs, errors: dict, reasons: dict) -> str:
    """classes.md: every two-class run at 2x the knee, per class (and per arm with --hold-arms)."""
    engine = (f"scripted upstream `{args.scripted}`" if args.scripted is not None else f"engine --dtype {args.dtype}")
    arms = sorted({arm for _, _, arm, _, _ in runs})
    lines = ["# Goodput guard: two priority classes at 2x the knee\n",
             _command_line(),
             f"SLO TTFT {args.slo_ttft} s, TPOT {args.slo_tpot} s for both classes; admission_margin {args.margin}; "
             f"knee {args.knee:g} req/s, offered {2 * args.knee:g} req/s; {engine}; "
             + ("one sidecar" if arms == ["two"] else "a sidecar per arm (hold: admission_hold true; refuse: false)")
             + " (high priority 1, low 0) for every run, after unrecorded runs at 0.5x and 1x the knee. 1-minute load "
             f"average {args.load_before:.2f} at the start, {args.load_after:.2f} at the end.\n",
             "| mix high:low | repeat | arm | load avg | class | offered req/s | requests | good | shed | attainment | admitted attainment | TTFT p99 |",
             "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for mix, r, arm, path, load in runs:
        result = json.loads(path.read_text())
        weights = dict(part.split("=") for part in mix.split(","))
        total = sum(float(w) for w in weights.values())
        for name, c in result.get("by_class", {}).items():
            share = float(weights.get(name, 0)) / total
            p99 = c.get("ttft", {}).get("p99")
            lines.append(f"| {mix} | {r} | {arm} | {load:.2f} | {name} | {2 * args.knee * share:.2f} | {c['requests']} | "
                         f"{c['good']} | {c['shed']} | {c['attainment'] * 100:.1f} % | {c['admitted_attainment'] * 100:.1f} % | "
                         + (f"{p99:.2f} s |" if p99 is not None else "- |"))
    for objective, by_sidecar in errors.items():
        for arm in arms:
            for cls, e in sorted(by_sidecar.get(arm, {}).items()):
                lines.append(f"\n{objective.upper()} prediction error, {'' if arm == 'two' else arm + ', '}class {cls}: "
                             f"{e['count']} checked, p50 {e['p50'] * 1000:.0f} ms, p90 {e['p90'] * 1000:.0f} ms")
    for arm in arms:
        for cls, r in sorted(reasons.get(arm, {}).items()):
            lines.append(f"\nshed (whole life, warm-up included), {'' if arm == 'two' else arm + ', '}class {cls}: "
                         f"ttft {r.get('ttft', 0)}, tpot {r.get('tpot', 0)}")
    text = "\n".join(lines) + "\n"
    (args.out / "classes.md").write_text(text)
    return text


def write_report(args, sweep: dict, two: dict, errors: dict, reasons: dict) -> str:
    off = {p["rate"]: p for p in sweep["series"]["off"]["points"]}
    on = {p["rate"]: p for p in sweep["series"]["on"]["points"]}
    knee = args.knee
    lines = [f"# Goodput guard: admission off vs on ({args.model})\n",
             _command_line(),
             f"SLO TTFT {args.slo_ttft} s, TPOT {args.slo_tpot} s; admission_margin {args.margin}; knee {knee:g} req/s; "
             f"{args.duration:g} s of Poisson arrivals per rate, seed {args.seed}: the same arrivals and lengths to both "
             "sidecars (fresh prompt text per run, so the prefix cache cannot favour the second). "
             f"Engine --dtype {args.dtype}; 1-minute load average {args.load_before:.2f} at the start, "
             f"{args.load_after:.2f} at the end.\n",
             (args.out / "sweep" / "summary.md").read_text().split("## Side by side", 1)[-1].strip() + "\n"]
    at_knee = {"off": off.get(knee, {}).get("goodput"), "on": on.get(knee, {}).get("goodput")}
    checks = []
    for m in (2, 3):
        rate = knee * m
        for label, pts in (("on", on), ("off", off)):
            if rate in pts and at_knee[label]:
                checks.append(f"- {label}: goodput at {m}x the knee is {pts[rate]['goodput'] / at_knee[label] * 100:.0f} % of "
                              f"the goodput at the knee ({pts[rate]['goodput']:.3f} vs {at_knee[label]:.3f} req/s)")
        if rate in on:
            checks.append(f"- on: admitted attainment at {m}x the knee {on[rate]['admitted_attainment'] * 100:.1f} % "
                          f"({on[rate]['shed']} of {on[rate]['requests']} shed)")
    low = knee * 0.5
    if low in on:
        checks.append(f"- on: shed at 0.5x the knee: {on[low]['shed']} of {on[low]['requests']}")
    high = two.get("by_class", {}).get("high")
    if high:
        checks.append(f"- two classes at 2x the knee: high-priority attainment {high['attainment'] * 100:.1f} % "
                      f"(the issue asks >= 95 %)")
    lines += ["## Against the issue's bar\n", *checks, ""]
    lines += ["## Two classes at 2x the knee (high priority 1, low priority 0)\n",
              "| class | requests | good | shed | attainment | admitted attainment |", "|---|---:|---:|---:|---:|---:|"]
    for name, c in two.get("by_class", {}).items():
        lines.append(f"| {name} | {c['requests']} | {c['good']} | {c['shed']} | {c['attainment'] * 100:.1f} % | "
                     f"{c['admitted_attainment'] * 100:.1f} % |")
    for objective, by_sidecar in errors.items():
        lines += ["", f"## {objective.upper()} prediction error of admitted requests (|predicted - measured|)\n",
                  "| sidecar | class | requests checked | p50 ms | p90 ms |", "|---|---|---:|---:|---:|"]
        for sidecar_name, by_class in by_sidecar.items():
            for cls, e in sorted(by_class.items()):
                lines.append(f"| {sidecar_name} | {cls} | {e['count']} | {e['p50'] * 1000:.0f} | {e['p90'] * 1000:.0f} |")
    lines.append("\n(p50/p90 interpolated within the histogram's buckets, as Prometheus' histogram_quantile does.)")
    lines += ["", "## Why the guard shed (whole life of each sidecar, warm-up included)\n",
              "| sidecar | class | ttft | tpot |", "|---|---|---:|---:|"]
    for sidecar_name, by_class in reasons.items():
        for cls, r in sorted(by_class.items()):
            lines.append(f"| {sidecar_name} | {cls} | {r.get('ttft', 0)} | {r.get('tpot', 0)} |")
    if not any(reasons.values()):
        lines.append("| (none shed) | | 0 | 0 |")
    text = "\n".join(lines) + "\n"
    (args.out / "report.md").write_text(text)
    return text


if __name__ == "__main__":
    sys.exit(main())
