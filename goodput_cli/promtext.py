"""Read a Prometheus text exposition into a flat {(name, labels): value} map, and summarise it.

Used by the demo's live view: it shows what the sidecar and forecaster export, not a private
copy of the numbers.
"""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(samples: Samples, name: str, **match: str) -> float:
    """Sum of every series of `name` whose labels include `match`."""
    return sum(v for (n, labels), v in samples.items()
               if n == name and all(dict(labels).get(k) == val for k, val in match.items()) and not math.isnan(v))


def label_of(samples: Samples, name: str, label: str) -> str | None:
    """`label`'s value on the first series of `name` (an info metric: its labels are its value)."""
    return next((dict(labels).get(label) for (n, labels) in samples if n == name), None)


def histogram_quantile(samples: Samples, name: str, q: float) -> float | None:
    """PromQL's histogram_quantile over the sum of all series of histogram `name` (linear within a bucket)."""
    buckets: dict[float, float] = {}
    for (n, labels), v in samples.items():
        if n == f"{name}_bucket":
            le = float(dict(labels)["le"])
            buckets[le] = buckets.get(le, 0.0) + v
    if not buckets:
        return None
    bounds = sorted(buckets)
    count = buckets[bounds[-1]]
    if count <= 0:
        return None
    rank = q * count
    prev_bound, prev_count = 0.0, 0.0
    for b in bounds:
        c = buckets[b]
        if c >= rank:
            if math.isinf(b):
                return prev_bound
            return prev_bound + (b - prev_bound) * ((rank - prev_count) / (c - prev_count) if c > prev_count else 0)
        prev_bound, prev_count = b, c
    return bounds[-2] if len(bounds) > 1 else None


def diff_histogram(now: Samples, before: Samples, name: str) -> Samples:
    """Bucket counts of `name` accumulated between two scrapes (for windowed percentiles)."""
    out: Samples = {}
    for key, v in now.items():
        if key[0] == f"{name}_bucket":
            out[key] = v - before.get(key, 0.0)
    return out
