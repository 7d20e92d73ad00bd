"""Label cardinality stays bounded: 10,000 requests, each with its own model name and SLO class
header, through a sidecar with no model allow-list (the worst case: it learns names itself)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from prometheus_client import generate_latest

from tests.reliability.rawhttp import exchange, request
from tests.reliability.recording_upstream import RecordingUpstream
from tests.sidecar.conftest import SidecarThread

N = 10_000
BATCH = 250          # pipelined on one connection per batch


@pytest.mark.slow
def test_ten_thousand_model_names_and_classes_keep_series_bounded():
    runner = SidecarThread()
    upstream = None
    try:
        upstream = asyncio.run_coroutine_threadsafe(RecordingUpstream().start(), runner.loop).result(10)
        live = runner.start(upstream.url)
        answered = 0
        for start in range(0, N, BATCH):
            data = b"".join(request("POST", "/v1/completions", [("x-slo-class", f"class-{i}")],
                                    json.dumps({"model": f"model-{i}", "prompt": "hi"}).encode())
                            for i in range(start, start + BATCH))
            responses, _ = exchange(live.running.port, [data], half_close=False, expect=BATCH, timeout=30)
            assert all(r.status == 200 for r in responses)
            answered += len(responses)
        assert answered == N
        page = generate_latest(live.registry).decode()
        models = set(re.findall(r'model="([^"]*)"', page))
        classes = set(re.findall(r'slo_class="([^"]*)"', page))
        series = [line for line in page.splitlines() if line.startswith("goodput_")]
        # The first 8 names seen are kept (ModelLabels.max_auto), every other one is "other";
        # unknown class headers fall back to the default class.
        assert models == {f"model-{i}" for i in range(8)} | {"other"}, sorted(models)[:20]
        assert classes == set(live.app.config.slo.classes), classes
        # 1,501 sample lines when written (9 model values; the decode-batch counters added 36), against
        # tens of thousands if names or classes leaked into labels.
        assert len(series) < 1600 and len(page) < 400_000, (len(series), len(page))
        assert sum(s.value for f in live.registry.collect() for s in f.samples
                   if s.name == "goodput_requests_total") == N
        print(f"\n{N} requests: {len(models)} model label values, {len(classes)} class values, "
              f"{len(series)} series, {len(page)} bytes of /metrics")
    finally:
        if upstream is not None:
            asyncio.run_coroutine_threadsafe(upstream.stop(), runner.loop).result(10)
        runner.close()
