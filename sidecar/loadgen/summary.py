"""Per-request records of a load run and the summary a reader wants from them.

Definitions (the same as `vllm bench serve --goodput`):
- a request is *good* when it finished without error and met every objective of its SLO;
- goodput = good requests / run duration, where the duration runs from the first scheduled
  arrival to the last response's end (so a server that falls behind is charged for it);
- attainment = good requests / requests sent (errors and cancellations count as misses);
- percentiles are numpy's linear interpolation between order statistics (np.percentile's
  default), the convention vLLM's benchmark reports.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    index: int
    scheduled: float            # planned arrival, seconds from run start
    sent: float                 # when it actually went out (open loop: ~scheduled)
    input_tokens: int           # planned prompt tokens
    max_tokens: int
    outcome: str = "error"      # good | slo_violated | error | cancelled | shed (answered 429)
    violated: list[str] = field(default_factory=list)
    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    usage_input_tokens: int | None = None
    error: str | None = None
    cached_tokens: int | None = None   # usage.prompt_tokens_details.cached_tokens, where the server says
    hash_ids: list[int] = field(default_factory=list)   # the trace's prefix-block ids (for `goodput advise`)
    slo_class: str | None = None   # the x-slo-class it was sent with (a class mix), else None

    def to_json(self) -> dict:
        return asdict(self)


def percentile(values, q: float) -> float | None:
    """np.percentile with linear interpolation; None for no values."""
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def _dist(values) -> dict:
    out = {f"p{q}": percentile(values, q) for q in PERCENTILES}
    out["mean"] = float(np.mean(values)) if len(values) else None
    return out


@dataclass
class Summary:
    requests: int
    completed: int
    good: int
    errors: int
    cancelled: int
    duration: float
    offered_rate: float
    achieved_rate: float
    goodput: float
    attainment: float
    output_tokens_per_s: float
    ttft: dict
    tpot: dict
    itl: dict
    e2e: dict
    violations: dict
    shed: int = 0                   # answered 429 by an admission guard; not good, not an error
    admitted_attainment: float = 0.0   # good / (requests - shed): do the admitted ones meet the SLO?
    by_class: dict = field(default_factory=dict)   # class -> requests, good, shed, attainment (a class mix)

    def to_json(self) -> dict:
        return asdict(self)


def summarise(records: list[RequestRecord], duration: float, offered_span: float | None = None) -> Summary:
    """Summary of a run; `duration` is first scheduled arrival → last response end, in seconds.

    `offered_span` is the schedule's span (last planned arrival); offered rate = n / span, which
    for a Poisson schedule of rate λ estimates λ.
    """
    n = len(records)
    done = [r for r in records if r.outcome in ("good", "slo_violated")]
    good = sum(1 for r in records if r.outcome == "good")
    errors = sum(1 for r in records if r.outcome == "error")
    cancelled = sum(1 for r in records if r.outcome == "cancelled")
    shed = sum(1 for r in records if r.outcome == "shed")
    span = offered_span if offered_span and offered_span > 0 else duration
    violations: dict[str, int] = {}
    for r in records:
        for objective in r.violated:
            violations[objective] = violations.get(objective, 0) + 1
    safe = duration if duration > 0 else math.inf
    return Summary(
        requests=n, completed=len(done), good=good, errors=errors, cancelled=cancelled,
        duration=duration,
        offered_rate=n / span if span > 0 else 0.0,
        achieved_rate=len(done) / safe,
        goodput=good / safe,
        attainment=good / n if n else 0.0,
        output_tokens_per_s=sum(r.output_tokens for r in done) / safe,
        ttft=_dist([r.ttft for r in done if r.ttft is not None]),
        tpot=_dist([r.tpot for r in done if r.tpot is not None]),
        itl=_dist([g for r in done for g in r.itl]),
        e2e=_dist([r.e2e for r in done if r.e2e is not None]),
        violations=violations,
        shed=shed,
        admitted_attainment=good / (n - shed) if n > shed else 0.0,
        by_class=_by_class(records),
    )


def _by_class(records: list[RequestRecord]) -> dict:
    out: dict[str, dict] = {}
    for name in sorted({r.slo_class for r in records if r.slo_class is not None}):
        mine = [r for r in records if r.slo_class == name]
        good = sum(r.outcome == "good" for r in mine)
        shed = sum(r.outcome == "shed" for r in mine)
        out[name] = {"requests": len(mine), "good": good, "shed": shed, "attainment": good / len(mine),
                     "admitted_attainment": good / (len(mine) - shed) if len(mine) > shed else 0.0,
                     "ttft": _dist([r.ttft for r in mine if r.outcome in ("good", "slo_violated") and r.ttft is not None])}
    return out


def format_summary(s: Summary) -> str:
    """A compact table for the terminal (milliseconds for latencies)."""
    def ms(d: dict, key: str) -> str:
        v = d.get(key)
        return "-" if v is None else f"{v * 1000:.1f}"

    lines = [
        f"requests {s.requests}  completed {s.completed}  good {s.good}  errors {s.errors}  cancelled {s.cancelled}"
        + (f"  shed {s.shed} (admitted attainment {s.admitted_attainment * 100:.1f} %)" if s.shed else ""),
        f"duration {s.duration:.1f} s  offered {s.offered_rate:.3f} req/s  achieved {s.achieved_rate:.3f} req/s",
        f"goodput {s.goodput:.3f} req/s  attainment {s.attainment * 100:.1f} %  output {s.output_tokens_per_s:.1f} tok/s",
        f"{'ms':<6}{'p50':>10}{'p90':>10}{'p99':>10}{'mean':>10}",
    ]
    for name in ("ttft", "tpot", "itl", "e2e"):
        d = getattr(s, name)
        lines.append(f"{name:<6}" + "".join(f"{ms(d, k):>10}" for k in ("p50", "p90", "p99", "mean")))
    if s.violations:
        lines.append("violations: " + ", ".join(f"{k} {v}" for k, v in sorted(s.violations.items())))
    for name, c in s.by_class.items():
        lines.append(f"class {name}: {c['requests']} requests, good {c['good']}, shed {c['shed']}, "
                     f"attainment {c['attainment'] * 100:.1f} %, admitted attainment {c['admitted_attainment'] * 100:.1f} %")
    return "\n".join(lines)
