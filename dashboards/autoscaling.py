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
               description="Requests/s one replica sustains while SLOs hold (configured or learned)."),
        single("Forecast model", [Query(f"max by (model_name) ({m('goodput_forecast_model_info')})", "{{model_name}}")],
               "short", text_name=True, description="The forecast model the forecaster selected (its own level model or a statsmodels one)."),
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
    return dashboard(UID, "goodput / Autoscaling", "dashboards/autoscaling.py",
                     "Forecast queue depth and arrivals against actuals, desired against observed replicas, "
                     "per-replica capacity and the forecast model in use.",
                     [("Decision", summary), ("Forecast", forecast)])
