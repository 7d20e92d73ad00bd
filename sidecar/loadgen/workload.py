"""What a load run sends: one `PlannedRequest` per arrival, from a process or a trace.

Open loop: arrival times are fixed before the run starts and requests go out on schedule whether
or not earlier ones finished, as `vllm bench serve` and real users do. Closed-loop generators
(send the next when one finishes) hide queueing and overstate what a server sustains.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class PlannedRequest:
    """One request of a workload; times are seconds from the start of the run."""

    arrival: float
    input_tokens: int
    output_tokens: int
    # Prefix-block ids (Mooncake): requests sharing the first k ids share that many prefix blocks.
    hash_ids: tuple[int, ...] = field(default=())
    slo_class: str | None = None     # sent as x-slo-class (a class mix); None: the endpoint's default


def assign_classes(requests: list[PlannedRequest], mix: dict[str, float], seed: int = 0) -> list[PlannedRequest]:
    """Each request gets an SLO class drawn with the mix's weights (seeded: the same classes for
    the same workload, whichever endpoint it is sent to)."""
    if not mix:
        return requests
    names, weights = list(mix), np.asarray(list(mix.values()), dtype=float)
    if (weights < 0).any() or weights.sum() <= 0:
        raise ValueError(f"class mix weights must be >= 0 and not all 0, got {mix}")
    rng = np.random.default_rng(seed + 2)
    picks = rng.choice(len(names), size=len(requests), p=weights / weights.sum())
    return [PlannedRequest(r.arrival, r.input_tokens, r.output_tokens, r.hash_ids, names[i])
            for r, i in zip(requests, picks)]


def poisson_arrivals(rate: float, count: int, seed: int = 0) -> np.ndarray:
    """Arrival times of a Poisson process: exponential gaps with mean 1/rate."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0 requests/s, got {rate}")
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(1.0 / rate, size=count))


def at_exact_rate(times: np.ndarray, rate: float) -> np.ndarray:
    """The schedule rescaled so that it offers exactly `rate`: its n-th arrival at n / rate (a
    run's offered rate is its requests over its last arrival, `summary.summarise`).

    Drawn gaps realise their own rate: 240 Poisson arrivals at 4 req/s span 60 ± 3.9 s, so a
    sweep point offers 4 ± 0.26 req/s (one sd), and neighbouring points can cross (seeds that
    realised 6.56 req/s at 6 and 6.52 at 7). For Poisson gaps the rescaled schedule is the
    process conditioned on its count: the arrivals before the last are uniform order statistics
    on the span, as a Poisson process's are given how many fell in it; bursts stay as drawn."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0 requests/s, got {rate}")
    times = np.asarray(times, dtype=float)
    if len(times) == 0 or not times[-1] > 0:
        return times
    return times * (len(times) / rate / times[-1])


def arrivals(rate: float, count: int, seed: int = 0, cv: float = 1.0) -> np.ndarray:
    """A synthetic schedule as the load generator and the demo's calibration send it: Poisson
    (cv 1) or Gamma gaps, offering exactly `rate` (`at_exact_rate`)."""
    times = poisson_arrivals(rate, count, seed) if cv == 1.0 else gamma_arrivals(rate, cv, count, seed)
    return at_exact_rate(times, rate)


def gamma_arrivals(rate: float, cv: float, count: int, seed: int = 0) -> np.ndarray:
    """Arrival times with Gamma-distributed gaps: mean 1/rate, coefficient of variation `cv`.

    cv = 1 is Poisson; cv > 1 is burstier (vLLM's `--burstiness` is 1/cv²). A Gamma with shape k
    has CV 1/sqrt(k), so k = 1/cv² and scale = 1/(rate·k) keeps the mean gap at 1/rate.
    """
    if rate <= 0:
        raise ValueError(f"rate must be > 0 requests/s, got {rate}")
    if cv <= 0:
        raise ValueError(f"cv must be > 0, got {cv}")
    shape = 1.0 / (cv * cv)
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), size=count))


def synthetic_workload(times: np.ndarray, input_tokens: int, output_tokens: int,
                       spread: float = 0.0, seed: int = 0, long_fraction: float = 0.0,
                       long_input_tokens: int = 1024) -> list[PlannedRequest]:
    """Fixed (or uniformly spread by ±`spread` fraction) lengths at the given arrival times.

    With `long_fraction` > 0, that fraction of requests (chosen at random) carry a long prompt
    instead: the mix under which a whole-prompt prefill stalls everyone else's decode.
    """
    rng = np.random.default_rng(seed + 1)
    out = []
    for t in times:
        n_in, n_out = input_tokens, output_tokens
        if long_fraction > 0 and rng.random() < long_fraction:
            n_in = long_input_tokens
        if spread > 0:
            n_in = max(1, int(round(input_tokens * rng.uniform(1 - spread, 1 + spread))))
            n_out = max(1, int(round(output_tokens * rng.uniform(1 - spread, 1 + spread))))
        out.append(PlannedRequest(float(t), n_in, n_out))
    return out
