"""Prometheus recording and alerting rules, generated from the metrics contract.

`build_groups(config)` returns the rule groups as plain data; `render(groups, format)` writes them
either as a Prometheus rules file (`groups:`) or as a prometheus-operator `PrometheusRule`. Both
formats carry the same groups, so `promtool check rules` and `promtool test rules` on the plain
file prove the operator object too.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from dashboards import contract as c
from dashboards.contract import name as m

GENERATOR = "dashboards/rules.py (goodput rules generate)"
FORMATS = ("prometheus", "prometheus-operator")


@dataclass(frozen=True)
class RulesConfig:
    """Thresholds the alerts use; defaults suit one goodput deployment per Prometheus."""

    runbook_base: str = "README.md"
    kv_saturation_ratio: float = 0.95
    preemptions_per_second: float = 1.0
    drain_alert_after: str = "2m"
    no_traffic_window: str = "15m"
    # Share of judged requests the admission guard may refuse (5-minute rate, held for 15 minutes)
    # before it is a capacity problem rather than a burst the guard absorbed as designed.
    shed_ratio: float = 0.05
    # kube-state-metrics selector for the HPA in front of the serving Deployment. The chart names
    # it "<release>-goodput", which this matches.
    hpa_selector: str = 'horizontalpodautoscaler=~".*goodput.*"'

    def __post_init__(self) -> None:
        if not 0 < self.kv_saturation_ratio <= 1:
            raise ValueError(f"kv_saturation_ratio={self.kv_saturation_ratio}: must be in (0, 1]")
        if not 0 < self.shed_ratio < 1:
            raise ValueError(f"shed_ratio={self.shed_ratio}: must be in (0, 1)")
        if self.preemptions_per_second <= 0:
            raise ValueError(f"preemptions_per_second={self.preemptions_per_second}: must be > 0")


def _runbook(config: RulesConfig, alert: str) -> str:
    # GitHub's anchor for the README heading "### Runbook: GoodputX" is "#runbook-goodputx".
    return f"{config.runbook_base}#runbook-{alert.lower()}"


def _alert(config, alert, expr, for_, severity, summary, description) -> dict:
    rule = {"alert": alert, "expr": expr}
    if for_:
        rule["for"] = for_
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {"summary": summary, "description": description,
                           "runbook_url": _runbook(config, alert)}
    return rule


def slo_recording_rules() -> list[dict]:
    requests = m("goodput_requests_total")
    rules = [{
        "record": c.ERROR_BUDGET_RECORD,
        # max: every sidecar exports the same configured objective; max collapses instances.
        "expr": f"1 - max by (slo_class) ({m('goodput_slo_objective_ratio')})",
    }]
    for w in c.SLO_WINDOWS:
        # Cancelled requests are not judged (the client left; the service neither met nor missed
        # its objective), so they are out of numerator and denominator. Shed ones are judged and
        # bad: a refused user was not served in time. The `or ... * 0` keeps a 0 for a class that
        # had traffic but no failures: a missing counter series is not "no data".
        bad = f'sum by (slo_class) (rate({requests}{{outcome=~"{c.BAD_OUTCOMES}"}}[{w}]))'
        judged = f'sum by (slo_class) (rate({requests}{{outcome!="cancelled"}}[{w}]))'
        rules.append({"record": c.error_ratio_record(w),
                      "expr": f"({bad} or 0 * {judged})\n/\n{judged}"})
        rules.append({"record": c.attainment_ratio_record(w), "expr": f"1 - {c.error_ratio_record(w)}"})
        rules.append({"record": c.burn_rate_record(w),
                      "expr": f"{c.error_ratio_record(w)}\n/ on (slo_class)\n{c.ERROR_BUDGET_RECORD}"})
    return rules


def _burn_expr(tiers) -> str:
    parts = [f"(\n  {c.burn_rate_record(t.long_window)} > {t.factor:g}\nand\n  {c.burn_rate_record(t.short_window)} > {t.factor:g}\n)"
             for t in tiers]
    return "\nor\n".join(parts)


def slo_alerts(config: RulesConfig) -> list[dict]:
    def tiers_text(tiers):
        return " or ".join(f"{t.long_window} and {t.short_window} above {t.factor:g}x" for t in tiers)

    # No `for:`: the short window already makes the alert reset within minutes of recovery,
    # and waiting would only delay a page that spends 2 % of a month's budget per hour.
    return [
        _alert(config, "GoodputErrorBudgetBurnPage", _burn_expr(c.PAGE_TIERS), None, "page",
               "SLO class {{ $labels.slo_class }} is burning its error budget fast",
               "Requests of SLO class {{ $labels.slo_class }} miss their TTFT/TPOT/E2E objectives "
               "{{ $value | printf \"%.1f\" }}x faster than the objective allows (" + tiers_text(c.PAGE_TIERS)
               + "); at this rate a 30-day budget is gone in days."),
        _alert(config, "GoodputErrorBudgetBurnTicket", _burn_expr(c.TICKET_TIERS), None, "ticket",
               "SLO class {{ $labels.slo_class }} is steadily burning its error budget",
               "Requests of SLO class {{ $labels.slo_class }} miss their objectives "
               "{{ $value | printf \"%.1f\" }}x faster than sustainable (" + tiers_text(c.TICKET_TIERS)
               + "); the budget runs out before the period ends."),
    ]


def engine_rules(config: RulesConfig) -> tuple[list[dict], list[dict]]:
    waiting = m("goodput_engine_requests_waiting")
    kv = m("goodput_engine_kv_cache_usage_ratio")
    requests = m("goodput_requests_total")
    recording = [{"record": c.WAITING_RECORD, "expr": f"sum({waiting})"}]
    alerts = [
        _alert(config, "GoodputKVCacheSaturated",
               f"{kv} > {config.kv_saturation_ratio:g}\nand\n{waiting} > 0", "10m", "warning",
               "KV cache of {{ $labels.model }} on {{ $labels.instance }} is full and requests queue",
               "KV-cache usage has been above " + f"{config.kv_saturation_ratio:.0%}"
               + " with requests waiting for 10 minutes: new requests wait for blocks to free up, "
               "so TTFT grows. Add replicas or lower max concurrency / context length."),
        _alert(config, "GoodputPreemptionStorm",
               f"sum by (model) (rate({m('goodput_engine_preemptions_total')}[5m])) > {config.preemptions_per_second:g}",
               "5m", "warning",
               "{{ $labels.model }} preempts {{ $value | printf \"%.2f\" }} requests/s",
               "The engine keeps evicting running requests to free KV-cache blocks and recomputing "
               "them later, which wastes compute and hurts TPOT. The fleet is oversubscribed."),
        _alert(config, "GoodputEngineScrapeDown", f"{m('goodput_engine_up')} == 0", "2m", "page",
               "Sidecar {{ $labels.instance }} cannot read its engine's /metrics",
               "The sidecar's last scrapes of the upstream engine's /metrics failed for 2 minutes, "
               "so engine gauges (queue, KV cache) are stale; the engine is probably down or hung."),
        _alert(config, "GoodputDrainTooLong", f"{m('goodput_draining')} == 1", config.drain_alert_after,
               "warning",
               "Sidecar {{ $labels.instance }} has been draining for over " + config.drain_alert_after,
               "A drain should finish within the sidecar's --drain-timeout; a pod still draining means "
               "streams that never end or a preStop hook that never returns, and it blocks rollouts."),
        _alert(config, "GoodputMalformedRequestFlood",
               f"sum by (instance) (rate({m('goodput_malformed_requests_total')}[5m])) > 1", "10m", "warning",
               "Sidecar {{ $labels.instance }} refuses {{ $value | printf \"%.1f\" }} malformed requests/s",
               "Requests that are not valid HTTP/1.1 (conflicting lengths, bad chunked framing, oversize "
               "headers) keep arriving; each gets a 400 and at most one log line in 10 s. A broken "
               "client, a misconfigured load balancer, or someone probing for request smuggling."),
        _alert(config, "GoodputNoTraffic",
               f"sum by (model) (rate({requests}[{config.no_traffic_window}])) == 0\n"
               f"and\nsum by (model) (increase({requests}[1d])) > 0",
               config.no_traffic_window, "warning",
               "No requests for {{ $labels.model }} although it served traffic in the last day",
               "The sidecars saw no request for " + config.no_traffic_window + " (plus the alert's "
               "wait) for a model that served traffic within the last day: clients may be failing "
               "before they reach the service (DNS, ingress, auth)."),
    ]
    return recording, alerts


def autoscaling_alerts(config: RulesConfig) -> list[dict]:
    current = f"kube_horizontalpodautoscaler_status_current_replicas{{{config.hpa_selector}}}"
    maximum = f"kube_horizontalpodautoscaler_spec_max_replicas{{{config.hpa_selector}}}"
    at_max = f"count({current} >= on (namespace, horizontalpodautoscaler) {maximum}) > 0"
    upper = m("goodput_forecast_arrival_rate")
    capacity = m("goodput_replica_capacity_requests_per_second")
    requests = m("goodput_requests_total")
    shed = f'sum by (slo_class) (rate({requests}{{outcome="shed"}}[5m]))'
    judged = f'sum by (slo_class) (rate({requests}{{outcome!="cancelled"}}[5m]))'
    return [
        _alert(config, "GoodputSheddingSustained", f"{shed}\n/\n{judged}\n> {config.shed_ratio:g}", "15m", "warning",
               "The admission guard refuses {{ $value | humanizePercentage }} of SLO class {{ $labels.slo_class }}",
               "For 15 minutes the sidecars have answered more than " + f"{config.shed_ratio:.0%}"
               + " of {{ $labels.slo_class }} requests with 429 because their predicted TTFT or TPOT would miss "
               "the objective (goodput_admission_shed_total says which): demand is above what the replicas serve. That is a capacity problem: check "
               "that the autoscaler is adding replicas and is not at its maximum."),
        _alert(config, "GoodputQueueGrowingAtMaxReplicas",
               f"(\n  deriv({c.WAITING_RECORD}[10m]) > 0\nand\n  {c.WAITING_RECORD} > 0\n)\nand on ()\n{at_max}",
               "10m", "page",
               "Requests keep queueing and the HPA is at its maximum replicas",
               "The engines' waiting queue has grown for 10 minutes while the HPA cannot add replicas: "
               "raise maxReplicas (and the GPU quota behind it) or shed load."),
        _alert(config, "GoodputForecasterInputBad",
               f"sum by (reason) (increase({m('goodput_forecaster_source_errors_total')}[5m])) > 10", "5m",
               "warning",
               "The forecaster holds its last decision: its input is bad ({{ $labels.reason }})",
               "Most forecaster steps in the last 5 minutes found their source unreachable or its data "
               "unusable (reason {{ $labels.reason }}), so the desired replica count is frozen at its "
               "last safe value and cannot follow demand up. See the forecaster's log for the cause."),
        _alert(config, "GoodputForecastAboveCapacityAtMaxReplicas",
               f'max({upper}{{bound="upper"}})\n> on ()\n(max({capacity}) * on () max({maximum}))',
               "10m", "warning",
               "Forecast demand exceeds what the maximum replica count can serve",
               "The forecaster's upper-bound arrival rate ({{ $value | printf \"%.1f\" }} req/s) is above "
               "per-replica capacity times the HPA's maxReplicas: when the forecast comes true, "
               "requests will queue. Raise maxReplicas before it does."),
    ]


def build_groups(config: RulesConfig | None = None) -> list[dict]:
    """Alerts share a group with the recording rules they read. Rules within a group run in order
    at one timestamp, while separate groups run independently; apart, an alert could read the
    recording from one evaluation earlier (promtool even picks the group order at random)."""
    config = config or RulesConfig()
    engine_recording, engine_alerts = engine_rules(config)
    return [
        {"name": "goodput-slo", "rules": slo_recording_rules() + slo_alerts(config)},
        {"name": "goodput-engine", "rules": engine_alerts},
        {"name": "goodput-autoscaling", "rules": engine_recording + autoscaling_alerts(config)},
    ]


def alert_names(groups: list[dict]) -> list[str]:
    return [r["alert"] for g in groups for r in g["rules"] if "alert" in r]


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper, value: str):
    # Multi-line PromQL as block scalars, so the file reads like hand-written rules.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(groups: list[dict], format: str) -> str:
    if format not in FORMATS:
        raise ValueError(f"format {format!r}: use one of {', '.join(FORMATS)}")
    header = f"# Generated by {GENERATOR}; do not edit: change the generator and regenerate.\n"
    if format == "prometheus":
        doc = {"groups": groups}
    else:
        doc = {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {"name": "goodput", "labels": {"app.kubernetes.io/name": "goodput"}},
            "spec": {"groups": groups},
        }
    return header + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True)
