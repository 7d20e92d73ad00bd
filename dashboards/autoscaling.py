"""Dashboard 3, "Autoscaling": what the forecaster predicts and what it asks the HPA for.

Forecast series are published "now" for a point `horizon_seconds` ahead, so a forecast line leads
the actual line by the horizon; the dashboard draws both on one axis rather than shifting, since
the horizon is a label value and PromQL offsets cannot depend on it.
"""

from __future__ import annotations

from dashboards.contract import name as m
from dashboards.panels import MODEL, Query, dashboard, series, single

UID = "goodput-autoscaling"
RATE = "$__rate_interval"


def _forecast(metric: str, what: str) -> list[Query]:
    return [Query(f'{m(metric)}{{bound="{bound}"}}', f"forecast {bound} (+{{{{horizon_seconds}}}}s)")
            for bound in ("mean", "upper")]


def _latency(objective: str, description: str):
    """One objective's actual mean against the service model's forecasts and the objective."""
    forecast = m(f"goodput_forecast_{objective}_seconds")
    actual = f"goodput_{objective}_seconds"
    return series(f"{objective.upper()}: actual vs forecast", [
        Query(f"sum(rate({m(actual + '_sum')}{{{MODEL}}}[{RATE}])) / "
              f"sum(rate({m(actual + '_count')}{{{MODEL}}}[{RATE}]))", "actual mean"),
        Query(f'max by (slo_class) ({forecast}{{bound="mean"}})', "forecast mean {{slo_class}}"),
        Query(f'max by (slo_class) ({forecast}{{bound="upper"}})', "forecast at objective ratio, upper demand {{slo_class}}"),
        Query(f'max by (slo_class) ({m("goodput_slo_target_seconds")}{{objective="{objective}"}})', "objective {{slo_class}}"),
    ], "s", min=0, description=description)


def build():
    desired = m("goodput_desired_replicas")
    observed = m("goodput_observed_replicas")
    capacity = m("goodput_replica_capacity_requests_per_second")
    summary = [
        single("Desired replicas", [Query(f"max({desired})", "desired")], "short",
               description="What the forecaster asks the HPA for (External metric, AverageValue 1)."),
        single("Observed replicas", [Query(f"max({observed})", "observed")], "short",
               description="Serving replicas the forecaster sees now."),
        single("Capacity per replica", [Query(f"max({capacity})", "capacity")], "reqps", decimals=2,
               description="Requests/s one replica serves while every SLO class meets its objectives, for the "
                           "current token mix (the learned service model; or configured)."),
        single("Forecast model", [Query(f"max by (model_name) ({m('goodput_forecast_model_info')})", "{{model_name}}")],
               "short", text_name=True, description="What made the forecast: the pool members averaged (e.g. ewma0.3+median40), or a fitted model (level, holt_winters, arima) that beat them."),
        single("Demand estimate", [Query(f"max by (estimate) ({m('goodput_forecast_demand_estimate_info')})",
                                         "{{estimate}}")],
               "short", text_name=True,
               description="Where the mean demand the replicas are planned on comes from: the forecast, or the "
                           "last window observed, whichever forecast such windows better "
                           "(each one scored on the windows that have ended)."),
    ]
    forecast = [
        series("Queue depth: actual vs forecast", [
            Query(f"sum({m('goodput_engine_requests_waiting')}{{{MODEL}}})", "actual waiting"),
            *_forecast("goodput_forecast_queue_depth", "queue"),
        ], "short", min=0,
               description="Requests waiting in the engines now, and the fluid-model forecast at the horizon "
                           "(mean and upper bound) for the current replica count."),
        series("Arrival rate: actual vs forecast", [
            Query(f"sum(rate({m('goodput_requests_arrived_total')}{{{MODEL}}}[{RATE}]))", "actual"),
            *_forecast("goodput_forecast_arrival_rate", "arrivals"),
        ], "reqps", min=0, description="Requests arriving at the sidecars (counted on arrival), and the demand forecast at the horizon."),
        series("Replicas: desired vs observed", [
            Query(f"max({desired})", "desired"), Query(f"max({observed})", "observed"),
        ], "short", min=0, description="A gap that persists means the HPA is limited (maxReplicas, quota) or slow."),
        series("Capacity vs demand", [
            Query(f"max({capacity}) * max({observed})", "capacity x observed replicas"),
            Query(f'max({m("goodput_forecast_arrival_rate")}{{bound="upper"}})', "forecast upper"),
        ], "reqps", min=0, description="Fleet capacity at the current replica count against forecast demand."),
    ]
    latency = [
        _latency("ttft", "What the service model predicts at the horizon with the current replicas: the mean "
                         "at the demand's mean, and the TTFT the class's objective ratio of requests stay under "
                         "at the demand's upper bound, against the objective and the actual mean."),
        _latency("tpot", "As TTFT: overload that shows as a growing batch (nothing waiting) shows here."),
        series("Forecast error, one horizon later", [
            Query(f'max by (quantity) ({m("goodput_forecast_error_ratio")})', "relative error {{quantity}}"),
            Query(f'max by (quantity) ({m("goodput_forecast_error_upper_coverage_ratio")})', "under upper bound {{quantity}}"),
        ], "percentunit", min=0, description="Each published forecast scored against what was observed one horizon "
                                             "later (recent forecasts weigh most): mean absolute error over the mean "
                                             "actual, and the share of actuals at or under the published upper bound. "
                                             "Absolute errors: goodput_forecast_error_absolute."),
        series("Forecast error (absolute)", [
            Query(f'max by (quantity) ({m("goodput_forecast_error_absolute")})', "{{quantity}}"),
        ], "short", min=0, description="Mean absolute error of each quantity's mean forecast, in its own units."),
    ]
    service = [
        series("Decode step time (learned)", [
            Query(f"max by (bound) ({m('goodput_replica_decode_step_seconds')})", "one sequence alone {{bound}}"),
            Query(f"max by (bound) ({m('goodput_replica_decode_step_base_seconds')})", "batched: fixed part {{bound}}"),
            Query(f"max by (bound) ({m('goodput_replica_decode_step_per_sequence_seconds')})", "batched: per sequence {{bound}}"),
            Query(f"max by (bound) ({m('goodput_replica_decode_step_log_seconds')})", "batched: x ln(batch) {{bound}}"),
        ], "s", min=0, description="The service model's decode step, learned online from engine iterations or TPOT, with "
                                   "its 90 % band: fixed part + per sequence x batch + the concave part x ln(batch) "
                                   "from two sequences on, and one sequence decoding alone (from TPOT at low load; on "
                                   "the curve until low load shows it)."),
        series("Prefill rate (learned)", [
            Query(f"max by (bound) ({m('goodput_replica_prefill_tokens_per_second')})", "{{bound}}"),
        ], "short", min=0, description="Prompt tokens per second one replica prefills (chunk overhead included), 90 % band."),
        series("KV capacity and fixed TTFT (learned)", [
            Query(f"max by (bound) ({m('goodput_replica_kv_capacity_tokens')})", "KV tokens {{bound}}"),
        ], "short", min=0, description="KV cache tokens per replica, from KV usage against the tokens held."),
        series("Token mix and overhead", [
            Query(f"max by (kind) ({m('goodput_replica_tokens_per_request')})", "{{kind}} tokens/request"),
            Query(f"max by (bound) ({m('goodput_replica_ttft_overhead_seconds')}) * 1000", "TTFT overhead ms {{bound}}"),
            Query(f"max by (source) ({m('goodput_replica_capacity_info')})", "capacity from {{source}}"),
            Query(f"max({m('goodput_replica_cold_start_seconds')})", "cold start s"),
        ], "short", min=0, description="Mean prompt and output tokens per request in the recent mix; what every TTFT "
                                       "holds beyond queue and prefill; where the capacity figure comes from; "
                                       "the cold start the forecaster plans with (learned from EndpointSlices)."),
        series("Tokens per request (the mix)", [
            Query(f"histogram_quantile(0.5, sum by (le) (rate({m('goodput_request_input_tokens_bucket')}{{{MODEL}}}[{RATE}])))",
                  "prompt p50"),
            Query(f"histogram_quantile(0.99, sum by (le) (rate({m('goodput_request_input_tokens_bucket')}{{{MODEL}}}[{RATE}])))",
                  "prompt p99"),
            Query(f"histogram_quantile(0.5, sum by (le) (rate({m('goodput_request_output_tokens_bucket')}{{{MODEL}}}[{RATE}])))",
                  "output p50"),
            Query(f"histogram_quantile(0.99, sum by (le) (rate({m('goodput_request_output_tokens_bucket')}{{{MODEL}}}[{RATE}])))",
                  "output p99"),
        ], "short", min=0, description="The shape of the token mix the service model plans for: how long the long "
                                       "prompts are sets the TTFT tail (buckets are powers of two)."),
        series("Arrival clumping", [
            Query(f"max({m('goodput_replica_arrival_dispersion')})", "planned on (at a prompt's service time)"),
            *[Query(f"avg((sum by (instance) (rate({m('goodput_requests_arrived_squared_total')}"
                    f"{{{MODEL},window_seconds=\"{w}\"}}[{RATE}])) - "
                    f"sum by (instance) (rate({m('goodput_requests_arrived_total')}{{{MODEL}}}[{RATE}])) ^ 2 * {w}) / "
                    f"sum by (instance) (rate({m('goodput_requests_arrived_total')}{{{MODEL}}}[{RATE}])))",
                    f"{w}-s windows") for w in ("0.1", "1")],
        ], "short", min=0, description="Index of dispersion (variance / mean) of the requests one replica receives: 1 "
                                       "for Poisson arrivals, more where they come in clumps. Per window length from "
                                       "the sidecars' counters (0.1 and 1 s; over the rate interval, so slower swings "
                                       "of the rate count too; the 10-s counter is too coarse for a panel's interval), "
                                       "and the value the service model queues prompts with: read at a prompt's mean "
                                       "service time, over each forecast step."),
        series("Router pooling (wait scale)", [
            Query(f"max({m('goodput_replica_wait_scale')}{{state=\"learned\"}})", "learned"),
            Query(f"max({m('goodput_replica_wait_scale')}{{state=\"planned\"}})", "planned on"),
        ], "short", min=0, max=1, description="How much less prompts wait than in one replica's own queue: the engines' "
                                              "queue time over the service model's, from steps with no burst in "
                                              "memory (the upper end of its 90 % band). 1: routed at random (a "
                                              "Kubernetes Service); below 1, a load-aware router pools the replicas' "
                                              "queues. Capacity is planned on it only while no burst is in memory."),
        series("Engine iterations and generation", [
            Query(f"sum(rate({m('goodput_engine_steps_total')}{{{MODEL}}}[{RATE}]))", "iterations/s"),
            Query(f"sum(rate({m('goodput_engine_generation_tokens_total')}{{{MODEL}}}[{RATE}]))", "generated tokens/s"),
        ], "short", min=0, description="What the decode fit reads: tokens per iteration is the mean batch."),
    ]
    return dashboard(UID, "goodput / Autoscaling", "dashboards/autoscaling.py",
                     "Forecast queue depth, arrivals, TTFT and TPOT against actuals, forecast errors, desired "
                     "against observed replicas, the learned service model and the forecast model in use.",
                     [("Decision", summary), ("Forecast", forecast), ("Latency forecast", latency),
                      ("Service model (learned)", service)])
