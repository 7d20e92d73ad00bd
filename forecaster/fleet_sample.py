"""What the forecaster observes of the fleet: one FleetSample every step (cumulative counters and
gauges, summed over replicas by a source: forecaster/sources/), and the per-step differences of two
of them that the service model learns from (StepObservation, forecaster/service_learn.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class StepObservation:
    """One forecast step's per-replica view (rates over the step; gauges at its end)."""

    dt: float
    replicas: int
    arrival_rps: float            # whole fleet
    ended: float                  # requests that ended in the step (whole fleet)
    input_tokens: float           # prompt tokens of those
    output_tokens: float
    ttft_sum: float | None = None
    ttft_count: float | None = None
    tpot_sum: float | None = None
    tpot_count: float | None = None
    # The mean decode batch of those TPOTs' requests, measured per request at the sidecars
    # (goodput_decode_batch_total over goodput_decode_batch_requests_total): sum and count.
    decode_batch_sum: float | None = None
    decode_batch_count: float | None = None
    running: float = 0.0          # whole fleet, mean of the step's two ends
    running_start: float = 0.0    # whole fleet, at the step's start
    waiting: float = 0.0
    kv_usage: float = math.nan    # mean over replicas
    prefill_sum: float | None = None    # engine-reported prefill seconds (whole fleet)
    prefill_count: float | None = None
    input_hist: dict | None = None      # per-request prompt tokens: {bucket upper bound: requests} in the step
    output_hist: dict | None = None
    queue_sum: float | None = None      # engine-reported queue seconds (whole fleet)
    queue_count: float | None = None
    generated_tokens: float | None = None   # tokens the engines generated in the step (counted as
                                            # they stream, unlike output_tokens: at the end)
    engine_steps: float | None = None       # engine iterations in the step (whole fleet)
    prefilled_tokens: float | None = None   # prompt tokens the engines computed in the step (counted at
                                            # prefill, unlike input_tokens: at the end; cache hits excluded)
    arrivals: float | None = None           # requests that arrived in the step (whole fleet)
    arrivals_squared: dict | None = None    # {window s: Σ over each sidecar's windows of (arrivals in it)²}, in the step


@dataclass
class FleetSample:
    """One observation of the whole fleet, every step_seconds."""
    t: float                  # seconds (any monotonic origin)
    arrivals_total: float     # cumulative requests arrived (counter; may reset)
    input_tokens_total: float
    output_tokens_total: float
    in_flight: float          # requests in flight at the sidecars
    queue_waiting: float      # engine queue, summed over replicas
    running: float
    kv_cache_usage: float     # mean over replicas, 0-1
    preemptions_total: float
    ready_replicas: int
    good_total: float | None = None   # cumulative good requests (for online capacity learning)
    # For the service model (forecaster/service_learn.py); None where a source cannot tell.
    ended_total: float | None = None          # requests that ended (goodput_requests_total)
    ttft_sum_total: float | None = None       # goodput_ttft_seconds_sum / _count
    ttft_count_total: float | None = None
    tpot_sum_total: float | None = None
    tpot_count_total: float | None = None
    decode_batch_total: float | None = None         # goodput_decode_batch_total
    decode_batch_count_total: float | None = None   # goodput_decode_batch_requests_total
    prefill_sum_total: float | None = None    # goodput_engine_prefill_time_seconds_sum / _count
    prefill_count_total: float | None = None
    queue_sum_total: float | None = None      # goodput_engine_queue_time_seconds_sum / _count
    queue_count_total: float | None = None
    generation_tokens_total: float | None = None  # goodput_engine_generation_tokens_total (as generated)
    engine_steps_total: float | None = None       # goodput_engine_steps_total (engine iterations)
    prompt_computed_total: float | None = None    # goodput_engine_prompt_tokens_computed_total (at prefill)
    input_token_hist_total: dict | None = None    # goodput_request_input_tokens: {le: cumulative count}
    output_token_hist_total: dict | None = None
    # goodput_requests_arrived_squared_total: {window seconds: Σ over each sidecar's windows of
    # (requests arrived in that window)²}; with arrivals_total, how clumped arrivals come.
    arrivals_squared_total: dict | None = None
    slos: tuple | None = None                 # the sidecars' SLO classes (service_model.Slo)


# Totals a fleet need not export (an engine without a queue/prefill split or iteration counter, a
# sidecar without the decode batch): FleetSample field -> (the source's total, the total whose
# export gates it).
OPTIONAL_TOTALS = {
    "decode_batch_total": ("decode_batch", "decode_batch_count"),
    "decode_batch_count_total": ("decode_batch_count", "decode_batch_count"),
    "prefill_sum_total": ("prefill_sum", "prefill_count"),
    "prefill_count_total": ("prefill_count", "prefill_count"),
    "queue_sum_total": ("queue_sum", "queue_count"),
    "queue_count_total": ("queue_count", "queue_count"),
    "generation_tokens_total": ("generation_tokens", "generation_tokens"),
    "engine_steps_total": ("engine_steps", "engine_steps"),
    "prompt_computed_total": ("prompt_computed", "prompt_computed"),
}


def optional_totals(totals: dict, exported: set) -> dict:
    """The OPTIONAL_TOTALS fields of a FleetSample from a source's running totals: None while the
    gating total has not been exported (the learner then takes its other paths), from 0 once it
    has (the sidecars create their series at 0), so the first step with something counted has its
    increase. (Differenced against None that step had none: on the live step test the learner
    then fell back to the running gauge for it.)"""
    return {name: (totals[key] if gate in exported else None) for name, (key, gate) in OPTIONAL_TOTALS.items()}


def delta(prev, cur) -> float | None:
    """A counter's increase over one step; None when unknown or reset (a restarted sidecar)."""
    if prev is None or cur is None or not (math.isfinite(prev) and math.isfinite(cur)) or cur < prev:
        return None
    return cur - prev


def hist_delta(prev: dict | None, cur: dict | None) -> dict | None:
    """Requests per bucket in the step, from two cumulative histograms ({le: count}); None on a reset."""
    if not prev or not cur:
        return None
    cum = {le: cur[le] - prev.get(le, 0.0) for le in cur}
    if any(v < 0 for v in cum.values()):
        return None
    edges = sorted(cum)
    out, below = {}, 0.0
    for le in edges:
        out[le] = max(0.0, cum[le] - below)
        below = cum[le]
    return out


def _dict_delta(prev: dict | None, cur: dict | None) -> dict | None:
    """Per-key counter increases over one step, for the keys both have and that did not reset."""
    if not prev or not cur:
        return None
    out = {k: d for k in cur if (d := delta(prev.get(k), cur[k])) is not None}
    return out or None


def _mean_gauge(a: float, b: float) -> float:
    vals = [v for v in (a, b) if math.isfinite(v)]
    return sum(vals) / len(vals) if vals else 0.0


def step_observation(prev: FleetSample, cur: FleetSample, arrival_rps: float | None) -> StepObservation | None:
    dt = cur.t - prev.t
    ended = delta(prev.ended_total, cur.ended_total)
    if dt <= 0 or ended is None or ended <= 0 or cur.ready_replicas <= 0:
        return None
    tokens_in = delta(prev.input_tokens_total, cur.input_tokens_total)
    tokens_out = delta(prev.output_tokens_total, cur.output_tokens_total)
    if tokens_in is None or tokens_out is None:
        return None
    return StepObservation(
        dt=dt, replicas=int(cur.ready_replicas), arrival_rps=float(arrival_rps or 0.0), ended=ended,
        input_tokens=tokens_in, output_tokens=tokens_out,
        ttft_sum=delta(prev.ttft_sum_total, cur.ttft_sum_total),
        ttft_count=delta(prev.ttft_count_total, cur.ttft_count_total),
        tpot_sum=delta(prev.tpot_sum_total, cur.tpot_sum_total),
        tpot_count=delta(prev.tpot_count_total, cur.tpot_count_total),
        decode_batch_sum=delta(prev.decode_batch_total, cur.decode_batch_total),
        decode_batch_count=delta(prev.decode_batch_count_total, cur.decode_batch_count_total),
        # The requests that ended lived through the step: the batch they saw is nearer the step's
        # mean than its end (gauges are instants), so take the mean of both ends.
        running=_mean_gauge(prev.running, cur.running),
        running_start=float(prev.running) if math.isfinite(prev.running) else 0.0,
        waiting=float(cur.queue_waiting) if math.isfinite(cur.queue_waiting) else 0.0,
        kv_usage=float(cur.kv_cache_usage),
        prefill_sum=delta(prev.prefill_sum_total, cur.prefill_sum_total),
        prefill_count=delta(prev.prefill_count_total, cur.prefill_count_total),
        queue_sum=delta(prev.queue_sum_total, cur.queue_sum_total),
        queue_count=delta(prev.queue_count_total, cur.queue_count_total),
        input_hist=hist_delta(prev.input_token_hist_total, cur.input_token_hist_total),
        output_hist=hist_delta(prev.output_token_hist_total, cur.output_token_hist_total),
        generated_tokens=delta(prev.generation_tokens_total, cur.generation_tokens_total),
        engine_steps=delta(prev.engine_steps_total, cur.engine_steps_total),
        prefilled_tokens=delta(prev.prompt_computed_total, cur.prompt_computed_total),
        arrivals=delta(prev.arrivals_total, cur.arrivals_total),
        arrivals_squared=_dict_delta(prev.arrivals_squared_total, cur.arrivals_squared_total))
