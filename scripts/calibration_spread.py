"""The demo calibration's spread, measured: `python scripts/calibration_spread.py measure --out DIR`,
then `python scripts/calibration_spread.py refit DIR`.

`measure` starts the bundled engine (SmolLM2, float32) and the sidecar as `goodput demo` does,
runs --calibrations calibrations in a row (each one's requests by stage in DIR/cal-K.jsonl, the
shape of the demo's calibration-records.jsonl; what it printed in DIR/cal-K.json), then open-loop
Poisson arrivals of the demo's mix at each RATE:SEED of --truth for --seconds
(DIR/truth-RATE-SEED.jsonl), each printed with the share of requests that met the SLO and the
load average. It is a latency measurement: run it alone.

`refit` reads those back and fits each calibration's second operating point three ways on its
own requests (`goodput_cli.demo_plan`): the slope alone under the probes' concave part (the
calibration before 2026-12-07), the slope and the concave part together, and the one of the two
that serves less (what the calibration plans on), with each one's capacity and the spread over
the calibrations; then the truth runs' attainment. These are the tables of
docs/service_model/calibration-spread.md. A `goodput demo` report folder's
calibration-records.jsonl and calibration.json refit the same way (`refit --demo DIR`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from forecaster.service_model import Slo, TokenMix  # noqa: E402
from goodput_cli import demo  # noqa: E402
from goodput_cli import demo_plan as dp  # noqa: E402

STEP_TOKEN_BUDGET, MAX_BATCH = 512, 64      # as `goodput demo` calibrates


def demo_mix() -> tuple[list[int], list[int]]:
    """The prompt and output lengths `goodput demo` replays, with its defaults."""
    fitted, _ = demo.replayed_trace()
    return [r.input_tokens for r in fitted], [r.output_tokens for r in fitted]


def measure(args) -> int:
    from sidecar.loadgen.prompts import PromptFactory
    from sidecar.loadgen.runner import LoadConfig
    from sidecar.slo import SloClass

    args.out.mkdir(parents=True, exist_ok=True)
    ns = argparse.Namespace(model=args.model, dtype="float32", engine_port=args.engine_port,
                            sidecar_port=args.sidecar_port, out=args.out, slo_ttft=args.slo_ttft,
                            slo_tpot=args.slo_tpot, objective=args.objective, admission=False)
    mix_prompt, mix_output = demo_mix()
    tiny = args.model == "tiny"
    procs: list = []
    try:
        demo.start_stack(ns, procs, [])
        import httpx

        url = f"http://127.0.0.1:{args.sidecar_port}"
        model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        cfg = LoadConfig(base_url=url, model=model,
                         slo=SloClass("demo", ttft=args.slo_ttft, tpot=args.slo_tpot, objective=args.objective))
        tokenizer = demo.tokenizer_file(args.model)
        for k in range(args.calibrations):
            cal = dp.calibrate(cfg, lambda j: PromptFactory(tokenizer, seed=1000 + j), mix_prompt, mix_output,
                               args.slo_ttft, args.slo_tpot, args.objective, step_token_budget=STEP_TOKEN_BUDGET,
                               max_batch=MAX_BATCH, time_scale=0.15 if tiny else 1.0, max_rate=20.0 if tiny else None)
            dp.write_calibration_records(args.out / f"cal-{k}.jsonl", cal.records)
            load = os.getloadavg()
            (args.out / f"cal-{k}.json").write_text(json.dumps({"capacity": cal.capacity, "line": cal.line,
                                                                "bench": cal.bench, "load": load}, indent=1))
            print(f"calibration {k}: {cal.capacity:.2f} req/s in {cal.seconds:.0f} s (load average {load[0]:.2f})",
                  flush=True)
        for rate, seed in args.truth:
            records = asyncio.run(dp.measure_operating_point(cfg, lambda j: PromptFactory(tokenizer, seed=9000 + j),
                                                             mix_prompt, mix_output, rate, args.seconds, seed=seed))
            dp.write_calibration_records(args.out / f"truth-{rate:g}-{seed}.jsonl", [(f"truth-{rate:g}", records)])
            good = sum(r.outcome == "good" for r in records) / len(records)
            print(f"Poisson {rate:g} req/s, seed {seed}, {args.seconds:g} s: {good:.1%} of {len(records)} met the SLO "
                  f"(load average {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        for p in procs[::-1]:
            p.stop()
    return 0


def refit_one(stages, rate: float, mix, slo) -> dict:
    """Capacity, req/s, of the probes alone and of each fit of the second operating point, as
    `goodput_cli.demo_plan.calibrate` made them; the planned one is the one that serves less."""
    probes = [(s, r) for s, r in stages if not s.startswith("operating-")]
    bench, t_short = dp.bench_from_probes(probes, "?")
    first = dp.probe_model(bench, t_short, STEP_TOKEN_BUDGET, MAX_BATCH)
    op = next(r for s, r in stages if s == "operating-2")
    fits = dp.operating_point_fits(first, mix, rate, op, min_batch=dp.DECODE_BATCHES[0])
    planned = dp.fit_to_operating_point(first, mix, rate, op, min_batch=dp.DECODE_BATCHES[0], slo=slo)
    capacity = planned.slo_capacity_rps(mix, slo)
    batches = dp.decode_loads(op, first.prefill_tokens_per_s)[1]
    return {"probe steps ms": [round(s["step_s"] * 1000) for s in bench["engine_decode"]],
            "steps": [planned.step_s(b) for b in (1, *dp.DECODE_BATCHES)],
            "batches": (float(np.mean(batches)), float(min(batches)), float(max(batches))) if batches else None,
            "probes": first.slo_capacity_rps(mix, slo),
            # under the calibration's smallest batch, neither is fitted: the planned one stands for both
            "slope alone": fits["slope"].slo_capacity_rps(mix, slo) if "slope" in fits else capacity,
            "slope and concave part": fits["both"].slo_capacity_rps(mix, slo) if "both" in fits else capacity,
            "serves less (planned)": capacity}


def refit(args) -> int:
    mix_prompt, mix_output = demo_mix()
    mix = TokenMix.from_samples(mix_prompt, mix_output)
    slo = [Slo(args.slo_ttft, args.slo_tpot, args.objective, "demo")]
    if args.demo:
        runs = [(args.dir / "calibration-records.jsonl", json.loads((args.dir / "calibration.json").read_text()))]
    else:
        runs = [(p, json.loads(p.with_suffix(".json").read_text())["bench"])
                for p in sorted(args.dir.glob("cal-*.jsonl"), key=lambda p: int(p.stem.split("-")[1]))]
    if not runs:
        print(f"no calibrations in {args.dir}", file=sys.stderr)
        return 2
    columns = ("probes", "slope alone", "slope and concave part", "serves less (planned)")
    print("| calibration | probe steps at 1/8/32, ms | 2nd point's batches: mean (min-max) | " + " | ".join(columns) + " |")
    print("|---" * (3 + len(columns)) + "|")
    got: dict = {c: [] for c in columns}
    for path, bench in runs:
        fit = refit_one(dp.read_calibration_records(path), float(bench["probes"]["operating_point"]["rate"]), mix, slo)
        b = fit["batches"]
        cells = [f"{fit[c]:.2f}" for c in columns]
        for c in columns:
            got[c].append(fit[c])
        print(f"| {path.name} | {'/'.join(map(str, fit['probe steps ms']))} | "
              + (f"{b[0]:.1f} ({b[1]:.0f}-{b[2]:.0f})" if b else "-") + " | " + " | ".join(cells) + " |")
    print("| all | | | " + " | ".join(f"{min(v):.2f}-{max(v):.2f}, mean {np.mean(v):.2f}" for v in got.values()) + " |")
    for path in sorted(args.dir.glob("truth-*.jsonl")):
        records = dp.read_calibration_records(path)[0][1]
        good = sum(r.outcome == "good" for r in records) / len(records)
        print(f"{path.stem}: {good:.1%} of {len(records)} met the SLO")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="calibrate N times, then Poisson runs at fixed rates")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--calibrations", type=int, default=8)
    m.add_argument("--truth", default="2:11,2.5:11,2.75:11,3:11,3:21,3.25:21,3.5:21,3.25:31,3.5:31,4:11",
                   help="RATE:SEED,... of the Poisson runs (default: the doc's ten)")
    m.add_argument("--seconds", type=float, default=60.0)
    m.add_argument("--model", default="smollm2")
    m.add_argument("--engine-port", type=int, default=8000)
    m.add_argument("--sidecar-port", type=int, default=8080)
    r = sub.add_parser("refit", help="each calibration's fits side by side, and the Poisson runs")
    r.add_argument("dir", type=Path)
    r.add_argument("--demo", action="store_true", help="DIR is a `goodput demo` report folder")
    for p in (m, r):
        p.add_argument("--slo-ttft", type=float, default=3.0)
        p.add_argument("--slo-tpot", type=float, default=0.5)
        p.add_argument("--objective", type=float, default=0.9)
    args = ap.parse_args(argv)
    if args.cmd == "measure":
        try:
            args.truth = [(float(a), int(b)) for a, b in (x.split(":") for x in args.truth.split(",") if x)]
        except ValueError:
            ap.error("--truth: RATE:SEED,... (for example 3:11,3.5:21)")
        return measure(args)
    return refit(args)


if __name__ == "__main__":
    sys.exit(main())
