"""The demo's report: figures per phase, the forecaster's lead, report.json, report.md, timeline.png.

Definitions (report.md repeats them):
- A request belongs to the phase its planned arrival falls in; per phase, `requests`, the
  outcomes and `attainment` (good / requests, shed and errors counted as not good) are over those.
- `throughput` and `goodput` are rates in the phase's window, as a dashboard's rate() shows them:
  requests answered (good or late) and good requests *finishing* in the window, per second. The
  last window runs to the end of the run, so requests still draining are counted.
- Attainment "falls" at the first moment from the start of the first phase above capacity that
  the requests finished in the last 10 s (what the sidecar's counters show) are under the
  objective. The forecaster "asks" at the first moment in that span its desired replicas exceed
  what it asked for at the end of the phase before. `forecast_lead_seconds` = falls - asks
  (negative: it asked only after users saw it).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from goodput_cli.demo_plan import Phase, phase_of

WINDOW_S = 10.0
MIN_WINDOW_REQUESTS = 3      # a rolling attainment over fewer finished requests says nothing


def finished_at(rec) -> float:
    """Seconds from the start of the replay when the client had its answer (shed: at once)."""
    return rec.sent + (rec.e2e or 0.0)


def _pct(values, q):
    return float(np.percentile(values, q)) if len(values) else None


@dataclass
class PhaseFigures:
    name: str
    start: float
    end: float
    load: float
    offered_rate: float
    requests: int
    good: int
    slo_violated: int
    shed: int
    errors: int
    attainment: float | None
    throughput: float
    goodput: float
    ttft_p50: float | None
    ttft_p90: float | None
    tpot_p50: float | None
    tpot_p90: float | None
    desired_replicas_max: float | None
    desired_replicas_end: float | None

    def to_json(self) -> dict:
        return dict(self.__dict__)


def phase_figures(records, phases: list[Phase], series: list[dict], run_end: float) -> list[PhaseFigures]:
    out = []
    for k, p in enumerate(phases):
        mine = [r for r in records if phase_of(phases, r.scheduled) is p]
        last = k == len(phases) - 1
        # The windows tile the whole run: the first from its start, the last to the end of the drain.
        w_start, w_end = (p.start if k else -math.inf), (math.inf if last else p.end)
        done = [r for r in records if w_start <= finished_at(r) < w_end]
        answered = [r for r in done if r.outcome in ("good", "slo_violated")]
        seconds = max((max(run_end, p.end) if last else p.end) - p.start, 1e-9)
        count = lambda o: sum(r.outcome == o for r in mine)  # noqa: E731
        errors = sum(r.outcome not in ("good", "slo_violated", "shed") for r in mine)
        ttfts = [r.ttft for r in mine if r.ttft is not None]
        tpots = [r.tpot for r in mine if r.tpot is not None]
        desired = [s["desired_replicas"] for s in series if p.start <= s["t"] < w_end and s.get("desired_replicas") is not None]
        out.append(PhaseFigures(
            name=p.name, start=p.start, end=p.end, load=p.load, offered_rate=len(mine) / (p.end - p.start),
            requests=len(mine), good=count("good"), slo_violated=count("slo_violated"), shed=count("shed"),
            errors=errors, attainment=count("good") / len(mine) if mine else None,
            throughput=len(answered) / seconds, goodput=sum(r.outcome == "good" for r in done) / seconds,
            ttft_p50=_pct(ttfts, 50), ttft_p90=_pct(ttfts, 90), tpot_p50=_pct(tpots, 50), tpot_p90=_pct(tpots, 90),
            desired_replicas_max=max(desired) if desired else None,
            desired_replicas_end=desired[-1] if desired else None))
    return out


def rolling_attainment(records, times) -> list[tuple[float, float | None, int]]:
    """(t, good share of the requests finished in (t - 10 s, t], how many) on the given times."""
    fin = np.array([finished_at(r) for r in records])
    good = np.array([r.outcome == "good" for r in records])
    out = []
    for t in times:
        sel = (fin > t - WINDOW_S) & (fin <= t)
        n = int(sel.sum())
        out.append((float(t), float(good[sel].mean()) if n else None, n))
    return out


def lead_times(records, phases: list[Phase], series: list[dict], objective: float, ttft: float, tpot: float,
               run_end: float) -> dict:
    over = next((p for p in phases if p.load > 1.0), None)
    if over is None:
        return {"forecast_lead_seconds": None, "note": "no phase above capacity"}
    times = np.arange(over.start, run_end + 1e-9, 0.5)
    fell = next((t for t, a, n in rolling_attainment(records, times) if a is not None and n >= MIN_WINDOW_REQUESTS
                 and a < objective), None)
    before = [s for s in series if s["t"] < over.start and s.get("desired_replicas") is not None]
    baseline = before[-1]["desired_replicas"] if before else None
    asked = next((s["t"] for s in series if s["t"] >= over.start and baseline is not None
                  and s.get("desired_replicas") is not None and s["desired_replicas"] > baseline), None)
    predicted = next((s["t"] for s in series if s["t"] >= over.start
                      and ((s.get("forecast_ttft_upper") or 0) > ttft or (s.get("forecast_tpot_upper") or 0) > tpot)), None)
    # Earliest arrival among the over-capacity phase's requests that missed: when the first user
    # who would see it sent their request (a stricter yardstick than the counters).
    missed = [r.sent for r in records if over.start <= r.scheduled and r.outcome != "good"]
    first_miss = min(missed) if missed else None
    lead = None if fell is None or asked is None else fell - asked
    if fell is None:
        note = "attainment never fell below the objective"
    elif asked is None:
        note = "the forecaster never asked for more replicas"
    else:
        note = ("the forecaster asked before attainment fell" if lead > 0 else
                "the forecaster asked only after attainment fell")
    return {"forecast_lead_seconds": lead, "attainment_fell_at": fell, "forecaster_asked_at": asked,
            "desired_replicas_before": baseline, "forecast_predicted_miss_at": predicted,
            "predicted_miss_lead_seconds": None if fell is None or predicted is None else fell - predicted,
            "first_missed_request_sent_at": first_miss,
            "lead_vs_first_missed_arrival_seconds": None if first_miss is None or asked is None else first_miss - asked,
            "over_capacity_phase": over.name, "note": note}


def write_report(out: Path, *, records, phases: list[Phase], series: list[dict], run_end: float, calibration,
                 slo: dict, model: str, trace: str, admission: bool, extra: dict | None = None) -> dict:
    figures = phase_figures(records, phases, series, run_end)
    leads = lead_times(records, phases, series, slo["objective"], slo["ttft"], slo["tpot"], run_end)
    report = {"model": model, "trace": trace, "slo": slo, "admission": admission,
              "calibration": {"line": calibration.line, "capacity_req_per_s": calibration.capacity,
                              "seconds": calibration.seconds, "bench": calibration.bench,
                              "ttft_overhead_s": calibration.overhead_s},
              "phases": [f.to_json() for f in figures], **leads,
              "requests": len(records), "run_seconds": run_end, **(extra or {})}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(report_markdown(report))
    timeline_png(out / "timeline.png", records, phases, series, slo, leads, calibration.capacity)
    return report


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1000:.0f} ms"


def _n(v) -> str:
    return "-" if v is None else f"{v:.0f}"


def report_markdown(r: dict) -> str:
    slo = r["slo"]
    lines = [f"# goodput demo: {r['model']}", "",
             f"Trace `{Path(r['trace']).name}`, SLO TTFT {slo['ttft']:g} s and TPOT {slo['tpot']:g} s for "
             f"{slo['objective']:.0%} of requests, admission {'on' if r['admission'] else 'off'}. "
             f"Calibration {r['calibration']['line']}.", "",
             "![timeline](timeline.png)", ""]
    for p in r["phases"]:
        att = "-" if p["attainment"] is None else f"{p['attainment']:.1%}"
        lines.append(
            f"**{p['name']}** ({p['start']:.0f}–{p['end']:.0f} s, offered {p['offered_rate']:.2f} req/s = "
            f"{p['load']:g}x capacity): {p['requests']} requests, {p['good']} good, {p['slo_violated']} late, "
            f"{p['shed']} shed, {p['errors']} errors; attainment {att}. Throughput {p['throughput']:.2f} req/s, "
            f"goodput {p['goodput']:.2f} req/s. TTFT p50/p90 {_ms(p['ttft_p50'])}/{_ms(p['ttft_p90'])}, "
            f"TPOT p50/p90 {_ms(p['tpot_p50'])}/{_ms(p['tpot_p90'])}. The forecaster's desired replicas: "
            f"at most {_n(p['desired_replicas_max'])}, {_n(p['desired_replicas_end'])} at the end.")
        lines.append("")
    lead = r["forecast_lead_seconds"]
    if lead is not None:
        lines.append(f"**Lead**: in `{r['over_capacity_phase']}` the forecaster asked for more replicas at "
                     f"{r['forecaster_asked_at']:.1f} s and attainment over the last 10 s fell under the objective at "
                     f"{r['attainment_fell_at']:.1f} s: `forecast_lead_seconds` = {lead:+.1f} s ({r['note']}).")
    else:
        lines.append(f"**Lead**: not measured: {r['note']}.")
    if r.get("first_missed_request_sent_at") is not None and r.get("forecaster_asked_at") is not None:
        lines.append(f"The first request of that phase that missed was sent at {r['first_missed_request_sent_at']:.1f} s "
                     f"({r['lead_vs_first_missed_arrival_seconds']:+.1f} s after the ask; a miss is known only when "
                     f"the request finishes).")
    if r.get("forecast_predicted_miss_at") is not None:
        lines.append(f"The forecaster's predicted TTFT/TPOT (upper bound) crossed the objective at "
                     f"{r['forecast_predicted_miss_at']:.1f} s.")
    lines += ["", "Per phase, a request belongs to the phase its planned arrival falls in; throughput and goodput "
              "are requests answered and good requests finishing in the phase's window per second (the last window "
              "runs to the end of the run). Attainment falls when the requests finished in the last 10 s are under "
              "the objective; the forecaster asks when its desired replicas exceed what it asked at the end of the "
              "phase before. Every replica count is what `goodput_desired_replicas` asked for: the demo runs one "
              "replica, so no request was served by the replicas asked for.", ""]
    return "\n".join(lines)


def timeline_png(path: Path, records, phases: list[Phase], series: list[dict], slo: dict, leads: dict,
                 capacity: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = max([finished_at(r) for r in records] + [phases[-1].end])
    fig, axes = plt.subplots(4, 1, figsize=(11, 11), sharex=True,
                             gridspec_kw={"height_ratios": [3, 2, 3, 2]})
    colours = {"under": "#e8f4e8", "burst": "#fbe3e3", "recovery": "#e6eef9"}
    for ax in axes:
        for k, p in enumerate(phases):
            ax.axvspan(p.start, p.end, color=colours.get(p.name, "#f0f0f0" if k % 2 else "#fafafa"), zorder=0)
        ax.grid(alpha=0.3)
    for p in phases:
        axes[0].text((p.start + p.end) / 2, 0.97, f"{p.name}\n{p.rate:.2f} req/s ({p.load:.2g}x)",
                     transform=axes[0].get_xaxis_transform(), ha="center", va="top", fontsize=9)

    # 1: offered, throughput, goodput, shed (5-s bins).
    width = 5.0 if end > 60 else 2.0
    bins = np.arange(0.0, end + width, width)
    mid = (bins[:-1] + bins[1:]) / 2

    def rate(ts):
        h, _ = np.histogram(ts, bins=bins)
        return h / width

    ax = axes[0]
    ax.step(mid, rate([r.scheduled for r in records]), where="mid", color="grey", label="offered")
    ax.plot(mid, rate([finished_at(r) for r in records if r.outcome in ("good", "slo_violated")]),
            color="tab:blue", lw=5, alpha=0.35, label="throughput (answered)")
    ax.plot(mid, rate([finished_at(r) for r in records if r.outcome == "good"]), color="tab:green", lw=2,
            label="goodput")
    shed = [finished_at(r) for r in records if r.outcome == "shed"]
    if shed:
        ax.plot(mid, rate(shed), color="tab:orange", lw=1.5, ls="--", label="shed")
    ax.axhline(capacity, color="black", ls=":", lw=1, label=f"calibrated capacity {capacity:.2f}")
    ax.set_ylabel(f"requests/s ({width:.0f}-s bins)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.35)
    ax.legend(loc="upper right", fontsize=8, ncol=2, bbox_to_anchor=(1.0, 0.78))
    ax.set_title("goodput demo: one replica, a real trace in three phases", loc="left", fontsize=11)

    # 2: rolling attainment.
    ax = axes[1]
    times = np.arange(0.0, end + 0.5, 0.5)
    roll = rolling_attainment(records, times)
    ax.plot([t for t, a, n in roll if a is not None], [a * 100 for t, a, n in roll if a is not None],
            color="tab:green", lw=2, label="SLO attainment, requests finished in the last 10 s")
    ax.axhline(slo["objective"] * 100, color="black", ls=":", lw=1, label=f"objective {slo['objective']:.0%}")
    ax.set_ylim(-5, 105)
    ax.set_ylabel("%")
    ax.legend(loc="lower left", fontsize=8)

    # 3: TTFT and TPOT, actual (by finish time) against the forecaster's prediction.
    ax = axes[2]
    done = [r for r in records if r.ttft is not None]
    ax.scatter([finished_at(r) for r in done], [r.ttft for r in done], s=6, color="tab:blue", alpha=0.5,
               label="TTFT, each request")
    tp = [r for r in records if r.tpot is not None]
    ax.scatter([finished_at(r) for r in tp], [r.tpot for r in tp], s=6, color="tab:purple", alpha=0.5,
               label="TPOT, each request")
    st = [s for s in series if s.get("forecast_ttft_mean") is not None]
    if st:
        # An overloaded prediction is unbounded (inf): drawn as a gap.
        fin = lambda v: v if v is not None and math.isfinite(v) else float("nan")  # noqa: E731
        ts = [s["t"] for s in st]
        ax.plot(ts, [fin(s["forecast_ttft_upper"]) for s in st], color="tab:blue", lw=2,
                label="forecast TTFT (upper; gap = unbounded)")
        ax.plot(ts, [fin(s["forecast_tpot_upper"]) for s in st], color="tab:purple", lw=2,
                label="forecast TPOT (upper)")
    ax.axhline(slo["ttft"], color="tab:blue", ls=":", lw=1)
    ax.axhline(slo["tpot"], color="tab:purple", ls=":", lw=1)
    ax.set_yscale("log")
    ax.set_ylabel("seconds (log)")
    ax.legend(loc="upper left", fontsize=8, ncol=2)

    # 4: desired replicas.
    ax = axes[3]
    sd = [s for s in series if s.get("desired_replicas") is not None]
    if sd:
        ax.step([s["t"] for s in sd], [s["desired_replicas"] for s in sd], where="post", color="tab:red", lw=2,
                label="goodput_desired_replicas (forecaster)")
    ax.axhline(1, color="black", ls=":", lw=1, label="replicas running (1)")
    ax.set_ylabel("replicas")
    ax.set_xlabel("seconds since the replay started")
    ax.set_ylim(0, max([s["desired_replicas"] for s in sd] + [2]) + 1)
    if leads.get("forecaster_asked_at") is not None:
        for a in axes:
            a.axvline(leads["forecaster_asked_at"], color="tab:red", lw=1, ls="--")
    if leads.get("attainment_fell_at") is not None:
        for a in axes:
            a.axvline(leads["attainment_fell_at"], color="black", lw=1, ls="--")
    lead = leads.get("forecast_lead_seconds")
    if lead is not None:
        ax.annotate(f"asked {lead:+.0f} s before attainment fell", xy=(leads["forecaster_asked_at"], 0.5),
                    xycoords=("data", "axes fraction"), fontsize=9, color="tab:red",
                    xytext=(5, 0), textcoords="offset points")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
