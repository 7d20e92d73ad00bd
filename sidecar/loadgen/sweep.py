"""Offered-load sweep: goodput and throughput against offered rate, and the knee.

The knee is the highest offered rate whose attainment still meets the SLO objective. Past it,
throughput keeps rising (continuous batching packs more tokens per step) while goodput falls:
the picture that says why throughput is the wrong number to scale on.

With `--compare LABEL=URL,...` the same workload (same seed) goes to several endpoints, one
after the other at each rate (so a noisy machine hurts them alike): e.g. a sidecar with the
admission guard off and one with it on, in front of the same engine. The report then holds one
series per label, a side-by-side table and both goodput curves in one plot.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sidecar.loadgen.summary import Summary


@dataclass
class SweepPoint:
    rate: float
    summary: Summary


def find_knee(points: list[SweepPoint], objective: float) -> SweepPoint | None:
    """Highest offered rate whose attainment >= objective (None when even the lowest misses)."""
    ok = [p for p in points if p.summary.attainment >= objective]
    return max(ok, key=lambda p: p.rate) if ok else None


def sweep_json(points: list[SweepPoint], objective: float, slo: dict, meta: dict) -> dict:
    knee = find_knee(points, objective)
    return {
        "knee": None if knee is None else {"rate": knee.rate, "attainment": knee.summary.attainment,
                                           "goodput": knee.summary.goodput},
        "objective": objective,
        "slo": slo,
        "meta": meta,
        "points": [{"rate": p.rate, **p.summary.to_json()} for p in points],
    }


def write_report(out: Path, points: list[SweepPoint], objective: float, slo: dict, meta: dict,
                 compare: dict[str, list[SweepPoint]] | None = None) -> dict:
    """sweep.json, summary.md and two PNG plots in `out`; returns the JSON document.

    `compare` (label -> points, `points` being the first series) adds `series` to sweep.json, a
    side-by-side table to summary.md and every series' goodput curve to goodput.png. The top-level
    `knee` and `points` stay those of the first series (what --capacity-from reads)."""
    out.mkdir(parents=True, exist_ok=True)
    doc = sweep_json(points, objective, slo, meta)
    if compare:
        doc["series"] = {label: sweep_json(pts, objective, slo, meta) for label, pts in compare.items()}
        for one in doc["series"].values():
            del one["meta"], one["slo"], one["objective"]
    (out / "sweep.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    (out / "summary.md").write_text(markdown(doc) + (compare_markdown(doc) if compare else ""))
    if points:
        plot(points, doc, out)
        if compare:
            plot_compare(compare, doc, out)
    return doc


def compare_markdown(doc: dict) -> str:
    """One row per rate, the labelled series side by side."""
    labels = list(doc["series"])
    cols = ["goodput req/s", "attainment", "admitted attainment", "shed", "TTFT p99 ms (admitted)",
            "TPOT p99 ms (admitted)"]
    head = ["\n## Side by side\n", "| offered req/s | " + " | ".join(f"{c} ({l})" for c in cols for l in labels) + " |",
            "|---:|" + "---:|" * (len(cols) * len(labels))]
    by_rate = {label: {p["rate"]: p for p in doc["series"][label]["points"]} for label in labels}
    for rate in sorted({r for pts in by_rate.values() for r in pts}):
        cells = []
        for col in cols:
            for label in labels:
                p = by_rate[label].get(rate)
                if p is None:
                    cells.append("-")
                elif col == "goodput req/s":
                    cells.append(f"{p['goodput']:.3f}")
                elif col == "attainment":
                    cells.append(f"{p['attainment'] * 100:.1f} %")
                elif col == "admitted attainment":
                    cells.append(f"{p.get('admitted_attainment', p['attainment']) * 100:.1f} %")
                elif col == "shed":
                    cells.append(str(p.get("shed", 0)))
                else:
                    key = "ttft" if col.startswith("TTFT") else "tpot"
                    p99 = p.get(key, {}).get("p99")
                    cells.append("-" if p99 is None else f"{p99 * 1000:.0f}")
        head.append(f"| {rate:.3g} | " + " | ".join(cells) + " |")
    return "\n".join(head) + "\n"


def plot_compare(compare: dict[str, list[SweepPoint]], doc: dict, out: Path) -> None:
    """goodput-compare.png: goodput (solid) and throughput (dotted) against offered load, per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (label, points) in enumerate(compare.items()):
        rates = [p.rate for p in points]
        color = f"C{i}"
        ax.plot(rates, [p.summary.goodput for p in points], "o-", color=color, label=f"goodput, {label}")
        ax.plot(rates, [p.summary.achieved_rate for p in points], ":", color=color, alpha=0.7,
                label=f"throughput, {label}")
    every = sorted({p.rate for pts in compare.values() for p in pts})
    ax.plot(every, every, "--", color="grey", lw=0.8, label="offered")
    ax.set_xlabel("offered load (req/s)")
    ax.set_ylabel("req/s")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("Goodput against offered load: " + " vs ".join(compare))
    fig.tight_layout()
    fig.savefig(out / "goodput-compare.png", dpi=110)
    plt.close(fig)


def markdown(doc: dict) -> str:
    knee = doc["knee"]
    slo = doc["slo"]
    head = [f"# Goodput sweep\n",
            f"SLO: TTFT ≤ {slo.get('ttft')} s, TPOT ≤ {slo.get('tpot')} s"
            + (f", E2E ≤ {slo['e2e']} s" if slo.get("e2e") else "") + f"; objective {doc['objective']:.0%}.\n",
            ("Knee: **%.3g req/s** (attainment %.1f %%, goodput %.3g req/s).\n"
             % (knee["rate"], knee["attainment"] * 100, knee["goodput"])) if knee else "Knee: none (no rate met the objective).\n",
            "| offered req/s | achieved req/s | goodput req/s | attainment | output tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | errors |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def ms(v):
        return "-" if v is None else f"{v * 1000:.0f}"

    for p in doc["points"]:
        head.append(f"| {p['offered_rate']:.3g} | {p['achieved_rate']:.3f} | {p['goodput']:.3f} | {p['attainment'] * 100:.1f} % | "
                    f"{p['output_tokens_per_s']:.1f} | {ms(p['ttft']['p50'])} | {ms(p['ttft']['p99'])} | "
                    f"{ms(p['tpot']['p50'])} | {ms(p['tpot']['p99'])} | {p['errors']} |")
    return "\n".join(head) + "\n"


def plot(points: list[SweepPoint], doc: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [p.rate for p in points]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(rates, [p.summary.achieved_rate for p in points], "o-", label="throughput (completed req/s)")
    ax.plot(rates, [p.summary.goodput for p in points], "s-", label="goodput (req/s meeting SLO)")
    ax.plot(rates, rates, ":", color="grey", label="offered")
    if doc["knee"]:
        ax.axvline(doc["knee"]["rate"], color="red", ls="--", label=f"knee {doc['knee']['rate']:.3g} req/s")
    ax.set_xlabel("offered load (req/s)")
    ax.set_ylabel("req/s")
    ax2 = ax.twinx()
    ax2.plot(rates, [p.summary.output_tokens_per_s for p in points], "^-", color="tab:green", alpha=0.6,
             label="output tokens/s")
    ax2.set_ylabel("output tokens/s")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", fontsize=8)
    ax.set_title("Goodput vs throughput against offered load")
    fig.tight_layout()
    fig.savefig(out / "goodput.png", dpi=110)
    plt.close(fig)

    slo = doc["slo"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, name in zip(axes, ("ttft", "tpot")):
        for q, style in (("p50", "o-"), ("p99", "s-")):
            ys = [getattr(p.summary, name)[q] for p in points]
            ax.plot(rates, [None if y is None else y * 1000 for y in ys], style, label=q)
        if slo.get(name):
            ax.axhline(slo[name] * 1000, color="red", ls="--", label="SLO")
        ax.set_xlabel("offered load (req/s)")
        ax.set_ylabel(f"{name.upper()} (ms)")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
        ax.set_title(name.upper())
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=110)
    plt.close(fig)
