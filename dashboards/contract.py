"""The metrics contract (DESIGN.md, "Metrics contract") as data, read by every generator.

Dashboards, alerting rules and the Helm chart's monitoring objects all take metric names from
here through `name()`, which refuses a name the contract does not list, so a typo or a renamed
metric breaks generation instead of producing a panel that silently shows nothing. Tests compare
this table with what the sidecar and the forecaster really expose on /metrics.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    type: str  # "counter" | "gauge" | "histogram" (as written in the exposition's # TYPE line)
    labels: tuple[str, ...]
    source: str  # "sidecar" | "forecaster"


# Label value sets; small and bounded on purpose (DESIGN.md: no unbounded labels).
# `shed`: refused with 429 by the sidecar's admission guard; judged, and not good.
OUTCOMES = ("good", "slo_violated", "error", "cancelled", "shed")
OBJECTIVES = ("ttft", "tpot", "e2e")
BOUNDS = ("mean", "upper")
# Judged outcomes that are not good (a regex alternation for PromQL): what SLO error ratios count.
BAD_OUTCOMES = "slo_violated|error|shed"
# Why the admission guard shed a request: the objective it was predicted to miss.
SHED_REASONS = ("ttft", "tpot")

_SIDECAR = [
    Metric("goodput_requests_total", "counter", ("model", "slo_class", "outcome"), "sidecar"),
    Metric("goodput_requests_arrived_total", "counter", ("model", "slo_class"), "sidecar"),
    Metric("goodput_requests_arrived_squared_total", "counter", ("model", "window_seconds"), "sidecar"),
    Metric("goodput_slo_violations_total", "counter", ("model", "slo_class", "objective"), "sidecar"),
    Metric("goodput_ttft_seconds", "histogram", ("model", "slo_class"), "sidecar"),
    Metric("goodput_tpot_seconds", "histogram", ("model", "slo_class"), "sidecar"),
    # The decode batch those TPOTs were measured at (sidecar/metrics.py DecodeConcurrency).
    Metric("goodput_decode_batch_total", "counter", ("model",), "sidecar"),
    Metric("goodput_decode_batch_requests_total", "counter", ("model",), "sidecar"),
    Metric("goodput_itl_seconds", "histogram", ("model",), "sidecar"),
    Metric("goodput_e2e_seconds", "histogram", ("model", "slo_class"), "sidecar"),
    Metric("goodput_input_tokens_total", "counter", ("model", "slo_class"), "sidecar"),
    Metric("goodput_output_tokens_total", "counter", ("model", "slo_class"), "sidecar"),
    Metric("goodput_request_input_tokens", "histogram", ("model",), "sidecar"),
    Metric("goodput_request_output_tokens", "histogram", ("model",), "sidecar"),
    Metric("goodput_requests_in_flight", "gauge", ("model",), "sidecar"),
    Metric("goodput_slo_target_seconds", "gauge", ("slo_class", "objective"), "sidecar"),
    Metric("goodput_slo_objective_ratio", "gauge", ("slo_class",), "sidecar"),
    Metric("goodput_admission_predicted_ttft_seconds", "histogram", ("model", "slo_class"), "sidecar"),
    Metric("goodput_admission_ttft_error_seconds", "histogram", ("model", "slo_class"), "sidecar"),
    Metric("goodput_admission_predicted_tpot_seconds", "histogram", ("model", "slo_class"), "sidecar"),
    Metric("goodput_admission_tpot_error_seconds", "histogram", ("model", "slo_class"), "sidecar"),
    Metric("goodput_admission_shed_total", "counter", ("model", "slo_class", "reason"), "sidecar"),
    Metric("goodput_admission_held_seconds", "histogram", ("model", "slo_class"), "sidecar"),
    Metric("goodput_engine_requests_waiting", "gauge", ("model",), "sidecar"),
    Metric("goodput_engine_requests_running", "gauge", ("model",), "sidecar"),
    Metric("goodput_engine_kv_cache_usage_ratio", "gauge", ("model",), "sidecar"),
    Metric("goodput_engine_preemptions_total", "counter", ("model",), "sidecar"),
    Metric("goodput_engine_prefix_cache_queries_total", "counter", ("model",), "sidecar"),
    Metric("goodput_engine_prefix_cache_hits_total", "counter", ("model",), "sidecar"),
    Metric("goodput_engine_queue_time_seconds", "histogram", ("model",), "sidecar"),
    Metric("goodput_engine_prefill_time_seconds", "histogram", ("model",), "sidecar"),
    Metric("goodput_engine_decode_time_seconds", "histogram", ("model",), "sidecar"),
    Metric("goodput_engine_prompt_tokens_cached_total", "counter", ("model",), "sidecar"),
    Metric("goodput_engine_prompt_tokens_computed_total", "counter", ("model",), "sidecar"),
    # For the forecaster's service model: generation as it happens, engine iterations.
    Metric("goodput_engine_generation_tokens_total", "counter", ("model",), "sidecar"),
    Metric("goodput_engine_steps_total", "counter", ("model",), "sidecar"),
    Metric("goodput_engine_up", "gauge", (), "sidecar"),
    Metric("goodput_draining", "gauge", (), "sidecar"),
    # Prompt-layout advice (sidecar/advisor.py): token counts are estimates, never text.
    Metric("goodput_prompt_requests_total", "counter", ("model",), "sidecar"),
    Metric("goodput_prompt_tokens_total", "counter", ("model",), "sidecar"),
    Metric("goodput_prompt_prefix_reusable_tokens_total", "counter", ("model",), "sidecar"),
    Metric("goodput_prompt_volatile_span_requests_total", "counter", ("model",), "sidecar"),
    Metric("goodput_prompt_movable_tokens_total", "counter", ("model",), "sidecar"),
    Metric("goodput_prompt_ttft_saving_seconds_total", "counter", ("model",), "sidecar"),
    Metric("goodput_prompt_volatile_span_offset_tokens", "histogram", ("model",), "sidecar"),
    # Refused at the HTTP layer (not valid HTTP/1.1): no model or class, so not a request outcome.
    Metric("goodput_malformed_requests_total", "counter", (), "sidecar"),
]

_FORECASTER = [
    Metric("goodput_forecast_queue_depth", "gauge", ("horizon_seconds", "bound"), "forecaster"),
    Metric("goodput_forecast_arrival_rate", "gauge", ("horizon_seconds", "bound"), "forecaster"),
    Metric("goodput_desired_replicas", "gauge", (), "forecaster"),
    Metric("goodput_observed_replicas", "gauge", (), "forecaster"),
    Metric("goodput_replica_capacity_requests_per_second", "gauge", (), "forecaster"),
    Metric("goodput_forecast_model_info", "gauge", ("model_name",), "forecaster"),
    # The demand window's mean (forecaster/demand.py): which estimate it came from.
    Metric("goodput_forecast_demand_estimate_info", "gauge", ("estimate",), "forecaster"),
    # The service model (forecaster/service_model.py), learned online, and what it predicts.
    Metric("goodput_forecast_ttft_seconds", "gauge", ("horizon_seconds", "bound", "slo_class"), "forecaster"),
    Metric("goodput_forecast_tpot_seconds", "gauge", ("horizon_seconds", "bound", "slo_class"), "forecaster"),
    Metric("goodput_replica_capacity_info", "gauge", ("source",), "forecaster"),
    Metric("goodput_replica_cold_start_seconds", "gauge", (), "forecaster"),
    Metric("goodput_replica_decode_step_seconds", "gauge", ("bound",), "forecaster"),
    Metric("goodput_replica_decode_step_base_seconds", "gauge", ("bound",), "forecaster"),
    Metric("goodput_replica_decode_step_log_seconds", "gauge", ("bound",), "forecaster"),
    Metric("goodput_replica_decode_step_per_sequence_seconds", "gauge", ("bound",), "forecaster"),
    Metric("goodput_replica_prefill_tokens_per_second", "gauge", ("bound",), "forecaster"),
    Metric("goodput_replica_kv_capacity_tokens", "gauge", ("bound",), "forecaster"),
    Metric("goodput_replica_ttft_overhead_seconds", "gauge", ("bound",), "forecaster"),
    Metric("goodput_replica_tokens_per_request", "gauge", ("kind",), "forecaster"),
    Metric("goodput_replica_arrival_dispersion", "gauge", (), "forecaster"),
    Metric("goodput_replica_wait_scale", "gauge", ("state",), "forecaster"),
    # Each published forecast against what was observed one horizon later (forecaster/scoring.py).
    Metric("goodput_forecast_error_absolute", "gauge", ("quantity", "horizon_seconds"), "forecaster"),
    Metric("goodput_forecast_error_ratio", "gauge", ("quantity", "horizon_seconds"), "forecaster"),
    Metric("goodput_forecast_error_upper_coverage_ratio", "gauge", ("quantity", "horizon_seconds"), "forecaster"),
    # Steps that kept the last decision because the input was bad (reasons: forecaster/server.py).
    Metric("goodput_forecaster_source_errors_total", "counter", ("reason",), "forecaster"),
]

METRICS: dict[str, Metric] = {m.name: m for m in _SIDECAR + _FORECASTER}


def name(metric: str) -> str:
    """The metric name, after checking the contract lists it.

    `name("goodput_ttft_seconds_bucket")` is accepted too: histogram series carry suffixes.
    """
    base = metric
    for suffix in ("_bucket", "_sum", "_count"):
        if metric.endswith(suffix) and metric[: -len(suffix)] in METRICS:
            if METRICS[metric[: -len(suffix)]].type != "histogram":
                raise KeyError(f"{metric}: {metric[:-len(suffix)]} is not a histogram in the metrics contract")
            base = metric[: -len(suffix)]
    if base not in METRICS:
        raise KeyError(f"{metric} is not in the metrics contract (dashboards/contract.py, DESIGN.md)")
    return metric


def by_source(source: str) -> list[Metric]:
    return [m for m in METRICS.values() if m.source == source]


# Recording-rule windows for SLO error and attainment ratios (multi-window multi-burn-rate
# alerting, Google SRE workbook ch. 5): short windows reset an alert quickly, long ones prove
# the budget is really going.
SLO_WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")


@dataclass(frozen=True)
class BurnTier:
    """Alert when BOTH windows burn faster than `factor` times the sustainable rate."""

    long_window: str
    short_window: str
    factor: float


# SRE workbook table 5-8: 2% of a 30-day budget in 1h (14.4x), 5% in 6h (6x) page;
# 10% in 1d (3x) and 10% in 3d (1x) open a ticket.
PAGE_TIERS = (BurnTier("1h", "5m", 14.4), BurnTier("6h", "30m", 6.0))
TICKET_TIERS = (BurnTier("1d", "2h", 3.0), BurnTier("3d", "6h", 1.0))


def error_ratio_record(window: str) -> str:
    return f"slo_class:goodput_slo_error_ratio:rate{window}"


def attainment_ratio_record(window: str) -> str:
    return f"slo_class:goodput_slo_attainment_ratio:rate{window}"


def burn_rate_record(window: str) -> str:
    return f"slo_class:goodput_slo_burn_rate:rate{window}"


ERROR_BUDGET_RECORD = "slo_class:goodput_slo_error_budget:ratio"
WAITING_RECORD = "goodput:engine_requests_waiting:sum"
