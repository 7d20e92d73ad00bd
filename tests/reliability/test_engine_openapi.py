"""schemathesis against the bundled engine's own OpenAPI document (FastAPI's /openapi.json).

Positive and negative cases (bodies that break the schema: wrong types, missing fields, values out
of range) for every operation. Checked: never a 5xx, and the engine's log has no traceback; at
the end no request is running and every KV block is free. GOODPUT_SCHEMATHESIS_EXAMPLES per
operation (default 25) sets the length; the long run is
`GOODPUT_SCHEMATHESIS_EXAMPLES=500 python -m pytest tests/reliability/test_engine_openapi.py`.
"""

from __future__ import annotations

import os
import time

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from tests.engine.test_server import metric
from tests.support import ServerProcess, free_port, goodput_command

EXAMPLES = int(os.environ.get("GOODPUT_SCHEMATHESIS_EXAMPLES", "25"))
CALLS: dict[str, int] = {}


@pytest.fixture(scope="module")
def engine():
    port = free_port()
    proc = ServerProcess(goodput_command("engine", "serve", "--model", "tiny", "--port", str(port),
                                         "--num-blocks", "256", "--max-model-len", "2048"),
                         f"http://127.0.0.1:{port}/health", timeout=120, name="engine-tiny")
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


def _bounded(case) -> None:
    """Generated max_tokens can be in the millions; a few tokens exercise the same code paths."""
    body = case.body
    if not isinstance(body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(key), int) and not isinstance(body[key], bool) and body[key] > 8:
            body[key] = 8
    if "messages" in body and "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = 4     # chat runs to the end of the context by default


def test_engine_never_answers_5xx(engine):
    """Every operation in the document, positive and negative cases. (schemathesis' pytest plugin
    does not load under pytest 9, so the strategies are driven with hypothesis directly.)"""
    _, base = engine
    schema = schemathesis.openapi.from_url(base + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= {"POST /v1/completions", "POST /v1/chat/completions"}
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 25,
                      suppress_health_check=list(HealthCheck), database=None)
            def run(case):
                _bounded(case)
                CALLS[operation.label] = CALLS.get(operation.label, 0) + 1
                case.call_and_validate(checks=[not_a_server_error], timeout=30)
            try:
                run()
            except Unsatisfiable:
                # No parameters and no body (GET /health): nothing can break its schema.
                assert mode is GenerationMode.NEGATIVE and operation.method.upper() == "GET", operation.label


def test_engine_ends_clean(engine):
    """Runs after the fuzz: nothing running or waiting, no KV block held, no traceback logged."""
    proc, base = engine
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (metric(base, "vllm:num_requests_running") or metric(base, "vllm:kv_cache_usage_perc")):
        time.sleep(0.1)
    assert metric(base, "vllm:num_requests_running") == 0
    assert metric(base, "vllm:num_requests_waiting") == 0
    assert metric(base, "vllm:kv_cache_usage_perc") == 0
    assert httpx.get(base + "/health").status_code == 200
    assert "Traceback" not in proc.log(), proc.log()[-3000:]
    print(f"\nschemathesis calls per operation: {CALLS}")
