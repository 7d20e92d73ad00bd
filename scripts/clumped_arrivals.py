"""The service model against the simulated replica when arrivals are not Poisson.

One h100-70b replica serves the Azure code mix (`../shared/traces/azure2023_code.csv`) under
arrival patterns with the same mean rate: Poisson; clumps (a client firing several requests at
once: geometric sizes of mean 3, within 20 ms or spread over 0.2 s; constant clumps of 4); and
on-off bursts (three times the mean for a quarter of each 1-, 4- or 20-s period). For each, the
model predicts TTFT p50/p99 and the share of requests within the SLO twice: taking arrivals as
Poisson, and with the index of dispersion the forecaster would learn from the sidecars' window
counters (per 15-s step about that step's mean, per window length 0.1 / 1 / 10 s, read at a
prompt's mean service time: `forecaster/service_learn.py`).

    python scripts/clumped_arrivals.py [--shares 0.4,0.6] [--seconds 1500] [--out docs/service_model/clumped_arrivals.md]

Deterministic (seeded); prints the table and the load average, and writes it as Markdown.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from forecaster.prompt_queue import ARRIVAL_WINDOWS_S, ArrivalClumping, dispersion_at  # noqa: E402
from forecaster.service_model import TokenMix  # noqa: E402
from forecaster.simulate.fleet import RequestFleet  # noqa: E402
from forecaster.simulate.profiles import H100_70B  # noqa: E402
from forecaster.simulate.traces import RequestTrace, read_azure_csv  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "azure2023_code.csv"


def clumps(rng, rate, seconds, mean=3.0, spread=0.02, constant=False):
    starts = np.cumsum(rng.exponential(mean / rate, int(rate * seconds / mean)))
    sizes = np.full(len(starts), int(mean)) if constant else rng.geometric(1.0 / mean, len(starts))
    return np.sort(np.repeat(starts, sizes) + rng.uniform(0.0, spread, int(sizes.sum())))


def on_off(rng, rate, seconds, period, duty=0.25, peak=3.0):
    low = rate * (1.0 - duty * peak) / (1.0 - duty)
    out, t = [], 0.0
    while t < seconds:
        for length, r in ((period * duty, rate * peak), (period * (1.0 - duty), low)):
            out.append(t + rng.uniform(0.0, length, rng.poisson(r * length)))
            t += length
    return np.sort(np.concatenate(out))


PATTERNS = {
    "Poisson": lambda rng, rate, s: np.cumsum(rng.exponential(1.0 / rate, int(rate * s))),
    "clumps of 3 (geometric), within 20 ms": lambda rng, rate, s: clumps(rng, rate, s),
    "clumps of 3 (geometric), over 0.2 s": lambda rng, rate, s: clumps(rng, rate, s, spread=0.2),
    "clumps of 4, within 20 ms": lambda rng, rate, s: clumps(rng, rate, s, mean=4.0, constant=True),
    "3x for 0.25 s of every 1 s": lambda rng, rate, s: on_off(rng, rate, s, 1.0),
    "3x for 1 s of every 4 s": lambda rng, rate, s: on_off(rng, rate, s, 4.0),
    "3x for 5 s of every 20 s": lambda rng, rate, s: on_off(rng, rate, s, 20.0),
}


def learned_dispersion(arrivals: np.ndarray, step_s: float = 15.0) -> dict[float, float]:
    """What the learner pools from one sidecar's counters (forecaster/prompt_queue.py
    ArrivalClumping): the squared counter grows by 2n + 1 as the (n + 1)-th request of a window
    arrives; each step's increase and arrivals go to the same pooling the forecaster does."""
    arrivals = np.sort(arrivals)
    steps = (arrivals // step_s).astype(int)
    n = np.bincount(steps).astype(float)
    squares = {}
    for w in ARRIVAL_WINDOWS_S:
        window = (arrivals // w).astype(int)
        first = np.searchsorted(window, window, side="left")    # arrivals before it in its window
        squares[w] = np.bincount(steps, weights=2.0 * (np.arange(len(arrivals)) - first) + 1.0, minlength=len(n))
    clumping = ArrivalClumping()
    for k in range(len(n)):
        clumping.observe({w: float(sq[k]) for w, sq in squares.items()}, float(n[k]), 1.0, step_s)
    return clumping.by_window()


def serve(arrivals, prompts, outputs, tick=0.05):
    fleet = RequestFleet(H100_70B, RequestTrace("t", arrivals, prompts, outputs), 1, 0.0, tick)
    t, k = 0.0, 0
    while (not fleet.idle or t < arrivals[-1]) and t < arrivals[-1] + 600:
        fleet.step(t)
        k += 1
        t = k * tick
    done = np.isfinite(fleet.t_done) & (fleet.arrival > 150)
    return (fleet.t_first - fleet.arrival)[done], done, fleet


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shares", default="0.4,0.6", help="rates as shares of the Poisson SLO capacity")
    ap.add_argument("--seconds", type=float, default=1500.0)
    ap.add_argument("--out", default=str(ROOT / "docs" / "service_model" / "clumped_arrivals.md"))
    args = ap.parse_args(argv)
    if not TRACE.is_file():
        print(f"needs {TRACE}", file=sys.stderr)
        return 2
    trace = read_azure_csv(TRACE)
    prompts, outputs = trace.prompt_tokens.astype(float), np.maximum(1.0, trace.output_tokens.astype(float))
    mix = TokenMix.from_samples(prompts, outputs)
    slo = H100_70B.slo
    capacity = H100_70B.slo_capacity_rps(mix, [slo])
    service_s = float(np.mean(mix.prompt_tokens)) / H100_70B.prefill_tokens_per_s
    rows = []
    for name, make in PATTERNS.items():
        for share in (float(x) for x in args.shares.split(",")):
            rng = np.random.default_rng(1)
            rate = capacity * share
            arrivals = make(rng, rate, args.seconds)
            pick = rng.integers(0, len(prompts), len(arrivals))
            ttft, done, fleet = serve(arrivals, prompts[pick], outputs[pick])
            tpot = ((fleet.t_done - fleet.t_first) / np.maximum(fleet.output - 1, 1))[done]
            good = float(np.mean((ttft <= slo.ttft_s) & ((fleet.output[done] <= 1) | (tpot <= slo.tpot_s))))
            by_window = learned_dispersion(arrivals)
            disp = dispersion_at(service_s, by_window)
            pois = H100_70B.predict(rate, mix)
            clump = replace(H100_70B, arrival_dispersion=disp).predict(rate, mix)
            rows.append((name, share, by_window, disp, [float(np.quantile(ttft, q)) for q in (0.5, 0.99)], good,
                         [pois.ttft_quantile(q) for q in (0.5, 0.99)], pois.good_share(slo),
                         [clump.ttft_quantile(q) for q in (0.5, 0.99)], clump.good_share(slo)))
            print(f"{name:<40} {share:.1f}  I {disp:5.2f}  TTFT p99 measured {rows[-1][4][1]:.2f} s, "
                  f"as Poisson {rows[-1][6][1]:.2f}, clumped {rows[-1][8][1]:.2f}; in SLO {good:.3f} / "
                  f"{rows[-1][7]:.3f} / {rows[-1][9]:.3f}", flush=True)

    def err(pred, meas):
        return f"{pred:.2f} ({(pred / meas - 1) * 100:+.0f} %)"

    load = os.getloadavg()
    lines = [
        "# The service model under clumped and bursty arrivals",
        "",
        f"`python scripts/clumped_arrivals.py --shares {args.shares} --seconds {args.seconds:g}`: one h100-70b replica "
        f"(simulated, `forecaster/simulate/fleet.py`), the Azure code mix, rates as shares of its Poisson SLO capacity "
        f"({capacity:.2f} req/s; SLO TTFT {slo.ttft_s:g} s / TPOT {slo.tpot_s:g} s for 99 %). I: the index of dispersion "
        f"the forecaster would learn (per 15-s step, windows 0.1 / 1 / 10 s) read at a prompt's mean service time "
        f"({service_s * 1000:.0f} ms). TTFT in seconds, measured against predicted (error).",
        "",
        "| arrivals | share | I (0.1 / 1 / 10 s windows) | TTFT p50 measured | as Poisson | clumped | TTFT p99 measured "
        "| as Poisson | clumped | in SLO measured | as Poisson | clumped |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, share, byw, disp, meas, good, pois, pgood, clump, cgood in rows:
        windows = " / ".join(f"{byw[w]:.2f}" if w in byw else "-" for w in ARRIVAL_WINDOWS_S)
        lines.append(f"| {name} | {share:g} | {disp:.2f} ({windows}) | {meas[0]:.2f} | {err(pois[0], meas[0])} | "
                     f"{err(clump[0], meas[0])} | {meas[1]:.2f} | {err(pois[1], meas[1])} | {err(clump[1], meas[1])} | "
                     f"{good:.3f} | {pgood:.3f} | {cgood:.3f} |")
    lines += ["", f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (deterministic: the figures do not depend on it)"]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
