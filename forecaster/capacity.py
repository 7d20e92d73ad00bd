"""Per-replica capacity: requests/s one replica sustains while SLOs hold.

Either configured (a number, or the knee of a `goodput sweep` report), or learned online from the
fleet's own metrics: the throughput observed per ready replica during steps where a queue was
waiting (so the replicas were busy, and the throughput is what they can do, not what was asked)
and the share of good requests held the objective (so it is the rate at which SLOs still hold).
It also keeps `drain_rps`, the throughput of those busy steps whether SLOs held or not: the rate a
backlog drains at (forecaster/policy.py plans new demand at the SLO's rate, a backlog at this one).
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def load_sweep_capacity(path: str | Path) -> float:
    """The knee rate (requests/s per replica) of a `goodput sweep` report: sweep.json or its folder."""
    path = Path(path)
    if path.is_dir():
        path = path / "sweep.json"
    if not path.is_file():
        raise ValueError(f"no sweep result at {path}; pass the sweep.json that `goodput sweep` wrote, or its folder")
    try:
        data = json.loads(path.read_text())
        rate = float(data["knee"]["rate"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path} has no numeric knee.rate ({exc}); is it a `goodput sweep` sweep.json?") from exc
    if not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"{path}: knee.rate must be a positive number of requests/s, got {rate}")
    return rate


class OnlineCapacity:
    """Learns capacity from (served rate, ready replicas, queue, good share) per step.

    The estimate is an exponentially weighted mean of per-replica throughput over saturated,
    SLO-holding steps. Until one such step is seen, the highest per-replica throughput observed
    so far is used (a lower bound: replicas did at least that) but never less than `prior_rps`.
    """

    def __init__(self, prior_rps: float = 1.0, min_queue: float = 1.0, good_share: float = 0.9,
                 weight: float = 0.1):
        if prior_rps <= 0:
            raise ValueError(f"prior capacity must be > 0 requests/s, got {prior_rps}")
        self.prior_rps = prior_rps
        self.min_queue = min_queue
        self.good_share = good_share
        self.weight = weight
        self.learned_rps: float | None = None
        self.max_seen_rps = 0.0
        self.num_saturated_steps = 0
        # Throughput while a queue waited, whether or not SLOs held: the rate at which a backlog
        # drains (its requests are late already), as distinct from the rate at which SLOs hold.
        self.drain_rps: float | None = None

    def observe(self, served_rps: float, ready_replicas: int, queue: float, good_rps: float | None) -> None:
        if ready_replicas <= 0 or not math.isfinite(served_rps) or served_rps <= 0:
            return
        per_replica = served_rps / ready_replicas
        self.max_seen_rps = max(self.max_seen_rps, per_replica)
        if queue < self.min_queue:
            return  # idle replicas: throughput is what was asked, not what they can do
        self.drain_rps = per_replica if self.drain_rps is None else \
            self.drain_rps + self.weight * (per_replica - self.drain_rps)
        if good_rps is not None and good_rps < self.good_share * served_rps:
            return  # SLOs did not hold at this rate: it is past the capacity we want
        self.num_saturated_steps += 1
        if self.learned_rps is None:
            self.learned_rps = per_replica
        else:
            self.learned_rps += self.weight * (per_replica - self.learned_rps)

    @property
    def capacity_rps(self) -> float:
        if self.learned_rps is not None:
            return self.learned_rps
        return max(self.prior_rps, self.max_seen_rps)
