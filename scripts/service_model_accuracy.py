"""Service-model accuracy on the bundled engine: the model the forecaster learns online, against
what a `goodput sweep` measures at five offered loads.

Starts the engine, the sidecar (SLO TTFT 3 s / TPOT 0.5 s) and the forecaster (scraping the
sidecar, nothing configured but what the sidecar announces), runs the sweep through the sidecar,
then reads the forecaster's learned parameters (goodput_replica_*) and the capacity it plans on,
and predicts TTFT and TPOT p50/p99 at each swept rate (the rate each sweep offered) with them:
once with the sweep's actual token mix, once with the mix the forecaster assumes from the
counters alone (exponential lengths around the observed means).

    python scripts/service_model_accuracy.py --model smollm2 --rates 0.5,1,1.5,2,2.5 --duration 60

Each rate runs at least --duration seconds and long enough for --min-requests requests (100).
Writes docs/service_model/<model>_accuracy.{json,md}; prints the table and the load average.
`--repredict docs/service_model/smollm2_accuracy.json` re-scores a saved run (its measured figures
and learned parameters) with the service model as it is now, without running anything. A run
also records the sidecar's /metrics every 5 s, as the forecaster scrapes it (`--scrapes FILE`, gzip
JSON lines; default beside the report); `--repredict JSON --relearn SCRAPES` re-learns the model
from those scrapes with the learner as it is now (forecaster/service_learn.py) before scoring.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from engine.dtype import REQUESTABLE  # noqa: E402
from forecaster.service_model import ServiceModel, Slo, TokenMix  # noqa: E402
from goodput_cli import promtext  # noqa: E402
from goodput_cli.procs import ServerProcess, goodput_command  # noqa: E402
from tests.support import free_port  # noqa: E402


def learned_model(text: str) -> tuple[ServiceModel, float, float]:
    """The service model a forecaster's /metrics page exports (goodput_replica_*, bound="mean"),
    and its mix means (prompt, output tokens). The engine's batch limit and step budget are not
    exported: a run reads them as 64 and unlimited."""
    samples = promtext.parse(text)

    def mean(name: str) -> float:
        value = samples.get((name, (("bound", "mean"),)))
        if value is None:
            raise SystemExit(f"the forecaster exports no {name}{{bound=\"mean\"}}: its service model had not "
                             "learned the replica by the end of the run (run longer or at more load)")
        return value

    per_seq = mean("goodput_replica_decode_step_per_sequence_seconds")
    base = mean("goodput_replica_decode_step_base_seconds")
    single = mean("goodput_replica_decode_step_seconds")
    model = ServiceModel(prefill_tokens_per_s=mean("goodput_replica_prefill_tokens_per_second"),
                         decode_base_s=base, decode_per_seq_s=per_seq,
                         decode_log_s=mean("goodput_replica_decode_step_log_seconds"),
                         decode_single_s=None if math.isclose(single, base + per_seq, rel_tol=1e-9) else single,
                         kv_capacity_tokens=mean("goodput_replica_kv_capacity_tokens"),
                         max_batch=64, step_token_budget=1 << 30,
                         ttft_overhead_s=mean("goodput_replica_ttft_overhead_seconds"), name="learned")
    kinds = {dict(labels).get("kind"): v for (name, labels), v in samples.items()
             if name == "goodput_replica_tokens_per_request"}
    return model, kinds["prompt"], kinds["output"]


# The SLO the run's sidecar judges by (one class), and the forecaster plans for.
SLO = Slo(ttft_s=3.0, tpot_s=0.5, ratio=0.99)


def planned_capacity(text: str) -> dict | None:
    """The per-replica capacity a forecaster's /metrics page says it plans with
    (`goodput_replica_capacity_requests_per_second`) and where it came from
    (`goodput_replica_capacity_info{source}`: service-model, throughput, prior, configured)."""
    samples = promtext.parse(text)
    rps = samples.get(("goodput_replica_capacity_requests_per_second", ()))
    if rps is None:
        return None
    return {"rps": rps, "source": promtext.label_of(samples, "goodput_replica_capacity_info", "source"),
            "read": "live"}


def engine_dtype(text: str) -> str | None:
    """The dtype the engine computes in, from its /metrics page (`goodput:engine_dtype_info`)."""
    return promtext.label_of(promtext.parse(text), "goodput:engine_dtype_info", "dtype")


def rate_durations(rates: str, duration: float, min_requests: int) -> list[tuple[float, float]]:
    """(rate, seconds of arrivals) per rate of --rates: at least `duration`, and long enough for
    `min_requests` requests at that rate."""
    try:
        values = [float(r) for r in rates.split(",") if r.strip()]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise ValueError(f"--rates must be comma-separated positive req/s, got {rates!r}")
    return [(rate, max(duration, min_requests / rate)) for rate in values]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--rates", default="0.5,1,1.5,2,2.5")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per rate, at least")
    p.add_argument("--min-requests", type=int, default=100,
                   help="a rate runs long enough for this many requests (duration = max(--duration, N / rate)): "
                        "a p99 of a dozen requests is their slowest one")
    p.add_argument("--input-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--dtype", default="float32", choices=REQUESTABLE,
                   help="engine dtype (default float32, as `goodput demo` runs it, so runs compare across hosts "
                        "and with the demo; `auto` picks per host: bfloat16 on a CPU with AMX)")
    p.add_argument("--out", default="docs/service_model")
    p.add_argument("--repredict", metavar="JSON",
                   help="no run: re-score a saved <model>_accuracy.json (its measured figures and learned "
                        "parameters) with the service model as it is now")
    p.add_argument("--scrapes", metavar="FILE", help="where a run records the sidecar's /metrics pages "
                                                    "(default: OUT/<model>_scrapes.jsonl.gz)")
    p.add_argument("--relearn", metavar="SCRAPES", help="with --repredict: re-learn the model from a run's "
                                                       "recorded scrapes with the learner as it is now")
    args = p.parse_args(argv)
    if args.relearn and not args.repredict:
        p.error("--relearn needs --repredict (the run's measured figures)")
    try:
        plan = rate_durations(args.rates, args.duration, args.min_requests)
    except ValueError as exc:
        p.error(str(exc))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.repredict:
        saved = json.loads(Path(args.repredict).read_text())
        points = [{"rate": r["rate"], "offered_rate": r.get("offered_rate"), "attainment": r["attainment"],
                   "requests": r.get("requests"), "measured": r["measured"]} for r in saved["rows"]]
        p_mean, o_mean = saved["mix_means"] if len(saved["mix_means"]) == 2 else (args.input_tokens, args.output_tokens)
        model = ServiceModel(**saved["learned"])
        if args.relearn:
            model, (p_mean, o_mean), planned = relearn(Path(args.relearn), model)
        else:
            planned = saved.get("planned_capacity")
        return _report(args, out, model, p_mean, o_mean, points,
                       saved["load_average"], saved.get("engine_dtype"), planned, repredicted=True)
    work = Path(tempfile.mkdtemp(prefix="svc-accuracy-"))
    slo = work / "slo.yaml"
    slo.write_text(f"classes:\n  - {{name: default, ttft: {SLO.ttft_s:g}, tpot: {SLO.tpot_s:g}, objective: {SLO.ratio:g}}}\n")
    engine, sidecar, forecaster = free_port(), free_port(), free_port()
    procs = []
    try:
        procs.append(ServerProcess(goodput_command("engine", "serve", "--model", args.model, "--port", str(engine),
                                                   "--dtype", args.dtype),
                                   f"http://127.0.0.1:{engine}/health", timeout=600, name="engine"))
        procs.append(ServerProcess(goodput_command("sidecar", "run", "--upstream", f"http://127.0.0.1:{engine}",
                                                   "--port", str(sidecar), "--slo-config", str(slo),
                                                   "--engine-metrics-interval", "1"),
                                   f"http://127.0.0.1:{sidecar}/healthz", timeout=60, name="sidecar"))
        procs.append(ServerProcess(goodput_command("forecaster", "run", "--targets", f"127.0.0.1:{sidecar}",
                                                   "--host", "127.0.0.1", "--metrics-port", str(forecaster),
                                                   "--api-port", "0", "--step", "5", "--horizon", "30"),
                                   f"http://127.0.0.1:{forecaster}/metrics", timeout=60, name="forecaster"))
        scrapes = Path(args.scrapes) if args.scrapes else out / f"{args.model}_scrapes.jsonl.gz"
        recorder = _Recorder(f"http://127.0.0.1:{sidecar}/metrics", scrapes, period=5.0)
        sweep_points = []
        recorder.start()
        try:
            # One sweep per rate, each long enough for --min-requests (the engine warmed up once).
            for k, (rate, duration) in enumerate(plan):
                sweep_dir = work / f"sweep-{k}"
                cmd = goodput_command("sweep", "--url", f"http://127.0.0.1:{sidecar}", "--rates", f"{rate:g}",
                                      "--duration", f"{duration:g}", "--input-tokens", str(args.input_tokens),
                                      "--output-tokens", str(args.output_tokens), "--slo-ttft", f"{SLO.ttft_s:g}",
                                      "--slo-tpot", f"{SLO.tpot_s:g}", "--out", str(sweep_dir), "--quiet", "--seed", str(k))
                if k:
                    cmd.append("--no-warmup")
                print(f"rate {rate:g} req/s for {duration:.0f} s", flush=True)
                subprocess.run(cmd, check=True, env={**os.environ})
                sweep_points += json.loads((sweep_dir / "sweep.json").read_text())["points"]
        finally:
            recorder.stop()
        print(f"recorded {recorder.count} scrapes of the sidecar in {scrapes}")
        text = urllib.request.urlopen(f"http://127.0.0.1:{forecaster}/metrics", timeout=10).read().decode()
        dtype = engine_dtype(urllib.request.urlopen(f"http://127.0.0.1:{engine}/metrics", timeout=10).read().decode())
    finally:
        for proc in reversed(procs):
            proc.stop()
    model, p_mean, o_mean = learned_model(text)
    points = [{"rate": point["rate"], "offered_rate": point["offered_rate"], "attainment": point["attainment"],
               "requests": point.get("requests"),
               "measured": {"ttft p50": point["ttft"]["p50"], "ttft p99": point["ttft"]["p99"],
                            "tpot p50": point["tpot"]["p50"], "tpot p99": point["tpot"]["p99"]}}
              for point in sweep_points]
    return _report(args, out, model, p_mean, o_mean, points, os.getloadavg(), dtype, planned_capacity(text))


class _Recorder(threading.Thread):
    """Scrapes the sidecar every `period` seconds, as the forecaster does, and keeps each page."""

    def __init__(self, url: str, path: Path, period: float):
        super().__init__(daemon=True, name="scrape-recorder")
        self.url, self.path, self.period, self.count = url, path, period, 0
        self._halt = threading.Event()

    def run(self) -> None:
        with gzip.open(self.path, "wt") as f:
            while not self._halt.wait(self.period):
                try:
                    text = urllib.request.urlopen(self.url, timeout=5).read().decode()
                except OSError as exc:
                    print(f"scrape failed: {exc}", file=sys.stderr)
                    continue
                f.write(json.dumps({"t": time.time(), "text": text}) + "\n")
                self.count += 1

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)


def relearn(path: Path, saved: ServiceModel) -> tuple[ServiceModel, tuple[float, float], dict]:
    """Replay recorded sidecar scrapes through the forecaster's policy (scrape parsing, per-step
    observations, the online learner) and return the model it learns, the mix means and the
    capacity the policy would plan with at the end (as `planned_capacity` reads it live)."""
    from forecaster.policy import ForecastPolicy, PolicyConfig
    from forecaster.sources.scrape import ScrapeSource

    with gzip.open(path, "rt") as f:
        pages = [json.loads(line) for line in f if line.strip()]
    if len(pages) < 3:
        raise SystemExit(f"{path}: {len(pages)} scrapes; too few to learn from")
    current: dict = {}
    source = ScrapeSource(lambda: ["replay"], fetch=lambda url: current["text"])
    policy = ForecastPolicy(PolicyConfig(step_seconds=5.0, horizon_seconds=30.0, models=("naive",)))
    try:
        for page in pages:
            current["text"] = page["text"]
            sample = source.poll(now=page["t"])
            if sample is not None:
                policy.observe(sample)
    finally:
        source.close()
    model = policy.service.model()
    if model is None:
        raise SystemExit(f"{path}: the learner was not ready after {len(pages)} scrapes")
    # As a run reads it: the engine's budget and batch limit are not exported.
    model = ServiceModel(**{**model.to_dict(), "max_batch": saved.max_batch, "step_token_budget": saved.step_token_budget,
                            "name": "relearned"})
    print(f"relearned from {len(pages)} scrapes: {_describe(model)}")
    return model, policy.service.mix_means(), {"rps": policy.capacity_rps, "source": policy.capacity_source,
                                               "read": "replayed"}


def _describe(model: ServiceModel) -> str:
    alone = "" if model.decode_single_s is None else f", {1000 * model.decode_single_s:.1f} ms alone"
    curve = f" + {1000 * model.decode_log_s:.1f} ms·ln(b)" if model.decode_log_s else ""
    return (f"prefill {model.prefill_tokens_per_s:.0f} tok/s, step {1000 * (model.decode_base_s + model.decode_per_seq_s):.1f} ms + "
            f"{1000 * model.decode_per_seq_s:.2f} ms/seq{curve} (b sequences){alone}, TTFT overhead "
            f"{1000 * model.ttft_overhead_s:.0f} ms")


def sample_p99_range(pred, n: int, draws: int = 2000, seed: int = 5) -> dict:
    """The central 95 % of the p99 of `n` requests drawn independently from a prediction's sampled
    requests: how far a run of n requests can read its p99 from the distribution's own (a p99 of
    100 requests is about their second slowest). Requests in a real run are not independent (a
    slow spell of the host delays several), so a run's spread is wider still."""
    rng = np.random.default_rng(seed)
    out = {}
    for key, values in (("ttft", pred.ttft_s), ("tpot", pred.tpot_s[pred.output_tokens > 1])):
        picks = np.quantile(rng.choice(values, size=(draws, max(1, int(n)))), 0.99, axis=1)
        out[key] = (float(np.quantile(picks, 0.025)), float(np.quantile(picks, 0.975)))
    return out


def _report(args, out: Path, model: ServiceModel, p_mean: float, o_mean: float, points: list, load,
            dtype: str | None, planned: dict | None = None, repredicted: bool = False) -> int:
    mixes = {"sweep mix": TokenMix(np.full(4000, float(args.input_tokens)), np.full(4000, float(args.output_tokens))),
             "assumed mix": TokenMix.from_means(p_mean, o_mean)}
    rows, errors = [], {name: [] for name in mixes}
    for point in points:
        measured = point["measured"]
        # The rate the engine was offered (the sweep's requests over its schedule's span) is what
        # the model is asked about. Since the load generator's exact-rate schedules it is the rate
        # asked; runs before them offered what their draws realised (3.51 req/s at a nominal 4).
        rate = point.get("offered_rate") or point["rate"]
        row = {"rate": point["rate"], "offered_rate": point.get("offered_rate"), "attainment": point["attainment"],
               "requests": point.get("requests"), "measured": measured, "predicted": {}}
        for name, mix in mixes.items():
            pred = model.predict(rate, mix)
            got = {"ttft p50": pred.ttft_quantile(0.5), "ttft p99": pred.ttft_quantile(0.99),
                   "tpot p50": pred.tpot_quantile(0.5), "tpot p99": pred.tpot_quantile(0.99)}
            row["predicted"][name] = got
            if name == "sweep mix":
                row["p99_of_n"] = sample_p99_range(pred, point.get("requests") or 100)
            for k, v in got.items():
                m = measured[k]
                if m:
                    errors[name].append(abs(v - m) / m)
        rows.append(row)
    # What one replica serves within the SLO: what the forecaster planned on (the step's slope at
    # its band's steep end, floored at what the replica was seen to serve), and the mean model.
    model_capacity = model.slo_capacity_rps(mixes["sweep mix"], [SLO])
    doc = {"model": args.model, "engine_dtype": dtype, "learned": model.to_dict(), "mix_means": [p_mean, o_mean], "rows": rows,
           "max_error": {k: max(v) if v else None for k, v in errors.items()},
           "planned_capacity": planned, "model_capacity_rps": model_capacity,
           "load_average": list(load), "repredicted": repredicted}
    (out / f"{args.model}_accuracy.json").write_text(json.dumps(doc, indent=2, default=float) + "\n")
    lines = [f"engine dtype: {dtype or 'not recorded'}", "",
             f"learned: {_describe(model)}; mix {p_mean:.0f}/{o_mean:.0f} tokens",
             "capacity within the SLO: " + (f"the forecaster planned on {planned['rps']:.2f} req/s ({planned['source']}, {planned['read']}), "
                                            if planned else "the forecaster's plan not recorded; ")
             + f"the mean model serves {model_capacity:.2f} req/s of the sweep's mix",
             "",
             "| rate req/s | offered req/s | requests | attainment | TTFT p50 meas / pred | TTFT p99 meas / pred | "
             "TPOT p50 meas / pred | TPOT p99 meas / pred |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = []
        for k in ("ttft p50", "ttft p99", "tpot p50", "tpot p99"):
            m = r["measured"][k]
            preds = " / ".join(f"{r['predicted'][n][k]:.3f}" for n in mixes)
            cells.append(f"{m:.3f} / {preds}" if m is not None else "-")
        offered = f"{r['offered_rate']:.3f}" if r.get("offered_rate") else "not recorded"
        lines.append(f"| {r['rate']:g} | {offered} | {r.get('requests') or '-'} | {100 * r['attainment']:.1f} % | "
                     + " | ".join(cells) + " |")
    lines += ["", "p99 of a run's requests against the p99 of as many independent draws from the prediction (sweep mix; "
              "95 % of such draws fall in the range):", "",
              "| rate req/s | TTFT p99 measured | drawn from the prediction | TPOT p99 measured | drawn from the prediction |",
              "|---|---|---|---|---|"]
    for r in rows:
        rng_ = r["p99_of_n"]
        lines.append(f"| {r['rate']:g} | {r['measured']['ttft p99']:.3f} | {rng_['ttft'][0]:.3f}–{rng_['ttft'][1]:.3f} | "
                     f"{r['measured']['tpot p99']:.3f} | {rng_['tpot'][0]:.3f}–{rng_['tpot'][1]:.3f} |")
    lines += ["", "predicted = with the sweep's mix / with the mix assumed from the counters (exponential lengths), "
              "at the offered rate (the sweep's schedule as realised: its requests over its span; the nominal rate "
              "where that was not recorded)",
              "max relative error: " + ", ".join(f"{k} {100 * v:.0f} %" for k, v in doc["max_error"].items() if v is not None),
              f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
              + (" (of the measured run; predictions recomputed with the model as it is now)" if repredicted else "")]
    (out / f"{args.model}_accuracy.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
