"""Runs every policy on one trace and scores it: attainment, goodput, replica-minutes, ...

All policies start from the same deployment size (what the oracle has at t = 0) so none begins
under- or over-provisioned by accident. Cost is counted over the trace's span only (the drain
after the last arrival is simulated so every request finishes, but not billed).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from forecaster.simulate.fleet import ROUTERS, RequestFleet, servable_alone
from forecaster.simulate.loop import LoopConfig, run
from forecaster.simulate.oracle import HEADROOMS, Oracle, oracle_plan, required_replicas
from forecaster.simulate.policies import Limits, make_policy
from forecaster.simulate.profiles import ServiceProfile
from forecaster.simulate.traces import RequestTrace


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    requests: int
    good: int
    dropped: int
    unfinished: int
    attainment: float
    goodput_rps: float
    replica_minutes: float
    scale_events: int
    underprovisioned_s: float
    mean_replicas: float
    peak_replicas: int
    ttft_p99_s: float
    tpot_p99_s: float
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class PolicyRun:
    result: PolicyResult
    series: dict  # per-second arrays: t, spec, ready, starting, draining, waiting, running, arrivals, metric, required


def score(name: str, fleet: RequestFleet, timeline, required: np.ndarray, trace_end_s: float, note: str = "",
          warmup_s: float = 0.0) -> PolicyRun:
    """Scores over [warmup_s, trace end): requests arriving in it, replicas existing in it."""
    s = timeline.arrays()
    counted = fleet.arrival >= warmup_s
    n = int(counted.sum())
    finished = np.isfinite(fleet.t_done) & counted
    good = int((fleet.good & counted).sum())
    dropped = int((fleet.dropped & counted).sum())
    in_span = (s["t"] >= warmup_s) & (s["t"] < trace_end_s)
    cost = s["spec"] + s["draining"]
    req = np.ceil(required - 1e-9)
    idx = np.minimum(s["t"].astype(int), len(req) - 1)
    under = (s["ready"] < req[idx]) & in_span
    ttft = (fleet.t_first - fleet.arrival)[finished]
    out = fleet.output[finished]
    tpot = np.where(out > 1, (fleet.t_done - fleet.t_first)[finished] / np.maximum(out - 1, 1), 0.0)
    span_s = max(trace_end_s - warmup_s, 1e-9)
    result = PolicyResult(
        policy=name, requests=n, good=good, dropped=dropped, unfinished=int(n - finished.sum() - dropped),
        attainment=good / n if n else 1.0, goodput_rps=good / span_s,
        replica_minutes=float(cost[in_span].sum()) / 60.0, scale_events=timeline.scale_events,
        underprovisioned_s=float(under.sum()), mean_replicas=float(cost[in_span].mean()) if in_span.any() else 0.0,
        peak_replicas=int(cost[in_span].max()) if in_span.any() else 0,
        ttft_p99_s=float(np.percentile(ttft, 99)) if len(ttft) else math.nan,
        tpot_p99_s=float(np.percentile(tpot, 99)) if len(tpot) else math.nan, note=note)
    s["required"] = req[idx]
    return PolicyRun(result, s)


def work_per_second(trace: RequestTrace, profile: ServiceProfile, operating_batch: int = 32) -> np.ndarray:
    """Replica-seconds of work arriving in each second of the trace."""
    batch = min(profile.max_batch, operating_batch)
    work = profile.request_work_s(trace.prompt_tokens.astype(float), trace.output_tokens.astype(float), batch)
    return np.bincount(trace.arrival_s.astype(np.int64), weights=work, minlength=int(trace.duration_s) + 1)


def sweep_capacity(profile: ServiceProfile, trace: RequestTrace, target: float = 0.99, seconds: float = 600.0,
                   seed: int = 1, tick_s: float = 0.1) -> float:
    """What `goodput sweep` measures: the highest Poisson rate one replica serves at `target` attainment,
    with prompt/output lengths drawn from the trace. Bisection over the rate."""
    rng = np.random.default_rng(seed)
    mean_work = float(np.mean(profile.request_work_s(trace.prompt_tokens.astype(float),
                                                     trace.output_tokens.astype(float), min(profile.max_batch, 32))))
    lo, hi = 0.0, 2.0 / mean_work
    for _ in range(10):
        rate = (lo + hi) / 2
        n = max(1, int(rate * seconds))
        arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
        pick = rng.integers(0, len(trace), n)
        probe = RequestTrace("sweep", arrivals, trace.prompt_tokens[pick], trace.output_tokens[pick])
        fleet = RequestFleet(profile, probe, 1, 0.0, tick_s)
        t, k = 0.0, 0
        while not fleet.idle and t < arrivals[-1] + 600:
            fleet.step(t)
            k += 1
            t = k * tick_s
        if fleet.good.mean() >= target:
            lo = rate
        else:
            hi = rate
    return lo


def simulate_trace(trace: RequestTrace, profile: ServiceProfile, policy_names: list[str], loop: LoopConfig,
                   limits: Limits, tick_s: float = 0.1, target: float = 0.99, capacity_rps: float | None = None,
                   goodput_overrides: dict | None = None, progress=None,
                   warmup_s: float = 0.0, router: str = ROUTERS[0]) -> tuple[list[PolicyRun], dict]:
    """Every named policy on the trace. Returns the runs and facts about the setup (for the report)."""
    end = trace.duration_s
    # The oracle and the static fleet aim at `target` of the requests an idle replica serves
    # within the SLO, as the forecaster's objective ratio does: a prompt too long to prefill
    # within the TTFT objective misses on any fleet, so an absolute target would make them buy
    # replicas for it (and miss anyway).
    servable = servable_alone(profile, trace, tick_s)[trace.arrival_s >= warmup_s]
    ceiling = float(servable.mean()) if len(servable) else 1.0
    oracle_target = target * ceiling
    required = required_replicas(work_per_second(trace, profile), profile.slo.ttft_s)

    def fleet_of(n: int) -> RequestFleet:
        return RequestFleet(profile, trace, n, loop.cold_start_s, tick_s, router)

    base_plan = oracle_plan(required, loop.cold_start_s, limits.min_replicas, limits.max_replicas)
    initial = int(base_plan[0])
    # The goodput policy learns its capacity online (the service model, from the fleet's own
    # metrics and the SLO) unless one is handed to it.
    runs: list[PolicyRun] = []
    learned = None
    static = None
    if "static" in policy_names:
        static = _static_search(fleet_of, trace, loop, limits, required, oracle_target, progress, warmup_s)
    for name in policy_names:
        if name == "oracle":
            runs.append(_oracle_search(fleet_of, trace, loop, limits, required, oracle_target, progress, warmup_s,
                                       static))
            continue
        if name == "static":
            runs.append(static)
            continue
        policy = make_policy(name, limits, loop.cold_start_s, capacity_rps, goodput_overrides=goodput_overrides,
                             slo=profile.slo, target=target)
        fleet = fleet_of(initial)
        timeline = run(fleet, policy, loop, end, progress=_bind(progress, name))
        runs.append(score(name, fleet, timeline, required, end, warmup_s=warmup_s))
        if name == "goodput" and capacity_rps is None:
            learned = _learned(policy)
    facts = {"initial_replicas": initial, "warmup_s": warmup_s, "capacity_rps": capacity_rps, "requests": len(trace),
             "servable_alone": ceiling, "oracle_target": oracle_target, "router": router,
             "duration_s": end, "mean_rate_rps": len(trace) / end if end else 0.0}
    if learned is not None:
        facts["learned"] = learned
    return runs, facts


def _learned(policy) -> dict | None:
    """What the goodput policy's service model learned by the end of the run, beside the truth."""
    f = policy.forecaster
    params = f.service.params()
    if params is None:
        return None
    m = params.model
    return {"capacity_rps": f.capacity_rps, "capacity_source": f.capacity_source,
            "prefill_tokens_per_s": m.prefill_tokens_per_s, "decode_base_s": m.decode_base_s,
            "decode_per_seq_s": m.decode_per_seq_s, "decode_log_s": m.decode_log_s,
            "kv_capacity_tokens": m.kv_capacity_tokens, "arrival_dispersion": m.arrival_dispersion,
            "wait_scale": m.wait_scale,
            "prompt_mean": params.prompt_mean, "output_mean": params.output_mean, "steps": params.num_steps}


def _oracle_search(fleet_of, trace, loop, limits, required, target, progress, warmup_s,
                   static: PolicyRun | None = None) -> PolicyRun:
    """The cheapest clairvoyant plan that meets `target`: the headroom on the work-based plan is
    bisected (below 1 too: the work formula prices decode at a fixed batch, so it can overstate
    what a replica needs), and a fixed fleet that meets the target is a clairvoyant plan as well,
    so the oracle is never costlier than the static search on the same run."""
    tried: dict[float, PolicyRun] = {}

    def attempt(headroom: float) -> PolicyRun:
        headroom = round(headroom, 3)
        if headroom not in tried:
            plan = oracle_plan(required * headroom, loop.cold_start_s, limits.min_replicas, limits.max_replicas)
            fleet = fleet_of(int(plan[0]))
            timeline = run(fleet, Oracle(plan, headroom), loop, trace.duration_s,
                           progress=_bind(progress, f"oracle x{headroom:g}"))
            tried[headroom] = score("oracle", fleet, timeline, required, trace.duration_s,
                                    note=f"headroom x{headroom:g}", warmup_s=warmup_s)
        return tried[headroom]

    def meets(r: PolicyRun) -> bool:
        return r.result.attainment >= target

    # Bracket: find a headroom that meets the target and one that does not, then bisect.
    lo, hi = None, None
    for h in (1.0, *HEADROOMS[1:]):
        if meets(attempt(h)):
            hi = h
            break
        lo = h
    if hi is not None and lo is None:
        lo_try = 0.5
        while lo_try >= 0.125 and meets(attempt(lo_try)):
            hi, lo_try = lo_try, lo_try / 2
        lo = lo_try if lo_try >= 0.125 else None
    if hi is not None and lo is not None:
        for _ in range(4):
            mid = (lo + hi) / 2
            if meets(attempt(mid)):
                hi = mid
            else:
                lo = mid
    feasible = [r for r in tried.values() if meets(r)]
    if static is not None and meets(static):
        as_oracle = PolicyRun(replace(static.result, policy="oracle", note=f"fixed fleet: {static.result.note}"),
                              static.series)
        feasible.append(as_oracle)
    if not feasible:
        return max(tried.values(), key=lambda r: r.result.attainment)
    return min(feasible, key=lambda r: r.result.replica_minutes)


def _bind(progress, name):
    if progress is None:
        return None
    return lambda t: progress(name, t)


def _static_search(fleet_of, trace, loop, limits, required, target, progress, warmup_s) -> PolicyRun:
    """The smallest fixed fleet that reaches `target` (bisection): what a causal policy costs if it
    cannot follow the load at all and simply provisions for it."""
    n_plan = len(required)
    lo, hi = limits.min_replicas, limits.max_replicas
    best = None
    while lo <= hi:
        n = (lo + hi) // 2
        plan = np.full(n_plan, n, dtype=np.int64)
        fleet = fleet_of(n)
        timeline = run(fleet, Oracle(plan, 1.0), loop, trace.duration_s, progress=_bind(progress, f"static {n}"))
        scored = score("static", fleet, timeline, required, trace.duration_s, note=f"{n} replicas", warmup_s=warmup_s)
        if scored.result.attainment >= target:
            best, hi = scored, n - 1
        else:
            lo = n + 1
            if best is None and n == limits.max_replicas:
                best = scored
    return best if best is not None else scored
