"""KEDA's `metrics-api` scaler contract, served straight from the forecaster (no Prometheus).

KEDA polls `GET <url>` every `pollingInterval`, needs a 200 with a JSON body, and reads one number
at the trigger's `valueLocation` (a GJSON path). The chart points `valueLocation` at
`desiredReplicas` with `targetValue: "1"` and `metricType: AverageValue`, so the HPA KEDA makes
computes ceil(desiredReplicas / 1) = the forecaster's decision, exactly as in the other modes,
without a scrape and a query in between. The forecast values are in the same document, so a user
can scale on them instead (say `forecast.queueDepth.upper`) by changing only `valueLocation`.

Before the first decision there is nothing to report: 503, which KEDA treats as a failed read (the
HPA holds the replica count, or KEDA applies the ScaledObject's `fallback`), never a 0 that
would scale the workload down.
"""

from __future__ import annotations

from forecaster.server import ForecastState

PATH = "/keda/v1/scaler"
# The GJSON paths the chart and the docs use; the test reads each from the served document.
VALUE_LOCATIONS = ("desiredReplicas", "forecast.queueDepth.upper", "forecast.arrivalRate.upper")


def scaler_document(state: ForecastState) -> tuple[int, dict]:
    """(HTTP status, JSON body) for KEDA's metrics-api scaler."""
    p = state.get()
    if p is None:
        return 503, {"error": "no forecast published yet: the forecaster has not completed a step; "
                              "KEDA keeps the current replicas until it has"}
    d = p.decision
    return 200, {
        "desiredReplicas": d.desired_replicas,
        "observedReplicas": p.observed_replicas,
        "horizonSeconds": p.horizon_seconds,
        "forecast": {
            "queueDepth": {"mean": d.queue_depth_mean, "upper": d.queue_depth_upper},
            "arrivalRate": {"mean": d.arrival_rate_mean, "upper": d.arrival_rate_upper},
        },
        "capacityRequestsPerSecond": d.capacity_rps,
        "model": d.model_name,
        "timestamp": p.timestamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
