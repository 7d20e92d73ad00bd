"""Helpers for the live test: Prometheus config, a kube-state-metrics stand-in, load, and the
"data part" of an alert expression.

Kept apart from the test so the test reads as the story it checks.
"""

from __future__ import annotations

import asyncio
import re

import httpx
import yaml

from dashboards import contract
from tests.support import GetServer

# Lenient "interactive" so the tiny CPU engine meets it; "strict" can never be met (1 ms TTFT),
# so every strict request is slo_violated: violations, burn rates and a real page alert exist.
# Interactive has the admission guard on: its 30 s objective is never predicted to be missed, so
# nothing is shed, but the guard's predicted-TTFT and error histograms get data.
SLO_CONFIG = {
    "default_class": "interactive",
    "classes": [
        {"name": "interactive", "ttft": 30, "tpot": 5, "e2e": 120, "objective": 0.99, "admission": True},
        {"name": "strict", "ttft": 0.001, "tpot": 0.0001, "e2e": 0.01, "objective": 0.99},
    ],
    "rules": [{"header": "x-slo-class"}],
}

# What kube-state-metrics would report for the chart's HPA ("<release>-goodput") at its maximum.
# kube-state-metrics needs a Kubernetes API server, which these machines do not have.
KSM_TEXT = """# TYPE kube_horizontalpodautoscaler_status_current_replicas gauge
kube_horizontalpodautoscaler_status_current_replicas{namespace="serving",horizontalpodautoscaler="live-goodput"} 1
# TYPE kube_horizontalpodautoscaler_spec_max_replicas gauge
kube_horizontalpodautoscaler_spec_max_replicas{namespace="serving",horizontalpodautoscaler="live-goodput"} 1
"""


def prometheus_config(targets: dict[str, str], rules_file: str, alertmanager: str | None = None) -> str:
    alerting = {"alerting": {"alertmanagers": [{"api_version": "v2", "static_configs": [{"targets": [alertmanager]}]}]}} \
        if alertmanager else {}
    return yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [rules_file],
        **alerting,
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}]}
                           for job, target in targets.items()],
    })


def static_metrics(text: str) -> GetServer:
    """Serves a fixed exposition text on /metrics from a thread (the kube-state-metrics stand-in)."""
    body = text.encode()
    return GetServer(lambda path: body)


async def _stream(client: httpx.AsyncClient, url: str, slo_class: str, max_tokens: int) -> int:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me about autoscaling."}],
            "max_tokens": max_tokens, "stream": True}
    chunks = 0
    async with client.stream("POST", url, json=body, headers={"x-slo-class": slo_class}) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            chunks += line.startswith("data: {")
    return chunks


async def drive_load(base_url: str, seconds: float, concurrency: int = 6, max_tokens: int = 24) -> dict[str, int]:
    """`concurrency` streaming clients back to back for `seconds`; half ask for the strict class."""
    done = {"interactive": 0, "strict": 0}
    url = f"{base_url}/v1/chat/completions"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds

    async def worker(i: int) -> None:
        slo_class = "strict" if i % 2 else "interactive"
        async with httpx.AsyncClient(timeout=60) as client:
            while loop.time() < deadline:
                if await _stream(client, url, slo_class, max_tokens) > 0:
                    done[slo_class] += 1

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return done


def data_part(expr: str) -> str:
    """An alert expression with its thresholds taken out, so it returns data while nothing is wrong.

    `x > 14.4` becomes `x`; a comparison between two vectors (`a >= on (l) b`) becomes `a + on (l) b`,
    which keeps the same matching and returns a sample wherever the comparison could be judged.
    Label matchers (`{outcome!="cancelled"}`) and strings are left alone.
    """
    out, depth, i = [], 0, 0
    while i < len(expr):
        ch = expr[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if depth == 0:
            mo = re.match(r"\s*(>=|<=|==|!=|>|<)\s*(bool\s+)?", expr[i:])
            if mo and ch in " \n><=!":
                number = re.match(r"-?[0-9.]+(?![\w.])", expr[i + mo.end():])
                if number:
                    i += mo.end() + number.end()
                    continue
                out.append(" + ")
                i += mo.end()
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def uses_forecaster(expr: str) -> bool:
    return any(m.name in expr for m in contract.by_source("forecaster"))
