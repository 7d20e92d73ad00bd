"""Dashboard 1, "Goodput and SLOs": is the service serving users in time, per SLO class?"""

from __future__ import annotations

from dashboards import contract as c
from dashboards.contract import name as m
from dashboards.panels import CLASS, MODEL, MODEL_CLASS, Query, dashboard, series, single

UID = "goodput-slo"
RATE = "$__rate_interval"


def _requests(outcome_matcher: str = "", by: str = "", window: str = RATE, fn: str = "rate") -> str:
    matchers = MODEL_CLASS + (f", {outcome_matcher}" if outcome_matcher else "")
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} ({fn}({m('goodput_requests_total')}{{{matchers}}}[{window}]))"


GOOD = 'outcome="good"'
JUDGED = 'outcome!="cancelled"'  # the rules' definition: cancelled requests are not judged
BAD = f'outcome=~"{c.BAD_OUTCOMES}"'   # shed requests were judged and not served in time
SHED = 'outcome="shed"'
FAILED = 'outcome=~"error|cancelled"'


def _share(part: str, whole: str, by: str = "", window: str = RATE, fn: str = "rate") -> str:
    """part / whole, reading 0 (not "no data") where `part` has no series yet: a class whose
    requests all failed has no outcome="good" counter at all."""
    total = _requests(whole, by, window, fn)
    return f"({_requests(part, by, window, fn)} or 0 * {total}) / {total}"


def _latency(objective: str, title: str) -> object:
    histogram = m(f"goodput_{objective}_seconds_bucket")
    queries = [Query(f"histogram_quantile({q}, sum by (le) (rate({histogram}{{{MODEL_CLASS}}}[{RATE}])))", f"p{round(q * 100)}")
               for q in (0.5, 0.9, 0.99)]
    # The configured objective, drawn on the same axis so a percentile crossing it is obvious.
    queries.append(Query(f'max by (slo_class) ({m("goodput_slo_target_seconds")}{{{CLASS}, objective="{objective}"}})',
                         "target {{slo_class}}"))
    return series(title, queries, "s", w=8, min=0,
                  description=f"{objective.upper()} percentiles over the selected models and classes, "
                              "with each class's configured target.")


def _predicted(objective: str, title: str, description: str) -> object:
    predicted = m(f"goodput_admission_predicted_{objective}_seconds_bucket")
    return series(f"Predicted {title} at arrival", [
        Query(f"histogram_quantile({q}, sum by (le) (rate({predicted}{{{MODEL_CLASS}}}[{RATE}])))", f"p{round(q * 100)}")
        for q in (0.5, 0.9, 0.99)
    ] + [Query(f'max by (slo_class) ({m("goodput_slo_target_seconds")}{{{CLASS}, objective="{objective}"}})',
               "target {{slo_class}}")], "s", w=8, min=0, description=description)


def _prediction_error(objective: str, title: str) -> object:
    error = m(f"goodput_admission_{objective}_error_seconds_bucket")
    return series(f"{title} prediction error (admitted)", [
        Query(f"histogram_quantile({q}, sum by (le) (rate({error}{{{MODEL_CLASS}}}[{RATE}])))", f"p{round(q * 100)} |error|")
        for q in (0.5, 0.9)
    ], "s", w=8, min=0,
        description=f"|predicted - measured| {title} of admitted streamed requests: how far the guard can be trusted.")


def _held() -> object:
    held = m("goodput_admission_held_seconds")
    return series("Held for a decode slot", [
        Query(f"histogram_quantile({q}, sum by (le) (rate({held}_bucket{{{MODEL_CLASS}}}[{RATE}])))", f"p{round(q * 100)} held")
        for q in (0.5, 0.9, 0.99)
    ], "s", w=8, min=0,
        description="Requests the decode batch had no room for wait in the sidecar until a slot frees (then admitted) "
                    "or their TTFT has no room left (then shed, reason tpot): how long they waited. The wait is part "
                    "of their TTFT. How many are held per second: the panel 'Shed by the admission guard'.")


def build():
    budget_left = (f"1 - (({_requests(BAD, 'slo_class', '30d', 'increase')} or 0 * {_requests(JUDGED, 'slo_class', '30d', 'increase')})"
                   f" / {_requests(JUDGED, 'slo_class', '30d', 'increase')})"
                   f" / on (slo_class) {c.ERROR_BUDGET_RECORD}{{{CLASS}}}")
    overview = [
        single("Goodput", [Query(_requests(GOOD), "goodput")], "reqps", decimals=2,
               description="Requests per second that met every objective of their SLO class."),
        single("Throughput", [Query(_requests('outcome=~"good|slo_violated"'), "throughput")], "reqps", decimals=2,
               description="Requests per second that completed, in time or not."),
        single("Attainment (range)", [Query(_share(GOOD, JUDGED, window="$__range", fn="increase"), "attainment")],
               "percentunit", decimals=2,
               description="Share of judged requests over the dashboard's time range that met their SLO."),
        single("In flight", [Query(f"sum({m('goodput_requests_in_flight')}{{{MODEL}}})", "in flight")], "short",
               description="Requests the sidecars are proxying right now."),
        series("Goodput beside throughput", [
            Query(_requests(GOOD), "goodput"),
            Query(_requests('outcome=~"good|slo_violated"'), "throughput"),
            # vector(0): "no failures" should read 0, not "no data" (the series appear on the first one).
            Query(_requests(FAILED) + " or vector(0)", "errors + cancelled"),
            Query(_requests(SHED) + " or vector(0)", "shed (429)"),
        ], "reqps", min=0, description="Throughput keeps rising past the knee; goodput does not, unless the "
                                       "admission guard sheds what would miss anyway."),
        series("Attainment per SLO class vs objective", [
            Query(_share(GOOD, JUDGED, "slo_class"), "{{slo_class}} attainment"),
            Query(f"max by (slo_class) ({m('goodput_slo_objective_ratio')}{{{CLASS}}})", "{{slo_class}} objective"),
        ], "percentunit", max=1, description="Share of judged requests that met their SLO, against the objective."),
    ]
    budget = [
        series("Error budget remaining (rolling 30d)", [Query(budget_left, "{{slo_class}}")], "percentunit", max=1,
               description="1 - (failed share over 30 days) / (1 - objective). Below 0 the SLO is broken."),
        series("Burn rate", [
            Query(f"{c.burn_rate_record(w)}{{{CLASS}}}", "{{slo_class}} " + w) for w in ("5m", "1h", "6h")
        ], "x", min=0, lines=[1, 6, 14.4],
               description="Error ratio / (1 - objective) from the recording rules (all models): 1 spends the "
                           "budget exactly over the period; dashed lines are the alert tiers 1x, 6x, 14.4x."),
    ]
    latency = [_latency("ttft", "Time to first token"), _latency("tpot", "Time per output token"),
               _latency("e2e", "End-to-end latency")]
    traffic = [
        series("Outcomes", [Query(_requests(by="outcome"), "{{outcome}}")], "reqps", stacked=True, min=0,
               description="good | slo_violated | error | cancelled | shed, per second."),
        series("SLO violations by objective", [
            Query(f"sum by (objective) (rate({m('goodput_slo_violations_total')}{{{MODEL_CLASS}}}[{RATE}]))", "{{objective}}")
        ], "reqps", min=0, description="Which objective requests missed (one request may miss several)."),
        series("Requests by SLO class", [Query(_requests(by="slo_class"), "{{slo_class}}")], "reqps", min=0),
        series("Token rates", [
            Query(f"sum(rate({m('goodput_input_tokens_total')}{{{MODEL_CLASS}}}[{RATE}]))", "input tokens/s"),
            Query(f"sum(rate({m('goodput_output_tokens_total')}{{{MODEL_CLASS}}}[{RATE}]))", "output tokens/s"),
        ], "short", min=0),
    ]
    admission = [
        series("Shed by the admission guard", [
            # "or vector(0)": a sidecar that never shed has no series for it yet, and the panel reads 0.
            Query(f"sum by (slo_class, reason) (rate({m('goodput_admission_shed_total')}{{{MODEL_CLASS}}}[{RATE}]))"
                  " or vector(0)", "{{slo_class}} {{reason}} shed req/s"),
            Query(f"sum by (slo_class) (rate({m('goodput_admission_held_seconds_count')}{{{MODEL_CLASS}}}[{RATE}]))",
                  "{{slo_class}} held req/s"),
        ], "reqps", w=8, min=0,
               description="Requests answered 429 + Retry-After, by the objective they were predicted to miss: ttft "
                           "(the queue is too long) or tpot (the decode batch is too large for the step to meet the "
                           "objective). Sustained shedding is a capacity problem (alert GoodputSheddingSustained). Held: requests that "
                           "waited for a decode slot first (admitted or shed after)."),
        _predicted("ttft", "TTFT", "What the guard predicted for every request it judged, admitted or shed, against the target."),
        _predicted("tpot", "TPOT", "What the guard predicted for every request it judged, admitted or shed: the step time "
                                   "at the decode batch it would join, slowed by the prefills expected meanwhile, against "
                                   "the target."),
        _prediction_error("ttft", "TTFT"),
        _prediction_error("tpot", "TPOT"),
        _held(),
    ]
    return dashboard(UID, "goodput / Goodput and SLOs", "dashboards/goodput_slo.py",
                     "Goodput (requests that met their TTFT and TPOT objectives) beside throughput, SLO "
                     "attainment, error budget and burn rate, latency percentiles against targets.",
                     [("Goodput", overview), ("Error budget", budget), ("Latency", latency), ("Traffic", traffic),
                      ("Admission", admission)])
